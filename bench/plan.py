"""How long `rlops plan` takes when every API call costs 50 ms, against one call and against one environment.

A plan reads every resource of the environment (19 resources for a seed environment, read in 7
calls: a list per compute kind, the location's clusters with their node pools, the zone's Lustre
instances, the peering); done one after another that is ~0.4 s at 50 ms each. Reads go out in
parallel, so a plan should cost about one call. A fleet is environments of one project (a platform
team's): they share the lists, so ten or a hundred environments add one peering read and one state
record each, not seven calls. What a big fleet still pays is the client libraries' own CPU, about
2 ms per call (requests, protobuf JSON) on one interpreter, and rlops's per-environment work.

Usage: python bench/plan.py [ROUNDS] (BENCH_LATENCY=S changes the 50 ms). Runs the fake GCP control plane
(tests/fakes/gcp.py) in a process of its own, as the real API would be, with 50 ms of latency per request, and
fake-gcs-server for the state bucket, both on 127.0.0.1.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

from google.cloud import compute_v1

from rlops.cloud.base import Connection
from rlops.endpoints import Endpoints
from rlops.provision import service
from rlops.spec.load import load_text
from rlops.state.bucket import client as storage_client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fakes.gcs import fake_gcs  # noqa: E402

LATENCY = float(__import__("os").environ.get("BENCH_LATENCY", "0.05"))


def environments(count: int) -> list[service.CloudEnvironment]:
    """`count` copies of the H200 seed in one project, each with resource names of its own."""
    text = (REPO / "environments" / "h200.yaml").read_text().replace("rlops-h200-example", "rlops-bench")
    envs = []
    for i in range(count):
        loaded = load_text(text.replace("rl-", f"rl{i}-"), f"bench-{i}", f"bench-{i}.yaml")
        assert not loaded.problems, loaded.problems
        envs.append(service.CloudEnvironment(f"bench-{i}", loaded.environment))
    return envs


def plan_seconds(envs, connection, bucket) -> float:
    start = time.perf_counter()
    service.plan_live(envs, connection, lambda env: bucket)
    return time.perf_counter() - start


def one_call_seconds(connection) -> float:
    networks = connection.gapic("compute", compute_v1.NetworksClient)
    start = time.perf_counter()
    try:
        networks.get(project="rlops-bench", network="absent")
    except Exception:  # a 404 costs the same round trip as a hit
        pass
    return time.perf_counter() - start


def best(rounds: int, work) -> float:
    return min(work() for _ in range(rounds))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    fake = subprocess.Popen([sys.executable, "-m", "fakes.gcp", "--latency", str(LATENCY)], cwd=REPO / "tests",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with fake_gcs():
            connection = Connection.to(Endpoints(apis=json.loads(fake.stdout.readline())))
            bucket = storage_client("bench", Endpoints.from_environment()).create_bucket("rlops-bench-state")
            one_env, ten_envs, hundred_envs = environments(1), environments(10), environments(100)
            plan_seconds(hundred_envs, connection, bucket)  # warm up imports and connections
            call = best(rounds, lambda: one_call_seconds(connection))
            one = best(rounds, lambda: plan_seconds(one_env, connection, bucket))
            ten = best(rounds, lambda: plan_seconds(ten_envs, connection, bucket))
            hundred = best(rounds, lambda: plan_seconds(hundred_envs, connection, bucket))
    finally:
        fake.stdin.close()  # the fake serves until its stdin closes
        fake.wait(timeout=10)
    print(f"one call: {call * 1000:.0f} ms")
    print(f"plan of one environment: {one * 1000:.0f} ms; of ten: {ten * 1000:.0f} ms; of a hundred: "
          f"{hundred * 1000:.0f} ms (one project)")
    print(f"plan-vs-one-call: {one / call:.2f} (goal <= 2)")
    print(f"ten-vs-one-environment: {ten / one:.2f} (goal <= 2)")
    print(f"hundred-vs-one-environment: {hundred / one:.2f} (goal <= 5)")


if __name__ == "__main__":
    main()
