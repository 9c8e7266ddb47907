"""Field checks shared by every input format (instance JSON, cluster and request TOML, plan JSON).

Each check takes ``where`` — the field's path as the user wrote it
(``jobs[3].memory``, ``hosts[0].uri``, ``plan.steps[2].cap_cores``) — and
raises :class:`InputError` naming that path and the offending value, which
the CLI prints as its one-line error (exit 2).  One set of checks, so the
same mistake reads the same in every file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Set
from typing import Any

from vcsched.errors import InputError

#: The most vCPUs a VM may have: requests and plans' create steps alike.
MAX_VCPUS = 256


def check_fields(where: str, value: Any, allowed: Set[str], required: Set[str], *,
                 kind: str = "object") -> Mapping[str, Any]:
    """An object (a TOML table: ``kind="table"``) with only known keys and every required one.

    Unknown keys are errors, not ignored: a typo in an optional field must not
    silently fall back to its default.
    """
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: expected {'a' if kind == 'table' else 'an'} {kind}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(allowed) - set(required))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted({*allowed, *required}))})")
    missing = sorted(set(required) - set(value))
    if missing:
        raise InputError(f"{where}: missing field {missing[0]!r}")
    return value


def check_string(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def check_name(where: str, value: Any) -> str:
    """Names become libvirt domain names and metadata: keep them to a safe, printable alphabet."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", value):
        raise InputError(f"{where}: {value!r} is not a name (letters, digits, '_', '.', '-'; at most 63)")
    return value


def check_number(where: str, value: Any, *, low: float = 0.0, high: float | None = None,
                 low_open: bool = True) -> float:
    """A finite number above ``low`` (at least, if not ``low_open``) and at most ``high``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: expected a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise InputError(f"{where}: {value!r} is not a finite number")
    if (low_open and x <= low) or (not low_open and x < low):
        raise InputError(f"{where}: {value!r} must be {'above' if low_open else 'at least'} {low:g}")
    if high is not None and x > high:
        raise InputError(f"{where}: {value!r} is above {high:g}")
    return x


def check_fraction(where: str, value: Any, *, low_open: bool = False) -> float:
    """A number in [0, 1] (or (0, 1]): yields and shares."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{where}: expected a number, got {value!r}")
    if value > 1 or value < 0 or (low_open and value == 0):
        raise InputError(f"{where}: {value!r} is not in {'(0' if low_open else '[0'}, 1]")
    return float(value)


def check_count(where: str, value: Any) -> int:
    """A whole number >= 1 (tasks, vCPUs, bytes of a step)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: expected a whole number >= 1, got {value!r}")
    return value


def check_list(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{where}: expected a list, got {type(value).__name__}")
    return value
