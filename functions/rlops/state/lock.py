"""One lock per environment, as an object in the state bucket.

Taking it is a create with `ifGenerationMatch=0`, which Cloud Storage grants to exactly one caller.
The holder refreshes it while it works; a lock not refreshed for its TTL belonged to a process that
died, and the next caller takes it over (again under a generation precondition).

Whose clock says a lock expired: Cloud Storage's. The lock's age is the server's `updated` time of its
last refresh against the server's now (the `updated` time of a small object the caller writes for the
purpose), so a holder or a caller whose clock is off by minutes neither keeps a dead lock nor takes a
live one. A refresh that fails is retried until the lock would expire; if it cannot be kept (another
holder, or no write landed in time), the lock is `lost`, and the holder checks `ensure_held()` before
each step that changes something.
"""

import getpass
import json
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from google.api_core import exceptions as gexc
from google.cloud import storage

from rlops.clock import SYSTEM, Clock
from rlops.errors import Failure
from rlops.permissions import calls
from rlops.state.bucket import write_json
from rlops.state.layout import Layout


class LockHeld(Failure):
    pass


class LockLost(Failure):
    """The lock expired or was taken while its holder still worked: the holder stops before its next change."""


@calls("storage.objects.get", "storage.objects.insert", "storage.objects.delete")
class Lock:
    def __init__(self, bucket: storage.Bucket, prefix: str, environment: str, ttl_seconds: float = 900,
                 operation: str = "apply", clock: Clock = SYSTEM):
        self.blob = bucket.blob(Layout(prefix, environment).lock)
        self.environment = environment
        self.ttl = ttl_seconds
        self.operation = operation
        self.clock = clock
        self.token = uuid.uuid4().hex  # this holder's, in every write: a lost response is recognised as ours
        self.holder = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
        self.generation = 0
        self.lost: str | None = None
        self._kept_at = 0.0  # when (our monotonic clock) a write of ours last landed
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def _content(self) -> dict:
        now = datetime.fromtimestamp(self.clock.time(), UTC)
        return {"holder": self.holder, "operation": self.operation, "environment": self.environment,
                "since": now.isoformat(timespec="seconds"), "token": self.token, "ttl_seconds": self.ttl,
                "expires": (now + timedelta(seconds=self.ttl)).isoformat(timespec="seconds")}

    def acquire(self, timeout: float, on_wait: Callable[[dict], None] = lambda held: None,
                poll_seconds: float = 1.0) -> None:
        deadline = self.clock.monotonic() + timeout
        while True:
            try:
                self.generation = self._write(0)
                break
            except gexc.PreconditionFailed:
                held, generation, updated = _read(self.blob)
                if held is None:
                    continue  # released between our write and our read
                if held.get("token") == self.token:
                    self.generation = generation  # our own create landed; its response was lost
                    break
                if self._expired(held, updated):
                    try:
                        self.generation = self._write(generation)
                        break
                    except gexc.PreconditionFailed:
                        continue  # someone else took the expired lock first
                if self.clock.monotonic() >= deadline:
                    raise LockHeld(f"environment {self.environment} is locked by {held['holder']} "
                                   f"({held['operation']} since {held['since']}, expires {held['expires']}); "
                                   f"if that process is dead: rlops unlock {self.environment} --force") from None
                on_wait(held)
                self.clock.sleep(poll_seconds)
        self._kept_at = self.clock.monotonic()
        self._refresher = threading.Thread(target=self._refresh, daemon=True, name=f"lock-{self.environment}")
        self._refresher.start()

    def _write(self, generation: int) -> int:
        return write_json(self.blob, self._content(), if_generation_match=generation)

    def _expired(self, held: dict, updated: datetime | None) -> bool:
        """By the server's clock: the lock's last write against a write of ours now."""
        if updated is None:
            return False
        probe = self.blob.bucket.blob(f"{self.blob.name}.clock")
        probe.upload_from_string(self.token)
        if probe.updated is None:  # a write's answer carries the server's time; without it, none is expired
            return False
        return (probe.updated - updated).total_seconds() > float(held.get("ttl_seconds", self.ttl))

    def refresh(self) -> bool:
        """One refresh; False once the lock is lost (`lost` says why)."""
        try:
            self.generation = self._write(self.generation)
            self._kept_at = self.clock.monotonic()
            return True
        except gexc.PreconditionFailed:
            held, generation, _ = _read(self.blob)
            if held is not None and held.get("token") == self.token:
                self.generation, self._kept_at = generation, self.clock.monotonic()  # our retried write had landed
                return True
            self.lost = f"taken by {held['holder']} ({held['operation']})" if held else "removed (rlops unlock --force)"
        except Exception as error:  # any failure to write: retried until the lock would expire
            if self.clock.monotonic() - self._kept_at < self.ttl:
                return True
            self.lost = f"not refreshed for its TTL ({type(error).__name__}: {error})"
        return False

    def _refresh(self) -> None:
        wait = self.ttl / 3
        while not self._stop.wait(wait):
            before = self._kept_at
            if not self.refresh():
                return
            wait = self.ttl / 3 if self._kept_at != before else min(self.ttl / 30, 10.0)  # failed: retry sooner

    def ensure_held(self) -> None:
        """Before a change: stop if the lock was lost, or has gone unrefreshed for its TTL."""
        if self.lost is None and self.clock.monotonic() - self._kept_at >= self.ttl:
            self.lost = "not refreshed for its TTL"
        if self.lost is not None:
            raise LockLost(f"the lock on {self.environment} was lost ({self.lost}); stopped before the next change, "
                           "run it again to finish")

    def release(self) -> None:
        self._stop.set()
        if self._refresher:
            self._refresher.join()
        try:
            self.blob.delete(if_generation_match=self.generation)
        except (gexc.NotFound, gexc.PreconditionFailed):
            pass  # forcibly unlocked, or taken over, meanwhile: not ours to delete

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(blob: storage.Blob) -> tuple[dict | None, int, datetime | None]:
    """(content, generation, the server's time of that generation's write) of the lock; (None, 0, None) if none."""
    fresh = blob.bucket.get_blob(blob.name)
    if fresh is None:
        return None, 0, None
    try:
        data = fresh.download_as_bytes(if_generation_match=fresh.generation)
    except (gexc.NotFound, gexc.PreconditionFailed):
        return _read(blob)  # rewritten or removed between the two reads
    return json.loads(data), fresh.generation, fresh.updated


@calls("storage.objects.get", "storage.objects.delete")
def force_unlock(bucket: storage.Bucket, prefix: str, environment: str) -> dict | None:
    """Remove the lock as it was read (a holder's refresh in between keeps it); what it said, or None."""
    blob = bucket.blob(Layout(prefix, environment).lock)
    held, generation, _ = _read(blob)
    if held is not None:
        try:
            blob.delete(if_generation_match=generation)
        except gexc.NotFound:
            pass
        except gexc.PreconditionFailed:
            raise Failure(f"the lock on {environment} changed while it was being removed: its holder is alive; "
                          "look again before forcing it") from None
    return held
