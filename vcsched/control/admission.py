"""Admission of a virtual-cluster request into a running cluster, and the plan that carries it out.

Pure: takes the cluster file, the live inventory and the request; returns a
:class:`Decision` (admitted with a :class:`~vcsched.plans.plan.Plan`, or refused with
a reason).  Nothing here talks to a hypervisor.

**The whole-cluster instance.**  Units follow docs/model.md: the reference host
has ``n_ref`` = the most usable cores of any host and ``mem_ref`` = the most
usable memory; host ``h`` has ``C_h = cores_h / n_ref`` and
``M_h = (usable_h - memory of unmanaged VMs on h) / mem_ref``.  Every running
managed virtual cluster is one job whose tasks are its VMs (section 5: a
parallel job's VMs all get the same CPU fraction); the request is one more job
with ``k = vms`` tasks.  Unmanaged domains are never capped or moved, so their
memory and their CPU reservation (:meth:`vcsched.inventory.Inventory.usable_cores`:
measured by the controller, else the most they can use) are taken off their host:
``C_h = usable_cores_h / n_ref`` (``n_ref`` stays the largest host's cores, so a
request's need in cores means the same whatever runs beside it).

**Pinning existing VMs.**  Moving running VMs is migration, which is the
adaptation's job (section 6.1, under a byte budget: :mod:`vcsched.control.live`).  Here existing VMs
keep their hosts and only the new VMs are placed, by the chosen algorithm, in
the capacity the others leave:

* for a common minimum yield ``Y`` the existing VMs on host ``h`` need
  ``Y * L_h`` CPU (``L_h`` = their summed CPU needs), leaving
  ``C_h - Y * L_h`` CPU and ``M_h`` minus their memory for the new job;
* ``Y`` is feasible iff the algorithm places the new job in that residual
  capacity with a yield of at least ``Y`` — monotone in ``Y`` (less ``Y``,
  more residual), so we bisect on it with MCB's own search
  (:func:`~vcsched.solvers.yield_search.bisect_yield`, section 3.4), probing first the
  upper end: the LP bound ``min(1, sum C / sum k alpha)`` (section 3.1) or less
  if the pinned VMs bound ``Y`` lower;
* with the best placement found, :func:`vcsched.yields.allocate` computes
  the whole cluster's yields, including the average-yield phase (3.5).

**Floors.**  A request's ``min_yield`` is recorded in its VMs' metadata; a
later request that would push an earlier cluster below its recorded floor is
refused like one that misses its own (:func:`floors_missed`).

This is correct (every VM's cap respects every host's capacity, and the new
job gets what is left fairly), keeps the algorithm pluggable through the
registry, and never plans a migration.  It can be worse than re-placing
everything, which is exactly what the adaptation's budgeted MILP is for.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from vcsched.caps import min_cap, realisable_cap, same_cap
from vcsched.control.sharing import (
    Sharing,
    check_tenant,
    check_vms,
    host_capacities,
    io_amounts,
    io_step_fields,
    model_needs,
    needed_resources,
    references,
    sharing_for,
)
from vcsched.errors import InputError, VcschedError
from vcsched.formats.cluster import Cluster
from vcsched.formats.request import Request
from vcsched.formats.units import format_size
from vcsched.inventory import Inventory, VmState, snapshot_hash
from vcsched.model import Allocation, Amounts, Host, Instance, Job, SolveOptions
from vcsched.plans.ordering import order_steps
from vcsched.plans.plan import Plan, VmPrediction
from vcsched.plans.steps import Boot, CreateStep, SetCapStep, Step
from vcsched.policies.placement import level_rates
from vcsched.policies.registry import allocate_policy
from vcsched.rules import describe, unsatisfiable, without_soft
from vcsched.solvers.algorithm import Placement, Placer
from vcsched.solvers.mcb import KERNELS, VARIANTS, kernel_backend, sorted_lists
from vcsched.solvers.registry import get, place_with_rules, solve
from vcsched.solvers.search import Probe, ResidualRoom, normalised_rates
from vcsched.solvers.yield_search import bisect_yield
from vcsched.units import CAP_TOLERANCE, FIT_TOLERANCE, MEMORY_TOLERANCE, SOLVER_TOLERANCE, YIELD_TOLERANCE
from vcsched.validate import check_instance
from vcsched.yields import allocate

#: The residual placement's search (:func:`~vcsched.solvers.yield_search.bisect_yield`): a request that
#: does not fit at ``SEARCH_FLOOR * upper`` is refused; otherwise the interval is halved until it is below
#: ``upper * 2**-SEARCH_STEPS`` (SEARCH_STEPS halvings).
SEARCH_STEPS = 24
SEARCH_FLOOR = 1e-4


class HostsDown(VcschedError):
    """No host of the cluster answers: nothing can be planned (exit 1, the hosts are the problem)."""

    exit_code = 1


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str | None
    plan: Plan | None
    min_yield: float | None = None
    avg_yield: float | None = None
    #: The placement rules' report (:func:`vcsched.rules.place_preferred_first`): ``rules``, and
    #: ``unmet_preferred`` / ``preferred_dropped`` when a preferred rule is not honoured (empty without rules);
    #: ``fallback``: what the allocation fell back on, if anything (the average-yield LP failed).
    detail: dict[str, object] = field(default_factory=dict)


def check_request(cluster: Cluster, inventory: Inventory, request: Request) -> None:
    """The request checks that need the cluster; bad input raises :class:`InputError` (exit 2)."""
    if request.name in inventory.clusters():
        raise InputError(f"name: virtual cluster {request.name!r} already exists in cluster {cluster.name!r}")
    if request.name in cluster.host_names:
        raise InputError(f"name: {request.name!r} is also a host name in cluster {cluster.name!r}")
    taken = {v.name: v for v in inventory.vms}
    names = request.vm_names()
    for vm in names:
        if vm in taken:
            raise InputError(f"name: VM {vm!r} already exists in cluster {cluster.name!r}")
    # Virtual clusters and VMs share one namespace (`--depart NAME`, `status`, the plan's steps name either).
    clash = taken.get(request.name)
    if clash is not None:
        owner = f"of virtual cluster {clash.cluster!r}" if clash.cluster else "unmanaged"
        raise InputError(f"name: {request.name!r} is already a VM's name in cluster {cluster.name!r} (on host "
                         f"{clash.host}, {owner}); virtual cluster and VM names must differ")
    known = set(inventory.clusters())
    for vm in names:
        if vm in known:
            raise InputError(f"name: the request's VM {vm!r} would carry the name of virtual cluster {vm!r}; "
                             "virtual cluster and VM names must differ")
    n_ref = inventory.reference_cores
    cores = request.need_cores(n_ref)
    if cores > request.vcpus + CAP_TOLERANCE:
        raise InputError(f"cpu_need: {cores:g} cores per VM is more than its {request.vcpus} vCPUs can use")
    if cores > n_ref + CAP_TOLERANCE:
        raise InputError(f"cpu_cores: {cores:g} cores per VM is more than the largest host has ({n_ref})")
    if request.memory_bytes > inventory.reference_memory:
        raise InputError(f"memory: {format_size(request.memory_bytes)} per VM is larger than the largest host "
                         f"({format_size(inventory.reference_memory)} usable)")
    if request.template is None and request.image is None and cluster.guest is None:
        raise InputError(f"template: request {request.name!r} names no template or image and cluster "
                         f"{cluster.name!r} has no [guest] default")


def boot_for(cluster: Cluster, request: Request) -> Boot:
    domain_type = cluster.guest.domain_type if cluster.guest else "qemu"
    if request.template is not None:
        return Boot("template", path=request.template, domain_type=domain_type)
    if request.image is not None:
        return Boot("image", path=request.image, domain_type=domain_type)
    assert cluster.guest is not None  # check_request refused the request otherwise
    g = cluster.guest
    return Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=g.cmdline, domain_type=g.domain_type)


@dataclass(frozen=True)
class Existing:
    """Running managed VMs as jobs: one per (virtual cluster, CPU need, memory), tasks where they run."""

    jobs: tuple[Job, ...]
    vms: tuple[VmState, ...]  # task order
    hosts: tuple[int, ...]  # current host index per task


def unmanaged_memory(inventory: Inventory) -> defaultdict[str, int]:
    """Bytes of running unmanaged domains per host: vcsched cannot move them, so it plans around them."""
    out: defaultdict[str, int] = defaultdict(int)
    for v in inventory.vms:
        if v.active and not v.managed:
            out[v.host] += v.memory_bytes
    return out


def model_hosts(inventory: Inventory, capacity: Mapping[str, Amounts] | None = None,
                cordoned: frozenset[str] = frozenset()) -> tuple[Host, ...]:
    """The hosts in model units (module docstring): cores and usable memory less what unmanaged domains reserve.

    Every planning path builds its hosts here, so the unmanaged reservation is honoured by one mechanism.

    ``capacity``: each host's extra fluid capacities (:func:`vcsched.control.sharing.host_capacities`);
    ``cordoned``: the hosts in maintenance (the cluster file's ``maintenance = true``, docs/rules.md).
    """
    n_ref, mem_ref = inventory.reference_cores, inventory.reference_memory
    unmanaged_mem = unmanaged_memory(inventory)
    extra = capacity or {}
    return tuple(Host(h.name, inventory.usable_cores(h) / n_ref,
                      max(h.usable_memory - unmanaged_mem[h.name], 0) / mem_ref, extra.get(h.name, ()),
                      h.name in cordoned)
                 for h in inventory.hosts)


def existing_jobs(inventory: Inventory, vms: Iterable[VmState] | None = None,
                  needs: Mapping[str, float] | None = None, refs: Mapping[str, int] | None = None) -> Existing:
    """``vms`` (default: every running managed VM) as jobs, a VM's need taken from ``needs`` if there.

    With ``refs`` (the reference rate of each extra resource, :func:`vcsched.control.sharing.references`)
    the jobs also carry their extra needs, weight and tenant from the VMs' metadata.
    """
    n_ref, mem_ref = inventory.reference_cores, inventory.reference_memory
    needs = needs or {}
    groups: dict[tuple[str, float, int], list[VmState]] = defaultdict(list)
    for v in inventory.managed() if vms is None else vms:
        assert v.meta is not None
        cores = needs.get(v.name, v.meta.cpu_need_cores)
        groups[(v.meta.cluster, round(cores, 9), v.memory_bytes)].append(v)
    index = {h.name: i for i, h in enumerate(inventory.hosts)}
    jobs, vms_out, hosts = [], [], []
    per_cluster = Counter(k[0] for k in groups)  # (a count per group was quadratic: 1,250 groups, 1.5 M tests)
    for (cluster, cores, mem), members in sorted(groups.items()):
        label = cluster if per_cluster[cluster] == 1 else f"{cluster}/{cores:g}/{mem}"
        first_meta = members[0].meta
        assert first_meta is not None
        spread, together = first_meta.spread, first_meta.together  # docs/rules.md
        # A VM recorded as needing more than today's reference host (hosts changed) can use one host at most.
        if refs is None:
            jobs.append(Job(label, min(cores / n_ref, 1.0), mem / mem_ref, len(members), spread=spread,
                            together=together))
        else:
            meta = members[0].meta
            assert meta is not None
            jobs.append(Job(label, min(cores / n_ref, 1.0), mem / mem_ref, len(members),
                            model_needs(meta.io_needs(), refs, f"virtual cluster {cluster!r}"), meta.weight,
                            meta.tenant, spread=spread, together=together))
        for v in sorted(members, key=lambda v: v.name):
            vms_out.append(v)
            hosts.append(index[v.host])
    return Existing(tuple(jobs), tuple(vms_out), tuple(hosts))


def admit(cluster: Cluster, inventory: Inventory, request: Request, algorithm: str = "mcb8",
          options: SolveOptions | None = None, sharing: Sharing | None = None, *, ordered: bool = True) -> Decision:
    """Decide whether ``request`` fits, and if so the plan (see the module docstring).

    Hosts that are down get nothing; the plan's snapshot still names them, so
    it is refused once they answer again (their VMs were not planned around).

    ``sharing``: the policy in force (default: the cluster file's, else
    ``yield``).  Under ``yield`` with no extra resource needed by anyone the
    instance has CPU and memory alone and the yields are
    :func:`vcsched.yields.allocate`'s; otherwise every needed fluid resource
    is in it, with weights and tenants, and the policy allocates.

    ``ordered=False``: the plan's steps are left in the placement's order, not made safe to apply
    (:func:`~vcsched.plans.ordering.order_steps`) — for a caller that only reads the plan (``headroom``),
    since ordering a plan of thousands of steps costs more than deciding it.
    """
    full, inventory = inventory, inventory.up()
    if not inventory.hosts:
        raise HostsDown(f"every host of cluster {cluster.name!r} is down: "
                        + "; ".join(f"{h.name}: {h.down}" for h in full.hosts))
    if get(algorithm).bound_only:
        raise InputError(f"algorithm: {algorithm!r} computes a bound, not a placement")
    check_request(cluster, inventory, request)
    options = options or SolveOptions()
    sharing = sharing or sharing_for(cluster)
    check_tenant(cluster, request.tenant, f"request {request.name!r}")
    check_vms(cluster, inventory.managed())
    metas = [v.meta for v in inventory.managed() if v.meta is not None]
    needed = needed_resources(metas, request.io_needs())
    plain = sharing.is_default and not needed  # CPU and memory alone, vcsched's own objective
    n_ref, mem_ref = inventory.reference_cores, inventory.reference_memory
    cores = request.need_cores(n_ref)
    if plain:
        hosts = model_hosts(inventory, cordoned=cluster.cordoned)
        existing = existing_jobs(inventory)
        new = Job(request.name, cores / n_ref, request.memory_bytes / mem_ref, request.vms,
                  spread=request.spread, together=request.together)
        instance = Instance(hosts=hosts, jobs=(*existing.jobs, new))
    else:
        refs = references(cluster, inventory, needed)
        hosts = model_hosts(inventory, host_capacities(cluster, inventory, refs), cordoned=cluster.cordoned)
        existing = existing_jobs(inventory, refs=refs)
        new = Job(request.name, cores / n_ref, request.memory_bytes / mem_ref, request.vms,
                  model_needs(request.io_needs(), refs, f"request {request.name!r}"), request.weight,
                  request.tenant, spread=request.spread, together=request.together)
        instance = Instance(hosts=hosts, jobs=(*existing.jobs, new), tenants=cluster.tenants)
        check_instance(instance)
    rates = level_rates(instance, sharing.policy)
    rho = None if rates is None else normalised_rates(rates)
    placing = _pinned(instance, existing)
    placement, report = place_with_rules(placing, _admission_placer(rho, algorithm, options), options,
                                         "admission")
    report["rules"] = describe(dataclasses.replace(placing, pinned=()))  # the request's (running VMs: placed)
    if placement.hosts is None:
        refused = _refusal(placing, rho, algorithm, options, request, inventory, report)
        return Decision(False, refused, None, detail=report if placing.has_rules else {})
    task_hosts = np.asarray(placement.hosts, dtype=np.int64)
    fallback: list[str] = []  # what the allocation fell back on (the average-yield LP failed), said
    if plain:
        allocation = allocate(instance, task_hosts)
        fallback = list(allocation.notes)
        decision = _decide(cluster, full, inventory, request, instance, existing, allocation, cores,
                           ordered=ordered)
    else:
        palloc = allocate_policy(instance, task_hosts, sharing.policy, sharing.options)
        if isinstance(palloc.detail.get("fallback"), str):
            fallback = [str(palloc.detail["fallback"])]
        io: dict[int, Mapping[str, int]] = {}
        for t, v in enumerate(existing.vms):
            if v.meta is not None and v.meta.io_needs():
                io[int(instance.task_job[t])] = v.meta.io_needs()
        io[instance.n_jobs - 1] = request.io_needs()
        decision = _decide(cluster, full, inventory, request, instance, existing, palloc.allocation(instance),
                           cores, policy=sharing.policy, io=io, ordered=ordered)
    detail = {**(report if placing.has_rules else {}), **({"fallback": fallback} if fallback else {})}
    return dataclasses.replace(decision, detail=detail) if detail else decision


def _pinned(instance: Instance, existing: Existing) -> Instance:
    """The instance the request is placed in: the running VMs pinned to their hosts, their own rules left out
    (none of their VMs is placed), and a host whose running VMs already exceed its memory (it shrank) taken
    as exactly full rather than below 0."""
    n_old = len(existing.hosts)
    old = np.asarray(existing.hosts, dtype=np.int64)
    used = np.bincount(old, weights=instance.task_mem[:n_old], minlength=instance.n_hosts)
    hosts = tuple(dataclasses.replace(h, memory=float(used[i])) if used[i] > h.memory else h
                  for i, h in enumerate(instance.hosts))
    jobs = tuple(dataclasses.replace(j, spread=None, together=None) if j.spread or j.together else j
                 for j in instance.jobs[:-1])
    pins = (*existing.hosts, *([-1] * instance.jobs[-1].tasks))
    return dataclasses.replace(instance, hosts=hosts, jobs=(*jobs, instance.jobs[-1]),
                               pinned=pins if n_old else ())


def _admission_placer(rho: np.ndarray | None, algorithm: str, options: SolveOptions) -> Placer:
    """The request's VMs placed around the pinned running ones (module docstring): a placer for the rule loop."""

    def place(attempt: Instance, _: SolveOptions) -> Placement:
        room = ResidualRoom(attempt, None, rho)
        upper = room.ceiling()
        if upper is None or upper <= 0:  # memory does not fit even fractionally; or running VMs sit on a host
            return Placement(hosts=None)  # with no CPU left for them (its unmanaged domains fill it): no yield > 0
        probe = room.probe(algorithm) if algorithm in VARIANTS else _solve_probe(room, algorithm, options)
        # Upper end first (often nothing binds); then the floor, where a failure refuses the request at once.
        search = bisect_yield(probe, SEARCH_FLOOR * upper, upper, upper * 2.0 ** -SEARCH_STEPS,
                              probe_upper=True, probe_lower=True)
        return Placement(hosts=search.found)

    return place


def _solve_probe(room: ResidualRoom, algorithm: str, options: SolveOptions) -> Probe:
    """The probe for an algorithm that is not an MCB variant: at a level, ``algorithm`` places the pool's jobs
    on the room the fixed VMs leave (hosts in maintenance or without room left out), and the level holds when
    every pool job gets at least its yield there."""
    inst = room.instance
    jobs = np.unique(inst.task_job[room.pool])
    assert int(inst.job_tasks[jobs].sum()) == len(room.pool), "a job with both fixed and pool tasks"
    pool_jobs = tuple(inst.jobs[j] for j in jobs)
    smallest = float(room.pool_mem.min()) if len(room.pool) else 0.0
    extra = inst.resources[1:]

    def probe(level: float) -> np.ndarray | None:
        r = room.at(level)
        if r is None:
            return None
        cpu = r.fluid[:, 0] if room.vector else r.fluid
        usable = np.flatnonzero((cpu > FIT_TOLERANCE) & (r.memory >= smallest - MEMORY_TOLERANCE))
        if not len(usable):
            return None
        sub = Instance(tuple(Host(inst.hosts[h].name, float(cpu[h]), float(r.memory[h]),
                                  tuple((extra[k], max(float(r.fluid[h, k + 1]), 0.0)) for k in range(len(extra))))
                             for h in usable), pool_jobs)
        result = solve(sub, algorithm, options)
        if not result.feasible or result.allocation is None:
            return None
        y = room.yields(level)
        want = np.full(len(jobs), y) if isinstance(y, float) else y[jobs]
        if np.any(result.allocation.yields(sub) < want - SOLVER_TOLERANCE):
            return None
        return room.hosts(usable[np.asarray(result.allocation.hosts, dtype=np.int64)])

    return probe


def _decide(cluster: Cluster, full: Inventory, inventory: Inventory, request: Request, instance: Instance,
            existing: Existing, allocation: Allocation, cores: float, *, policy: str | None = None,
            io: Mapping[int, Mapping[str, int]] | None = None, ordered: bool = True) -> Decision:
    """Floors, caps and the plan for an allocation of the whole cluster (existing VMs first, then the request).

    ``policy`` and ``io`` (each job's extra needs in bytes/s) come from a
    sharing policy (:func:`_admit_shared`): the plan then names the policy and
    predicts every VM's disk and network bytes/s.
    """
    n_ref = inventory.reference_cores
    io = io or {}
    task_hosts = allocation.hosts
    min_y, avg_y = allocation.min_yield(instance), allocation.avg_yield(instance)

    floor, who = cluster.min_yield, f"cluster {cluster.name!r} min_yield"
    if request.min_yield is not None and request.min_yield > floor:
        floor, who = request.min_yield, f"request {request.name!r} min_yield"
    if min_y < floor - YIELD_TOLERANCE:
        return Decision(False, f"the minimum yield would be {min_y:.4f}, below {who} {floor:g}"
                        + unmanaged_note(inventory), None, min_y, avg_y)
    yields = allocation.yields(instance)
    missed = floors_missed(existing.vms, {v.name: float(yields[int(instance.task_job[t])])
                                          for t, v in enumerate(existing.vms)})
    if missed:
        vc, got, floor = missed[0]
        return Decision(False, f"virtual cluster {vc!r} would get a yield of {got:.4f}, below the min_yield "
                               f"{floor:g} it was admitted with", None, min_y, avg_y)

    per_vm: dict[str, VmPrediction] = {}
    steps: list[Step] = []
    boot = boot_for(cluster, request)
    names = request.vm_names()  # once: rebuilt per VM it made admission quadratic in the request
    for t, h in enumerate(task_hosts):
        j = int(instance.task_job[t])
        host = inventory.hosts[int(h)].name
        if t < len(existing.vms):
            v = existing.vms[t]
            assert v.meta is not None
            cap = realisable_cap(allocation.cpu[j] * n_ref, v.vcpus)
            shares = io_amounts(float(yields[j]), io.get(j, {}))
            per_vm[v.name] = VmPrediction(host, v.meta.cluster, v.meta.cpu_need_cores, cap, float(yields[j]), shares)
            if v.cap_cores is None or not same_cap(v.cap_cores, cap, v.vcpus):
                steps.append(SetCapStep(v.name, host, cap, **io_step_fields(SetCapStep, shares)))
        else:
            name = names[t - len(existing.vms)]
            cap = realisable_cap(allocation.cpu[j] * n_ref, request.vcpus)
            if cap < min_cap(request.vcpus):
                return Decision(False, f"each VM would get {cap:g} cores, below the smallest cap of a "
                                       f"{request.vcpus}-vCPU VM ({min_cap(request.vcpus):g} cores)", None,
                                min_y, avg_y)
            shares = io_amounts(float(yields[j]), io.get(j, {}))
            per_vm[name] = VmPrediction(host, request.name, cores, cap, float(yields[j]), shares)
            steps.append(CreateStep(name, host, request.name, request.vcpus, request.memory_bytes, cores, cap, boot,
                                    request.min_yield, request.disk_bps, request.net_bps, request.weight,
                                    request.tenant, spread=request.spread, together=request.together,
                                    pinned=request.pinned, priority=request.priority,
                                    **io_step_fields(CreateStep, shares)))
    in_order = order_steps(steps, current_caps(inventory), {h.name: float(h.cores) for h in inventory.hosts}) \
        if ordered else tuple(steps)
    extra: dict[str, object] = {"request": request.name}
    if policy is not None:
        extra["policy"] = policy
    plan = Plan("place", cluster.name, snapshot_hash(full), min_y, avg_y, per_vm, in_order, extra=extra)
    return Decision(True, None, plan, min_y, avg_y)


def _refusal(placing: Instance, rho: np.ndarray | None, algorithm: str, options: SolveOptions, request: Request,
             inventory: Inventory, report: Mapping[str, object]) -> str:
    """Why no placement was found, naming its real cause, checked in this order:

    1. a required rule no placement can meet (:func:`vcsched.rules.unsatisfiable`: a spread request with
       more VMs than hosts that may take one, a together request larger than every host, every host in
       maintenance);
    2. memory: the request's VMs, rules aside, do not fit in the memory the running VMs leave;
    3. a fluid resource (disk, network): they fit in memory only on hosts without it;
    4. the rules: without its spread and together rules and with every host in service, the request fits;
    5. CPU: what is left (the running VMs leave too little CPU at any yield the search probed).
    """
    required = without_soft(placing)
    screened = unsatisfiable(required)
    if screened is not None:
        return screened
    room = ResidualRoom(_unruled(placing), None, rho)
    pool_mem = room.pool_mem
    memory_left = placing.host_mem - np.bincount(room.fixed_at[room.fixed], weights=placing.task_mem[room.fixed],
                                                 minlength=placing.n_hosts)
    if not _memory_fits(pool_mem, memory_left):
        return _memory_reason(request, inventory)
    new = placing.jobs[-1]
    lacking = [r for r, need in new.needs if need > 0]
    with_all = np.ones(placing.n_hosts, dtype=bool)
    for r in lacking:
        with_all &= placing.host_capacity[:, placing.resources.index(r)] > 0
    if lacking and not _memory_fits(pool_mem, np.where(with_all, memory_left, -1.0)):
        names = " and ".join(RESOURCE_NAMES.get(r, r) for r in lacking)
        having = [h.name for h, ok in zip(placing.hosts, with_all, strict=True) if ok]
        where = f"only {', '.join(having)} can give, without" if having else "no host can give, with"
        return (f"{names}: {request.vms} VMs of {format_size(request.memory_bytes)} need {names}, which {where} "
                f"the memory for them (free memory: {_free_memory(inventory)})")
    if placing.has_rules:
        unruled = _admission_placer(rho, algorithm, options)(_unruled(placing), options)
        if unruled.hosts is not None:
            return _rules_reason(request, placing, inventory) or str(report.get("infeasible", "the placement rules"))
    return (f"cpu: no placement of {request.vms} VMs of {request.need_cores(inventory.reference_cores):g} cores "
            f"reaches a yield of {SEARCH_FLOOR:g} of the bound in the CPU the running VMs leave"
            + unmanaged_note(inventory))


def unmanaged_note(inventory: Inventory) -> str:
    """``" (unmanaged domains reserve h1 1 of 1 cores; h1 40 of 50 MB/s disk)"``: the CPU, and the measured
    disk and network rates, a refusal could not use, said, or ""."""
    held = [(h.name, inventory.unmanaged_cores(h.name), h.cores) for h in inventory.hosts]
    said = [f"{name} {r:.2f} of {cores}" for name, r, cores in held if r > 0]
    parts = [f"{', '.join(said)} cores"] if said else []
    for res in ("disk", "net"):
        io = [f"{h.name} {u / 1e6:.2f} of {c / 1e6:.2f} MB/s" for h in inventory.hosts
              if (c := h.capacity(res)) is not None and (u := inventory.unmanaged_io(h.name, res)) > 0]
        if io:
            parts.append(f"{', '.join(io)} {res}")
    return f" (unmanaged domains reserve {'; '.join(parts)})" if parts else ""


#: What a refusal calls each extra fluid resource.
RESOURCE_NAMES = {"disk": "disk", "net": "network"}


def _unruled(placing: Instance) -> Instance:
    """``placing`` without the request's rules and with every host in service (the running VMs stay pinned)."""
    new = dataclasses.replace(placing.jobs[-1], spread=None, together=None)
    return dataclasses.replace(placing, jobs=(*placing.jobs[:-1], new),
                               hosts=tuple(dataclasses.replace(h, maintenance=False) for h in placing.hosts))


def _memory_fits(memory: np.ndarray, memory_left: np.ndarray) -> bool:
    """Whether VMs of these memory sizes pack into what each host has left (MCB8's kernel on memory alone)."""
    kernel = KERNELS[kernel_backend(None)]
    zero = np.zeros(len(memory))
    return kernel(sorted_lists(VARIANTS["mcb8"], zero, memory), np.full(len(memory_left), np.inf),
                  np.asarray(memory_left, dtype=float), None) is not None


def _rules_reason(request: Request, instance: Instance, inventory: Inventory) -> str | None:
    """Why a request with placement rules found no room, when its rules are the likely cause."""
    rules = [f"{k} = {v!r}" for k, v in (("spread", request.spread), ("together", request.together)) if v]
    cordoned = [h.name for h in instance.hosts if h.maintenance]
    if not rules and not cordoned:
        return None
    where = f" ({len(cordoned)} host(s) in maintenance: {', '.join(cordoned)})" if cordoned else ""
    return (f"no placement of {request.vms} VMs honours {' and '.join(rules) or 'maintenance'}{where} in the room "
            "the running VMs leave" + unmanaged_note(inventory))


def floors_missed(vms: Iterable[VmState], yields: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """``(virtual cluster, its lowest yield, its floor)`` for each cluster below the floor in its metadata.

    A request's ``min_yield`` is recorded in its VMs' metadata when admitted,
    so that no later admission squeezes it below what it was promised.
    """
    worst: dict[str, tuple[float, float]] = {}
    for v in vms:
        if v.meta is None or v.meta.min_yield is None or v.name not in yields:
            continue
        got = min(yields[v.name], worst.get(v.meta.cluster, (math.inf, 0.0))[0])
        worst[v.meta.cluster] = (got, v.meta.min_yield)
    return [(vc, got, floor) for vc, (got, floor) in sorted(worst.items()) if got < floor - YIELD_TOLERANCE]


def current_caps(inventory: Inventory) -> dict[str, dict[str, float]]:
    """Caps in cores per host of the running managed VMs; an uncapped VM counts as all its vCPUs."""
    caps: dict[str, dict[str, float]] = {h.name: {} for h in inventory.hosts}
    for v in inventory.managed():
        caps.setdefault(v.host, {})[v.name] = v.cap_or_vcpus
    return caps


def free_memory(inventory: Inventory) -> dict[str, int]:
    """Each host's bytes left for new VMs: usable memory less every running VM's (never below 0)."""
    unmanaged = unmanaged_memory(inventory)
    return {h.name: max(h.usable_memory - unmanaged[h.name] - sum(v.memory_bytes for v in inventory.vms_on(h.name)
                                                                  if v.active and v.managed), 0)
            for h in inventory.hosts}


def _free_memory(inventory: Inventory) -> str:
    """Each host's memory left for new VMs, e.g. ``h0 896 MiB, h1 1 GiB``."""
    return ", ".join(f"{h} {format_size(f)}" for h, f in free_memory(inventory).items())


def _memory_reason(request: Request, inventory: Inventory) -> str:
    return (f"memory: {request.vms} VMs of {format_size(request.memory_bytes)} do not fit in the free memory "
            f"({_free_memory(inventory)})")
