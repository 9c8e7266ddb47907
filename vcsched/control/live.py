"""Adapting the running managed VMs of a live inventory: the adaptation problem built from libvirt state, solved,
ordered safely and turned into a plan (paper section 6.1 made executable)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.adaptation.drain import drain
from vcsched.adaptation.problem import AdaptProblem, AdaptResult
from vcsched.adaptation.solve import solve_adapt
from vcsched.adaptation.spare import Spare, spend_spare, with_spare_report
from vcsched.caps import min_cap, realisable_cap, same_cap
from vcsched.control.admission import Existing, HostsDown, existing_jobs, floors_missed, model_hosts
from vcsched.control.failover import failover_refusal
from vcsched.control.sharing import (
    Sharing,
    check_vms,
    host_capacities,
    io_amounts,
    needed_resources,
    references,
    sharing_for,
)
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.inventory import Inventory, VmState, snapshot_hash
from vcsched.model import Instance, SolveOptions
from vcsched.plans.migration import HostRoom, MigrationBlocked, MigrationOrder, VmChange, order_changes, plan_steps
from vcsched.plans.plan import MEASURED, Plan, VmPrediction
from vcsched.plans.reasons import yield_of
from vcsched.plans.steps import RemoveStep, SetNeedStep
from vcsched.policies.registry import allocate_policy
from vcsched.units import CAP_TOLERANCE
from vcsched.validate import check_instance


@dataclass(frozen=True)
class LiveAdaptation:
    """An adaptation of a live inventory: the solver's answer, the safe order, and the plan to apply."""

    adapted: AdaptResult
    plan: Plan | None  # None when nothing was found within the budget
    order: MigrationOrder | None
    problem: AdaptProblem
    #: (virtual cluster, yield, recorded min_yield) for clusters the new allocation leaves below their
    #: floor.  Reported, not refused: the allocation is already the best within the budget, and the
    #: current one (after the changes) is no better.
    floors_missed: tuple[tuple[str, float, float], ...] = ()
    #: The staying VMs' minimum of cap / need before the plan (needs after the changes): what the plan improves on.
    current_min_yield: float | None = None
    #: A drain (docs/rules.md): the drained host, and each VM that stays on it with its reason and explanation.
    drained: str | None = None
    stays: tuple[tuple[str, str, str], ...] = ()

    @property
    def drain_complete(self) -> bool:
        """A drain whose plan empties the host: a plan, and no VM stays."""
        return self.plan is not None and not self.stays

    @property
    def infeasible(self) -> str:
        """Why no plan was found within the budget (the solver's own words when it has them)."""
        return str(self.adapted.result.detail.get("infeasible", "no placement within the budget"))

    def drain_blocked(self, *, allow_below_floor: bool = False) -> str | None:
        """Why this drain's plan may not be applied, or None when it may (:func:`drain_blocked`)."""
        return drain_blocked(str(self.drained), self.stays, self.floors_missed, allow_below_floor=allow_below_floor)


def drain_blocked(host: str, stays: Sequence[Sequence[str]], missed: Sequence[tuple[str, float, float]], *,
                  allow_below_floor: bool = False) -> str | None:
    """Why a drain's plan may not be applied, or None when it may (docs/rules.md) — `drain --apply` and `apply`
    of a saved drain plan alike:

    a plan that leaves VMs on the host is never applied (the host would go into maintenance with them
    still there), and one that leaves a virtual cluster below the min_yield it was admitted with only
    when the operator allows it.
    """
    if stays:
        return f"{host} cannot be emptied within these rules and budget"
    if missed and not allow_below_floor:
        below = "; ".join(f"virtual cluster {vc!r} would end at yield {y:.3f}, below the min_yield {floor:g} it was "
                          "admitted with" for vc, y, floor in missed)
        return f"{below} (--allow-below-floor to apply anyway)"
    return None


def adapt_inventory(cluster_name: str, inventory: Inventory, budget: int, *, needs: Mapping[str, float] | None = None,
                    depart: Iterable[str] = (), algorithm: str = "heuristic", parallel: int = 1,
                    options: SolveOptions | None = None, cluster: Cluster | None = None,
                    sharing: Sharing | None = None, pinned: Iterable[str] = (),
                    record_needs: bool = True, drain: str | None = None,
                    storage: Cluster | None = None, spare: str | None = None) -> LiveAdaptation:
    """Adapt the running managed VMs of ``inventory``  within ``budget``.

    Units as in admission (docs/model.md): hosts in fractions of the reference
    host (most cores, most usable memory, less what unmanaged domains use).
    Each virtual cluster with one CPU need and memory size is a job whose
    tasks are its VMs (section 5: they share one yield).  ``needs`` overrides
    VMs' CPU needs in cores.  Moving a VM costs its memory in bytes.  The
    result's migrations are ordered by :func:`vcsched.plans.migration.order_changes`
    and the total including relays must fit the budget, else
    :class:`vcsched.plans.migration.MigrationBlocked`.

    ``depart`` names virtual clusters that leave: their VMs get ``remove``
    steps at the head of the plan (removing only frees memory and CPU, so the
    rest is planned, ordered and budgeted as if they were already gone) and
    the remaining clusters share what they held.  A need in ``needs`` that
    differs from the VM's metadata gets a ``set-need`` step at the end, so
    once applied the next adaptation starts from it (unless ``record_needs``
    is False: `vcsched run` plans with measured needs and leaves the recorded
    ones alone).

    ``cluster`` (the cluster file) and ``sharing`` (default: its policy)
    bring in the sharing policies (docs/policies.md): under a policy other
    than ``yield``, or when VMs need extra fluid resources (disk, network),
    the byte-budgeted search places on the resource vector (every host's
    declared disk and network capacity, as the placing algorithms do), and
    the policy then allocates every fluid resource on that placement.

    What a move costs (docs/migrations.md, "Shared and local storage"): its
    memory, plus its disks when source and target do not share ``storage``
    in the cluster file (``cluster``, or ``storage`` alone for a caller that
    wants only that from the file, like the controller).

    Placement rules (docs/rules.md): hosts in maintenance in ``cluster`` take
    no VM that does not run there, VMs keep their recorded spread, together
    and pinned rules, and a rule broken now is repaired within the budget
    (what is left is in the result's detail).  ``drain`` names a host to
    empty (:func:`vcsched.adaptation.drain.drain`): in maintenance, its VMs
    leave within the budget, or the best partial drain with each staying VM's reason.

    ``pinned`` VMs also stay where they are (`vcsched run`'s cool-down after a
    migration), as if their metadata pinned them.

    ``spare`` (``"consolidate"`` or ``"spread"``, the cluster file's ``spare``; None: nothing): what the budget
    left buys once every floor and the target yield (the file's ``power_yield``) hold
    (:mod:`vcsched.adaptation.spare`), never breaking the ``failures_tolerated`` room.  Not with a drain (its
    own goal) nor under a sharing policy or extra resources (the policy re-allocates afterwards); the result's
    detail says why it did nothing.
    """
    full, inventory = inventory, inventory.up()
    if not inventory.hosts:
        raise HostsDown(f"every host of cluster {cluster_name!r} is down: "
                        + "; ".join(f"{h.name}: {h.down}" for h in full.hosts))
    needs = dict(needs or {})
    departing = sorted(set(depart))
    known = inventory.clusters()
    for vc in departing:
        if vc not in known:
            raise InputError(f"--depart: {vc!r} is not a virtual cluster of cluster {cluster_name!r} "
                             f"(its virtual clusters: {', '.join(known) or 'none'})")
    leaving = [v for v in inventory.vms if v.cluster in departing]
    gone = frozenset(v.name for v in leaving)
    managed = tuple(v for v in inventory.managed() if v.name not in gone)
    names = {v.name for v in managed}
    for vm in needs:
        if vm in gone:
            raise InputError(f"--set-need: {vm!r} belongs to a departing virtual cluster (--depart)")
        if vm not in names:
            raise InputError(f"--set-need: {vm!r} is not a running managed VM of cluster {cluster_name!r}")
    n_ref = inventory.reference_cores
    used_mem: defaultdict[str, int] = defaultdict(int)
    caps_used: defaultdict[str, float] = defaultdict(float)
    for v in inventory.vms:
        if not v.active or v.name in gone:
            continue
        used_mem[v.host] += v.memory_bytes
        if v.managed:  # unmanaged domains are never capped: their reservation is off their host (model_hosts)
            caps_used[v.host] += v.cap_or_vcpus
    cores_of: dict[str, float] = {}  # each staying VM's need in cores, after the changes
    renew: dict[str, float] = {}  # the changed needs to record in metadata
    for v in managed:
        assert v.meta is not None  # managed
        cores = needs.get(v.name, v.meta.cpu_need_cores)
        if not 0 < cores <= v.vcpus:
            raise InputError(f"--set-need {v.name}: {cores:g} cores must be above 0 and at most its {v.vcpus} vCPUs")
        cores_of[v.name] = cores
        if record_needs and abs(cores - v.meta.cpu_need_cores) > CAP_TOLERANCE:
            renew[v.name] = cores
    shared = None
    if cluster is not None:
        shared = _shared_instance(cluster, inventory, managed, needs, sharing or sharing_for(cluster))
    elif any(v.meta is not None and v.meta.io_needs() for v in managed):
        raise InputError("adapt: VMs need disk or network bandwidth; pass the cluster file (its hosts' disk_bps and "
                         "net_bps) to plan them")
    # The same whole-cluster instance as admission's (one job per virtual cluster and size), not pinned.
    existing = shared[2] if shared is not None else existing_jobs(inventory, managed, needs)
    current_min = min((yield_of(v.cap_or_vcpus, cores_of[v.name]) for v in managed), default=None)
    vms = list(existing.vms)
    stay = set(pinned)
    cordoned = cluster.cordoned if cluster is not None else frozenset()
    pins = tuple(existing.hosts[t] if (v.meta is not None and v.meta.pinned) or v.name in stay else -1
                 for t, v in enumerate(vms))
    pinned_tasks = pins if any(p >= 0 for p in pins) else ()
    if shared is not None:  # every fluid resource with its capacities, weights and tenants: placed on the vector
        instance = dataclasses.replace(shared[0], hosts=tuple(dataclasses.replace(h, maintenance=h.name in cordoned)
                                                              for h in shared[0].hosts), pinned=pinned_tasks)
    else:
        instance = Instance(model_hosts(inventory, cordoned=cordoned), existing.jobs, pinned=pinned_tasks)
    layout = cluster if cluster is not None else storage  # which hosts share storage (the cluster file)
    groups = storage_groups(layout, inventory)
    disk_bytes, host_storage = _storage_costs(groups, inventory, vms)
    problem = AdaptProblem(instance, np.array(existing.hosts, dtype=np.int64),
                           np.array([v.memory_bytes for v in vms], dtype=np.int64), budget,
                           disk_bytes=disk_bytes, host_storage=host_storage)
    stays: tuple[tuple[str, str, str], ...] = ()
    if drain is not None:
        problem, adapted, stays = _drain(cluster_name, inventory, full, vms, problem, drain, algorithm, options)
    else:
        adapted = solve_adapt(problem, algorithm, options)
        if spare is not None:
            adapted = _spend_spare(adapted, problem, spare, layout, inventory, vms, shared is not None, algorithm,
                                   options)
    if adapted.result.allocation is None:
        return LiveAdaptation(adapted, None, None, problem, current_min_yield=current_min, drained=drain, stays=stays)
    if shared is not None:  # the policy's yields on the placement found (the search maximised the minimum yield)
        adapted = _reallocated(adapted, instance, shared[1])
    alloc = adapted.result.allocation
    assert alloc is not None
    yields = alloc.yields(instance)
    changes, per_vm = [], {}
    for t, v in enumerate(vms):
        assert v.meta is not None  # managed
        j = int(instance.task_job[t])
        target = inventory.hosts[alloc.hosts[t]].name
        cap = realisable_cap(alloc.cpu[j] * n_ref, v.vcpus)
        if cap < min_cap(v.vcpus):
            raise MigrationBlocked(f"{v.name} would get a cap of {cap:g} cores, below the smallest cap of a "
                                   f"{v.vcpus}-vCPU VM ({min_cap(v.vcpus):g}); the cluster is too crowded")
        per_vm[v.name] = VmPrediction(target, v.meta.cluster, cores_of[v.name], cap, float(yields[j]),
                                      io_amounts(float(yields[j]), v.meta.io_needs()) if shared else ())
        now = v.cap_or_vcpus
        final = now if v.cap_cores is not None and same_cap(now, cap, v.vcpus) else cap
        changes.append(VmChange(v.name, v.host, target, v.memory_bytes, now, final, vcpus=v.vcpus))
    rooms = [HostRoom(h.name, h.usable_memory, used_mem[h.name], float(h.cores), caps_used[h.name])
             for h in inventory.hosts]
    moved_pinned = sorted(c.vm for c in changes if c.vm in stay and c.source != c.target)
    if moved_pinned:  # only possible with an unlimited budget, where no cost exceeds it
        raise MigrationBlocked(f"{moved_pinned[0]} is pinned (migrated recently) but the best placement moves it; "
                               "give a finite budget")
    disks = {v.name: v.disk_bytes for v in vms}

    def hop_bytes(c: VmChange, src: str, dst: str) -> int:
        """Memory, plus the disks when source and destination do not share storage."""
        return c.cost + (0 if groups[src] == groups[dst] else disks.get(c.vm, 0))

    order = order_changes(rooms, changes, parallel=parallel, move_bytes=hop_bytes if host_storage is not None else None)
    if order.total_bytes > budget:
        raise MigrationBlocked(f"budget: the safe order needs {order.total_bytes} bytes ({order.relays} relays "
                               f"through hosts with room), above the budget of {budget}; raise --budget")
    removals = tuple(RemoveStep(v.name, v.host, str(v.cluster)) for v in sorted(leaving, key=lambda v: v.name))
    # New needs are written back last (on each VM's final host), so the next run plans with them.
    renewals = tuple(SetNeedStep(v.name, per_vm[v.name].host, renew[v.name]) for v in vms if v.name in renew)
    steps = removals + plan_steps(order) + renewals
    moved = frozenset(s.vm for s in steps if s.moves)
    renewed = frozenset(s.vm for s in renewals)
    plan = Plan("adapt", cluster_name, snapshot_hash(full, gone, moved, renewed),
                float(adapted.result.min_yield or 0), float(adapted.result.avg_yield or 0), per_vm, steps,
                extra={"budget": budget, "migrated_bytes": order.total_bytes,
                       # Planned on needs it does not record (`vcsched run`'s measured ones): the predictions' needs
                       # are those, not the VMs' recorded ones (vcsched.plans.claims).
                       **({"needs": MEASURED} if needs and not record_needs else {}),
                       **({"policy": shared[1].policy} if shared is not None else {}),
                       **({"drain": drain, "stays": [list(s) for s in stays]} if drain is not None else {})})
    missed = floors_missed(vms, {name: p.yield_ for name, p in per_vm.items()})
    return LiveAdaptation(adapted, plan, order, problem, tuple(missed), current_min, drain, stays)


def _spend_spare(adapted: AdaptResult, problem: AdaptProblem, mode: str, cluster: Cluster | None,
                 inventory: Inventory, vms: Sequence[VmState], policy: bool, algorithm: str,
                 options: SolveOptions | None) -> AdaptResult:
    """``adapted`` with its spare room used as ``mode`` says (:func:`adapt_inventory`), when every floor holds."""
    alloc = adapted.result.allocation
    if alloc is None:
        return adapted
    skipped = None
    if policy:
        skipped = "a sharing policy or extra resources: the policy allocates after the placement"
    else:
        yields = alloc.yields(problem.instance)
        missed = floors_missed(vms, {v.name: float(yields[int(problem.instance.task_job[t])])
                                     for t, v in enumerate(vms)})
        if missed:
            skipped = f"{missed[0][0]} is below its floor {missed[0][2]:g}"
    if skipped is not None:
        return with_spare_report(adapted, {"mode": mode, "moves": 0, "bytes": 0, "skipped": skipped})
    names = [h.name for h in inventory.hosts]
    accept = None
    if cluster is not None and cluster.failures_tolerated > 0:
        index = {v.name: t for t, v in enumerate(vms)}

        def room(hosts: np.ndarray) -> str | None:
            """The ``failures_tolerated`` room on the cluster as ``hosts`` leaves it (departing VMs gone)."""
            moved = tuple(dataclasses.replace(v, host=names[int(hosts[index[v.name]])]) if v.name in index else v
                          for v in inventory.vms if v.name in index or not v.managed)
            return failover_refusal(cluster, dataclasses.replace(inventory, vms=moved), explain=False)

        accept = room
    target = cluster.power.target_yield if cluster is not None else 1.0
    return spend_spare(problem, adapted, Spare(mode, target, accept), algorithm, options)


def _drain(cluster_name: str, inventory: Inventory, full: Inventory, vms: list[VmState], problem: AdaptProblem,
           host: str, algorithm: str, options: SolveOptions | None
           ) -> tuple[AdaptProblem, AdaptResult, tuple[tuple[str, str, str], ...]]:
    """The drain of ``host``: bad input checked first (unknown or down host, pinned VMs with a budget)."""
    names = [h.name for h in inventory.hosts]
    if host not in names:
        if any(h.name == host for h in full.hosts):
            raise HostsDown(f"drain {host}: the host does not answer; its VMs are unknown")
        raise InputError(f"drain: {host!r} is not a host of cluster {cluster_name!r} (hosts: "
                         f"{', '.join(h.name for h in full.hosts)})")
    index = names.index(host)
    pinned = [v.name for v in vms if v.host == host and v.meta is not None and v.meta.pinned]
    if pinned and problem.budget > 0:
        raise InputError(f"drain {host}: {', '.join(pinned)} {'is' if len(pinned) == 1 else 'are'} pinned (pinned = "
                         "true) and can never leave; move it by hand or unpin it first (--budget 0 shows what "
                         "would stay)")
    result = drain(problem, index, algorithm, options, names=[v.name for v in vms])
    stays = tuple((vms[s.task].name, s.reason, s.detail) for s in result.stays)
    return result.problem, result.adapted, stays


def storage_groups(cluster: Cluster | None, inventory: Inventory) -> dict[str, str]:
    """Each host's storage group: the cluster file's ``storage`` (default the host's own name), else what the
    inventory says (``HostState.storage``, which the hypervisor reads from the same file), else one group for
    every host: nothing known, moves cost memory, as before (:func:`vcsched.plans.claims.move_bytes` the same)."""
    if cluster is not None:
        return {h.name: cluster.host(h.name).storage_name if h.name in cluster.host_names else h.name
                for h in inventory.hosts}
    return {h.name: h.storage or "" for h in inventory.hosts}


def _storage_costs(groups: Mapping[str, str], inventory: Inventory,
                   vms: list[VmState]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per VM its disks' bytes and per host its storage group, when some move would copy disks; else (None, None)."""
    if not any(v.disk_bytes for v in vms):
        return None, None
    names = [groups[h.name] for h in inventory.hosts]
    index = {n: i for i, n in enumerate(dict.fromkeys(names))}
    if len(index) < 2:
        return None, None
    return (np.array([v.disk_bytes for v in vms], dtype=np.int64),
            np.array([index[n] for n in names], dtype=np.int64))


def _shared_instance(cluster: Cluster, inventory: Inventory, managed: tuple[VmState, ...], needs: Mapping[str, float],
                     sharing: Sharing) -> tuple[Instance, Sharing, Existing] | None:
    """The whole-cluster instance with extra resources, weights and tenants, when a policy needs it, and its
    tasks' VMs (their order is the instance's: a VC's VMs with different extra needs are different jobs); else
    None."""
    check_vms(cluster, managed)
    needed = needed_resources(v.meta for v in managed if v.meta is not None)
    if sharing.is_default and not needed:
        return None  # today's adaptation, unchanged
    refs = references(cluster, inventory, needed)
    existing = existing_jobs(inventory, managed, needs, refs)
    instance = Instance(model_hosts(inventory, host_capacities(cluster, inventory, refs)), existing.jobs,
                        cluster.tenants)
    check_instance(instance)
    return instance, sharing, existing


def _reallocated(adapted: AdaptResult, instance: Instance, sharing: Sharing) -> AdaptResult:
    """The adaptation's placement with the policy's yields on every fluid resource."""
    assert adapted.result.allocation is not None
    palloc = allocate_policy(instance, adapted.result.allocation.hosts, sharing.policy, sharing.options)
    y = np.asarray(palloc.yields)
    result = dataclasses.replace(adapted.result, allocation=palloc.allocation(instance),
                                 min_yield=float(y.min()) if len(y) else 1.0,
                                 avg_yield=float(y.mean()) if len(y) else 1.0,
                                 detail={**adapted.result.detail, "policy": sharing.policy})
    return dataclasses.replace(adapted, result=result)


def rule_violations(inventory: Inventory) -> list[dict[str, str]]:
    """Every placement rule the running managed VMs break now (docs/rules.md), one entry per virtual cluster.

    A rule recorded after its VMs were placed (or a preferred one that could not be met) shows here until
    ``vcsched adapt`` repairs it within a budget.  VMs on a host in maintenance are not a violation: they
    may stay until the host is drained.
    """
    by_vc: defaultdict[str, list[VmState]] = defaultdict(list)
    for v in inventory.managed():
        by_vc[str(v.cluster)].append(v)
    out = []
    for vc, vms in sorted(by_vc.items()):
        meta = vms[0].meta
        assert meta is not None
        hosts = [v.host for v in vms]
        if meta.spread and len(set(hosts)) < len(hosts):
            shared = sorted({h for h in hosts if hosts.count(h) > 1})
            out.append({"cluster": vc, "rule": f"spread ({meta.spread})",
                        "problem": f"several VMs on {', '.join(shared)}"})
        if meta.together and len(set(hosts)) > 1:
            out.append({"cluster": vc, "rule": f"together ({meta.together})",
                        "problem": f"VMs on {len(set(hosts))} hosts: {', '.join(sorted(set(hosts)))}"})
    return out
