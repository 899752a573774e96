"""The time the control plane reads and waits on: the system's, or the simulated one a test hands a `Site`.

Every decision that depends on time (an idle pool's age, a run's progress, a lock's expiry, a wait's deadline) reads
it from the site's clock, so a test drives hours of ticks in milliseconds, and a scheduler of interleavings makes a
sleep a point where another actor runs."""

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (what records and events carry)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM = SystemClock()
