"""Numbers, byte counts and durations as a person reads them: in a run's report, `rlops status` and
`rlops checkpoints`."""

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def number(value: float | None) -> str:
    """A logged number as a person reads it: four significant digits (0.1235, 1.235e-05, 1235), never seventeen."""
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def binary_unit(count: float) -> tuple[str, int]:
    """The binary unit a byte count reads best in, and its size."""
    power = 0
    while power < len(UNITS) - 1 and count >= 1024 ** (power + 1):
        power += 1
    return UNITS[power], 1024 ** power


def size(count: float | None) -> str:
    """Bytes as a person reads them: 812 B, 812 KiB, 9.5 MiB, 1.25 GiB (three significant digits); - when unknown."""
    if count is None:
        return "-"
    unit, scale = binary_unit(count)
    value = count / scale
    if unit == "B":
        return f"{count:.0f} B"
    return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}" if value >= 10 else f"{value:.2f} {unit}"


def duration(seconds: float | None) -> str:
    """1h02m, 4m10s, 12s; - when unknown."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"
