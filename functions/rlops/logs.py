"""Log lines as Cloud Logging reads them from a function's stdout: one JSON object per line, with a severity.

The CLI sends them to stderr (`to_stderr`), so that its stdout stays what the command prints.
"""

import json
import sys

_stream = None


def to_stderr() -> None:
    global _stream
    _stream = sys.stderr


def emit(severity: str, message: str, **fields) -> None:
    print(json.dumps({"severity": severity, "message": message, **fields}, default=str), file=_stream or sys.stdout,
          flush=True)
