"""The per-environment lock and the resource record, on fake-gcs-server behind the real storage client."""

import threading
import time

import pytest

from rlops.endpoints import Endpoints
from rlops.errors import Failure
from rlops.state import bucket as state_bucket
from rlops.state.lock import Lock, LockHeld, force_unlock
from rlops.state.resources import ResourceRecord


@pytest.fixture
def bucket(gcs, request):
    client = state_bucket.client("test", Endpoints.from_environment())
    name = f"state-{request.node.name.lower().replace('_', '-')[:40]}"
    return client.create_bucket(name)


def test_only_one_of_many_concurrent_callers_gets_the_lock(bucket):
    winners, losers = [], []
    start = threading.Barrier(8)

    def contend(i: int) -> None:
        lock = Lock(bucket, "rlops", "h200")
        start.wait()
        try:
            lock.acquire(timeout=0)
            winners.append(i)
        except LockHeld as held:
            losers.append(str(held))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(losers) == 7
    assert all("rlops unlock h200 --force" in message and " pid " in message for message in losers)


def test_the_second_caller_waits_and_gets_it_after_release(bucket):
    first = Lock(bucket, "rlops", "b200")
    first.acquire(timeout=0)
    waited = []
    got = threading.Event()

    def second() -> None:
        lock = Lock(bucket, "rlops", "b200")
        lock.acquire(timeout=10, on_wait=waited.append, poll_seconds=0.1)
        got.set()
        lock.release()

    thread = threading.Thread(target=second)
    thread.start()
    deadline = time.monotonic() + 30
    while not waited:  # until the second caller has found the lock held, however slow the machine
        assert time.monotonic() < deadline, "the second caller never looked at the lock"
        time.sleep(0.02)
    assert not got.is_set() and waited[0]["operation"] == "apply"
    first.release()
    thread.join(timeout=10)
    assert got.is_set()


def test_an_expired_lock_is_taken_over_and_force_unlock_removes_a_live_one(bucket):
    dead = Lock(bucket, "rlops", "env", ttl_seconds=1)
    dead.acquire(timeout=0)
    dead._stop.set()  # the holder died: nobody refreshes the lock any more
    heir = Lock(bucket, "rlops", "env")
    with pytest.raises(LockHeld):
        heir.acquire(timeout=0)
    heir.acquire(timeout=60, poll_seconds=0.1)  # once Cloud Storage's clock says a second went by unrefreshed
    held = force_unlock(bucket, "rlops", "env")
    assert held is not None and held["operation"] == "apply" and held["token"] == heir.token


def test_a_holder_whose_clock_is_behind_keeps_its_lock(bucket):
    """Expiry is by the server's clock: a holder 20 minutes behind writes an `expires` already past for everyone
    else, which the previous code read as expired and took over while the holder still worked."""
    holder = Lock(bucket, "rlops", "skewed")
    holder.acquire(timeout=0)
    held, generation = state_bucket.read_json(holder.blob)
    holder.generation = state_bucket.write_json(holder.blob, {**held, "expires": "2026-01-01T00:00:00+00:00"},
                                                if_generation_match=generation)
    with pytest.raises(LockHeld):
        Lock(bucket, "rlops", "skewed").acquire(timeout=0)
    holder.release()

def test_the_record_refuses_a_writer_that_read_an_older_version(bucket):
    mine = ResourceRecord(bucket, "rlops", "h200").load()
    theirs = ResourceRecord(bucket, "rlops", "h200").load()
    mine.put("network/a", {"mtu": 8896}, ())
    with pytest.raises(Failure, match="changed by someone else"):
        theirs.put("network/b", {"mtu": 1460}, ())
    assert ResourceRecord(bucket, "rlops", "h200").load().resources == {
        "network/a": {"fields": {"mtu": 8896}, "depends_on": []}}


def test_a_reader_that_saw_an_older_generation_reads_the_live_one(state_buckets):
    from rlops.state.bucket import client, read_json, write_json

    bucket = client("test", Endpoints.from_environment()).bucket("rlops-h200-example-state")
    reader = bucket.blob("tests/reread.json")
    write_json(reader, {"n": 1}, 0)
    assert read_json(reader)[0] == {"n": 1}
    write_json(bucket.blob("tests/reread.json"), {"n": 2}, read_json(reader)[1])
    content, generation = read_json(reader)
    assert content == {"n": 2} and generation > 0
