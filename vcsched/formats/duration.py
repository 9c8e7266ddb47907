"""Durations on the command line: ``30``, ``30s``, ``500ms``, ``2m``, ``1h``, ``7d`` (seconds when bare)."""

from __future__ import annotations

import math
import re
from typing import Any

from vcsched.errors import InputError

_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)")


def parse_duration(where: str, value: Any, *, allow_zero: bool = False) -> float:
    """Seconds from ``value``; an error names ``where`` and the value (bad input, exit 2)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(f"{where}: expected a duration such as 30s, 500ms, 2m, got {value!r}")
    if isinstance(value, str):
        text = value.strip().lower()
        m = _RE.fullmatch(text)
        if not m or m.group(2) not in _UNITS:
            raise InputError(f"{where}: {value!r} is not a duration (e.g. 30, 30s, 500ms, 2m, 1h)")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise InputError(f"{where}: {value!r} is not a finite duration")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InputError(f"{where}: {value!r} must be {'at least 0' if allow_zero else 'above 0'} seconds")
    return seconds
