"""Issue 32, 5: NeMo RL sends every actor's output to the driver (`log_to_driver=True`), so the lines between a step's
banner and its results can be more than the tail a watch tick reads. The watcher keeps the last banner it saw in the
attempt's state, and a later tick's tail without one still gives its step the reward, loss and time it prints."""

import json
import uuid
from types import SimpleNamespace

import pytest

from conftest import ENVIRONMENTS
from rlops.checkpoints import gate
from rlops.endpoints import Endpoints
from rlops.runs import jobs, progress, watch
from rlops.sites import Site
from rlops.spec.load import load_or_raise
from rlops.state.bucket import client

H200 = load_or_raise(ENVIRONMENTS / "h200.yaml")
RECIPE = "gemma3-27b-gsm8k"
RULE = "=" * 25


def banner(step: int, of: int = 10) -> str:
    return f"{RULE} Step {step}/{of} {RULE}"


def results(loss: float, reward: float, seconds: float) -> list[str]:
    """NeMo RL's lines after a step (grpo.py, v0.4.0-v0.7.0, its format strings)."""
    return ["", "📊 Training Results:", f"  • Loss: {loss:.4f}", "  • Generation KL Error: 0.0010",
            f"  • Avg Reward: {reward:.4f}", "", "⏱️  Timing:", f"  • Total step time: {seconds:.2f}s"]


def actors(count: int, step: int) -> list[str]:
    return [f"(VllmGenerationWorker pid=4242) INFO step {step}: generated a batch, line {i}" for i in range(count)]


class RunningNemoJob:
    """One running NeMo RL job as Ray shows it to the watcher: its output so far, whole (the job API) or its last
    lines (the log API on the driver's node), and which of the two each read was."""

    def __init__(self, request):
        self.request, self.lines, self.reads = request, [], []

    def all(self) -> list:
        return [SimpleNamespace(submission_id=self.request.submission_id, status="RUNNING", message="",
                                metadata=self.request.metadata, error_type=None, start_time=1_790_000_000_000,
                                end_time=None, driver_node_id="head")]

    def logs(self, submission_id: str) -> str:
        self.reads.append("whole")
        return "".join(f"{line}\n" for line in self.lines)

    def tail(self, submission_id: str, node: str, lines: int) -> str:
        self.reads.append("tail")
        return "".join(f"{line}\n" for line in self.lines[-lines:])

    def nodes(self) -> list[dict]:
        return []


@pytest.fixture
def nemo(gcs):
    recipe = H200.recipes[RECIPE]
    request = jobs.request("h200", RECIPE, recipe, "long-steps", recipe.default_settings(), "tests", 1, "/lustre")
    ray = RunningNemoJob(request)
    bucket = client("rlops-h200-example", Endpoints.from_environment()).create_bucket(f"banner-{uuid.uuid4().hex[:12]}")
    site = Site("h200", H200, Endpoints.from_environment(), ray, bucket, lambda event: None, lambda down: None,
                lambda scaled_down: None, "/lustre", {}, checkpoints_here=False)
    return SimpleNamespace(site=site, ray=ray)


def test_a_step_whose_actors_print_10000_lines_gets_its_reward_from_the_banner_the_attempt_kept(nemo):
    point = {"step": None, "set_aside": [], "verified": True, "at": 1_790_000_001.0}
    nemo.ray.lines += [gate.PREFIX + json.dumps(point), f"{RULE} Epoch 1/1 {RULE}", banner(1),
                       *actors(20, 1), *results(-0.001, 0.125, 40.0), banner(2), *actors(20, 2)]
    watch.tick(nemo.site)
    record = nemo.site.records.get("long-steps")[0]
    assert nemo.ray.reads == ["whole"]  # the gate's line is near the top: read once whole
    assert (record.step, record.reward, record.current.banner) == (1, 0.125, {"step": 2, "rewarded": False})

    nemo.ray.lines += [*actors(10_000, 2), *results(-0.002, 0.25, 400.0), *actors(3, 2)]
    watch.tick(nemo.site)
    assert nemo.ray.reads[-1] == "tail"
    assert banner(2) not in "\n".join(nemo.ray.lines[-watch.TAIL_LINES:])  # what the tick read has no banner
    record = nemo.site.records.get("long-steps")[0]
    assert (record.step, record.reward) == (2, 0.25)
    assert record.current.banner == {"step": 2, "rewarded": True}
    series = nemo.site.records.metrics("long-steps", 1)["steps"]
    assert series == [[1, 0.125, -0.001, 40.0], [2, 0.25, -0.002, 400.0]]

    # Its results again in the next tail, after more lines: the step's own, read once more, change nothing.
    nemo.ray.lines += actors(5, 2)
    watch.tick(nemo.site)
    assert nemo.site.records.get("long-steps")[0].step == 2

    nemo.ray.lines += [banner(3), *actors(10_000, 3), *results(-0.003, 0.5, 380.0)]  # a whole step between two ticks
    watch.tick(nemo.site)
    record = nemo.site.records.get("long-steps")[0]
    assert (record.step, record.reward) == (2, 0.25), "a reward whose banner no tick saw is not given to step 2"
    assert nemo.site.records.metrics("long-steps", 1)["steps"][-1] == [2, 0.25, -0.002, 400.0]


def test_a_tail_that_begins_before_the_kept_banner_gives_the_reward_before_it_to_no_step():
    """A tick's tail can begin before the banner an earlier tick kept (few lines printed since): the results it
    shows before that banner are the previous step's, already counted, not the kept step's."""
    tail = "\n".join([*results(-0.001, 0.125, 40.0), banner(2), *actors(3, 2)])
    found = progress.from_logs("nemo-rl", tail, banner={"step": 2, "rewarded": False})
    assert found["step"] is None and found["banner"] == {"step": 2, "rewarded": False}
    assert progress.series("nemo-rl", tail, banner={"step": 2, "rewarded": False})["steps"] == [[2, None, None, None]]
    after = "\n".join([*actors(3, 2), *results(-0.002, 0.25, 400.0), banner(3)])
    found = progress.from_logs("nemo-rl", after, banner={"step": 2, "rewarded": False})
    assert (found["step"], found["reward"], found["banner"]) == (2, 0.25, {"step": 3, "rewarded": False})


def test_a_point_one_tick_saw_in_part_is_completed_by_the_next():
    first = progress.merged(None, {"steps": [[2, None, -0.002, None]], "saves": []})
    assert progress.merged(first, {"steps": [[2, 0.25, None, 400.0]], "saves": []})["steps"] == [
        [2, 0.25, -0.002, 400.0]]
