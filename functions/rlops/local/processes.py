"""Background processes that outlive the command that started them, recorded so that exactly they can be stopped.

Each process starts in a session of its own, so its process group holds it and every child it
spawns (Ray's raylet and GCS, the emulator's JVM, gunicorn's workers) and nothing else. Stopping
signals that group, never a process found by name: other Ray clusters on the machine are not ours.
"""

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlops.errors import Failure


@dataclass
class Process:
    name: str
    pid: int
    command: list[str]
    log: str
    ports: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    start_ticks: int = 0  # the kernel's start time of the PID: a reused PID has another

    def alive(self) -> bool:
        """Still running, and still the process we started."""
        stat = _stat(self.pid)
        return stat is not None and stat[0] != "Z" and int(stat[19]) == self.start_ticks

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(Path(self.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Registry:
    """`processes.json` in the local state directory: what `up` started and `down` stops."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.path = directory / "processes.json"

    def load(self) -> dict[str, Process]:
        try:
            return {name: Process(**entry) for name, entry in json.loads(self.path.read_text()).items()}
        except FileNotFoundError:
            return {}

    def save(self, processes: dict[str, Process]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({name: asdict(p) for name, p in processes.items()}, indent=1))
        temporary.replace(self.path)


def free_port() -> int:
    """A port nobody listens on now, outside Ray's worker port range (10002-19999)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if not 10002 <= port <= 19999:
            return port


def start(name: str, command: list[str], log: Path, env: dict[str, str], ports: dict[str, int] | None = None,
          cwd: Path | None = None) -> Process:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 cwd=cwd, start_new_session=True)
    stat = _stat(child.pid)
    # Our child, not yet waited for: /proc keeps its entry even once it has exited (a zombie until reaped).
    assert stat is not None, f"/proc/{child.pid}/stat of the child just started"
    return Process(name, child.pid, command, str(log), ports or {}, time.time(), int(stat[19]))


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]; None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def stop(process: Process, grace_seconds: float = 20.0) -> bool:
    """Stop the process and everything it started; True if it was running.

    SIGTERM to the process alone first (`ray start --block` then shuts its cluster down in order),
    then to its process group and every descendant left (Ray's workers leave the group), then SIGKILL.
    A process that has exited may have left its group running (the raylet of a `ray start` that gave up):
    that is stopped too.
    """
    running = process.alive()
    family = _family(process.pid, with_root=running)
    for signum, share in ((None, 0.5), (signal.SIGTERM, 0.25), (signal.SIGKILL, 0.25)):
        if not family:
            break
        if signum is None:
            if not running:
                continue
            os.kill(process.pid, signal.SIGTERM)
        else:
            _signal(process.pid, family, signum)
        deadline = time.monotonic() + grace_seconds * share
        while family and time.monotonic() < deadline:
            _reap(process.pid)
            time.sleep(0.1)
            family = _family(process.pid, family, with_root=running)
    _reap(process.pid)
    return running


def _signal(pgid: int, pids: set[int], signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _family(root: int, known: AbstractSet[int] = frozenset(), with_root: bool = True) -> set[int]:
    """Live processes that are `root`, in its process group, below it, or already known to be ours. Without
    `with_root` (it has exited), its PID may be another's by now; its group's ID is not reused while the group
    lives."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] != "Z":
                table[int(entry.name)] = (int(stat[1]), int(stat[2]))
    family = {pid for pid, (_, pgid) in table.items() if pgid == root or (with_root and pid == root)}
    family |= set(known) & set(table)
    grew = True
    while grew:
        children = {pid for pid, (parent, _) in table.items() if parent in family} - family
        family |= children
        grew = bool(children)
    return family


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child (in tests): collect it, or it lingers as a zombie
    except ChildProcessError:
        pass


def wait_until(ready: Callable[[], bool], process: Process, what: str, timeout: float,
               report: Callable[[str], None]) -> None:
    """Poll `ready()` until true; fail with the log's tail when the process dies or time runs out."""
    started = last = time.monotonic()
    while not ready():
        if not process.alive():
            raise Failure(f"{process.name} exited while starting; the end of {process.log}:\n{process.log_tail()}")
        if time.monotonic() - started > timeout:
            raise Failure(f"{process.name} not {what} after {timeout:.0f}s; the end of {process.log}:\n"
                               f"{process.log_tail()}")
        if time.monotonic() - last > 10:
            report(f"  waiting for {process.name} ({time.monotonic() - started:.0f}s)")
            last = time.monotonic()
        time.sleep(0.2)
