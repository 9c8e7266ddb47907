"""Byte sizes, the one parser and the one printer every input and table uses.

**The rule.**  Sizes follow libvirt's scaled integers (``virsh``'s too, and
IEC): binary suffixes ``KiB``, ``MiB``, ``GiB``, ``TiB`` — and the bare ``K``,
``M``, ``G``, ``T`` that libvirt also reads as binary — are powers of 1024;
decimal suffixes ``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000; ``B`` or
no suffix is bytes.  Case and a space before the suffix do not matter.  One
rule for request memory, reserved host memory, disk and network rates and
migration budgets alike, so a size means the same wherever an operator types
it: ``"64 MB"`` is 64,000,000 bytes, ``"64MiB"`` 67,108,864.

**A VM's memory** (:func:`parse_memory`) is held to two more rules, so that
the VM gets exactly the memory the plan says: at least :data:`MIN_VM_MEMORY`
(16 MiB: below that no Linux guest boots, and QEMU's direct kernel boot
refuses the initrd outright), and a whole number of MiB — libvirt's QEMU
driver rounds a domain's memory *up* to a multiple of 1 MiB
(``qemuDomainGetMemorySizeAlignment``), so ``"64 MB"`` would be planned as
61.04 MiB and run as 62 MiB.  Such a size is refused naming both readings,
not rounded behind the operator's back.
"""

from __future__ import annotations

import math
import re
from typing import Any

from vcsched.errors import InputError
from vcsched.units import GIB, KIB, MIB, TIB
from vcsched.units import UNLIMITED as UNLIMITED  # re-exported: the size parser reads "unlimited" as it

_UNITS = {"": 1, "b": 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": GIB, "gib": GIB, "t": TIB, "tib": TIB,
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


#: The smallest memory a VM may have (:func:`check_vm_memory`).
MIN_VM_MEMORY = 16 << 20
#: libvirt's QEMU driver rounds a domain's memory up to a multiple of this (1 MiB).
VM_MEMORY_ALIGN = 1 << 20


def check_vm_memory(where: str, n: int, shown: Any = None) -> int:
    """A VM's memory in bytes: at least :data:`MIN_VM_MEMORY` and a whole number of MiB (module docstring).

    ``shown``: the value as the user wrote it (default ``n``), for the message.
    """
    shown = n if shown is None else shown
    if n < MIN_VM_MEMORY:
        raise InputError(f"{where}: {shown!r} is {format_size(n)}, below the smallest VM memory of "
                         f"{format_size(MIN_VM_MEMORY)}")
    if n % VM_MEMORY_ALIGN:
        up = -(-n // VM_MEMORY_ALIGN)
        raise InputError(f"{where}: {shown!r} is {n} bytes, not a whole number of MiB (KB, MB, GB are powers of "
                         f"1000, KiB, MiB, GiB of 1024); libvirt would round it up to {up} MiB: write the size in "
                         f"MiB or GiB, e.g. \"{n >> 20}MiB\"")
    return n


def parse_memory(where: str, value: Any) -> int:
    """A VM's memory: :func:`parse_size`, then :func:`check_vm_memory`."""
    return check_vm_memory(where, parse_size(where, value), value)


def format_size(n: float) -> str:
    """Bytes as the largest binary unit that keeps a readable number (for messages and tables)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def format_budget(n: int) -> str:
    """A migration byte budget (or bytes moved against one): "unlimited" (:data:`UNLIMITED`), else a size."""
    return "unlimited" if n >= UNLIMITED else format_size(n)
