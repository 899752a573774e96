"""Log lines as Cloud Logging reads them from a function's stdout: one JSON object per line, with a severity.

The CLI sends them to stderr (`to_stderr`), so that its stdout stays what the command prints: as JSON for a
program reading them, as text for a person at a terminal (`rlops --log-format`, default: text on a TTY).
"""

import json
import sys

_to_stderr = False
_as_text = False


def to_stderr(log_format: str = "auto") -> None:
    global _to_stderr, _as_text
    _to_stderr = True
    _as_text = log_format == "text" or (log_format == "auto" and sys.stderr.isatty())


def emit(severity: str, message: str, **fields: object) -> None:
    # sys.stderr and sys.stdout are looked up at each line: whoever replaced them since (a test's capture) is
    # written to, never a stream closed since.
    if _to_stderr and _as_text:
        said = " ".join(f"{key}={value}" for key, value in fields.items())
        print(f"{severity.lower()}: {message}" + (f" ({said})" if said else ""), file=sys.stderr, flush=True)
        return
    print(json.dumps({"severity": severity, "message": message, **fields}, default=str),
          file=sys.stderr if _to_stderr else sys.stdout, flush=True)
