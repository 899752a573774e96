"""How long `rlops doctor` takes when every API call costs 50 ms, against one call.

The checks read the project at once (Service Usage, the reservation, the network profile, each secret version, the
state bucket): their depth, not their number, should set the time. Runs the fake GCP control plane
(tests/fakes/gcp.py) in a process of its own with 50 ms per request, and fake-gcs-server for the state bucket,
both on 127.0.0.1. The fake's project has no reservation and no secrets: some checks fail, in the same number of
calls.

Usage: python bench/doctor.py [ROUNDS] (BENCH_LATENCY=S changes the 50 ms)
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rlops.cloud.base import Connection
from rlops.endpoints import Endpoints
from rlops.provision import doctor, service
from rlops.spec.load import load_or_raise
from rlops.state.bucket import client as storage_client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from fakes.gcs import fake_gcs  # noqa: E402
from plan import best, one_call_seconds  # noqa: E402

LATENCY = float(os.environ.get("BENCH_LATENCY", "0.05"))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    env = service.CloudEnvironment("h200", load_or_raise(REPO / "environments" / "h200.yaml"))
    fake = subprocess.Popen([sys.executable, "-m", "fakes.gcp", "--latency", str(LATENCY)], cwd=REPO / "tests",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with fake_gcs():
            connection = Connection.to(Endpoints(apis=json.loads(fake.stdout.readline())))
            bucket = storage_client("bench", Endpoints.from_environment()).create_bucket(env.spec.state.bucket)

            def examined() -> float:
                start = time.perf_counter()
                examined.findings = doctor.examine(env, connection, bucket)
                return time.perf_counter() - start

            examined()  # warm up imports and connections
            call = best(rounds, lambda: one_call_seconds(connection))
            took = best(rounds, examined)
    finally:
        fake.stdin.close()  # the fake serves until its stdin closes
        fake.wait(timeout=10)
    print(doctor.render(examined.findings), end="")
    print(f"one call: {call * 1000:.0f} ms; rlops doctor h200: {took * 1000:.0f} ms "
          f"({len(examined.findings)} findings)")
    print(f"doctor-seconds: {took:.2f} (goal <= 2)")
    print(f"doctor-vs-one-call: {took / call:.2f} (goal <= 3)")


if __name__ == "__main__":
    main()
