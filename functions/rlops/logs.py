"""Log lines as Cloud Logging reads them from a function's stdout: one JSON object per line, with a severity."""

import json
import sys


def emit(severity: str, message: str, **fields) -> None:
    print(json.dumps({"severity": severity, "message": message, **fields}, default=str), file=sys.stdout, flush=True)
