"""Every wake measured phase by phase (issue 37, points 2 and 3): a reaped GPU pool woken on the fake GCP and the
fake cluster, whose resize operation, nodes, pods and kubelet events come up on the fakes' timings under one
simulated clock; each phase's duration checked in pool.json, `rlops status`, the run report and `rlops cost`,
and `idle.timeout: auto` moving from the machine-type default to the measured median."""

import datetime
import json
from types import SimpleNamespace

import pytest

from fakes.kube_scheduling import Timings
from fakes.ray import Clock, SimulatedRay
from rlops import cli, waiting
from rlops.cloud import base
from rlops.endpoints import Endpoints
from rlops.reaper import reap
from rlops.runs import environment_cost, message, report_page, train, watch
from rlops.sites import Site
from rlops.state import run_records
from rlops.state.pool import PoolStatus

T0 = 1_790_000_000.0
RESIZE = 90.0


@pytest.fixture
def woken(cloud_fakes, specs, monkeypatch):
    """The h200 seed applied with `idle.timeout: auto` and its reserved pool reapable, then everything on one
    simulated clock: the fake GKE's operations, the fake API server's, Ray's, and rlops's own sleeps and reads."""
    from rlops import sites
    from rlops.kube.gke_cluster import GkeCluster
    from rlops.provision.service import target_of

    gcp, kube = cloud_fakes
    text = (specs / "h200.yaml").read_text().replace("  timeout: 30m\n", "  timeout: auto\n  scale_reserved: true\n")
    (specs / "h200.yaml").write_text(text)
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=10, base_seconds=0.02, cap_seconds=0.2))
    assert cli.main(["apply", "--yes", "h200", "--skip-doctor"]) == 0
    env = sites.load_environment("h200")
    endpoints = Endpoints.from_environment()
    cluster = GkeCluster(target_of("h200", env), env, endpoints)

    clock = Clock(T0)
    gcp.clock, gcp.operation_kind_seconds = clock, {"SET_NODE_POOL_SIZE": RESIZE}
    kube.clock = lambda: datetime.datetime.fromtimestamp(clock(), datetime.UTC).replace(tzinfo=None)
    kube.scheduling.timings = Timings(streaming=lambda name: any(
        pool.get("config", {}).get("gcfsConfig", {}).get("enabled")
        for pool in gcp.resources("node_pool").values() if pool["name"] == name))
    monkeypatch.setattr(base, "time", clock)  # the cloud adapters' polls and retries, which take no clock
    ray, events = SimulatedRay(clock), []
    site = Site("h200", env, endpoints, ray, sites.state_bucket("h200", env, endpoints), events.append,
                cluster.scale, cluster.waiting, "/lustre", {}, checkpoints_here=False, wake_phases=cluster.wake_phases,
                clock=clock)
    monkeypatch.setattr(sites, "run_records", lambda name, env, endpoints: site.records)  # `rlops status`'s
    return SimpleNamespace(site=site, clock=clock, ray=ray, gcp=gcp, kube=kube)


def _reaped(w, at: float) -> None:
    """The reaper's first look at `at`, and its scale-down once the pool has been idle past the timeout."""
    w.clock.now = at
    reap.reap(w.site)
    w.clock.now = at + 700
    decision, _ = reap.reap(w.site)
    assert decision.scale_down, decision.reason


def _streaming(w, on: bool) -> None:
    """The GPU pool's image streaming (its node config's gcfsConfig), as the fake GKE stores it."""
    name, pool = next((name, pool) for name, pool in w.gcp.resources("node_pool").items() if pool["name"] == "gpu-pool")
    pool.setdefault("config", {})["gcfsConfig"] = {"enabled": on}
    w.gcp.put("node_pool", name, pool)


def _train(w, run: str) -> None:
    request = message.parse(json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": run,
                                        "overrides": {}, "requested_by": "tests"}).encode())
    assert train.accept(w.site, request, message.settings(request, message.recipe_of(request, w.site.env))) == \
        "submitted"


def _first_step(w, run: str, after_submission: float) -> float:
    """The watcher's tick `after_submission` seconds after the run's job was submitted, when its script prints the
    first step: the tick records when it first saw one (`first_step_at`). Returns that time."""
    record, _ = w.site.records.get(run)
    w.clock.now = record.attempts[0].submitted_at + after_submission
    watch.tick(w.site)
    record, _ = w.site.records.get(run)
    assert record.attempts[0].first_step_at == w.clock.now
    return w.clock.now


def _durations(state: PoolStatus, at: float) -> dict[str, float]:
    return {phase: end - start for phase, start, end in state.wake_of(at).phases}


# The fakes' timings from the pods' creation at the wake: a node's boot 120 s (the second of the pool's two 40 s
# later), Ready 45 s later, the pod scheduled 1 s after that, a 420 s pull (30 s streamed), the container 20 s after
# the pull, Ray's node 9 s after that. Each phase ends when the slower node is through it.
SPREAD = 40.0
UNCACHED = {"resize": RESIZE, "boot": 120 + SPREAD - RESIZE, "node-ready": 45, "scheduling": 1, "image-pull": 420,
            "container-start": 20, "ray-join": 9, "first-step": 85}


def test_a_wake_on_the_fake_gke_is_measured_phase_by_phase_in_the_record_status_report_and_cost(woken, capsys,
                                                                                               tmp_path):
    w = woken
    _streaming(w, False)  # today's wake: the image pulled whole from its registry
    w.kube.scheduling.timings.node_spread = SPREAD
    _reaped(w, T0)
    state, _ = w.site.pool.read()
    assert "no wake measured yet: 255s assumed (a3-ultragpu-8g: " in reap.timeout(w.site, state, [], w.clock())[1]

    wake = T0 + 2000
    w.clock.now = wake
    w.ray.script("rlops.h200.a.1", 600, [(650, 1)], 5000, runner="nemo-rl")  # from its submission
    # The Ray containers started at +606 and +646; their raylets joined at +615 and +655.
    w.ray.node_starts = [wake + 615, wake + 655]
    _train(w, "a")
    assert w.clock() >= wake + RESIZE  # the wake waited for the resize, on the simulated clock

    w.clock.now = wake + 300  # mid-pull: a reap tick records the phases so far; status says where the wake is
    reap.reap(w.site)
    state, _ = w.site.pool.read()
    assert list(_durations(state, wake)) == ["resize", "boot", "node-ready", "scheduling"]
    assert cli.main(["status", "h200"]) == 0
    assert "GPU pool waking for 5 min 00 s: image-pull for 1 min 34 s so far (resize 1 min 30 s, boot 1 min 10 s, " \
           "node-ready 45 s, scheduling 1 s)" in capsys.readouterr().out

    stepped = _first_step(w, "a", 650)  # submitted once the resize was done, its first step printed 650 s later
    expected = {**UNCACHED, "first-step": stepped - (wake + 655)}
    w.clock.now = stepped + 20
    reap.reap(w.site)
    state, _ = w.site.pool.read()
    assert _durations(state, wake) == pytest.approx(expected) and state.wake_of(wake).done
    assert state.ready == ((wake, wake + 655),)  # the last of the two nodes
    pulled = [e for e in w.kube.objects.values() if e.get("kind") == "Event" and e["reason"] == "Pulled"]
    assert pulled[0]["message"].startswith('Successfully pulled image "') and \
        pulled[0]["message"].endswith(" in 7m0s (7m0s including waiting). Image size: 21000000000 bytes.")

    record, _ = w.site.records.get("a")
    page = report_page.write(tmp_path / "report", record.to_json(), {}, [], state.to_json()).markdown.read_text()
    took = lambda seconds: f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"  # noqa: E731
    assert f"- the GPU pool woke for attempt 1 in {took(stepped - wake)}: resize 1m30s, boot 1m10s, node-ready 45s, " \
           f"scheduling 1s, image-pull 7m00s, container-start 20s, ray-join 9s, first-step " \
           f"{took(expected['first-step'])}" in page

    cost = environment_cost.gather(w.site, since=T0, until=stepped + 20)
    (pool,) = cost["pools"]
    gpu_hours = lambda seconds: seconds * 2 * 8 / 3600  # noqa: E731 - two 8-GPU nodes
    # Waking ends when the last GPU node joined Ray (+655): every phase before it, first-step not.
    assert pool["waking_gpu_hours_by_phase"] == pytest.approx(
        {phase: gpu_hours(seconds) for phase, seconds in expected.items() if phase != "first-step"})
    assert pool["gpu_hours"]["waking"] == pytest.approx(gpu_hours(655))
    assert "gpu-pool waking GPU-h by phase: resize 0.40, boot 0.31, node-ready 0.20, scheduling 0.00, " \
           "image-pull 1.87, container-start 0.09, ray-join 0.04" in environment_cost.text(cost)
    assert cost["wakes"][0]["phases"][0] == ["resize", wake, wake + RESIZE]


def test_auto_moves_from_the_machine_type_default_to_the_measured_median_and_streaming_shortens_the_pull(woken):
    w = woken
    _reaped(w, T0)
    state, _ = w.site.pool.read()
    # The machine-type default: h200's A3 Ultra node, its RDMA stack and the image streamed (ray.image_cache).
    assert reap.timeout(w.site, state, [], w.clock()) == (255.0, "auto, break-even: 255s, what a wake costs (no idle "
                                                                 "gap seen yet); wake cost: no wake measured yet: "
                                                                 "255s assumed (a3-ultragpu-8g: node start 165s, "
                                                                 "rdma network stack 30s, image streamed 30s, start "
                                                                 "and Ray join 30s)")
    _streaming(w, True)  # what apply sets with ray.image_cache
    wake = T0 + 2000
    w.clock.now = wake
    w.ray.script("rlops.h200.b.1", 300, [(310, 1)], 5000, runner="nemo-rl")
    w.ray.node_starts = [wake + 225] * 2  # streamed: the containers started at +216
    _train(w, "b")
    w.clock.now = _first_step(w, "b", 310) + 20
    reap.reap(w.site)
    state, _ = w.site.pool.read()
    assert _durations(state, wake)["image-pull"] == 30
    assert reap.timeout(w.site, state, [], w.clock()) == (225.0, "auto, break-even: 225s, what a wake costs (no idle "
                                                                 "gap seen yet); wake cost: median of the last 1 "
                                                                 "measured wakes")


def test_the_phases_are_read_from_what_kubernetes_and_gke_report():
    at = 1_000_000.0
    stamp = lambda seconds: datetime.datetime.fromtimestamp(at + seconds, datetime.UTC).strftime(  # noqa: E731
        "%Y-%m-%dT%H:%M:%SZ")
    pod = {"metadata": {"name": "w", "creationTimestamp": stamp(0)},
           "status": {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(50)}],
                      "containerStatuses": [{"name": "ray-worker", "state": {"running": {"startedAt": stamp(120)}}}]}}
    old = {"metadata": {"name": "before", "creationTimestamp": stamp(-500)}, "status": {}}
    node = {"metadata": {"creationTimestamp": stamp(30)},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp(45)}]}}
    pulled = {"reason": "Pulled", "involvedObject": {"name": "w"}, "firstTimestamp": stamp(110),
              "message": 'Successfully pulled image "x" in 58.5s (1m0.1s including waiting). Image size: 9 bytes.'}
    phases = waiting.gke_phases(at, 1, [(at + 1, at + 20), (at - 900, at - 800)], [node], [pod, old], [pulled])
    assert [(p, a - at, b - at) for p, a, b in phases] == [
        ("resize", 1, 20), ("boot", 20, 30), ("node-ready", 30, 45), ("scheduling", 45, 50),
        ("image-pull", 51.5, 110), ("container-start", 110, 120)]
    # A pod not scheduled yet: the chain stops at the node; an image already present: no pull phase.
    assert [p for p, _, _ in waiting.gke_phases(at, 1, [], [node], [old], [])] == ["boot", "node-ready"]
    # Two workers: a phase ends when the slower is through it, and is not over while one has not got there.
    later = json.loads(json.dumps(pod).replace(stamp(50), stamp(70)).replace(stamp(120), stamp(200)))
    later["metadata"]["name"] = "w2"
    slower_pull = {**pulled, "involvedObject": {"name": "w2"}, "firstTimestamp": stamp(190)}
    second = {"metadata": {"creationTimestamp": stamp(60)}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": stamp(66)}]}}
    both = waiting.gke_phases(at, 2, [(at + 1, at + 20)], [node, second], [pod, later], [pulled, slower_pull])
    assert [(p, a - at, b - at) for p, a, b in both] == [
        ("resize", 1, 20), ("boot", 20, 60), ("node-ready", 60, 66), ("scheduling", 66, 70),
        ("image-pull", 131.5, 190), ("container-start", 190, 200)]
    assert [p for p, _, _ in waiting.gke_phases(at, 2, [(at + 1, at + 20)], [node], [pod], [pulled])] == ["resize"]
    assert waiting.go_duration("1h0m2.5s") == 3602.5 and waiting.go_duration("350ms") == pytest.approx(0.35)
    with pytest.raises(ValueError):
        waiting.go_duration("5 minutes")
    assert waiting.local_phases(at, 1, [at - 50, at + 3]) == [("worker-start", at, at + 3)]
    assert waiting.local_phases(at, 2, [at + 3, at - 50, at + 8]) == [("worker-start", at, at + 8)]
    assert waiting.local_phases(at, 2, [at - 50, at + 3]) == []


def test_a_version_1_pool_record_reads_with_no_wakes_and_a_newer_one_is_refused():
    old = {"version": 1, "scaled_down": False, "transitions": [[1.0, "up"]], "ready": []}
    assert PoolStatus.from_json(old).wakes == ()
    state = PoolStatus.from_json({**old, "version": 2, "wakes": [{"at": 5.0, "phases": [["resize", 5, 9]],
                                                                   "done": False}]})
    assert state.wake_of(5.0).phases == (("resize", 5.0, 9.0),)
    assert PoolStatus.from_json(state.to_json()) == state
    with pytest.raises(run_records.UnknownVersion):
        PoolStatus.from_json({**old, "version": 3})


def test_a_local_wake_is_measured_from_its_worker_process_ray_and_the_watchers_first_step(gcs, tmp_path, monkeypatch):
    """The local loop's GPU-pool node reports its own phases: the worker process's start (the stack's process
    registry), its Ray node's start, and the first step the watcher saw (its tick writes `first_step_at`)."""
    import uuid

    from conftest import ENVIRONMENTS
    from rlops.spec.load import load_text
    from rlops.state.bucket import client

    env = load_text((ENVIRONMENTS / "local.yaml").read_text(), "local", "local.yaml").environment
    clock, starts = Clock(T0), []
    ray, endpoints = SimulatedRay(clock), Endpoints.from_environment()
    bucket = client("rlops-local", endpoints).create_bucket(f"wakes-{uuid.uuid4().hex[:12]}")
    scale = lambda down: None if down else starts.append(clock() + 4)  # noqa: E731 - the process starts 4 s later
    site = Site("local", env, endpoints, ray, bucket, lambda event: None, scale,
                lambda scaled_down: waiting.on_local(ray.nodes(), scaled_down), str(tmp_path), {"gpu_pool": 1},
                checkpoints_here=True,
                wake_phases=lambda wakes: {at: waiting.local_phases(at, 1, starts) for at in wakes},
                clock=SimpleNamespace(time=clock, monotonic=clock, sleep=lambda seconds: None))  # set, never slept on
    reap.reap(site)
    clock.now = T0 + 100
    assert reap.reap(site)[0].scale_down  # local.yaml's 30 s timeout
    wake = T0 + 1000
    clock.now = wake
    ray.script("rlops.local.c.1", 15, [(30, 1), (40, 2)], 100)
    ray.node_starts = [wake + 12]
    request = message.parse(json.dumps({"environment": "local", "recipe": "tiny-arith", "run": "c", "overrides": {},
                                        "requested_by": "tests"}).encode())
    assert train.accept(site, request, message.settings(request, message.recipe_of(request, env))) == "submitted"
    clock.now = wake + 35
    watch.tick(site)
    assert site.records.get("c")[0].attempts[0].first_step_at == wake + 35  # the tick that first saw step 1
    reap.reap(site)
    state, _ = site.pool.read()
    assert _durations(state, wake) == {"worker-start": 4, "ray-join": 8, "first-step": 23}
    assert state.wake_of(wake).done
