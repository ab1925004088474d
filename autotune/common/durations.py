"""Human durations ("90s", "20m", "2h", "1h30m") to seconds."""

from __future__ import annotations

import re

from autotune.common.errors import UserError

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """Parse a duration; a bare number means seconds. Raises UserError on anything else."""
    cleaned = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        seconds = float(cleaned)
    elif cleaned and _PART.sub("", cleaned) == "":
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(cleaned))
    else:
        raise UserError(f"cannot read duration {text!r}: use a number with a unit, e.g. 90s, 20m, 2h or 1h30m")
    if seconds <= 0:
        raise UserError(f"duration {text!r} must be positive")
    return seconds


def format_duration(seconds: float) -> str:
    """Short form for progress lines: 95 -> '1m35s'."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
