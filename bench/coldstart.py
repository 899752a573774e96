"""Cold start of the functions: importing `functions/main.py`, and handling one `train` event in a new process.

Both against a bare interpreter importing functions-framework (what every Python Cloud Function
pays), measured in the same run; each figure is the best of ROUNDS fresh processes. The train
event goes to a real local Ray head (started here, stopped by its PID) with no GPU-pool node, so
the job is submitted and stays pending: the figure is rlops's handling, not the training.

Usage: python bench/coldstart.py [ROUNDS]
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FUNCTIONS = REPO / "functions"

HANDLE_ONE = """
import base64, json, sys, time
began = time.perf_counter()
import main
from cloudevents.http import CloudEvent
data = base64.b64encode(sys.argv[1].encode()).decode()
main.train(CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "source": "//bench"},
                      {"message": {"data": data, "messageId": "1"}}))
print(time.perf_counter() - began)
"""


def best_of(rounds: int, code: str, *args: str, env: dict | None = None) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, *args], cwd=FUNCTIONS, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    bare = best_of(rounds, "import functions_framework")
    imported = best_of(rounds, "import main")
    print(f"import functions_framework: {bare * 1000:.0f} ms; import main: {imported * 1000:.0f} ms")

    from rlops.local.stack import Stack
    from rlops.spec.load import load_text

    work = Path(tempfile.mkdtemp(prefix="rlops-coldstart-"))
    (work / "environments").mkdir()
    spec = (REPO / "environments" / "local.yaml").read_text().replace("workers: 1", "workers: 0")
    (work / "environments" / "local.yaml").write_text(spec)
    os.chdir(work)
    os.environ.update(RLOPS_ENVIRONMENTS=str(work / "environments"), RLOPS_LOCAL_TICK_SECONDS="0")
    stack = Stack("local", load_text(spec, "local", "local.yaml").environment, lambda line: None)
    try:
        stack.up()
        env = os.environ | stack.service_env()
        handled = []
        for _ in range(rounds):
            message = json.dumps({"environment": "local", "recipe": "tiny-arith", "run": f"bench-{time.time_ns()}",
                                  "overrides": {}, "requested_by": "bench"})
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", HANDLE_ONE, message], cwd=FUNCTIONS, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            handled.append(time.perf_counter() - began)
    finally:
        stack.down()
    handle = min(handled)
    print(f"new process, import main and handle one train event (job submitted, record and event written): "
          f"{handle * 1000:.0f} ms")
    print(f"main-import-vs-framework-import: {imported / bare:.2f} (goal <= 1.5)")
    print(f"train-event-cold-vs-framework-import: {handle / bare:.2f} (goal <= 8)")


if __name__ == "__main__":
    main()
