"""The small interface the executor and the CLI need from a hypervisor (cf. Cosmic Python's adapters).

Two implementations: :mod:`hypervisor.libvirt_backend` (real hosts, one libvirt
connection per host URI) and :mod:`hypervisor.memory` (a dict, for tests and
dry runs).  Everything above this line — admission, plans, the executor —
receives a ``Hypervisor`` and never imports libvirt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from vcsched.errors import VcschedError
from vcsched.formats.throttles import MigrationThrottles
from vcsched.inventory import Inventory, VmMeta, VmState
from vcsched.iocaps import IoCaps, VmDevices
from vcsched.plans.steps import CreateStep

if TYPE_CHECKING:
    from vcsched.plans.repair import RepairReport


class HypervisorError(VcschedError):
    """A host refused or failed an operation; the message names the host (and the VM).

    Exit 1: the input was fine, a host was not (bad input is :class:`vcsched.errors.InputError`, exit 2).
    """

    exit_code = 1


class VmInDoubt(HypervisorError):
    """A step was asked to act on a VM that is in doubt (copies on several hosts, or a paused arrival): refused,
    naming its copies; ``vcsched repair`` settles it (docs/repair.md, "A VM never runs twice")."""


class HostReadBug(VcschedError):
    """vcsched could not make sense of what a host answered (its own parsing failed: ``ET.ParseError``,
    ``KeyError``, ``ValueError`` ...): a bug in vcsched, not a down host.

    Reported as such (exit 70, asking for a report) instead of marking the host down, which would make its VMs
    vanish from the inventory and let a plan treat the host as empty.
    """

    exit_code = 70


class Hypervisor(Protocol):
    #: Whether the cluster lock is still ours, set by its holder while it acts (None: not watched): a
    #: migration that would outlive the lock's lease is aborted.
    lease: Callable[[], bool] | None
    @property
    def throttles(self) -> MigrationThrottles:
        """The cluster's migration throttles (cluster file): how many migrations the executor runs at once, and
        each one's bandwidth and timeout."""
        ...

    def inventory(self, hosts: Iterable[str] | None = None) -> Inventory:
        """Every host's capacity and every domain on it, managed or not; only ``hosts`` when given.

        A host that does not answer is in the inventory as *down* (with the
        reason), without VMs: one host down is a fact to report, not a
        reason to stop.  Unknown host names raise.
        """
        ...

    def find_vm(self, name: str) -> VmState | None:
        """The domain ``name`` wherever it is now, or None.

        Raises :class:`VmInDoubt` when it has active copies on several hosts or its one copy is a paused
        arrival: never "the first copy found", which a step could then act on while another copy runs.
        """
        ...

    def create_problems(self, step: CreateStep, where: str, *, define: bool = True) -> list[str]:
        """Why ``step`` could not create its VM, found before a plan's first step (its boot files, its domain
        XML as the target host's driver validates it); each problem names ``where`` (``plan.steps[3]``).
        ``define=False`` (a dry run, which holds no lock and so changes nothing on any host): not the driver's
        validation, which defines a throw-away domain; ``--apply`` runs it before its first step."""
        ...

    def create_vm(self, step: CreateStep) -> None:
        """Create and start a managed VM on ``step.host`` with its metadata and cap from the first instant."""
        ...

    def set_cap(self, host: str, vm: str, cap_cores: float) -> None:
        """Cap a running managed VM to ``cap_cores`` cores (live, and persistent config if it has one)."""
        ...

    def set_need(self, host: str, vm: str, cpu_need_cores: float) -> None:
        """Rewrite the CPU need in a managed VM's metadata (live, and persistent config if it has one)."""
        ...

    def adopt_vm(self, host: str, vm: str, meta: VmMeta, cap_cores: float) -> None:
        """Make running unmanaged ``vm`` managed where it runs: write ``meta`` into it (live and persistent) and cap
        it at ``cap_cores`` (docs/introducing.md).  Refuses a domain that is already managed."""
        ...

    def release_vm(self, host: str, vm: str) -> None:
        """Make managed ``vm`` unmanaged: remove its CPU cap and vcsched's metadata; it keeps running untouched."""
        ...

    def domain_definition(self, host: str, vm: str) -> str:
        """``vm``'s domain XML as libvirt would define it again (its persistent definition, else its live one):
        what adopting it records for a restart elsewhere."""
        ...

    def remove_vm(self, host: str, vm: str) -> None:
        """Stop a managed VM on ``host`` and forget it (undefine, if persistent); refuses unmanaged domains."""
        ...

    def migrate_vm(self, vm: str, source: str, target: str, cap_cores: float, *,
                   timeout_s: float | None = None) -> None:
        """Live-migrate a running managed VM from ``source`` to ``target``, arriving capped at ``cap_cores``.

        ``timeout_s``: abort the migration once it has run that long (the cluster's
        ``migration_timeout_per_gib`` times what it moves); it then fails like any other.

        Raises HypervisorError on failure, saying where the VM was left.  A failure usually leaves it running on
        ``source`` (libvirt resumes the source when the migration fails before its end), possibly with a paused
        copy on ``target`` that could not be removed.  But a failure at the end — the destination's copy
        arrived, the source copy is gone, and resuming the destination failed or the source could not be
        checked — leaves it **paused on** ``target``: in doubt, never resumed by the step, settled by
        :meth:`repair` once every host answers.  Either way at most one copy runs.
        """
        ...

    def repair(self, guard: Callable[[], None], *, apply: bool = True,
               inventory: Inventory | None = None, fenced: frozenset[str] = frozenset()) -> RepairReport:
        """Settle in-doubt VMs (:mod:`hypervisor.settlement`): only under the cluster lock (``guard``, called
        before every action), each once every host that may hold another copy of it answered or is asleep
        (powered off empty by vcsched: ``inventory`` read now with the power record's marks, else read here).
        ``apply=False``: what it would do.  ``fenced``: hosts a recovery powered off that have not answered since
        (they hold no copy: the definitions store's fence marks)."""
        ...

    def realised_cap(self, host: str, vcpus: int, cap_cores: float) -> float:
        """The cap ``host`` actually holds (and reads back) when asked for ``cap_cores`` on a ``vcpus``-vCPU VM."""
        ...

    def lists(self, host: str, vm: str) -> bool:
        """Whether ``host`` has a domain named ``vm`` in any state (running, paused or only defined)."""
        ...

    def read_cap(self, host: str, vm: str) -> float | None:
        """The VM's cap in cores as the hypervisor reports it (None: uncapped)."""
        ...

    def cpu_time_ns(self, host: str, vm: str) -> int | None:
        """Cumulative CPU time of the VM in ns (None where the backend cannot measure)."""
        ...

    def cpu_counters(self, host: str, vm: str) -> CpuCounters | None:
        """Cumulative CPU time, time held back by its cap and time waiting for a host CPU (docs/contention.md);
        None where the backend cannot measure, a None field where that one signal is not available there."""
        ...

    # ---- disk and network (vcsched.iocaps) ----

    def set_io_caps(self, host: str, vm: str, caps: IoCaps) -> None:
        """Cap a running managed VM's disks and/or network: the fields ``caps`` gives, the others unchanged.

        Live, and in its persistent config if it has one.  Refused (nothing
        changed) when the host's driver cannot cap that resource, the VM has
        no such device, or the value is below libvirt's minimum.
        """
        ...

    def read_io_caps(self, host: str, vm: str) -> IoCaps:
        """The VM's disk and network caps as the hypervisor reports them (None fields: uncapped)."""
        ...

    def realised_io_caps(self, host: str, devices: VmDevices, caps: IoCaps) -> IoCaps:
        """The caps ``host`` holds (and reads back) when asked for ``caps`` on a VM with ``devices``."""
        ...

    def planned_devices(self, step: CreateStep) -> VmDevices:
        """The disks and interfaces the VM ``step`` creates will have (from its boot)."""
        ...

    def io_counters(self, host: str, vm: str) -> IoCounters | None:
        """Cumulative disk and network bytes of the VM (None where the backend cannot measure)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CpuCounters:
    """A VM's cumulative CPU counters, in ns, read together (docs/contention.md says where each comes from).

    ``cpu_ns``: what it used (libvirt ``cpu.time``).  ``throttled_ns`` / ``throttled_periods`` / ``periods``:
    its vCPU cgroups' ``cpu.stat`` (``throttled_time``, ``nr_throttled``, ``nr_periods``): time and CFS periods
    its own cap held it back.  ``delay_ns``: the sum of libvirt's ``vcpu.N.delay``, time its vCPU threads were
    runnable but queued behind other work on a host CPU (the guest's steal time).  ``wait_ns``: the sum of
    ``vcpu.N.wait`` (time a vCPU waited for I/O) where the driver reports it.  None: not available there —
    the sampler names what is missing instead of guessing (:mod:`acting.sampling`).
    """

    cpu_ns: int
    throttled_ns: int | None = None
    throttled_periods: int | None = None
    periods: int | None = None
    delay_ns: int | None = None
    wait_ns: int | None = None

    def missing(self) -> tuple[str, ...]:
        """The signals this reading lacks, by the names docs/contention.md uses."""
        return tuple(name for name, value in (("throttled", self.throttled_periods), ("delay", self.delay_ns),
                                              ("wait", self.wait_ns)) if value is None)


@dataclass(frozen=True)
class IoCounters:
    """Cumulative bytes a VM moved: read + written on all its disks (``blockStats``), and received and sent
    on all its interfaces (``interfaceStats``, the guest's view: rx = into the guest)."""

    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int


@dataclass(frozen=True)
class Usage:
    """What a VM used over one sample window, per second (None: not measurable there)."""

    cores: float | None
    disk_bps: float | None = None
    net_rx_bps: float | None = None
    net_tx_bps: float | None = None


def measure_usage(hv: Hypervisor, vms: Iterable[VmState], seconds: float,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, Usage]:
    """CPU cores, disk and network bytes per second each running VM used over ``seconds``: two samples.

    All VMs are sampled together (one window), so the numbers are comparable
    with each other and with the caps.
    """
    running = [v for v in vms if v.active]
    t0 = time.monotonic()
    first = {v.name: (hv.cpu_time_ns(v.host, v.name), hv.io_counters(v.host, v.name)) for v in running}
    sleep(seconds)
    second = {v.name: (hv.cpu_time_ns(v.host, v.name), hv.io_counters(v.host, v.name)) for v in running}
    elapsed = time.monotonic() - t0
    out: dict[str, Usage] = {}
    for v in running:
        (c0, io0), (c1, io1) = first[v.name], second[v.name]
        if elapsed <= 0:
            out[v.name] = Usage(None)
            continue
        cores = None if c0 is None or c1 is None else (c1 - c0) / 1e9 / elapsed
        if io0 is None or io1 is None:
            out[v.name] = Usage(cores)
            continue
        out[v.name] = Usage(cores, (io1.disk_bytes - io0.disk_bytes) / elapsed,
                            (io1.net_rx_bytes - io0.net_rx_bytes) / elapsed,
                            (io1.net_tx_bytes - io0.net_tx_bytes) / elapsed)
    return out


def measure_cores(hv: Hypervisor, vms: Iterable[VmState], seconds: float,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, float | None]:
    """Cores each running VM used over ``seconds``: two CPU-time samples, difference over the elapsed time.

    All VMs are sampled together (one window), so the numbers are comparable
    with each other and with the caps; None where the backend cannot measure.
    (:func:`measure_usage` samples disk and network in the same window.)
    """
    return {name: u.cores for name, u in measure_usage(hv, vms, seconds, sleep).items()}
