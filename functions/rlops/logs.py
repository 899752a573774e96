"""Log lines as Cloud Logging reads them from a function's stdout: one JSON object per line, with a severity.

The CLI sends them to stderr (`to_stderr`), so that its stdout stays what the command prints.
"""

import json
import sys

_to_stderr = False


def to_stderr() -> None:
    global _to_stderr
    _to_stderr = True


def emit(severity: str, message: str, **fields) -> None:
    # sys.stderr and sys.stdout are looked up at each line: whoever replaced them since (a test's capture) is
    # written to, never a stream closed since.
    print(json.dumps({"severity": severity, "message": message, **fields}, default=str),
          file=sys.stderr if _to_stderr else sys.stdout, flush=True)
