"""Byte sizes, the one parser and the one printer every input and table uses.

Sizes follow libvirt's scaled integers (and IEC): binary suffixes ``KiB``,
``MiB``, ``GiB``, ``TiB`` — and the bare ``K``, ``M``, ``G``, ``T`` that
libvirt also reads as binary — are powers of 1024; decimal suffixes ``KB``,
``MB``, ``GB``, ``TB`` are powers of 1000.  Case does not matter.  One rule
for request memory, reserved host memory and migration budgets alike, so a
size means the same wherever an operator types it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from vcsched.errors import InputError

UNLIMITED = (1 << 63) - 1  # a byte budget no cluster reaches: free re-placement

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?)\s*([a-z]*)")
_EXAMPLES = "e.g. 1073741824, 2GiB, 512MiB"


def parse_size(where: str, value: Any, *, allow_zero: bool = False, allow_unlimited: bool = False) -> int:
    """Bytes from a whole number or a string such as ``"128MiB"``, ``"1.5GiB"``, ``"1GB"``.

    ``allow_unlimited`` admits ``"unlimited"`` (:data:`UNLIMITED`), for budgets.
    Errors name ``where`` and the value.
    """
    examples = _EXAMPLES + (", unlimited" if allow_unlimited else "")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InputError(f"{where}: expected a byte size ({examples}), got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = value.strip().lower()
        if allow_unlimited and text in ("unlimited", "inf", "infinity"):
            return UNLIMITED
        m = _SIZE_RE.fullmatch(text)
        if not m or m.group(2) not in _UNITS:
            raise InputError(f"{where}: {value!r} is not a byte size ({examples})")
        x = float(m.group(1)) * _UNITS[m.group(2)]
        if not math.isfinite(x) or x >= UNLIMITED:
            raise InputError(f"{where}: {value!r} is too large")
        n = round(x)
    if n < 0 or (n == 0 and not allow_zero):
        raise InputError(f"{where}: {value!r} must be {'at least 0' if allow_zero else 'above 0'}")
    return n


def format_size(n: float) -> str:
    """Bytes as the largest binary unit that keeps a readable number (for messages and tables)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"
