"""One lock per environment, as an object in the state bucket.

Taking it is a create with `ifGenerationMatch=0`, which Cloud Storage grants to exactly one caller.
The holder refreshes it while it works; a lock whose expiry has passed belonged to a process that
died, and the next caller takes it over (again under a generation precondition).
"""

import getpass
import os
import socket
import threading
import time
from datetime import datetime, timedelta, timezone

from google.api_core import exceptions as gexc

from rlops.errors import Failure
from rlops.state.bucket import read_json, write_json
from rlops.state.layout import Layout


class LockHeld(Failure):
    pass


class Lock:
    def __init__(self, bucket, prefix: str, environment: str, ttl_seconds: float = 900, operation: str = "apply"):
        self.blob = bucket.blob(Layout(prefix, environment).lock)
        self.environment = environment
        self.ttl = ttl_seconds
        self.operation = operation
        self.generation = 0
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def _content(self) -> dict:
        now = datetime.now(timezone.utc)
        return {"holder": f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}", "operation": self.operation,
                "environment": self.environment, "since": now.isoformat(timespec="seconds"),
                "expires": (now + timedelta(seconds=self.ttl)).isoformat(timespec="seconds")}

    def acquire(self, timeout: float, on_wait=lambda holder: None, poll_seconds: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.generation = write_json(self.blob, self._content(), if_generation_match=0)
                break
            except gexc.PreconditionFailed:
                held, generation = read_json(self.blob)
                if held is None:
                    continue  # released between our write and our read
                if datetime.fromisoformat(held["expires"]) < datetime.now(timezone.utc):
                    try:
                        self.generation = write_json(self.blob, self._content(), if_generation_match=generation)
                        break
                    except gexc.PreconditionFailed:
                        continue  # someone else took the expired lock first
                if time.monotonic() >= deadline:
                    raise LockHeld(f"environment {self.environment} is locked by {held['holder']} "
                                   f"({held['operation']} since {held['since']}, expires {held['expires']}); "
                                   f"if that process is dead: rlops unlock {self.environment} --force")
                on_wait(held)
                time.sleep(poll_seconds)
        self._refresher = threading.Thread(target=self._refresh, daemon=True, name=f"lock-{self.environment}")
        self._refresher.start()

    def _refresh(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.generation = write_json(self.blob, self._content(), if_generation_match=self.generation)
            except gexc.PreconditionFailed:
                return  # forcibly unlocked and taken by another: nothing left of ours to refresh

    def release(self) -> None:
        self._stop.set()
        if self._refresher:
            self._refresher.join()
        try:
            self.blob.delete(if_generation_match=self.generation)
        except (gexc.NotFound, gexc.PreconditionFailed):
            pass  # forcibly unlocked meanwhile

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def force_unlock(bucket, prefix: str, environment: str) -> dict | None:
    """Remove the lock whoever holds it; what it said, or None when there was none."""
    blob = bucket.blob(Layout(prefix, environment).lock)
    held, _ = read_json(blob)
    if held is not None:
        try:
            blob.delete()
        except gexc.NotFound:
            pass
    return held
