"""What a cluster holds right now: hosts, VMs (managed or not) and their caps, as plain values.

A hypervisor backend (:mod:`hypervisor`) reads this; the core decides from it.

The **snapshot hash** names the inventory a plan was computed from, so that
``vcsched apply`` can refuse a plan made for a cluster that has changed since.
It covers the *inputs* of the decision: each host's name and usable cores,
and every running VM's name, host, memory, vCPUs and (for managed VMs)
virtual cluster and CPU need.  It deliberately leaves out

* hosts' memory — libvirt's node memory drifts between calls on a live host
  (measured on the lab: ``getInfo`` said 4698 MiB, then 5082 MiB minutes
  later), which would refuse every saved plan; the VMs' memory is covered;
* current caps — they are the decision's *output*; a plan rewrites them, and
  a half-applied plan must still match its own snapshot so a re-run converges;
* the VMs the plan itself creates (``exclude``), for the same reason;
* the host of the VMs the plan moves (``moving``): a half-applied
  migration plan has already moved some of them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from vcsched.iocaps import IoCaps, VmDevices

#: Namespace of vcsched's domain metadata (the contract between the libvirt-side modules).
METADATA_NS = "https://vcsched.dev/xmlns/vm/1"
METADATA_PREFIX = "vcsched"


@dataclass(frozen=True)
class VmMeta:
    """What vcsched records in a managed domain's metadata (``<vcsched:vm .../>``)."""

    cluster: str
    cpu_need_cores: float
    memory_bytes: int
    vcpus: int
    min_yield: float | None = None  # the floor its request was admitted with; later admissions keep to it
    # The multi-resource fields of its request (docs/policies.md), absent from older metadata:
    disk_bps: int | None = None  # disk bytes/s one VM uses alone
    net_bps: int | None = None  # network bytes/s one VM uses alone
    weight: float = 1.0
    tenant: str | None = None  # its leaf of the cluster file's tenant tree
    # Placement rules of its request (docs/rules.md), absent from older metadata:
    spread: str | None = None  # "required" / "preferred": no two VMs of its virtual cluster on one host
    together: str | None = None  # "required" / "preferred": all on one host
    pinned: bool = False  # never migrated: its host is fixed
    #: Unix time of the VM's last live migration (None: never migrated).  Written into the domain XML the VM
    #: arrives with, so `vcsched run` (any leader, after any restart) keeps it put for its cool-down.
    migrated_at: float | None = None
    #: Restart order after a host failure (higher first), from its request; kept in the definitions store.
    priority: int = 0
    #: How many migration attempts the VM's state has been through (0: never migrated, or metadata older than
    #: generations).  Raised on the source *before* each attempt and written, the same number, into the
    #: destination's XML (:mod:`hypervisor.migration`), so that after interrupted migrations repair can name the
    #: copy holding the newest state (:mod:`hypervisor.settlement`, "Which paused copy is the newest").
    generation: int = 0
    #: The destination of the VM's last migration attempt while that attempt may have left a copy there (set on
    #: the source with the generation, cleared once the attempt's destination is verified clean): no step
    #: migrates the VM again while that host does not answer (:func:`vcsched.plans.check.copy_holder_down`).
    migrating_to: str | None = None
    #: Set on a paused arrival once libvirt reported its migration complete (``migrate3`` returned: the destination
    #: finished and the source was confirmed, not cancelled, so libvirt never resumes the source): this copy holds
    #: the newest state whatever becomes of the source's host (:func:`hypervisor.migration.mark_completed`);
    #: dropped with ``arriving_from`` when the arrival is resumed.
    completed: bool = False

    def io_needs(self) -> dict[str, int]:
        """``{"disk": bytes/s, "net": bytes/s}`` for the extra resources this VM needs."""
        return {r: v for r, v in (("disk", self.disk_bps), ("net", self.net_bps)) if v is not None}


@dataclass(frozen=True)
class VmState:
    """One domain on one host.  ``meta`` None = unmanaged: reported, never touched."""

    name: str
    host: str
    vcpus: int
    memory_bytes: int
    active: bool
    meta: VmMeta | None = None
    cap_cores: float | None = None  # None: no cap (or not readable, e.g. inactive)
    devices: VmDevices = field(default_factory=VmDevices)  # the disks and interfaces disk/net caps apply to
    io_caps: IoCaps = field(default_factory=IoCaps)  # its disk and network caps (not readable when inactive)
    uuid: str | None = None  # libvirt's UUID: the same VM on two hosts has the same one
    paused: bool = False  # active but not running (e.g. the destination copy of a migration not yet resumed)
    #: A copy of a VM (same UUID) also present on another host: reported, never acted on until resolved.
    in_doubt: bool = False
    #: Bytes its disks occupy on the host (allocation): what a move to a host with other storage copies.
    disk_bytes: int = 0
    #: Set on the paused destination copy of a migration until vcsched resumes it (the source host's name).
    arriving_from: str | None = None
    #: An unmanaged domain's measured CPU reservation in cores (:func:`vcsched.control.unmanaged.reservation`:
    #: a high percentile of its use over a sampling window).  None: not measured; :attr:`reserved` then takes
    #: the most it can use (its cap, else every vCPU).  Ignored for managed VMs, whose caps bound them.
    measured_reserve: float | None = None
    #: An unmanaged domain's measured disk and network reservations, ``(resource, bytes/s)``
    #: (:func:`vcsched.control.unmanaged.io_reservation`).  Empty: not measured, and then nothing is reserved
    #: (unlike CPU: a domain's most possible I/O is unbounded, docs/introducing.md).
    measured_io: tuple[tuple[str, float], ...] = ()

    @property
    def managed(self) -> bool:
        return self.meta is not None and not self.in_doubt

    @property
    def cluster(self) -> str | None:
        return self.meta.cluster if self.meta else None

    @property
    def cap_or_vcpus(self) -> float:
        """The cores it may use now: its cap, or every vCPU when it has none."""
        return self.cap_cores if self.cap_cores is not None else float(self.vcpus)

    @property
    def unmanaged(self) -> bool:
        """Running and not vcsched's (no metadata): its CPU is reserved on its host, never capped or moved.

        A copy in doubt is not counted: it is a managed VM's, and the other copy's cap covers it."""
        return self.active and self.meta is None

    @property
    def reserved(self) -> float:
        """The cores reserved for this unmanaged domain: what was measured, else the most it can use.

        Never above its cap or its vCPUs (it cannot use more), so a bursty measurement does not over-reserve."""
        bound = self.cap_or_vcpus
        return bound if self.measured_reserve is None else min(self.measured_reserve, bound)


@dataclass(frozen=True)
class HostState:
    """One host as read now.  ``down`` (the reason) when it did not answer: its VMs are unknown, and nothing is
    planned onto it or off it until it answers again."""

    name: str
    cores: int  # usable cores (the cluster file's override, else libvirt's count)
    memory_bytes: int  # physical memory libvirt reports
    memory_reserved: int = 0
    down: str | None = None
    #: Declared capacities (cluster file ``disk_bps``/``net_bps``, bytes per second; None: not declared).
    disk_bps: int | None = None
    net_bps: int | None = None
    #: ``(resource, why)`` for each resource (``cpu``, ``disk``, ``net``) its driver cannot cap (e.g. Xen disks; the
    #: test driver caps nothing).
    cannot_cap: tuple[tuple[str, str], ...] = ()
    #: Its storage group (the cluster file's ``storage``, by default the host's own name): a VM moving between
    #: hosts of different groups copies its disks too.  None: not known (moves cost memory only).
    storage: str | None = None
    #: libvirt's UUID of the host (capabilities ``<host><uuid>``): who the host *is*, however its URI is spelled.
    #: None: not read, or its driver reports none (libvirt's test driver).
    uuid: str | None = None
    #: Powered off by vcsched's power saving (docs/power.md; ``down`` then says so): not a failed host — never
    #: fenced, nothing of it restarted — and, like a down host, nothing planned onto it.
    asleep: bool = False
    #: For a host :attr:`asleep`, the power record's word for it: ``sleeping``, ``waking`` or ``wake-failed`` (its
    #: last wake failed: not chosen again until ``vcsched power clear``).  None for a host not asleep.
    power: str | None = None
    #: For a host :attr:`asleep`: it answers all the same, with no domain (switched on outside vcsched, or its
    #: power-off or wake cut short); still read as asleep — nothing planned onto it — until a wake records it on.
    answers_asleep: bool = False

    def capacity(self, resource: str) -> int | None:
        """Declared bytes per second of ``disk`` or ``net`` (None: the cluster file does not say)."""
        return self.disk_bps if resource == "disk" else self.net_bps

    def cap_problem(self, resource: str) -> str | None:
        """Why this host's driver cannot cap ``resource``, or None."""
        return next((why for r, why in self.cannot_cap if r == resource), None)

    @property
    def usable_memory(self) -> int:
        return max(self.memory_bytes - self.memory_reserved, 0)


@dataclass(frozen=True)
class InDoubt:
    """One VM (by UUID) that no plan may act on until it is settled: after an interrupted migration.

    Either active on more than one host, or a lone paused *arrival* (a migration's destination copy that
    vcsched has not resumed: its source may still hold a copy, on a host that was not read).  ``vcsched
    repair`` settles what it safely can (docs/repair.md); reading never does.  ``resolved``: kept for the
    reports' shape, always None in an inventory (reading settles nothing).
    """

    vm: str
    uuid: str
    hosts: tuple[str, ...]
    states: tuple[str, ...]  # "running" / "paused", per host
    resolved: str | None = None
    #: Per host: the source host a paused arrival names (``arriving_from``), else None.
    arriving_from: tuple[str | None, ...] = ()
    #: Per host: the copy's migration generation (:attr:`VmMeta.generation`; None: no vcsched metadata).
    generations: tuple[int | None, ...] = ()


def find_in_doubt(vms: tuple[VmState, ...]) -> tuple[InDoubt, ...]:
    """Every UUID active on two or more hosts, and every lone paused arrival, in name order."""
    by_uuid: dict[str, list[VmState]] = {}
    for v in vms:
        if v.uuid is not None and v.active:
            by_uuid.setdefault(v.uuid, []).append(v)
    out = [InDoubt(copies[0].name, u, tuple(c.host for c in copies),
                   tuple("paused" if c.paused else "running" for c in copies),
                   arriving_from=tuple(c.arriving_from if c.paused else None for c in copies),
                   generations=tuple(c.meta.generation if c.meta is not None else None for c in copies))
           for u, copies in by_uuid.items()
           if len({c.host for c in copies}) > 1 or any(c.paused and c.arriving_from is not None for c in copies)]
    return tuple(sorted(out, key=lambda d: (d.vm, d.uuid)))


def mark_in_doubt(vms: tuple[VmState, ...], doubts: tuple[InDoubt, ...]) -> tuple[VmState, ...]:
    """``vms`` with every copy of a doubtful VM marked ``in_doubt`` (so :attr:`VmState.managed` is False)."""
    bad = {d.uuid for d in doubts if d.resolved is None}
    return tuple(replace(v, in_doubt=True) if v.uuid in bad and v.active else v for v in vms)


@dataclass(frozen=True)
class Inventory:
    cluster: str
    hosts: tuple[HostState, ...]
    vms: tuple[VmState, ...]
    #: VMs found on two hosts at once (see :class:`InDoubt`); their copies are marked ``in_doubt``.
    in_doubt: tuple[InDoubt, ...] = ()

    def host(self, name: str) -> HostState:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def vm(self, name: str) -> VmState | None:
        for v in self.vms:
            if v.name == name:
                return v
        return None

    @functools.cached_property
    def _by_host(self) -> dict[str, tuple[VmState, ...]]:
        """VMs grouped by host once (1,000 hosts x 10,000 VMs: a scan per host cost seconds)."""
        out: dict[str, list[VmState]] = {}
        for v in self.vms:
            out.setdefault(v.host, []).append(v)
        return {h: tuple(vs) for h, vs in out.items()}

    def vms_on(self, host: str) -> tuple[VmState, ...]:
        return self._by_host.get(host, ())

    def managed(self) -> tuple[VmState, ...]:
        return self._managed

    @functools.cached_property
    def _managed(self) -> tuple[VmState, ...]:
        """Computed once: one command asks several times (``place`` four, 10,000 VMs each)."""
        return tuple(v for v in self.vms if v.managed and v.active)

    def managed_on(self, host: str) -> tuple[VmState, ...]:
        """The running managed VMs of one host (what its failure would displace)."""
        return tuple(v for v in self.vms_on(host) if v.managed and v.active)

    def unmanaged_cores(self, host: str) -> float:
        """Cores reserved on ``host`` for its running unmanaged domains (docs/introducing.md).

        vcsched cannot cap or move them, so every plan keeps this much of the host for them: the one
        mechanism is :meth:`usable_cores`, which the model's hosts (admission, placement, adapt, drain,
        headroom, failover room, the controller) are built from."""
        return self._held_by_host[0].get(host, 0.0)

    @functools.cached_property
    def _held_by_host(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each host's unmanaged reservation and the caps of its copies in doubt (:meth:`doubtful_cores`), summed in
        one pass over the VMs (a pass per host doubled ``model_hosts`` at 1,000 hosts and 10,000 VMs: 10 ms to
        22 ms)."""
        unmanaged: dict[str, float] = {}
        doubtful: dict[str, float] = {}
        for v in self.vms:
            if not v.active:
                continue
            if v.meta is None:
                unmanaged[v.host] = unmanaged.get(v.host, 0.0) + v.reserved
            if v.in_doubt:
                doubtful[v.host] = doubtful.get(v.host, 0.0) + v.cap_or_vcpus
        return unmanaged, doubtful

    def unmanaged_io(self, host: str, resource: str) -> float:
        """Bytes/s of ``resource`` (``disk``/``net``) reserved on ``host`` for its running unmanaged domains'
        measured I/O; :func:`vcsched.control.sharing.host_capacities` takes it off the host's declared rate."""
        return self._unmanaged_io_by_host.get((host, resource), 0.0)

    @functools.cached_property
    def _unmanaged_io_by_host(self) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for v in self.vms:
            if v.active and v.meta is None:
                for r, bps in v.measured_io:
                    out[(v.host, r)] = out.get((v.host, r), 0.0) + bps
        return out

    def usable_cores(self, host: HostState) -> float:
        """``host``'s cores less its unmanaged reservation and the caps of the copies in doubt it holds (never
        below 0: a host its unmanaged domains fill gets nothing planned onto it)."""
        return max(host.cores - self.unmanaged_cores(host.name) - self.doubtful_cores(host.name), 0.0)

    def doubtful_cores(self, host: str) -> float:
        """Cores held on ``host`` by running copies of VMs in doubt: no plan acts on them, but repair may resume
        one where it stands, so the whole-plan check keeps its cap (vcsched/plans/check.py), and every plan is
        built around it too.  Left out, a recovery planned that host's caps full while a paused arrival sat on it,
        and the check refused the recovery at every interval: the VMs of the failed host stayed down (found by
        the fault simulation, seed 1, schedule 7157, docs/faultsim.md)."""
        return self._held_by_host[1].get(host, 0.0)

    def with_reserves(self, reserves: dict[str, float],
                      io: dict[str, tuple[tuple[str, float], ...]] | None = None) -> Inventory:
        """This inventory with the measured reservations of some unmanaged domains: ``reserves`` name -> cores,
        ``io`` name -> ``(resource, bytes/s)`` pairs."""
        io = io or {}
        if not reserves and not io:
            return self

        def measured(v: VmState) -> VmState:
            if v.meta is not None or (v.name not in reserves and v.name not in io):
                return v
            return replace(v, measured_reserve=reserves.get(v.name, v.measured_reserve),
                           measured_io=io.get(v.name, v.measured_io))

        vms = tuple(measured(v) for v in self.vms)
        return Inventory(self.cluster, self.hosts, vms, self.in_doubt)

    def up(self) -> Inventory:
        """The hosts that answered, and their VMs: what planning may use (a down host gets nothing)."""
        if all(h.down is None for h in self.hosts):
            return self
        hosts = tuple(h for h in self.hosts if h.down is None)
        names = {h.name for h in hosts}
        return Inventory(self.cluster, hosts, tuple(v for v in self.vms if v.host in names), self.in_doubt)

    def down_hosts(self) -> tuple[HostState, ...]:
        """The hosts that did not answer and are not asleep (docs/power.md): failed, or failing."""
        return tuple(h for h in self.hosts if h.down is not None and not h.asleep)

    def asleep_hosts(self) -> tuple[HostState, ...]:
        """The hosts vcsched's power saving powered off (:attr:`HostState.asleep`)."""
        return tuple(h for h in self.hosts if h.asleep)

    def clusters(self) -> tuple[str, ...]:
        return self._clusters

    @functools.cached_property
    def _clusters(self) -> tuple[str, ...]:
        return tuple(sorted({v.meta.cluster for v in self.vms if v.meta is not None}))

    @property
    def reference_cores(self) -> int:
        """n_ref: the reference host has the most usable cores of any host (docs/model.md, units)."""
        return max(h.cores for h in self.hosts)

    @property
    def reference_memory(self) -> int:
        return max(h.usable_memory for h in self.hosts)


def canonical(inventory: Inventory, exclude: frozenset[str] = frozenset(),
              moving: frozenset[str] = frozenset(), renewing: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The decision inputs as a JSON-ready value with a fixed order (see the module docstring)."""
    hosts = [{"name": h.name, "cores": h.cores, **({"down": True} if h.down is not None else {})}
             for h in sorted(inventory.hosts, key=lambda h: h.name)]
    vms = []
    for v in sorted(inventory.vms, key=lambda v: v.name):
        if v.name in exclude or not v.active:
            continue
        entry: dict[str, Any] = {"name": v.name, "memory": v.memory_bytes, "vcpus": v.vcpus}
        if v.name not in moving:
            entry["host"] = v.host
        if v.meta is not None:
            entry["cluster"] = v.meta.cluster
            if v.name not in renewing:
                entry["cpu_need_cores"] = round(v.meta.cpu_need_cores, 9)
        vms.append(entry)
    return {"cluster": inventory.cluster, "hosts": hosts, "vms": vms}


def snapshot_hash(inventory: Inventory, exclude: frozenset[str] = frozenset(),
                  moving: frozenset[str] = frozenset(), renewing: frozenset[str] = frozenset()) -> str:
    """sha256 of :func:`canonical`.

    ``exclude``: VMs a plan creates or removes; ``moving``: VMs it migrates
    (their host is left out); ``renewing``: VMs whose recorded need it
    rewrites (their need is left out).  Each is what a half-applied plan
    has already changed, so it still matches.
    """
    text = json.dumps(canonical(inventory, exclude, moving, renewing), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
