"""What the GPU pool cost: a simulated week driven through the real train, watch and reap code paths (the state
bucket is fake-gcs-server behind the real client), with ticks missed and repeated, checked against totals worked
out by hand; the accounting, the prices and the auto timeout on their own.

Ray cannot be run for a simulated week, so its job table here is `SimulatedRay` (tests/fakes/ray.py): jobs submitted
through rlops's own submission, each started, printing and ending on a script in simulated time, reported as Ray's
job API reports them (status, error type, start and end times in ms, the job's output).
"""

import json
import uuid
from types import SimpleNamespace

import pytest

from conftest import ENVIRONMENTS
from fakes.ray import Clock, SimulatedRay
from rlops import costs, waiting
from rlops.cloud.ray_jobs import JobView
from rlops.endpoints import Endpoints
from rlops.reaper import policy, reap
from rlops.runs import environment_cost, message, train, watch
from rlops.sites import Site
from rlops.spec import catalog
from rlops.spec.load import load_or_raise, load_text
from rlops.state.bucket import client

T0 = 1_790_000_000.0
TICK = 120.0


@pytest.fixture
def week(gcs, tmp_path, monkeypatch):
    """A local environment (idle.timeout 30m) on a simulated clock, its state in a fresh bucket."""
    text = (ENVIRONMENTS / "local.yaml").read_text().replace("timeout: 30s", "timeout: 30m")
    env = load_text(text, "local", "local.yaml").environment
    clock = Clock(T0)
    endpoints = Endpoints.from_environment()
    bucket = client("rlops-local", endpoints).create_bucket(f"costs-{uuid.uuid4().hex[:12]}")
    scaled, events = [], []
    ray = SimulatedRay(clock)
    site = Site("local", env, endpoints, ray, bucket, events.append, scaled.append,
                lambda scaled_down: waiting.on_local(ray.nodes(), scaled_down), str(tmp_path / "lustre"),
                {"gpu_pool": 1}, checkpoints_here=True,
                clock=SimpleNamespace(time=clock, monotonic=clock, sleep=lambda seconds: None))  # set, never slept on
    return SimpleNamespace(site=site, clock=clock, ray=site.ray, scaled=scaled, events=events, tmp=tmp_path)


def _train(week, run: str, at: float) -> str:
    week.clock.now = at
    request = message.parse(json.dumps({"environment": "local", "recipe": "tiny-arith", "run": run, "overrides": {},
                                        "requested_by": "tests"}).encode())
    recipe = message.recipe_of(request, week.site.env)
    return train.accept(week.site, request, message.settings(request, recipe))


def _ticks(week, start: float, end: float, skip_reap=(), skip_watch=(), twice=()) -> None:
    t = start
    while t < end:
        week.clock.now = t
        for _ in range(2 if t in twice else 1):
            if not any(a <= t <= b for a, b in skip_watch):
                watch.tick(week.site)
            if not any(a <= t <= b for a, b in skip_reap):
                reap.reap(week.site)
        t += TICK


def test_a_simulated_week_through_the_real_paths_costs_what_was_worked_out_by_hand(week):
    """Run a: 1 h. The reaper misses its ticks from +6000 to +7000 s, so it scales down at +7080 (the first tick
    past the 30-minute timeout that it does not miss) instead of +6120. Run b wakes the pool at +20000; its node
    joins Ray at +20300; it is preempted after 20 steps, resubmitted (the watcher misses ticks meanwhile), resumes
    from step 16; the pool goes down 30 minutes after it. Some ticks run twice."""
    ray = week.ray
    ray.script("rlops.local.a.1", 60, [(60 + 60 * i, i) for i in range(1, 61)], 3660)
    ray.script("rlops.local.b.1", 400, [(400 + 60 * i, i) for i in range(1, 21)], 1700, "FAILED",
               "JOB_SUPERVISOR_ACTOR_DIED")
    ray.script("rlops.local.b.2", 80, [(80 + 60 * (i - 16), i) for i in range(17, 41)], 1580, resumed=16)
    ray.node_starts = [T0 - 100, T0 + 20_300]
    _ticks(week, T0, T0 + 600, twice={T0})
    assert _train(week, "a", T0 + 600) == "submitted"
    _ticks(week, T0 + 720, T0 + 20_000, skip_reap=[(T0 + 6000, T0 + 7000)], skip_watch=[(T0 + 4000, T0 + 5000)],
           twice={T0 + 7080})
    assert _train(week, "b", T0 + 20_000) == "submitted" and week.scaled == [True, False]
    _ticks(week, T0 + 20_040, T0 + 30_000, skip_watch=[(T0 + 21_500, T0 + 21_700)], twice={T0 + 25_200})

    state, _ = week.site.pool.read()
    assert state.transitions == ((T0, "up"), (T0 + 7080, "down"), (T0 + 20_000, "up"), (T0 + 25_200, "down"))
    assert state.ready == ((T0 + 20_000, T0 + 20_300),)
    b, _ = week.site.records.get("b")
    assert [(a.started_at, a.ended_at) for a in b.attempts] == [(T0 + 20_400, T0 + 21_700), (T0 + 21_800, T0 + 23_300)]
    assert b.attempts[1].submitted_at == T0 + 21_720  # the first watcher tick after the failure

    report = environment_cost.gather(week.site, since=T0, until=T0 + 30_000)
    (pool,) = report["pools"]
    gpu_hours = lambda seconds: seconds * 8 / 3600  # noqa: E731 - one worker counted as one 8-GPU node
    # Up [0, 7080] and [20000, 25200]: 12280 s. Used: a 3600, b 1300 + 1500. Waking 300. Idle: the rest of up.
    assert pool["gpu_hours"] == pytest.approx({"used": gpu_hours(6400), "waking": gpu_hours(300),
                                               "idle": gpu_hours(5580), "reaped": gpu_hours(17_720),
                                               "billed": gpu_hours(12_280)})
    assert pool["usd"]["billed"] == pytest.approx(12_280 / 3600 * 84.806908)
    assert pool["saved_usd"] == pytest.approx(17_720 / 3600 * 84.806908)
    runs = {row["run"]: row for row in report["runs"]}
    assert runs["a"]["gpu_hours"] == pytest.approx({"used": gpu_hours(3600), "waking": 0.0, "redone": 0.0})
    assert runs["b"]["gpu_hours"] == pytest.approx({"used": gpu_hours(2800), "waking": gpu_hours(300),
                                                    "redone": gpu_hours(240)})
    assert runs["b"]["steps_redone"] == 4  # reached 20, resumed from 16, at 60 s a step
    assert [w["seconds"] for w in report["wakes"]] == [300.0] and report["reaps"] == [T0 + 7080, T0 + 25_200]

    text = environment_cost.text(report)
    assert "2 scale-downs, 1 wakes (median 300s until the GPU nodes joined)" in text
    assert next(line for line in text.splitlines() if line.startswith("b ")).split()[2:4] == ["6.22", "0.67"]
    plot = environment_cost.timeline(report, week.tmp / "cost.png")
    assert week.site.bucket and plot.read_bytes().startswith(b"\x89PNG")

    # idle.timeout auto: the wake measured (300 s) and the two idle gaps Ray's job table shows (15740 s, 20 s).
    auto = week.site.env.model_copy(update={"idle": week.site.env.idle.model_copy(update={"timeout": "auto"})})
    week.site.env = auto
    jobs = [JobView.of(job) for job in week.ray.all()]
    seconds, why = reap.timeout(week.site, state, jobs, week.clock())
    assert seconds == 25 and why == ("auto, fitted to the last 2 idle gaps: 20s would have cost least with a 300s "
                                     "wake, 25s with a margin; wake cost: median of the last 1 measured wakes")


def test_the_accounting_splits_time_between_runs_running_at_once_and_knows_nothing_before_its_history():
    transitions = [(100.0, "up"), (1000.0, "down"), (2000.0, "up")]
    attempts = [costs.Running("x", 1, 200, 600), costs.Running("y", 1, 400, 800), costs.Running("z", 1, 2100, None)]
    account = costs.account(transitions, attempts, since=0, until=3000, ready={2000.0: 2050.0})
    assert (account.pool.up, account.pool.used, account.pool.waking, account.pool.reaped) == (1900, 1500, 50, 1000)
    assert account.pool.idle == 1900 - 1500 - 50
    assert account.runs["x"].used == pytest.approx(200 + 100) and account.runs["y"].used == pytest.approx(100 + 200)
    assert account.runs["z"].used == 900 and account.runs["z"].waking == 50
    assert account.known_from == 100 and account.wakes == [(2000.0, 50.0)]
    assert costs.account([], attempts, 0, 3000).pool.up == 0  # no transitions: nothing known, nothing counted


def test_prices_come_from_the_dated_table_the_spec_overrides_them_and_a_reservation_bills_when_down():
    from rlops.spec.gcp_sections import PoolCost

    h200, b200 = load_or_raise(ENVIRONMENTS / "h200.yaml"), load_or_raise(ENVIRONMENTS / "b200-spot.yaml")
    (rate,) = costs.rates(h200)
    assert rate.billed_when_down and rate.capacity.startswith("reservation ") and rate.gpus_per_node == 8
    assert rate.usd_per_node_hour == pytest.approx(84.806908) and "as of 2026-" in rate.source
    # us-east1 has no published B200 price in the table; b200-spot states its own estimate in the spec
    listed = b200.model_copy(update={"gpu_pools": [b200.gpu_pools[0].model_copy(update={"cost": None})]})
    (spot,) = costs.rates(listed)
    assert spot.usd_per_node_hour is None and "no spot list price for a4-highgpu-8g in us-east1" in spot.source
    negotiated = b200.model_copy(update={"gpu_pools": [b200.gpu_pools[0].model_copy(
        update={"cost": PoolCost(usd_per_node_hour=31.5)})]})
    assert costs.rates(negotiated)[0].usd_per_node_hour == 31.5
    assert catalog.PRICES_AS_OF and catalog.PRICE_SOURCES


def test_auto_is_break_even_until_a_gap_is_known_then_fits_the_gaps_within_a_wake():
    assert policy.auto_timeout(600, [])[0] == 600
    assert policy.auto_timeout(600, [5000, 8000, 9000])[0] == 0  # every gap outlasts a wake: scale down at once
    chosen, why = policy.auto_timeout(600, [100, 120, 90, 7000])
    assert chosen == pytest.approx(150) and "fitted to the last 4 idle gaps" in why
    assert policy.wake_seconds([], (645.0, "parts")) == (645.0, "no wake measured yet: 645s assumed (parts)")
    assert policy.wake_seconds([100, 400, 200, 900, 300, 10_000], (645.0, "parts"))[0] == 400  # the last five's median
    assert policy.idle_gaps([(0, 100), (50, 200), (500, 600), (900, None)], now=1000) == [300, 300]


def test_the_wake_assumed_before_one_is_measured_is_the_machines_and_the_image_caches():
    """catalog.yaml's wake_assumed, summed per machine: its network stack, and whether the image streams."""
    h200, a100, local = (load_or_raise(ENVIRONMENTS / f"{name}.yaml") for name in ("h200", "a100", "local"))
    assumed = catalog.WAKE_ASSUMED
    node, join = assumed.node_seconds, assumed.start_and_join_seconds
    assert h200.ray.image_cache and h200.machine.transport.name == "rdma"
    assert policy.assumed_wake(h200) == (node + 30 + 30 + join, "a3-ultragpu-8g: node start 165s, rdma network stack "
                                         "30s, image streamed 30s, start and Ray join 30s")
    uncached = h200.model_copy(update={"ray": h200.ray.model_copy(update={"image_cache": False})})
    assert policy.assumed_wake(uncached)[0] == node + 30 + 420 + join
    assert a100.machine.transport.name == "none"  # no installer to wait for
    assert policy.assumed_wake(a100)[0] == node + assumed.image_pull_seconds[
        "streamed" if a100.ray.image_cache else "registry"] + join
    late = local.model_copy(update={"local": local.local.model_copy(update={
        "gpu_pool": local.local.gpu_pool.model_copy(update={"join_delay": "90s"})})})
    assert policy.assumed_wake(local)[0] == policy.LOCAL_WAKE_SECONDS
    assert policy.assumed_wake(late) == (policy.LOCAL_WAKE_SECONDS + 90, "20s for a local worker + its 90s join_delay")


def test_a_pool_on_a_reservation_is_not_scaled_down_unless_the_spec_asks():
    h200 = load_or_raise(ENVIRONMENTS / "h200.yaml")
    assert h200.reapable_pools == []
    asked = h200.model_copy(update={"idle": h200.idle.model_copy(update={"scale_reserved": True})})
    assert [pool.name for pool in asked.reapable_pools] == [pool.name for pool in h200.gpu_pools]
    assert reap._actions(SimpleNamespace(env=h200), down=True) == []


def test_a_run_ray_holds_behind_another_says_which_and_stops_saying_it_once_it_runs(week):
    """The GPU pool is up and busy: Ray holds the second run's job PENDING until the first one's ends. `status`
    says why (issue 39, 4), from the watcher's record; the cause clears when the job starts."""
    ray = week.ray
    ray.node_starts = [T0 - 100]
    ray.script("rlops.local.first.1", 10, [(70, 1)], 600)
    ray.script("rlops.local.second.1", 610, [(670, 1)], 900)
    _train(week, "first", T0)
    _train(week, "second", T0 + 5)
    week.clock.now = T0 + 120
    watch.tick(week.site)
    second, _ = week.site.records.get("second")
    assert second.state == "PENDING" and second.waiting.startswith("queued: ") and "now running: first" in \
        second.waiting
    assert week.site.records.get("first")[0].waiting is None  # it runs: nothing holds it
    assert any(e["type"] == "waiting" and e["run"] == "second" for e in week.events)
    week.clock.now = T0 + 700
    watch.tick(week.site)
    second, _ = week.site.records.get("second")
    assert second.state == "RUNNING" and second.waiting is None
