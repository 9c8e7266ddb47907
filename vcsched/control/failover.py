"""Room for host failures: where a host's managed VMs would run if it died (N+1), in the pure core.

One question, asked by three commands: *the VMs of host h are gone; do they
fit on the survivors?*

* admission with ``failures_tolerated = 1`` (cluster file) asks it, for every
  host, of the cluster as it would be after the request (vSphere HA's "host
  failures cluster tolerates", Ganeti's N+1), and refuses the request when some
  host's VMs would not fit (:func:`failover_refusal`);
* ``status`` shows the answer for every host (:func:`headroom`);
* ``recover`` (and the controller) place a failed host's VMs with it
  (:func:`failover`), most important first, and report the rest as stranded.

**What must fit.**  Memory is rigid: every VM needs all of its memory.  CPU
is fluid, so a VM needs only its virtual cluster's *floor*: the ``min_yield``
its request was admitted with (recorded in its metadata), or the cluster
file's ``min_yield`` when higher, times its CPU need — 0 when neither says
anything, so that with no floors failover room is memory alone.  The
survivors' own VMs stay where they are and need their floors too.

**How.**  With every job's CPU need scaled by its floor, "fits at the floors"
is the one placement probe (:class:`vcsched.solvers.search.ResidualRoom`) at
yield 1; then, scaled by ``max(floor, L)``, the highest common level ``L`` it
still places at is searched (:func:`vcsched.solvers.yield_search.bisect_yield`),
so that a restart spreads the load rather than filling the first host.  The
survivors' VMs are the fixed tasks, the displaced ones the pool, honouring
maintenance and spread (a displaced VM does not join another VM of its spread
virtual cluster on a survivor) through the one rule loop
(:func:`vcsched.solvers.registry.place_with_rules`).  A virtual cluster with
VMs on both sides keeps its spread rule only when its surviving VMs honour it
already, and never a together rule (its VMs were on one host, which is gone).
The min yield after the loss is :func:`vcsched.yields.allocate` of that
placement with the real needs, floors first (every VM gets its floor, then
the common level above them: the caps a recovery writes, so that the plan
keeps the floors it was placed at).

Disk and network bytes/s are not part of the question (a failed host's VMs
restart with their recorded caps); CPU and memory are.
"""

from __future__ import annotations

import dataclasses
import itertools
import xml.etree.ElementTree as ET
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vcsched.caps import min_cap, realisable_cap, same_cap
from vcsched.control.admission import Decision, current_caps, existing_jobs, model_hosts
from vcsched.control.lost import unseen_holders
from vcsched.control.unmanaged import full_hosts
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.formats.units import format_size
from vcsched.inventory import Inventory, VmMeta, VmState, snapshot_hash
from vcsched.model import Instance, SolveOptions
from vcsched.plans.ordering import order_steps
from vcsched.plans.plan import BELOW_FLOOR, Plan, VmPrediction
from vcsched.plans.steps import CreateStep, SetCapStep, Step
from vcsched.solvers.algorithm import Placement
from vcsched.solvers.registry import place_with_rules
from vcsched.solvers.search import ResidualRoom
from vcsched.solvers.yield_search import bisect_yield
from vcsched.units import FIT_TOLERANCE, MEMORY_TOLERANCE, YIELD_TOLERANCE
from vcsched.yields import allocate

#: ``status`` computes every host's headroom up to this many hosts (measured: 100 hosts of 10 VMs 0.6 s, 250 hosts
#: 3.7 s, 1,000 hosts 75 s on the loaded 2-core test machine: each host is one placement of the whole cluster).
HEADROOM_MAX_HOSTS = 100

#: How close to the best common yield above the floors a failover placement's search gets.
LEVEL_PRECISION = 1e-3

#: Why a displaced VM that the survivors cannot take is stranded.
NO_ROOM = "no room on the survivors (memory, and CPU at the virtual clusters' floors)"

#: Why one is stranded when the cluster restarts VMs below their floors (``on_failure = "restart"``): CPU is no
#: longer the reason, memory (or a required placement rule) is.
NO_MEMORY = ("not enough memory on the survivors, even below its floor (or a required spread/together rule keeps "
             "it off the hosts that have it)")


def floor_of(cluster: Cluster, meta: VmMeta) -> float:
    """The yield a VM must keep after a failover: its admitted ``min_yield``, or the cluster's when higher."""
    return max(cluster.min_yield, meta.min_yield or 0.0)


@dataclass(frozen=True)
class Failover:
    """Where host ``host``'s managed VMs would run if it failed.

    ``placed``: ``(vm, survivor)`` for the VMs that fit, in the order tried (most important first);
    ``stranded``: ``(vm, why)`` for the others; ``min_yield``: the lowest yield of every managed VM after the
    failover (None: none would run); ``floorless``: the placed VMs whose floor was dropped to place them
    (only when asked: ``below_floor_ok``).
    """

    host: str
    vms: tuple[str, ...]
    placed: tuple[tuple[str, str], ...]
    stranded: tuple[tuple[str, str], ...]
    min_yield: float | None
    floorless: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.stranded

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "vms": list(self.vms), "fits": self.fits,
                "placed": {vm: h for vm, h in self.placed}, "stranded": {vm: why for vm, why in self.stranded},
                "min_yield_after": None if self.min_yield is None else round(self.min_yield, 6)}


def without_hosts(inventory: Inventory, gone: Sequence[str]) -> Inventory:
    """``inventory`` without the hosts ``gone`` and their VMs: the survivors."""
    out = set(gone)
    return Inventory(inventory.cluster, tuple(h for h in inventory.hosts if h.name not in out),
                     tuple(v for v in inventory.vms if v.host not in out), inventory.in_doubt)


def _place(cluster: Cluster, survivors: Inventory, displaced: Sequence[VmState],
           floorless: frozenset[str] = frozenset()) -> tuple[np.ndarray, float | None] | None:
    """Hosts (indexes into ``survivors.hosts``) of ``displaced`` around the survivors' VMs at the floors, and the
    min yield after; None when they do not fit.  A job holding a VM of ``floorless`` is placed at floor 0 (its
    memory must still fit)."""
    if not survivors.hosts:
        return None
    fixed = survivors.managed()
    anywhere = survivors.hosts[0].name  # a stand-in host for existing_jobs' index; the displaced tasks are freed
    pool = tuple(dataclasses.replace(v, host=anywhere, in_doubt=False) for v in displaced)
    existing = existing_jobs(survivors, (*fixed, *pool))
    moving = {v.name for v in displaced}
    pins = tuple(-1 if v.name in moving else h for v, h in zip(existing.vms, existing.hosts, strict=True))
    hosts = model_hosts(survivors, cordoned=cluster.cordoned | full_hosts(survivors))
    real = Instance(hosts, existing.jobs, pinned=pins)
    floors, rules = [], []
    for j, job in enumerate(existing.jobs):
        first = int(real.job_first_task[j])
        meta = existing.vms[first].meta
        assert meta is not None
        fixed_at = [p for p in pins[first:first + job.tasks] if p >= 0]
        members = existing.vms[first:first + job.tasks]
        floors.append(0.0 if any(v.name in floorless for v in members) else floor_of(cluster, meta))
        rules.append((job.spread if len(set(fixed_at)) == len(fixed_at) else None,
                      job.together if not fixed_at else None))

    def placer(attempt: Instance, _: SolveOptions) -> Placement:
        return Placement(hosts=ResidualRoom(attempt).probe("mcb8")(1.0))

    def at_level(level: float) -> np.ndarray | None:
        """A placement where every VM gets at least its floor and at least ``level`` (CPU need scaled)."""
        jobs = tuple(dataclasses.replace(job, cpu_need=job.cpu_need * max(f, level), spread=s, together=t)
                     for job, f, (s, t) in zip(existing.jobs, floors, rules, strict=True))
        placement, _report = place_with_rules(Instance(hosts, jobs, pinned=pins), placer, SolveOptions(), "failover")
        return placement.hosts

    # Floors alone first (fail: nothing fits); then as high a common yield above them as the probe finds.
    search = bisect_yield(at_level, 0.0, 1.0, LEVEL_PRECISION, probe_upper=True, probe_lower=True)
    if search.found is None:
        return None
    task_hosts = np.asarray(search.found, dtype=np.int64)
    ruled = dataclasses.replace(real, jobs=tuple(dataclasses.replace(j, spread=None, together=None)
                                                 for j in real.jobs), pinned=())
    min_yield = allocate(ruled, task_hosts, floors=np.asarray(floors)).min_yield(ruled) if real.n_tasks else None
    by_name = {v.name: int(task_hosts[t]) for t, v in enumerate(existing.vms)}
    return np.asarray([by_name[v.name] for v in displaced], dtype=np.int64), min_yield


def job_floors(cluster: Cluster, instance: Instance, vms: Sequence[VmState], n_ref: int) -> np.ndarray:
    """Each job's floor (:func:`floor_of` its first VM), the yields a failover is placed at and its caps give
    first (:func:`vcsched.yields.allocate`'s ``floors``).

    A VM without a floor is placed as needing no CPU, so on a host its neighbours' floors fill it would get a
    cap of 0, which no hypervisor holds: every job's floor is at least twice the smallest cap of its VMs (one
    quota step above it after rounding down to the grid)."""
    out = np.zeros(instance.n_jobs)
    for j in range(instance.n_jobs):
        vm = vms[int(instance.job_first_task[j])]
        need = float(instance.jobs[j].cpu_need) * n_ref
        least = min(1.0, 2 * min_cap(vm.vcpus) / need) if need > 0 else 0.0
        out[j] = max(least, 0.0 if vm.meta is None else floor_of(cluster, vm.meta))
    return out


def importance(vm: VmState) -> tuple[int, str]:
    """Sort key: most important first (higher ``priority`` in the metadata), then by name."""
    return (-(vm.meta.priority if vm.meta is not None else 0), vm.name)


def failover(cluster: Cluster, survivors: Inventory, host: str, displaced: Sequence[VmState], *,
             below_floor_ok: bool = False) -> Failover:
    """Place ``displaced`` (the managed VMs of failed ``host``) on ``survivors``, most important first.

    When they do not all fit, the least important ones are left out one at a time until the rest fits; those
    are stranded (:data:`NO_ROOM`).  With ``below_floor_ok`` (a recovery under ``on_failure = "restart"``) the
    ones left out are then added back, most important first, at floor 0 — as many as memory and the required
    rules allow; only the rest are stranded (:data:`NO_MEMORY`).  (The caps then share the shortfall: on a
    host where the floors do not all fit, every floor there gives way together, :func:`_recovery_plan`.)
    """
    survivors = survivors.up()
    ordered = sorted(displaced, key=importance)
    names = tuple(v.name for v in ordered)
    if not survivors.hosts:
        return Failover(host, names, (), tuple((v.name, "no host survives") for v in ordered), None)
    found: tuple[np.ndarray, float | None] | None = None
    for keep in range(len(ordered), -1, -1):
        found = _place(cluster, survivors, ordered[:keep])
        if found is not None:
            break
    # None even with nothing displaced: the survivors miss their own floors already.
    keep = keep if found is not None else 0
    floorless: frozenset[str] = frozenset()
    why = NO_ROOM
    if below_floor_ok and keep < len(ordered):
        why = NO_MEMORY
        missed = frozenset(v.name for v in survivors.managed()) if found is None else frozenset()
        for more in range(len(ordered), keep, -1):
            dropped = frozenset(v.name for v in ordered[keep:more])
            relaxed = _place(cluster, survivors, ordered[:more], dropped | missed)
            if relaxed is not None:
                found, keep, floorless = relaxed, more, dropped
                break
    if found is None:
        return Failover(host, names, (), tuple((v.name, why) for v in ordered), None)
    where, min_yield = found
    placed = tuple((v.name, survivors.hosts[int(h)].name) for v, h in zip(ordered[:keep], where, strict=True))
    return Failover(host, names, placed, tuple((v.name, why) for v in ordered[keep:]), min_yield,
                    tuple(sorted(floorless)))


class _Cluster:
    """The model of a cluster whose hosts all answer, built once and asked for each host in turn: "if this host
    failed, would its VMs fit on the others?" — the host taking nothing (as in maintenance) and its VMs freed,
    the others fixed.  One model for every host is what keeps ``status`` and admission's check linear in the
    hosts' count rather than rebuilding 10,000 VMs per host (1,000 hosts: 0.25 s per host rebuilt)."""

    def __init__(self, cluster: Cluster, inventory: Inventory) -> None:
        self.cluster = cluster
        self.inventory = inventory
        self.existing = existing_jobs(inventory)
        self.hosts = model_hosts(inventory, cordoned=cluster.cordoned | full_hosts(inventory))
        self.pins = np.asarray(self.existing.hosts, dtype=np.int64)
        first = np.cumsum([0, *(j.tasks for j in self.existing.jobs)])[:-1]
        self.first = first
        metas = [self.existing.vms[int(t)].meta for t in first]
        self.floors = [floor_of(cluster, m) for m in metas if m is not None]
        self.index = {h.name: i for i, h in enumerate(inventory.hosts)}
        # Per task its memory, its CPU at its floor and whether it has a rule; per host what its tasks leave.
        jobs = self.existing.jobs
        tasks = [j.tasks for j in jobs]
        self.task_mem = np.repeat([j.memory for j in jobs], tasks).astype(float)
        self.task_cpu = np.repeat([j.cpu_need * f for j, f in zip(jobs, self.floors, strict=True)], tasks)
        self.task_ruled = np.repeat([bool(j.spread or j.together) for j in jobs], tasks).astype(bool)
        n = len(self.hosts)
        self.memory_left = (np.asarray([h.memory for h in self.hosts], dtype=float)
                            - np.bincount(self.pins, weights=self.task_mem, minlength=n))
        self.cpu_left = (np.asarray([h.cpu for h in self.hosts], dtype=float)
                         - np.bincount(self.pins, weights=self.task_cpu, minlength=n))
        self.closed = np.asarray([h.maintenance for h in self.hosts], dtype=bool)

    def first_fit(self, gone: Sequence[str]) -> bool:
        """Whether the VMs of hosts ``gone`` fit on the others at their floors by first fit, largest memory first:
        a placement found proves they fit, at the cost of one pass over the hosts per displaced VM rather than
        a placement of the whole cluster (:meth:`fits`).  False says nothing (a VM with a rule, or first fit
        missed): ask :meth:`fits`."""
        out = [self.index[g] for g in gone]
        moving = np.flatnonzero(np.isin(self.pins, out))
        if self.task_ruled[moving].any():
            return False
        memory, cpu = self.memory_left.copy(), self.cpu_left.copy()
        closed = self.closed.copy()
        closed[out] = True
        memory[closed] = -np.inf
        for t in moving[np.argsort(-self.task_mem[moving], kind="stable")]:
            room = np.flatnonzero((memory >= self.task_mem[t] - MEMORY_TOLERANCE)
                                  & (cpu >= self.task_cpu[t] - FIT_TOLERANCE))
            if not len(room):
                return False
            memory[room[0]] -= self.task_mem[t]
            cpu[room[0]] -= self.task_cpu[t]
        return True

    def fits(self, gone: Sequence[str]) -> tuple[bool, float | None, dict[str, str]]:
        """Whether the VMs of hosts ``gone`` fit on the others at their floors, the min yield after, and where
        each of them would go."""
        out = [self.index[g] for g in gone]
        pins = self.pins.copy()
        pins[np.isin(pins, out)] = -1
        hosts = tuple(dataclasses.replace(h, maintenance=True) if i in out else h for i, h in enumerate(self.hosts))
        jobs = self.existing.jobs
        rules = []
        for j, job in enumerate(jobs):
            at = pins[int(self.first[j]):int(self.first[j]) + job.tasks]
            fixed = at[at >= 0]
            rules.append((job.spread if len(set(fixed.tolist())) == len(fixed) else None,
                          job.together if not len(fixed) else None))
        pinned = tuple(int(p) for p in pins)

        def placer(attempt: Instance, _: SolveOptions) -> Placement:
            return Placement(hosts=ResidualRoom(attempt).probe("mcb8")(1.0))

        def at_level(level: float) -> np.ndarray | None:
            scaled = tuple(dataclasses.replace(job, cpu_need=job.cpu_need * max(f, level), spread=s, together=t)
                           for job, f, (s, t) in zip(jobs, self.floors, rules, strict=True))
            placement, _report = place_with_rules(Instance(hosts, scaled, pinned=pinned), placer, SolveOptions(),
                                                  "failover")
            return placement.hosts

        search = bisect_yield(at_level, 0.0, 1.0, LEVEL_PRECISION, probe_upper=True, probe_lower=True)
        if search.found is None:
            return False, None, {}
        found = np.asarray(search.found, dtype=np.int64)
        plain = Instance(hosts, tuple(dataclasses.replace(j, spread=None, together=None) for j in jobs))
        names = self.inventory.hosts
        moved = {self.existing.vms[int(t)].name: names[int(found[t])].name for t in np.flatnonzero(pins < 0)}
        return True, allocate(plain, found, floors=np.asarray(self.floors)).min_yield(plain), moved


def host_failover(cluster: Cluster, inventory: Inventory, host: str) -> Failover:
    """:func:`failover` of up host ``host``'s running managed VMs onto the other hosts that answer."""
    inv = inventory.up()
    return failover(cluster, without_hosts(inv, [host]), host, inv.managed_on(host))


def headroom(cluster: Cluster, inventory: Inventory) -> tuple[Failover, ...]:
    """For each host that answers: would its VMs fit on the others, and the min yield after its loss.

    Asked of one model of the cluster (:class:`_Cluster`); a host whose VMs do not all fit is placed again VM by
    VM (:func:`failover`) to say which would be stranded.
    """
    inv = inventory.up()
    if not inv.managed():
        return tuple(Failover(h.name, (), (), (), None) for h in inv.hosts)
    model = _Cluster(cluster, inv)
    out = []
    for h in inv.hosts:
        on = inv.managed_on(h.name)
        if len(inv.hosts) < 2 and on:
            out.append(failover(cluster, without_hosts(inv, [h.name]), h.name, on))
            continue
        ok, min_yield, moved = model.fits([h.name]) if on else (True, None, {})
        if ok:
            ordered = sorted(on, key=importance)
            out.append(Failover(h.name, tuple(v.name for v in ordered), tuple((v.name, moved[v.name]) for v in ordered),
                                (), min_yield))
        else:
            out.append(failover(cluster, without_hosts(inv, [h.name]), h.name, on))
    return tuple(out)


def failover_refusal(cluster: Cluster, after: Inventory, *, explain: bool = True) -> str | None:
    """Why the cluster as it would be (``after``) cannot absorb ``failures_tolerated`` host failures; None if
    it can (or nothing is asked).  Every combination of that many hosts is tried, smallest names first: first
    fit of its VMs on the others (:meth:`_Cluster.first_fit`, a pass over the hosts per VM) answers most; a
    combination it misses is placed (:meth:`_Cluster.fits`), then VM by VM (:func:`failover`) to name what
    would be stranded.  ``explain=False`` (a search that only needs yes or no, ``headroom``): the displaced
    VMs are placed once, all together, and the reason names them all instead of the stranded ones (placing VM
    by VM costs up to one placement of the cluster per displaced VM)."""
    k = cluster.failures_tolerated
    inv = after.up()
    if k < 1 or len(inv.hosts) <= k:
        return None if k < 1 else (f"failures_tolerated = {k}: only {len(inv.hosts)} host(s) answer, so no "
                                   f"{k} of them can fail with the VMs running elsewhere")
    model = _Cluster(cluster, inv)
    for gone in itertools.combinations([h.name for h in inv.hosts], k):
        displaced = [v for h in gone for v in inv.managed_on(h)]
        if not displaced or model.first_fit(gone) or model.fits(gone)[0]:
            continue
        which = f"host {gone[0]}" if k == 1 else f"hosts {', '.join(gone)}"
        if not explain:
            if _place(cluster, without_hosts(inv, gone), sorted(displaced, key=importance)) is not None:
                continue
            names = sorted(v.name for v in displaced)
            return (f"failover: if {which} failed, its {len(displaced)} VMs ({', '.join(names[:5])}"
                    f"{', ...' if len(names) > 5 else ''}; {format_size(sum(v.memory_bytes for v in displaced))}) "
                    f"would not all fit: {NO_ROOM} (failures_tolerated = {k})")
        f = failover(cluster, without_hosts(inv, gone), "+".join(gone), displaced)
        if not f.fits:
            lost = sorted(vm for vm, _ in f.stranded)
            memory = sum(v.memory_bytes for v in displaced if v.name in set(lost))
            return (f"failover: if {which} failed, {len(lost)} of its {len(displaced)} VMs "
                    f"({', '.join(lost[:5])}{', ...' if len(lost) > 5 else ''}; {format_size(memory)}) would find "
                    f"{NO_ROOM} (failures_tolerated = {k})")
    return None


def after_plan(inventory: Inventory, plan: Plan) -> Inventory:
    """``inventory`` with the VMs ``plan`` creates running where it puts them (what admission would leave)."""
    created = tuple(VmState(s.vm, s.host, s.vcpus, s.memory_bytes, True, s.meta(), s.cap_cores)
                    for s in plan.steps if isinstance(s, CreateStep))
    return Inventory(inventory.cluster, inventory.hosts, (*inventory.vms, *created), inventory.in_doubt)


def keep_failover_room(cluster: Cluster, inventory: Inventory, decision: Decision, *,
                       explain: bool = True) -> Decision:
    """``decision`` refused when, with ``failures_tolerated`` of the cluster file, the cluster it leaves could
    not absorb that many host failures (:func:`failover_refusal`, naming the host, with ``explain``); else
    unchanged."""
    if not decision.admitted or decision.plan is None or cluster.failures_tolerated < 1:
        return decision
    refused = failover_refusal(cluster, after_plan(inventory, decision.plan), explain=explain)
    if refused is None:
        return decision
    if failover_refusal(cluster, inventory, explain=explain) is not None:
        refused += "; the cluster lacked failover room already before this request (make room first)"
    return dataclasses.replace(decision, admitted=False, reason=refused, plan=None,
                               detail={**decision.detail, "failover": refused})


# --- recovery of a failed host ------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    """What recovering failed host ``host`` takes: fence it (``fence``: it has an agent), then ``plan``
    (creates of its VMs on the survivors, most important first, and the survivors' caps re-set so that
    floors hold where they can).  ``stranded``: ``(vm, why)`` for the VMs that are not restarted;
    ``running``: ``(vm, host)`` for VMs recorded on ``host`` that already run elsewhere (restarted before);
    ``below_floor``: ``(vm, predicted yield, floor)`` for the restarted VMs the plan runs below their floor
    (``on_failure = "restart"``: the survivors could not meet it; the plan says so in ``extra``)."""

    host: str
    fence: bool
    restarts: tuple[tuple[str, str], ...]
    stranded: tuple[tuple[str, str], ...]
    running: tuple[tuple[str, str], ...]
    plan: Plan | None
    min_yield: float | None
    below_floor: tuple[tuple[str, float, float], ...] = ()
    #: ``(vm, why)`` for the VMs not restarted *yet*: another host that does not answer and was not fenced may run
    #: them; they restart once it is recovered too (not stranded: nothing is wrong with them or the survivors).
    waiting: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "fence": self.fence, "restarts": [{"vm": vm, "host": h} for vm, h in self.restarts],
                "stranded": [{"vm": vm, "reason": why} for vm, why in self.stranded],
                "waiting": [{"vm": vm, "reason": why} for vm, why in self.waiting],
                "running": [{"vm": vm, "host": h} for vm, h in self.running],
                "below_floor": [{"vm": vm, "yield": round(y, 6), "min_yield": f} for vm, y, f in self.below_floor],
                "min_yield_after": self.min_yield}


def has_disk(step: CreateStep) -> bool:
    """Whether a VM boots from a disk (an image, or a template that may name disks) rather than a kernel alone;
    an adopted domain (boot ``domain``) has one when its own XML names a disk."""
    if step.boot.kind == "domain":
        disks = ET.fromstring(step.boot.xml or "<domain/>").findall("devices/disk")
        return any(d.get("device", "disk") == "disk" for d in disks)
    return step.boot.kind != "kernel"


def plan_recovery(cluster: Cluster, inventory: Inventory, host: str, records: Sequence[CreateStep], *,
                  waited_on: bool = False, fenced: Collection[str] = ()) -> Recovery:
    """The recovery of ``host`` (down in ``inventory``) from the definition ``records`` of its VMs.

    ``waited_on``: a VM in doubt waits for ``host`` to settle (:attr:`vcsched.plans.repair.RepairPlan.blocked`:
    it may hold another copy), or a running VM's cut migration may have left a paused copy there (``leftovers``).
    Then the host is fenced even with nothing to restart — the plan re-sets only the survivors' caps — since while
    it is merely down that VM stays paused everywhere, running nowhere (or its leftover copy stays); fenced, it
    holds nothing and repair settles the VM (found by the fault simulation, docs/faultsim.md).

    A VM is stranded when the host has no fence agent (it may still run there: restarting it would make two
    writers), when it has a disk that the survivors do not share (the host's ``storage``), or when the
    survivors have no room for it (:func:`failover`, least important first): no memory, or — with the cluster
    file's ``on_failure = "strand"`` — no CPU at the floors.  With ``on_failure = "restart"`` (the default) a VM
    whose floor cannot be met restarts below it, listed in ``below_floor`` and in the plan's ``extra``, which
    is what lets the whole-plan check accept the plan (:mod:`vcsched.plans.claims`).

    While another host does not answer and was not fenced (``fenced``: the definitions store's fence marks), a VM
    recorded on ``host`` may run there (a migration cut after its switch-over, before its step was recorded):
    nothing is restarted — each waits (``waiting``, with that reason) — but ``host`` is fenced all the same, so that
    once the other host is recovered too they are lost and restarted (:mod:`vcsched.control.lost`, the same rule;
    found by the fault simulation with SIGTERM, seed 1 schedule 8245, docs/faultsim.md).
    """
    survivors = without_hosts(inventory, [host]).up()
    elsewhere = {v.name: v.host for v in survivors.vms if v.active}
    running = tuple((r.vm, elsewhere[r.vm]) for r in records if r.vm in elsewhere)
    pending = sorted((r for r in records if r.vm not in elsewhere), key=lambda r: (-r.priority, r.vm))
    fence = cluster.host(host).fence is not None
    if not fence:
        why = (f"host {host} has no fence agent (cluster file: fence = {{agent = ...}}): it may still run there, "
               "so it is not started elsewhere")
        return Recovery(host, False, (), tuple((r.vm, why) for r in pending), running, None, None)
    holders = [h for h in unseen_holders(inventory, fenced) if h != host]
    if holders and pending:
        why = (f"host(s) {', '.join(holders)} do not answer and were not fenced: it may run there (a migration cut "
               f"after its switch-over); it is restarted once they are recovered too")
        # Fence it all the same (a plan that re-sets the survivors' caps), unless no host answers at all.
        caps = _recovery_plan(cluster, inventory, survivors, (), {}, {"recover": host}) if survivors.hosts else None
        return Recovery(host, True, (), (), running, caps, None if caps is None else caps.min_yield,
                        waiting=tuple((r.vm, why) for r in pending))
    stranded: list[tuple[str, str]] = []
    unshared = [h.name for h in survivors.hosts if not cluster.shares_storage(host, h.name)]
    candidates = []
    for r in pending:
        if has_disk(r) and unshared:
            stranded.append((r.vm, f"local disk: it boots from a {r.boot.kind} on {host}'s storage "
                                   f"({cluster.host(host).storage_name!r}), which {', '.join(unshared)} do not share"))
        else:
            candidates.append(r)
    placed, more, plan, below = restart_records(cluster, inventory, survivors, host, candidates, {"recover": host},
                                                cluster.on_failure == "restart")
    if plan is None and waited_on and survivors.hosts:
        plan = _recovery_plan(cluster, inventory, survivors, (), {}, {"recover": host})
    return Recovery(host, True, placed, (*stranded, *more), running, plan, None if plan is None else plan.min_yield,
                    below)


def restart_records(cluster: Cluster, inventory: Inventory, survivors: Inventory, host: str,
                    records: Sequence[CreateStep], extra: Mapping[str, Any], below_floor_ok: bool
                    ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], Plan | None,
                               tuple[tuple[str, float, float], ...]]:
    """Where ``records`` (VMs of ``host`` that run nowhere) start again on ``survivors``, and the plan that does
    it: ``(placed, stranded, plan, below floor)``.  The one mechanism behind a failed host's recovery and
    ``vcsched restart``: :func:`failover` places them most important first (below their floors if
    ``below_floor_ok``), :func:`_recovery_plan` caps floors first; ``extra`` goes into the
    plan (what it recovers), with :data:`vcsched.plans.plan.BELOW_FLOOR` when a VM runs below its floor."""
    displaced = [VmState(r.vm, host, r.vcpus, r.memory_bytes, True, r.meta(), r.cap_cores) for r in records]
    f = failover(cluster, survivors, host, displaced, below_floor_ok=below_floor_ok)
    if not f.placed:
        return (), f.stranded, None, ()
    by_name = {r.vm: r for r in records}
    where = dict(f.placed)
    restarted = tuple(VmState(vm, where[vm], by_name[vm].vcpus, by_name[vm].memory_bytes, True, by_name[vm].meta())
                      for vm, _ in f.placed)
    plan = _recovery_plan(cluster, inventory, survivors, restarted, by_name, extra)
    floors = {v.name: floor_of(cluster, v.meta) for v in (*survivors.managed(), *restarted) if v.meta is not None}
    below = tuple((vm, p.yield_, floors[vm]) for vm, p in sorted(plan.per_vm.items())
                  if p.yield_ < floors[vm] - YIELD_TOLERANCE)
    if below:
        plan = dataclasses.replace(plan, extra={**plan.extra, BELOW_FLOOR: [vm for vm, _, _ in below]})
    return f.placed, f.stranded, plan, below


@dataclass(frozen=True)
class Restart:
    """What ``vcsched restart`` does with lost VMs: ``restarts`` ``(vm, host)`` by ``plan``, ``refused``
    ``(vm, why)`` for the rest (no room, a local disk), ``below_floor`` as :class:`Recovery`'s."""

    restarts: tuple[tuple[str, str], ...]
    refused: tuple[tuple[str, str], ...]
    plan: Plan | None
    below_floor: tuple[tuple[str, float, float], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"restarts": [{"vm": vm, "host": h} for vm, h in self.restarts],
                "refused": [{"vm": vm, "reason": why} for vm, why in self.refused],
                "below_floor": [{"vm": vm, "yield": round(y, 6), "min_yield": f} for vm, y, f in self.below_floor],
                "min_yield_after": None if self.plan is None else self.plan.min_yield}


def plan_restart(cluster: Cluster, inventory: Inventory, records: Sequence[CreateStep], *,
                 below_floor_ok: bool | None = None) -> Restart:
    """Start ``records`` — lost VMs (:mod:`vcsched.control.lost`), run nowhere — again on the hosts that answer,
    as a failed host's recovery would (:func:`restart_records`), most important first.  A VM that boots from a
    disk is refused unless every host that answers shares its recorded host's storage (where else would its
    disk be?).  ``below_floor_ok``: whether a VM whose floor cannot be met restarts below it; default the
    cluster file's ``on_failure`` (the controller), and an operator's ``vcsched restart`` says True: naming the
    VM is choosing that it runs."""
    if below_floor_ok is None:
        below_floor_ok = cluster.on_failure == "restart"
    up = inventory.up()
    refused: list[tuple[str, str]] = []
    ok: list[CreateStep] = []
    for r in sorted(records, key=lambda r: (-r.priority, r.vm)):
        unshared = [h.name for h in up.hosts if r.host != h.name and not _shares(cluster, r.host, h.name)]
        if has_disk(r) and unshared:
            refused.append((r.vm, f"local disk: it boots from a {r.boot.kind} on {r.host}'s storage, which "
                                  f"{', '.join(unshared)} do not share"))
        else:
            ok.append(r)
    if not ok:
        return Restart((), tuple(refused), None)
    # One placement of them all (their recorded hosts only name the VMs' origin: any host that answers may take them).
    placed, more, plan, below = restart_records(cluster, inventory, up, ok[0].host, ok, {"restart": [r.vm for r in ok]},
                                                below_floor_ok)
    return Restart(placed, (*refused, *more), plan, below)


def _shares(cluster: Cluster, a: str, b: str) -> bool:
    """Whether hosts ``a`` and ``b`` share storage; a host the cluster file no longer lists shares with none."""
    try:
        return cluster.shares_storage(a, b)
    except InputError:
        return False


def _recovery_plan(cluster: Cluster, full: Inventory, survivors: Inventory, restarted: Sequence[VmState],
                   records: Mapping[str, CreateStep], extra: Mapping[str, Any]) -> Plan:
    """Creates of ``restarted`` where they are, and set-cap steps for the survivors' VMs whose caps change: the
    allocation of the cluster with them — floors first, then the common level, then the average yield — so that
    the caps keep the floors the restarts were placed at (and, when a VM was placed below its floor, every
    floor on its host gives way together: :func:`vcsched.yields.floored_lows`)."""
    after = Inventory(survivors.cluster, survivors.hosts, (*survivors.vms, *restarted), survivors.in_doubt)
    existing = existing_jobs(after)
    instance = Instance(model_hosts(after, cordoned=cluster.cordoned), existing.jobs)
    allocation = allocate(instance, np.asarray(existing.hosts, dtype=np.int64),
                          floors=job_floors(cluster, instance, existing.vms, after.reference_cores))
    yields = allocation.yields(instance)
    n_ref = after.reference_cores
    new = {v.name for v in restarted}
    per_vm: dict[str, VmPrediction] = {}
    steps: list[Step] = []
    for t, v in enumerate(existing.vms):
        j = int(instance.task_job[t])
        where = after.hosts[existing.hosts[t]].name
        assert v.meta is not None
        cap = realisable_cap(float(allocation.cpu[j]) * n_ref, v.vcpus)
        per_vm[v.name] = VmPrediction(where, v.meta.cluster, v.meta.cpu_need_cores, cap, float(yields[j]))
        if v.name in new:
            steps.append(dataclasses.replace(records[v.name], host=where, cap_cores=cap))
        elif v.cap_cores is None or not same_cap(v.cap_cores, cap, v.vcpus):
            steps.append(SetCapStep(v.name, where, cap))
    ordered = order_steps(steps, current_caps(survivors), {h.name: float(h.cores) for h in survivors.hosts})
    return Plan("recover", cluster.name, snapshot_hash(full), allocation.min_yield(instance),
                allocation.avg_yield(instance), per_vm, ordered, extra=dict(extra))
