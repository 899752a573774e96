"""Pin the functions' whole dependency closure: requirements.lock, what deploy.yaml ships as the functions'
requirements.txt and what `make` installs as constraints, so the tests run what deploys.

    .venv/bin/python tools/lock_requirements.py

resolves requirements.txt with pip (`install --dry-run --ignore-installed --report`, pip's own resolver) and
writes every distribution it would install, pinned.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), "-r", str(REPO / "requirements.txt")], check=True)
        chosen = sorted((i["metadata"]["name"], i["metadata"]["version"])
                        for i in json.loads(report.read_text())["install"])
    lines = ["# The functions' whole dependency closure, pinned: made by tools/lock_requirements.py from",
             "# requirements.txt. deploy.yaml ships it as the functions' requirements.txt; make installs with it",
             "# as constraints."]
    pinned = [f"{name}=={version}" for name, version in chosen]
    (REPO / "requirements.lock").write_text("\n".join(lines + pinned) + "\n")


if __name__ == "__main__":
    main()
