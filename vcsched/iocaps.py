"""Disk and network caps as planning must know them: units, the smallest cap libvirt accepts, the grids.

The CPU has :mod:`vcsched.caps`; this is the same for the two other resources
vcsched enforces through libvirt (the ``disk`` and ``net`` of the
multi-resource model, docs/policies.md):

* **disk** — bytes per second (and optionally I/O operations per second) over
  all the VM's disks together: QEMU's block throttling
  (``virDomainSetBlockIoTune`` ``total_bytes_sec``/``total_iops_sec``, one
  ``group_name`` for every disk of the VM, so the disks share one limit).
  Whole bytes: a cap is rounded *down* to a whole number.  libvirt reads 0 as
  "no limit", so the smallest cap is 1 B/s (1 op/s); QEMU refuses more than
  10^15.
* **net** — bytes per second in *each* direction (inbound and outbound get the
  same average, ``virDomainSetInterfaceParameters``).  libvirt's unit is
  called "kilobytes per second"; the QEMU driver hands it to ``tc`` as
  ``<n>kbps``, which tc reads as n × 1000 bytes/s (measured: average 1000
  became an HTB class of "rate 8Mbit" = 1 000 000 B/s, not 1 024 000), so the
  grid is :data:`NET_UNIT` = 1000 B/s per interface.  A VM's cap is split
  evenly over its interfaces (tc shapes each tap on its own; libvirt has no
  group across interfaces) and each share rounded *down* to the grid, so a
  cap never reads back above what was planned: a 1-NIC VM capped at
  2 500 000 B/s holds 2 500 000; one capped at 2 500 999 holds 2 500 000
  too; a 2-NIC VM capped at 2 500 999 holds 2 × 1 250 000.  An average of 0
  means "no limit", so the smallest cap is 1000 B/s per interface.

Like CPU caps, planned caps live on these grids, a cap reads back as exactly
the grid point planned, and sums of caps are compared with a host's declared
capacity (``disk_bps``/``net_bps`` in the cluster file: libvirt cannot know
them; ``vcsched calibrate --resource disk|net`` measures them).  A VM that
has no cap on a resource does not count on that resource: vcsched does not
share what it does not cap.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

DISK = "disk"
NET = "net"
#: The resources besides CPU that vcsched caps, in the multi-resource model's names.
IO_RESOURCES = (DISK, NET)

#: 0 means "no limit" to libvirt/QEMU, so the smallest disk cap is one byte (one operation) per second.
MIN_DISK_BYTES_SEC = 1
MIN_DISK_IOPS = 1
#: QEMU_BLOCK_IOTUNE_MAX: libvirt refuses larger throttle values.
MAX_DISK_VALUE = 10**15
#: Bytes per second in one unit of libvirt's ``<bandwidth>`` average, as the QEMU driver's tc applies it.
NET_UNIT = 1000
#: Field names of a plan step, by resource (``disk_iops_sec`` rides with the disk).
STEP_FIELDS = {DISK: "disk_bytes_sec", NET: "net_bytes_sec"}


@dataclass(frozen=True)
class IoCaps:
    """A VM's disk and network caps; None = no cap on that (or, in a step: not changed by it)."""

    disk_bytes_sec: int | None = None
    disk_iops_sec: int | None = None
    net_bytes_sec: int | None = None

    def given(self) -> dict[str, int]:
        """The fields that are set, by name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def __bool__(self) -> bool:
        return bool(self.given())

    def amount(self, resource: str) -> int | None:
        """Bytes per second on ``resource`` (``disk`` or ``net``), None when uncapped there."""
        return self.disk_bytes_sec if resource == DISK else self.net_bytes_sec

    def over(self, other: IoCaps) -> IoCaps:
        """These caps where set, ``other``'s elsewhere (a step's caps applied to what a VM had)."""
        return replace(other, **self.given())

    def only(self, names: set[str] | frozenset[str]) -> IoCaps:
        return IoCaps(**{k: v for k, v in self.given().items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dict(self.given())


@dataclass(frozen=True)
class VmDevices:
    """What a domain has that disk and network caps apply to: disk targets (``vda``) and interfaces.

    ``nics`` are the interfaces libvirt can shape (types network, bridge,
    direct, ethernet), named by their tap (``vnet0``) when the domain runs, or
    by MAC address / position before it does.
    """

    disks: tuple[str, ...] = ()
    nics: tuple[str, ...] = ()

    def count(self, resource: str) -> int:
        return len(self.disks) if resource == DISK else len(self.nics)


def realisable_disk(value: float) -> int:
    """The throttle QEMU holds for a disk cap (bytes or operations per second): whole, rounded down."""
    return int(value)


def net_units(bytes_sec: float, nics: int) -> int:
    """libvirt's ``average`` per interface for a VM cap of ``bytes_sec`` spread over ``nics`` interfaces."""
    return int(bytes_sec // (NET_UNIT * max(nics, 1)))


def realisable_net(bytes_sec: float, nics: int) -> int:
    """The VM cap ``nics`` interfaces hold when asked for ``bytes_sec``: each share rounded down to the grid."""
    return net_units(bytes_sec, nics) * NET_UNIT * max(nics, 1)


def min_net(nics: int) -> int:
    """The smallest network cap of a VM with ``nics`` interfaces (one grid unit on each)."""
    return NET_UNIT * max(nics, 1)


def realisable(caps: IoCaps, devices: VmDevices) -> IoCaps:
    """The caps a host holds (and reads back) for ``caps`` on a VM with ``devices``."""
    out = {}
    for name, value in caps.given().items():
        out[name] = realisable_net(value, len(devices.nics)) if name == "net_bytes_sec" else realisable_disk(value)
    return IoCaps(**out)


def io_problem(caps: IoCaps, devices: VmDevices) -> str | None:
    """Why ``caps`` cannot be held by a VM with ``devices`` (no such device, below libvirt's minimum), or None.

    The message names the field and the value; the caller adds VM and host.
    """
    for name, value in caps.given().items():
        if name == "net_bytes_sec":
            if not devices.nics:
                return f"net_bytes_sec {value}: it has no network interface libvirt can shape"
            if value < min_net(len(devices.nics)):
                return (f"net_bytes_sec {value}: below libvirt's minimum of {min_net(len(devices.nics))} B/s for "
                        f"{len(devices.nics)} interface(s) (an average of 0 {NET_UNIT} B/s units means no limit)")
        else:
            if not devices.disks:
                return f"{name} {value}: it has no disk"
            low = MIN_DISK_IOPS if name == "disk_iops_sec" else MIN_DISK_BYTES_SEC
            if value < low:
                return f"{name} {value}: below libvirt's minimum of {low} (0 means no limit)"
            if value > MAX_DISK_VALUE:
                return f"{name} {value}: above QEMU's largest throttle ({MAX_DISK_VALUE})"
    return None
