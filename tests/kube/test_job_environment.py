"""Issue 32, 2 and 3: NeMo RL's `init_ray` (nemo_rl/distributed/virtual_cluster.py, v0.4.0-v0.7.0) passes the
driver's whole environment as the runtime env every actor inherits. So a NeMo RL job carries the GPU workers' own
settings (gIB's LD_LIBRARY_PATH, NCCL's, one HF_HOME) whichever node its driver runs on, and no Ray node's
environment holds a token: Ray serves the actors' and tasks' runtime envs, and the runtime env agent's log, to
anyone who reaches its dashboard. The tokens are files the libraries are pointed at.

The last test runs such a driver on a real local Ray (a head and a GPU-pool worker started as `rlops up` starts
them, the worker given the spec's tokens as `rlops up` gives them) with a NeMo RL job's runtime env, and searches
everything Ray's state and log APIs serve for the planted tokens.
"""

import dataclasses
import hashlib
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import ENVIRONMENTS
from rlops import cli
from rlops.cloud.ray_jobs import RayJobs, alive_nodes, status_of
from rlops.kube import render, tokens
from rlops.runs import jobs
from rlops.spec.load import load_or_raise, load_text

H200 = load_or_raise(ENVIRONMENTS / "h200.yaml")
RECIPE = "gemma3-27b-gsm8k"
HF_TOKEN = "hf_PlantedOnlyAsAFile0123456789abcdefXYZ"
WANDB_KEY = "deadbeef" * 5  # 40 hexadecimal digits, as W&B's keys


def h200_job(run: str = "x"):
    recipe = H200.recipes[RECIPE]
    return jobs.request("h200", RECIPE, recipe, run, recipe.default_settings(), "tests", 1, "/lustre",
                        actors=jobs.actor_env(H200, recipe))


def worker_and_head_env(env) -> tuple[dict, dict]:
    cluster = render.ray_cluster(env)
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return ({e["name"]: e["value"] for e in worker["env"]}, {e["name"]: e["value"] for e in head["env"]})


def test_a_nemo_rl_job_carries_the_gpu_workers_settings_and_nothing_of_the_tokens():
    env_vars = h200_job().runtime_env["env_vars"]
    worker, head = worker_and_head_env(H200)
    # The worker's library path (gIB's plugin first) and NCCL settings, not the head's, for a driver on the head.
    assert env_vars["LD_LIBRARY_PATH"] == worker["LD_LIBRARY_PATH"] == "/usr/local/gib/lib64:/usr/local/nvidia/lib64"
    assert "LD_LIBRARY_PATH" not in head
    nccl = {k: v for k, v in worker.items() if k.startswith(("NCCL_", "GLOO_", "TP_"))}
    assert nccl["NCCL_NET"] == "gIB" and nccl["NCCL_TUNER_CONFIG_PATH"] and nccl.items() <= env_vars.items()
    # One HF_HOME: the pods', in the job too (it was /lustre/hf in the job, /lustre/huggingface_cache in the pods).
    assert env_vars["HF_HOME"] == worker["HF_HOME"] == head["HF_HOME"]
    # Nothing of the tokens, not even where their files are: each node's own.
    assert not set(env_vars) & (set(H200.secrets) | {"HF_TOKEN_PATH", "NETRC"})


def test_a_recipe_carries_the_settings_of_its_own_gpu_pool():
    """With two pools (a recipe then names its `gpu_pool`), each recipe's job carries its pool's NCCL tuner file."""
    pool = H200.gpu_pools[0]
    b200 = pool.model_copy(update={"name": "b200-pool", "machine_type": "a4-highgpu-8g", "reservation": None,
                                   "accelerator": pool.accelerator.model_copy(update={"type": "nvidia-b200"})})
    recipe = H200.recipes[RECIPE]
    two = H200.model_copy(update={"gpu_pools": [pool, b200]})
    tuners = {name: jobs.actor_env(two, recipe.model_copy(update={"gpu_pool": name}))["NCCL_TUNER_CONFIG_PATH"]
              for name in (pool.name, b200.name)}
    assert tuners == {pool.name: two.ray.nccl_tuner_config["nvidia-h200-141gb"],
                      b200.name: two.ray.nccl_tuner_config["nvidia-b200"]}
    assert len(set(tuners.values())) == 2


def test_train_dry_run_shows_the_actors_environment(capsys, monkeypatch):
    from rlops.cloud import pubsub

    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(ENVIRONMENTS))
    monkeypatch.setattr(pubsub, "publish", lambda *a: pytest.fail("a dry run published"))
    assert cli.main(["train", "h200", "--recipe", RECIPE, "--run", "x", "--dry-run"]) == 0
    out = capsys.readouterr().out
    head = out.split("\n---\n")[0]
    shown = yaml.safe_load(head)["runtime_env"]["env_vars"]
    assert jobs.actor_env(H200, H200.recipes[RECIPE]).items() <= shown.items() and shown["NCCL_NET"] == "gIB"
    assert "# runtime_env.env_vars reach every actor, whichever node the driver runs on" in head


# -- on a real Ray ----------------------------------------------------------------------------------------------------

# A NeMo RL driver as far as the environment goes: init_ray's runtime env (the driver's whole environment but
# RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES; log_to_driver), then an actor and a task that read the tokens as
# Hugging Face (huggingface_hub.get_token) and W&B (requests' netrc lookup for its server) do. Digests only leave them.
DRIVER = '''
import hashlib
import os

import ray


def tokens():
    import requests
    from huggingface_hub import get_token

    hf, wandb = get_token(), requests.utils.get_netrc_auth("https://api.wandb.ai")
    return [hashlib.sha256(value.encode()).hexdigest() if value else None for value in (hf, wandb and wandb[1])]


@ray.remote(num_cpus=0)
class Actor:
    def tokens(self):
        return tokens()


@ray.remote(num_cpus=0)
def task():
    return tokens()


copied = dict(os.environ)
copied.pop("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", None)
ray.init(address="auto", log_to_driver=True, include_dashboard=False, runtime_env={"env_vars": copied})
actor = Actor.remote()
print("[probe] driver", *tokens())
print("[probe] actor", *ray.get(actor.tokens.remote()))
print("[probe] task", *ray.get(task.remote()))
'''


@pytest.fixture(scope="module")
def ray_with_tokens(tmp_path_factory):
    """A head and a GPU-pool worker as `rlops up` starts them, for a local spec whose tokens are an HF token from
    an environment variable and a W&B key from a file. Stopped by their PIDs."""
    from rlops.local.stack import Stack

    tmp = tmp_path_factory.mktemp("tokens")
    (tmp / "wandb-key").write_text(WANDB_KEY)
    text = (ENVIRONMENTS / "local.yaml").read_text()
    source = "secrets:\n  HF_TOKEN:\n    env: RLOPS_LOCAL_HF_TOKEN"
    assert source in text
    text = text.replace(source, f"secrets:\n  WANDB_API_KEY:\n    file: {tmp / 'wandb-key'}\n"
                                f"  HF_TOKEN:\n    env: RLOPS_PLANTED_HF_TOKEN")
    env = load_text(text, "local", "local.yaml").environment
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLOPS_LOCAL_DIR", str(tmp / "state"))
        patch.setenv("RLOPS_PLANTED_HF_TOKEN", HF_TOKEN)
        stack = Stack("tokens", env, lambda line: None)
        try:
            stack._start_head("ray-head")
            stack._start_worker("ray-worker-0")
            yield stack, tmp
        finally:
            stack.down()


def get(dashboard: str, path: str) -> str:
    with urllib.request.urlopen(f"{dashboard}{path}", timeout=60) as response:
        return response.read().decode("utf-8", "replace")


def everything_ray_serves(dashboard: str, submission_id: str) -> dict[str, str]:
    """The jobs, tasks, actors, nodes, workers and placement groups as the state API lists them in detail, the job's
    logs, and every file of every node's logs as the log API serves it."""
    served = {path: get(dashboard, path) for path in (
        "/api/jobs/", f"/api/jobs/{submission_id}", f"/api/jobs/{submission_id}/logs",
        "/api/v0/tasks?detail=1&limit=10000", "/api/v0/actors?detail=1&limit=10000",
        "/api/v0/workers?detail=1&limit=10000", "/api/v0/nodes?detail=1", "/api/v0/placement_groups?detail=1")}
    for node in alive_nodes(dashboard):
        listing = json.loads(get(dashboard, "/api/v0/logs?" + urllib.parse.urlencode({"node_id": node["node_id"]})))
        for name in {name for names in listing["data"]["result"].values() for name in names}:
            if name.endswith("/"):  # a directory (nsight/, events/): the log API serves files
                continue
            query = urllib.parse.urlencode({"node_id": node["node_id"], "filename": name, "lines": -1})
            served[f"{node['node_id'][:8]}:{name}"] = get(dashboard, f"/api/v0/logs/file?{query}")
    return served


@pytest.mark.servers
def test_a_driver_that_copies_its_environment_into_its_actors_leaves_no_token_in_rays_state_api(ray_with_tokens):
    stack, tmp = ray_with_tokens
    dashboard = stack.dashboard_url()
    kept = stack._secrets_directory()
    assert kept.stat().st_mode & 0o777 == 0o700
    assert {p.name: p.stat().st_mode & 0o777 for p in kept.iterdir()} == {"HF_TOKEN": 0o600, "WANDB_API_KEY": 0o600,
                                                                         "netrc": 0o600}
    (tmp / "driver.py").write_text(DRIVER)
    job = dataclasses.replace(h200_job("planted"), submission_id=f"tokens-{time.time_ns()}",
                              entrypoint=f"python {tmp / 'driver.py'}",
                              entrypoint_resources={stack.env.local.gpu_pool.resource: 1})  # on the GPU-pool node
    ray = RayJobs(dashboard)
    assert ray.submit_once(job)
    deadline = time.monotonic() + 180
    while status_of(ray.find(job.submission_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, ray.logs(job.submission_id)
        time.sleep(0.5)
    output = ray.logs(job.submission_id)
    assert status_of(ray.find(job.submission_id)) == "SUCCEEDED", output
    # The tokens reached the driver, its actor and its task, as files.
    digests = " ".join(hashlib.sha256(token.encode()).hexdigest() for token in (HF_TOKEN, WANDB_KEY))
    for who in ("driver", "actor", "task"):
        assert f"[probe] {who} {digests}" in output, output

    served = everything_ray_serves(dashboard, job.submission_id)
    assert "runtime_env_agent.log" in " ".join(served) and len(served) > 20
    # What the driver copied is there to be read: the job's W&B run id, the worker's pointer to the token file.
    actors = served["/api/v0/actors?detail=1&limit=10000"]
    assert job.runtime_env["env_vars"]["WANDB_RUN_ID"] in actors
    assert tokens.pointers(str(kept), ["HF_TOKEN"])["HF_TOKEN_PATH"] in actors
    hits = {(where, name) for where, text in served.items() for name, token in
            (("HF_TOKEN", HF_TOKEN), ("WANDB_API_KEY", WANDB_KEY)) if token in text}
    assert hits == set()
    on_disk = {path for path in _files(stack._ray_temp())
               if any(token.encode() in path.read_bytes() for token in (HF_TOKEN, WANDB_KEY))}
    assert on_disk == set()


def _files(root: str):
    return (path for path in Path(root).rglob("*") if path.is_file() and not path.is_symlink())
