"""The paths a GKE environment takes, on the local loop's real Ray: the h200 environment applied to the fake GCP and
cluster, whose API server proxies the Ray head's dashboard to this module's Ray head (tests/local_stack.py
`h200_on_local_ray`): train and watch, GPUs that join late, waiting causes, the reaper, snapshots and Lustre
exports as Ray jobs, a pod template change under a live job.
"""

import base64
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import until, workload_words
from local_stack import (
    H200_EVENTS,
    forget_jobs,
    gpu_node,
)
from rlops.cloud.base import Connection
from rlops.endpoints import Endpoints
from rlops.provision.plan import Plan
from rlops.provision.session import Session

# One of the two groups of local-stack modules (tests/local_stack.py says why two).
pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("local-stack-b")]


def test_a_gke_environment_reaches_its_ray_head_through_the_api_servers_service_proxy(local, h200_on_local_ray):
    """The train and watch paths a GKE environment takes."""
    from google.cloud import pubsub_v1

    from conftest import PLANTED_TOKENS
    from rlops import sites
    from rlops.runs import jobs, train, watch

    gcp, kube = h200_on_local_ray
    events = "projects/rlops-h200-example/subscriptions/rlops-events-log"
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.create_subscription(request={"name": events, "topic": H200_EVENTS})

    data = json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-1", "overrides": {},
                       "requested_by": "tests"}).encode()
    with gpu_node(local):  # the recipe's 2 x 8 GPUs, until the watcher has recorded how the job ended
        assert train.handle(data, Endpoints.from_environment()) == "submitted"
        assert train.handle(data, Endpoints.from_environment()) == "duplicate"
        proxied = [r for r in kube.requests if "/services/ray-cluster-head-svc:dashboard/proxy/api/jobs/" in r.path]
        assert {r.method for r in proxied} >= {"GET", "POST"}
        job = next(j for j in local.ray_jobs() if j.submission_id == "rlops.h200.gke-1.1")
        assert " ".join(workload_words(job.entrypoint, "/lustre/checkpoints/gemma3-27b-gsm8k/gke-1")).startswith(
            "cd /opt/nemo-rl && uv run python examples/run_grpo_math.py --config examples/")
        assert "'checkpointing.checkpoint_dir=\"/lustre/" in job.entrypoint
        h200 = sites.load_environment("h200")  # its GPU workers' settings (issue 32, 2)
        actors = jobs.actor_env(h200, h200.recipes["gemma3-27b-gsm8k"])
        assert actors["LD_LIBRARY_PATH"].startswith("/usr/local/gib/lib64:") and actors["NCCL_NET"] == "gIB"
        assert job.runtime_env["env_vars"] == {**actors, "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
                                               "WANDB_RUN_ID": jobs.wandb_run_id("h200", "gke-1"),
                                               "WANDB_RESUME": "allow", "NRL_VIRTUAL_CLUSTER_MAX_RETRIES": "10"}

        # Neither uv nor NeMo RL is here: the job fails in its own code, which the watcher records and does not retry.
        env = sites.load_environment("h200")
        deadline = time.monotonic() + 120
        while True:
            watch.tick(sites.open_site("h200", env, Endpoints.from_environment()))
            record, _ = sites.open_site("h200", env, Endpoints.from_environment()).records.get("gke-1")
            if record.state == "FAILED" or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert record.state == "FAILED" and record.attempts[0].failure.kind == "code"
    assert len(record.attempts) == 1
    # The gate ran first, with rlops shipped as a py_module (the image need not have it): nothing to resume from.
    assert record.attempts[0].resume_point == {"step": None, "set_aside": [], "verified": True}
    # A running job's progress comes from the end of its output, read on the driver's node through the proxy.
    ray = sites.open_site("h200", env, Endpoints.from_environment()).ray
    whole = ray.logs(job.submission_id)
    # The gate's three lines (the data check; it had the GPUs; where it resumes), the shell's three.
    assert whole.count("\n") == 6 and '"earnable": true' in whole
    assert ray.tail(job.submission_id, job.driver_node_id, 2) == "".join(whole.splitlines(keepends=True)[-2:])
    assert any(r.path.endswith("/proxy/api/v0/logs/file") for r in kube.requests)
    received = subscriber.pull(request={"subscription": events, "max_messages": 20}, timeout=10).received_messages
    published = [json.loads(m.message.data) for m in received]
    assert {(e["type"], e.get("state")) for e in published} >= {("submitted", None), ("state-changed", "FAILED")}
    for token in PLANTED_TOKENS.values():
        assert token not in json.dumps(job.model_dump(), default=str)
        assert token not in json.dumps(record.to_json()) and token not in json.dumps(published)
    forget_jobs(local, "gke-1")  # its GPU node is gone: a later watcher would take the job for a preempted one


def test_a_gke_attempt_waits_in_its_gate_for_gpus_that_join_late_and_one_that_never_gets_them_is_retried(
        local, h200_on_local_ray, specs):
    """Issue 32, 1: NeMo RL's driver, on the CPU-only head, gives up after about a minute without its GPUs; nodes
    woken after a reap or a preemption take minutes. The attempt's gate waits for the GPUs first (the recipe's
    gpu_wait; 3 s in this module, 60 s here): a node that joins while it waits lets the workload start. An
    attempt that never gets them ends before its workload and is resubmitted (failure kind capacity, its gate backing
    off first), never final."""
    from rlops import sites
    from rlops.runs import jobs, policy, train, watch

    env = sites.load_environment("h200")
    site = sites.open_site("h200", env, Endpoints.from_environment())
    recipe = env.recipes["gemma3-27b-gsm8k"]
    site.env = env.model_copy(update={"recipes": {"gemma3-27b-gsm8k": recipe.model_copy(update={"gpu_wait": "60s"})}})
    request = jobs.for_site(site, "gemma3-27b-gsm8k", "late-gpus", dict(recipe.default_settings()), "tests", 1)
    assert "--wait-for GPU=16 --wait-seconds 60" in request.entrypoint
    assert site.ray.submit_once(request)
    logs = lambda: site.ray.logs(request.submission_id)  # noqa: E731
    until(lambda: '"have": 0.0' in logs(), "the gate to say it waits for the GPUs")
    assert "[rlops-resume]" not in logs(), "the workload must not start without its GPUs"
    with gpu_node(local):
        until(lambda: str(site.ray.client.get_job_status(request.submission_id).value) in ("SUCCEEDED", "FAILED"),
               "the job to end", timeout=120)
    said = logs()
    assert '"got": true' in said and "[rlops-resume]" in said  # the gate had them, then chose where to resume
    assert "can't cd to /opt/nemo-rl" in said  # the workload's command started (no NeMo RL image here)

    # No GPU ever comes (gpu_wait 3 s): the attempt fails in its gate and is resubmitted as a capacity failure.
    data = json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "no-gpus", "overrides": {},
                       "requested_by": "tests"}).encode()
    assert train.handle(data, Endpoints.from_environment()) == "submitted"
    deadline = time.monotonic() + 120
    while True:
        watch.tick(sites.open_site("h200", env, Endpoints.from_environment()))
        record, _ = sites.open_site("h200", env, Endpoints.from_environment()).records.get("no-gpus")
        if (record and len(record.attempts) >= 2) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert record.attempts[0].failure.kind == "capacity" and record.attempts[0].resume_point is None
    assert len(record.attempts) >= 2, "a capacity failure is resubmitted within the resume budget"
    second = next(j for j in local.ray_jobs() if j.submission_id == record.attempts[1].submission_id)
    assert f"--hold {policy.BACKOFF_SECONDS} " in second.entrypoint  # its gate backs off before it looks again
    site.ray.stop(second.submission_id)  # its backoff is not this test's to wait out
    forget_jobs(local, "late-gpus", "no-gpus")


def test_a_gke_run_waiting_for_its_gpu_workers_says_the_planted_cause_until_they_are_up(local, h200_on_local_ray,
                                                                                        tmp_path, capsys):
    """A NeMo RL driver runs on the head and waits for its GPU actors: Ray says RUNNING, no step comes. The
    watcher reads why from the fake cluster and GKE (here: the reservation is used up by other VMs), keeps it
    in the record, publishes a `waiting` event and `rlops status` shows it; once the workers are up it clears."""
    import dataclasses

    from google.cloud import pubsub_v1

    from rlops import cli, sites
    from rlops.runs import jobs, watch

    gcp, kube = h200_on_local_ray
    events = "projects/rlops-h200-example/subscriptions/rlops-events-waiting"
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.create_subscription(request={"name": events, "topic": H200_EVENTS})
    env = sites.load_environment("h200")
    site = sites.open_site("h200", env, Endpoints.from_environment())
    hold = tmp_path / "hold"
    hold.touch()
    request = jobs.for_site(site, "gemma3-27b-gsm8k", "gke-wait", {}, "tests", 1)
    waits = f"python -c 'import os, time\nwhile os.path.exists(\"{hold}\"): time.sleep(0.1)'"
    assert site.ray.submit_once(dataclasses.replace(request, entrypoint=waits))
    kube.grant_gpu_nodes(0)
    gcp.put_reservation("rlops-h200-example", "us-central1-b", "h200-reservation", "a3-ultragpu-8g",
                        "nvidia-h200-141gb", 8, count=4, in_use=4)

    def ticked() -> "RunRecord":  # noqa: F821 - rlops.state.run_records.RunRecord
        watch.tick(sites.open_site("h200", env, Endpoints.from_environment()))
        return sites.open_site("h200", env, Endpoints.from_environment()).records.get("gke-wait")[0]

    cause = "2 of 2 GPU nodes not up: reservation h200-reservation has 0 unused of 4"
    deadline = time.monotonic() + 60
    while (record := ticked()).state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert record.state == "RUNNING" and record.waiting == cause
    assert cli.main(["status", "h200"]) == 0
    assert f"gke-wait: waiting: {cause}" in capsys.readouterr().out
    kube.grant_gpu_nodes(None)
    assert ticked().waiting is None
    assert cli.main(["status", "h200", "--run", "gke-wait"]) == 0
    assert "waiting:" not in capsys.readouterr().out
    hold.unlink()
    deadline = time.monotonic() + 60
    while (record := ticked()).state != "SUCCEEDED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert record.state == "SUCCEEDED"
    received = subscriber.pull(request={"subscription": events, "max_messages": 20}, timeout=10).received_messages
    said = [json.loads(m.message.data) for m in received]
    assert [e["cause"] for e in said if e["type"] == "waiting"] == [cause]


def test_rlops_train_publishes_a_gke_environments_message_to_its_train_topic(local, specs, state_buckets, monkeypatch,
                                                                           capsys):
    from google.cloud import pubsub_v1

    from rlops import cli

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{local.port('pubsub', 'grpc')}")
    topic = "projects/rlops-h200-example/topics/rlops-train"
    subscription = "projects/rlops-h200-example/subscriptions/train-test"
    pubsub_v1.PublisherClient().create_topic(name=topic)
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    assert cli.main(["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "gke-2",
                     "--requested-by", "ana@example.com"]) == 0
    assert "published to rlops-train" in capsys.readouterr().out
    received = subscriber.pull(request={"subscription": subscription, "max_messages": 5}, timeout=10)
    assert [json.loads(m.message.data) for m in received.received_messages] == [
        {"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-2", "overrides": {},
         "requested_by": "ana@example.com"}]
    assert cli.main(["train", "h200", "--recipe", "gemma3-27b-gsm8k", "--run", "Bad_Name"]) == 1
    assert "not sent: run:" in capsys.readouterr().err


def test_a_tick_for_every_environment_covers_the_applied_gcp_ones_only(h200_on_local_ray, specs, capsys, monkeypatch):
    """Cloud Scheduler's tick names no environment: the example specs never applied and the local one are skipped,
    not reported as errors every minute."""

    from cloudevents.http import CloudEvent

    import main
    from rlops import logs

    monkeypatch.setattr(logs, "_to_stderr", False)  # the functions log to stdout, as on Cloud Run
    capsys.readouterr()
    main.watch(CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "source": "//tests"},
                          {"message": {"data": base64.b64encode(b"{}").decode(), "messageId": "1"}}))
    captured = capsys.readouterr()
    logged = [json.loads(line) for line in (captured.out + captured.err).splitlines() if line.startswith("{")]
    never_applied = sorted(path.stem for path in specs.glob("*.yaml") if path.stem not in ("h200", "local"))
    assert "b200-spot" in never_applied
    assert [e["environment"] for e in logged if e["message"] == "watch tick"] == ["h200"]
    assert sorted(e["environment"] for e in logged if e["message"].startswith("tick skips")) == never_applied
    assert not [e for e in logged if e["severity"] == "ERROR"], logged
    # Deployed in the B200 environment's project, the same tick leaves the H200 one to its own project's deployment.
    monkeypatch.setenv("RLOPS_PROJECT", "rlops-b200-example")
    main.reap(CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "source": "//tests"},
                         {"message": {"data": base64.b64encode(b"{}").decode(), "messageId": "2"}}))
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sorted((e["environment"], e["message"]) for e in logged) == sorted(
        [("b200-spot", "tick skips an environment with no cloud resources (never applied, or destroyed)")]
        + [(name, "tick skips an environment of another project") for name in never_applied + ["h200"]
           if name != "b200-spot"])


def test_a_gke_environments_idle_pool_is_reaped_at_once_and_woken_by_a_train_message(local, h200_on_local_ray, specs,
                                                                                     capsys):
    from rlops import cli, sites
    from rlops.kube.gke_cluster import ScaleFailed
    from rlops.reaper.reap import reap
    from rlops.runs import train

    gcp, kube = h200_on_local_ray
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("timeout: 30m", "timeout: 1s\n  scale_reserved: true"))
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    assert not reap(site)[0].scale_down  # the first look starts the clock
    time.sleep(1.5)
    assert cli.main(["reap", "h200", "--dry-run"]) == 0
    assert "node pool gpu-pool: resize to 0 nodes" in capsys.readouterr().out
    assert not [r for r in gcp.requests if r.path.endswith(":setSize")]

    gcp.fail_next(1, status=403, match=":setSize")  # the scale-down stops after the RayCluster, before the pool
    with pytest.raises(Exception, match="setSize|permission"):
        reap(site)
    decision, actions = reap(site)  # the next tick finishes it
    assert decision.reason == "finishing a scale-down that stopped part way"
    assert "node pool gpu-pool: resize to 0 nodes" in actions
    cluster = kube.get("rayclusters", "ray-cluster", "default")
    assert [g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]] == [0]
    resizes = [r for r in gcp.requests if r.path.endswith(":setSize") and 200 <= r.status < 300]
    assert len(resizes) == 1 and not (resizes[0].body or {}).get("nodeCount")
    assert reap(site)[0].reason == "already scaled down"
    captured = capsys.readouterr()  # the CLI above sent log lines to stderr from then on
    logged = [json.loads(line) for line in (captured.out + captured.err).splitlines() if line.startswith("{")]
    (savings,) = [e["savings"] for e in logged if e["message"] == "GPU pool scaled down"]  # once it finished
    assert "reservation h200-reservation is billed whether" in savings[0]
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, "a reaped pool must not be drift"

    data = json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "after-reap", "overrides": {},
                       "requested_by": "tests"}).encode()
    # The wake's resize is accepted, then its operation ends in a stockout: the message is delivered again.
    gcp.fail_operations(1, "SET_NODE_POOL_SIZE", 8, "GCE_STOCKOUT: The zone 'projects/rlops-h200-example/zones/"
                        "us-central1-b' does not have enough resources available to fulfill the request.")
    with pytest.raises(ScaleFailed, match="node pool gpu-pool: resize to 2 nodes failed: GCE_STOCKOUT"):
        train.handle(data, Endpoints.from_environment())
    state, _ = site.pool.read()
    assert state.scaled is False and "GCE_STOCKOUT" in state.error
    assert train.handle(data, Endpoints.from_environment()) == "submitted"
    state, _ = site.pool.read()
    assert state.scaled is True and state.error is None
    cluster = kube.get("rayclusters", "ray-cluster", "default")
    assert [g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]] == [2]
    assert [(r.body or {}).get("nodeCount") for r in gcp.requests
            if r.path.endswith(":setSize") and 200 <= r.status < 300] == [None, 2, 2]
    forget_jobs(local, "after-reap")


def applied_without_asking(session: Session) -> Plan:
    with session.planned_apply() as pending:
        return pending.carry_out()


def test_the_reaper_and_apply_take_turns_on_the_environments_lock(h200_on_local_ray, specs):
    """workerGroupSpecs is an atomic list: an apply that read replicas before a scale-down and applied after it
    would undo it. Both ways of the race: apply holds the lock and the tick waits its turn; the reaper holds it and
    apply waits, then plans again and keeps what the reaper did."""
    from concurrent.futures import ThreadPoolExecutor

    from rlops import sites
    from rlops.provision.service import CloudEnvironment
    from rlops.reaper.reap import reap
    from rlops.state.lock import Lock

    gcp, kube = h200_on_local_ray
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("timeout: 30m", "timeout: 1s\n  scale_reserved: true"))
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    assert not reap(site)[0].scale_down  # the first look starts the clock
    time.sleep(1.5)  # the idle timeout itself
    replicas = lambda: [g["replicas"] for g in kube.get("rayclusters", "ray-cluster", "default")["spec"]  # noqa: E731
                        ["workerGroupSpecs"]]
    resizes = lambda: [r for r in gcp.requests if r.path.endswith(":setSize") and 200 <= r.status < 300]  # noqa: E731

    applying_elsewhere = Lock(site.bucket, site.env.state.prefix, "h200", operation="apply")
    applying_elsewhere.acquire(0)  # what `rlops apply h200` takes first
    with applying_elsewhere:
        decision, actions = reap(site)
        assert not decision.scale_down and decision.reason.startswith("not this tick: environment h200 is locked")
        assert "(apply since" in decision.reason and actions == []
        assert replicas() == [2] and not resizes()

    said: list[str] = []
    session = Session(CloudEnvironment("h200", site.env), Connection.to(Endpoints.from_environment()), site.bucket,
                      said.append)
    with ThreadPoolExecutor(2) as threads:
        with gcp.holding_operations():  # the reaper's resize drains nodes for a while, under the lock
            reaping = threads.submit(reap, site)
            until(lambda: replicas() == [0] and resizes(), "the reaper to patch the RayCluster and resize")
            applying = threads.submit(applied_without_asking, session)
            until(lambda: any(line.startswith("waiting for the lock on h200") for line in said), "apply to wait")
            assert not reaping.done()
        assert reaping.result(timeout=60)[0].scale_down
        applying.result(timeout=120)
    assert replicas() == [0], "apply undid the reaper's scale-down"
    assert site.pool.read()[0].scaled is True


def test_a_gke_environment_hashes_its_checkpoints_in_a_ray_job_where_they_are(local, h200_on_local_ray, tmp_path):
    """The snapshot tick of a GKE environment: a CPU-only Ray job (rlops shipped as a py_module) prints the
    manifests on the cluster; the next tick stores them. Here the cluster's Ray is this module's, through the proxy."""
    from rlops import sites
    from rlops.checkpoints import manifest
    from rlops.runs import snapshot
    from rlops.state.run_records import new

    run_dir = tmp_path / "lustre" / "gke-snap"
    subprocess.run([sys.executable, "-m", "rlops.workloads.trl_grpo", "--output-dir", str(run_dir), "max_steps=4",
                    "save_steps=4"], check=True, capture_output=True, timeout=300)
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    site.records.create(new({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-snap",
                             "requested-by": "tests", "settings": "{}", "checkpoint-dir": str(run_dir),
                             "attempt": "1"}, "rlops.h200.gke-snap.1", time.time()))
    assert snapshot.tick(site) == []  # starts the job
    # A second tick that, racing the first, also found no scan running: the same checkpoints, the same job.
    started = time.time()
    snapshot._start_cluster_scan(replace(site, clock=SimpleNamespace(time=lambda: started + 61,
                                                                     monotonic=time.monotonic, sleep=time.sleep)))
    assert len([j for j in local.ray_jobs() if (j.metadata or {}).get("rlops-kind") == "snapshot"]) == 1
    deadline = time.monotonic() + 120
    while any((j.metadata or {}).get("rlops-kind") == "snapshot" and str(j.status.value) in ("PENDING", "RUNNING")
              for j in local.ray_jobs()):
        assert time.monotonic() < deadline, "the snapshot job did not finish"
        time.sleep(0.5)
    events = snapshot.tick(site)
    assert [(e["run"], e["step"]) for e in events] == [("gke-snap", 4)]
    stored = json.loads(site.bucket.blob(events[0]["manifest"]).download_as_bytes())
    assert not any(manifest.verify(run_dir / "checkpoint-4", stored).values())
    assert site.records.get("gke-snap")[0].manifests["4"]["digest"] == stored["digest"]
    assert not [j for j in local.ray_jobs() if (j.metadata or {}).get("rlops-kind") == "snapshot"
                and str(j.status.value) == "SUCCEEDED"], "collected jobs are deleted"


def test_a_gke_checkpoint_is_exported_by_the_lustre_api_verified_and_imported_for_another_run(local, h200_on_local_ray):
    """GKE: the Lustre API's exportData (the fake's, which copies the instance's files into fake-gcs-server) of a
    manifested checkpoint, verified by listing; the recipe's `export: every 1` followed over two snapshot ticks;
    an import into another run: a Ray job on the cluster (this module's Ray) makes the directory importData needs,
    and the run's checkpoint gate verifies what arrived. /lustre here is the fake instance's directory."""
    from rlops import sites
    from rlops.checkpoints import gate, manifest
    from rlops.errors import Failure
    from rlops.runs import checkpoint_transfers, jobs, progress
    from rlops.spec.model import ExportPolicy
    from rlops.state.bucket import write_json_if
    from rlops.state.run_records import new

    gcp, _ = h200_on_local_ray
    site = sites.open_site("h200", sites.load_environment("h200"), Endpoints.from_environment())
    root = gcp.lustre_files(site.env.lustre.name)
    recipe = site.env.recipes["gemma3-27b-gsm8k"]
    site.env = site.env.model_copy(update={
        "ray": site.env.ray.model_copy(update={"lustre_mount": str(root)}),
        "recipes": {"gemma3-27b-gsm8k": recipe.model_copy(update={"export": ExportPolicy(when="every", every=1)})}})
    site.lustre_root = str(root)
    run_dir = Path(jobs.checkpoint_dir(site.env.recipes["gemma3-27b-gsm8k"], "gke-x", site.lustre_root))
    subprocess.run([sys.executable, "-m", "rlops.workloads.trl_grpo", "--output-dir", str(run_dir), "max_steps=4",
                    "save_steps=4"], check=True, capture_output=True, timeout=300)
    site.records.create(new({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "gke-x",
                             "requested-by": "tests", "settings": "{}", "checkpoint-dir": str(run_dir),
                             "attempt": "1"}, "rlops.h200.gke-x.1", time.time()))
    content = manifest.build(run_dir / "checkpoint-4", "gke-x")  # what the cluster's scan job would print
    assert write_json_if(site.bucket.blob(site.records.layout.manifest("gke-x", 4)), content, 0)

    # The instance runs one transfer at a time: while another one runs, the policy's export waits for a later tick.
    other = checkpoint_transfers._transfers(site).export("/checkpoints/", f"gs://{site.bucket.name}/elsewhere/")
    assert checkpoint_transfers.tick(site) == [] and "4" not in site.records.get("gke-x")[0].exports
    deadline = time.monotonic() + 60
    while not checkpoint_transfers._transfers(site).state(other).done:
        assert time.monotonic() < deadline, "the other transfer did not finish"
        time.sleep(0.1)
    assert checkpoint_transfers.tick(site) == []  # the policy's export started: an operation, followed by the next tick
    started = site.records.get("gke-x")[0].exports["4"]
    assert started["operation"] and "verified_at" not in started
    assert [r for r in gcp.mutations() if r.path.endswith(":exportData")]
    deadline = time.monotonic() + 60
    while not (events := checkpoint_transfers.tick(site)):
        assert time.monotonic() < deadline, "the export did not finish"
        time.sleep(0.2)
    assert [(e["type"], e["step"], e["objects"]) for e in events] == [("checkpoint-exported", 4, len(content["files"]))]
    assert site.records.get("gke-x")[0].exports["4"]["verified_at"]
    destination = events[0]["destination"]
    assert destination == f"gs://{site.bucket.name}/{site.records.layout.exports('gke-x')}/step-4/"
    assert checkpoint_transfers.tick(site) == []  # once

    # The command's export, waited for with its counters; one the Lustre API fails part way is said, not recorded
    # as verified.
    said = []
    done = checkpoint_transfers.export_checkpoint(site, "gke-x", 4, (site.bucket, "elsewhere/gke-x"), said.append)
    assert done["destination"] == f"gs://{site.bucket.name}/elsewhere/gke-x/step-4/" and done["verified_at"]
    assert said[-1].startswith("exportData ") and f"{len(content['files'])}/{len(content['files'])} objects" in said[-1]
    gcp.fail_transfers(1, copied=2)
    with pytest.raises(Failure, match=r"export of step 4 of gke-x failed: .*2/\d+ objects.*failed"):
        checkpoint_transfers.export_checkpoint(site, "gke-x", 4, (site.bucket, "broken/gke-x"))
    assert "2/" in site.records.get("gke-x")[0].exports["4"]["error"]

    said = []
    done = checkpoint_transfers.import_checkpoint(site, "gke-y", "gemma3-27b-gsm8k",
                                     (site.bucket, destination.removeprefix(f"gs://{site.bucket.name}/")), said.append)
    target = Path(done["directory"])
    assert target == Path(jobs.checkpoint_dir(site.env.recipes["gemma3-27b-gsm8k"], "gke-y", site.lustre_root)) / \
        "checkpoint-4"
    assert not any(manifest.verify(target, content).values())
    assert [r for r in gcp.mutations() if r.path.endswith(":importData")]
    assert not [j for j in local.ray_jobs() if (j.metadata or {}).get("rlops-kind") == "import"], "collected"
    shipped = {step: json.loads(blob.download_as_bytes())
               for step, blob in site.records.manifest_objects("gke-y").items()}
    assert list(shipped) == [4]
    gate.stage(root.parent / "shipped", shipped)
    out = subprocess.run([sys.executable, "-m", "rlops.checkpoints.gate", "--run-dir", str(target.parent)],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(root.parent / "shipped"), os.environ.get("PYTHONPATH", "")])}).stdout
    said = progress.resume_point(out)
    assert said.pop("at") and said == {"step": 4, "set_aside": [], "verified": True}


def test_a_pod_template_change_waits_for_the_live_ray_job_and_reaches_every_pod_after_it(local, h200_on_local_ray,
                                                                                         specs, tmp_path, capsys):
    """A new image restarts every pod of the RayCluster: while a job runs on its head (the real Ray head, through
    the API server's proxy) apply holds that change, does the rest and fails saying why; once the job has ended
    the next apply makes it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from rlops import cli
    from rlops.spec.images import cached

    gcp, kube = h200_on_local_ray
    ray = JobSubmissionClient(f"http://127.0.0.1:{local.port('ray-head', 'dashboard')}")
    gate = tmp_path / "hold"
    gate.touch()
    job = ray.submit_job(entrypoint=f"python -c 'import os, time\nwhile os.path.exists(\"{gate}\"): time.sleep(0.1)'")
    until(lambda: ray.get_job_status(job) == JobStatus.RUNNING, f"job {job} to run")
    pods = {p["metadata"]["name"] for p in kube.pods("ray-cluster")}

    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("image: nvcr.io/nvidia/nemo-rl:v0.5.0",
                                          "image: nvcr.io/nvidia/nemo-rl:v0.5.1"))
    capsys.readouterr()
    assert cli.main(["apply", "--yes", "h200"]) == 1
    err = capsys.readouterr().err
    assert "held, not applied: RayCluster/default/ray-cluster" in err and job in err
    live = kube.get("rayclusters", "ray-cluster", "default")["spec"]["headGroupSpec"]["template"]["spec"]
    assert live["containers"][0]["image"] == cached("nvcr.io/nvidia/nemo-rl:v0.5.0", "rlops-h200-example",
                                                    "us-central1")
    assert {p["metadata"]["name"] for p in kube.pods("ray-cluster")} == pods

    gate.unlink()
    until(lambda: not any(j.status in (JobStatus.PENDING, JobStatus.RUNNING) for j in ray.list_jobs()),
           "every job on the head to end")
    assert ray.get_job_status(job) == JobStatus.SUCCEEDED
    assert cli.main(["apply", "--yes", "h200"]) == 0
    after = kube.pods("ray-cluster")
    assert not pods & {p["metadata"]["name"] for p in after}
    pulled = cached("nvcr.io/nvidia/nemo-rl:v0.5.1", "rlops-h200-example", "us-central1")  # ray.image_cache's path
    assert all(c["image"] == pulled for p in after for c in p["spec"]["containers"])
