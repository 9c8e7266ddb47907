"""Where a VM's CPU signals come from (docs/contention.md): libvirt's domain stats, its vCPU cgroups, the host.

A VM that uses less CPU than it needs does so for one of three reasons,
and a need estimate must tell them apart: it wanted less (its demand), its
own cap held it back (throttled), or its vCPU threads were runnable but
queued behind other work on a host CPU (delayed: the guest sees it as steal
time).  Used CPU is the need only in the first case; in the other two it is a
lower bound (:mod:`vcsched.control.observe`).

* **used**: ``cpu.time`` of ``getAllDomainStats`` / ``domainListGetStats``
  (``VIR_DOMAIN_STATS_CPU_TOTAL``): vCPUs and emulator thread, in ns.
* **delay** and **wait**: ``vcpu.N.delay`` and ``vcpu.N.wait`` of the same
  call (``VIR_DOMAIN_STATS_VCPU``).  libvirt reads ``delay`` from the vCPU
  threads' ``/proc/PID/task/TID/schedstat`` (its second field, run-queue
  delay); ``wait`` (I/O wait) only where the driver reports it.  A VM
  without them (an older libvirt, another driver) has None: not measured.
* **throttled**: the ``cpu.stat`` of the VM's vCPU cgroups (``vcpu_quota``
  is set on each vCPU's own cgroup): ``nr_periods``, ``nr_throttled``,
  ``throttled_time``.  libvirt does not report them, so they are read from
  the cgroup file system, which only works for a host on this machine (a
  ``qemu:///`` or ``qemu+unix://`` URI) whose cpu controller is mounted; the
  domain's cgroup is found under its ``<resource><partition>``.  Elsewhere:
  None, and the estimate falls back on "used about its cap".
* **host pressure**: ``/proc/pressure/cpu`` (the machine's ``some`` stall
  time) and the ``steal`` column of ``/proc/stat`` (this machine being a VM
  itself): for the machine vcsched runs on, shown beside the per-VM signals.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypervisor.base import CpuCounters

#: The cpu controller's mount points, the cgroup v1 one first (the v2 one has ``cpu.stat`` with
#: ``nr_throttled`` only where the cpu controller is enabled in it).
CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup"))
PRESSURE = Path("/proc/pressure/cpu")
PROC_STAT = Path("/proc/stat")


def local_uri(uri: str) -> bool:
    """Whether ``uri`` names a libvirt daemon on this machine (its cgroups are this machine's)."""
    scheme, _, rest = uri.partition("://")
    return scheme.split("+")[0] in ("qemu", "kvm") and ("+unix" in scheme or rest.startswith("/"))


def vcpu_sums(stats: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``(delay_ns, wait_ns)`` summed over the vCPUs of one domain's stats (None: the field is not reported)."""
    count = int(stats.get("vcpu.current", stats.get("vcpu.maximum", 0)) or 0)
    sums: list[int | None] = []
    for field in ("delay", "wait"):
        values = [stats.get(f"vcpu.{i}.{field}") for i in range(count)]
        present = [int(v) for v in values if v is not None]
        sums.append(sum(present) if present and len(present) == len(values) else None)
    return sums[0], sums[1]


@dataclass(frozen=True)
class Throttling:
    """Cumulative ``cpu.stat`` counters of a VM's vCPU cgroups, summed."""

    periods: int
    throttled_periods: int
    throttled_ns: int


def parse_cpu_stat(text: str) -> Throttling | None:
    """A ``cpu.stat`` file's throttling counters (v1: ``throttled_time`` ns; v2: ``throttled_usec``)."""
    fields = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
    if "nr_periods" not in fields or "nr_throttled" not in fields:
        return None
    ns = int(fields["throttled_time"]) if "throttled_time" in fields else int(fields.get("throttled_usec", 0)) * 1000
    return Throttling(int(fields["nr_periods"]), int(fields["nr_throttled"]), ns)


def partition_of(xml: str) -> str:
    """The domain's cgroup partition (``<resource><partition>``; libvirt's default ``/machine``)."""
    node = ET.fromstring(xml).find("./resource/partition")
    return node.text.strip() if node is not None and node.text else "/machine"


def domain_cgroup(partition: str, dom_id: int, name: str, roots: tuple[Path, ...] = CGROUP_ROOTS) -> Path | None:
    """The directory of a running domain's cgroup in the cpu controller, None when it cannot be found.

    libvirt names it ``qemu-ID-NAME.libvirt-qemu`` under the partition (each partition component with
    ``.partition`` appended, the default ``machine`` without) when it manages cgroups itself, and
    ``machine-qemu\\x2dID\\x2dNAME.scope`` under ``machine.slice`` with systemd: both are looked for, nothing
    else is guessed.
    """
    parts = [p for p in partition.strip("/").split("/") if p]
    escaped = [p if p == "machine" else f"{p}.partition" for p in parts]
    systemd_name = name.replace("-", "\\x2d")
    wanted = (f"qemu-{dom_id}-{name}.libvirt-qemu", f"machine-qemu\\x2d{dom_id}\\x2d{systemd_name}.scope")
    for root in roots:
        for base in (root.joinpath(*escaped), root / "machine.slice"):
            for leaf in wanted:
                if (base / leaf / "cpu.stat").is_file():
                    return base / leaf
    return None


def read_throttling(directory: Path) -> Throttling | None:
    """The summed ``cpu.stat`` of the domain's ``vcpuN`` cgroups (where ``vcpu_quota`` applies), or of the
    domain's own cgroup when it has none; None when unreadable (the domain stopped meanwhile)."""
    try:
        vcpus = sorted(directory.glob("vcpu[0-9]*/cpu.stat")) or [directory / "cpu.stat"]
        parsed = [parse_cpu_stat(p.read_text()) for p in vcpus]
    except OSError:
        return None
    if not parsed or any(t is None for t in parsed):
        return None
    return Throttling(sum(t.periods for t in parsed if t), sum(t.throttled_periods for t in parsed if t),
                      sum(t.throttled_ns for t in parsed if t))


def counters(cpu_ns: int, stats: Mapping[str, Any], throttling: Throttling | None) -> CpuCounters:
    delay, wait = vcpu_sums(stats)
    if throttling is None:
        return CpuCounters(cpu_ns, delay_ns=delay, wait_ns=wait)
    return CpuCounters(cpu_ns, throttling.throttled_ns, throttling.throttled_periods, throttling.periods, delay, wait)


@dataclass(frozen=True)
class HostPressure:
    """This machine's CPU pressure: cumulative ``some`` stall (µs, /proc/pressure/cpu) and steal (USER_HZ ticks,
    /proc/stat); None where the file or field does not exist (a kernel without PSI, a kernel before 2.6.11)."""

    some_us: int | None
    steal_ticks: int | None


def parse_pressure(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("some "):
            fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            return int(fields["total"]) if "total" in fields else None
    return None


def parse_steal(text: str) -> int | None:
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            return int(fields[8]) if len(fields) > 8 else None
    return None


def host_pressure(pressure: Path = PRESSURE, stat: Path = PROC_STAT) -> HostPressure:
    def read(path: Path) -> str | None:
        try:
            return path.read_text()
        except OSError:
            return None

    p, s = read(pressure), read(stat)
    return HostPressure(None if p is None else parse_pressure(p), None if s is None else parse_steal(s))
