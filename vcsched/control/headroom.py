"""How many more VMs of one shape fit in a running cluster: ``vcsched headroom`` (Ganeti's ``hspace``).

Pure.  The answer is admission's own (:func:`vcsched.control.admission.admit`, then
:func:`vcsched.control.failover.keep_failover_room` as ``vcsched place`` runs them), asked of
requests of ``n`` VMs of the shape: the largest ``n`` admitted.  No separate approximation, so that
``headroom`` says N exactly when ``place`` admits N such VMs and refuses N+1.

**One placement, not a search of placements.**  The running VMs stay where they are, so the count is
computable host by host (:func:`estimate`): a host takes as many VMs of the shape as its free memory
holds and as its CPU holds at the floor once its own VMs have theirs; with room for ``k`` host failures,
no more than the survivors of the ``k`` largest hosts hold with every VM at its floor.  Admission then
checks that count once, and the one above it: N admitted, N+1 refused.  Should the arithmetic miss
(rules, disk or network, rounding, where admission's placement puts the VMs), the count is walked from
there — steps doubling, then halved — until admission agrees (:func:`largest_admitted`), so that the
answer is always admission's.  Each admission costs one placement of the whole cluster: asking about
``2 log2 N`` counts from 1, as this module did, cost 425 s at 1,000 hosts.

**The floor.**  Every VM, new and running, is counted at a yield of at least the floor: ``--min-yield``
when given (the cluster file's ``min_yield`` still applies when higher), else the cluster file's
``min_yield``, else the lowest yield a running managed VM has now (its cap over its need), else 1 (no
managed VM runs).  Without one, CPU would bound nothing (any yield above 0 would do) and a CPU-bound
shape would be counted by memory alone.  The answer says which floor it counted with.

**The question's knobs.**  ``failures`` replaces the cluster file's ``failures_tolerated`` (room kept
for the loss of any that many hosts); ``min_yield`` is the shape's request floor, as a request's
``min_yield``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from vcsched.caps import min_cap
from vcsched.control.admission import Decision, admit, free_memory, unmanaged_memory
from vcsched.control.failover import floor_of, keep_failover_room
from vcsched.control.sharing import Sharing
from vcsched.control.status import predicted_yield
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.formats.request import Request
from vcsched.inventory import Inventory
from vcsched.model import SolveOptions
from vcsched.plans.plan import Plan
from vcsched.plans.steps import CreateStep
from vcsched.units import FIT_TOLERANCE

#: The virtual cluster the question's VMs are named after (a suffix is added when the cluster has one already).
NAME = "headroom"

#: A stand-in boot for a cluster without a ``[guest]``: the question's plan is never applied.
NO_BOOT = "(headroom: never booted)"


@dataclass(frozen=True)
class Headroom:
    """The answer: ``count`` more VMs of ``shape`` fit, ``per_host`` of them on each host (hosts with none left
    out), at a predicted ``min_yield``/``avg_yield`` for the whole cluster (None when none fits), with room kept
    for ``failures`` host failures, every yield at least ``floor`` (``floor_from``: whose floor it is);
    ``limit``: why one more is refused (admission's reason); ``asked``: how many counts admission was asked."""

    shape: Request
    count: int
    failures: int
    floor: float
    floor_from: str
    per_host: dict[str, int]
    min_yield: float | None
    avg_yield: float | None
    limit: str
    plan: Plan | None
    asked: int = 0

    def to_dict(self) -> dict[str, object]:
        s = self.shape
        return {"vm": {"vcpus": s.vcpus, "memory": s.memory_bytes, "cpu_cores": s.cpu_cores, "cpu_need": s.cpu_need,
                       "disk_bps": s.disk_bps, "net_bps": s.net_bps},
                "count": self.count, "failures": self.failures, "min_yield_floor": self.floor,
                "floor_from": self.floor_from, "per_host": self.per_host, "min_yield": self.min_yield,
                "avg_yield": self.avg_yield, "limit": self.limit}


def _free_name(inventory: Inventory, cluster: Cluster) -> str:
    """A virtual-cluster name no running VM, virtual cluster or host starts with (the request's VMs are NAME-i)."""
    taken = [*inventory.clusters(), *(v.name for v in inventory.vms), *cluster.host_names]
    for i in range(len(taken) + 1):
        name = NAME if i == 0 else f"{NAME}{i}"
        if not any(t.startswith(name) for t in taken):
            return name
    raise AssertionError("unreachable: one of len(taken) + 1 names is free")


def floor_for(cluster: Cluster, inventory: Inventory, min_yield: float | None) -> tuple[float, str]:
    """The yield every VM is counted at, and whose it is (module docstring, "The floor")."""
    if min_yield is not None:
        if cluster.min_yield > min_yield:
            return cluster.min_yield, f"cluster {cluster.name!r} min_yield (above --min-yield {min_yield:g})"
        return min_yield, "--min-yield"
    if cluster.min_yield > 0:
        return cluster.min_yield, f"cluster {cluster.name!r} min_yield"
    now = [(y, v.name) for v in inventory.up().managed() if (y := predicted_yield(v)) is not None]
    if not now:
        return 1.0, "no managed VM runs: full yield"
    y, vm = min(now)
    return y, f"the lowest current yield (VM {vm!r})"


def estimate(cluster: Cluster, inventory: Inventory, shape: Request, floor: float, failures: int = 0) -> int:
    """How many VMs of ``shape`` fit by per-host arithmetic around the running VMs, every VM at ``floor`` or
    its own recorded floor (module docstring): admission's count whenever nothing but memory and CPU binds.

    Per host in service: the VMs its free memory holds, and its CPU holds once its VMs have their floors.
    With ``failures``: at most what the survivors of the ``failures`` largest hosts (by memory, by cores) hold
    with every VM, running and new, at its floor — the displaced VMs restart there.
    """
    up = inventory.up()
    n_ref = up.reference_cores
    cores = shape.need_cores(n_ref)
    per_vm_cpu = cores * max(floor, min_cap(shape.vcpus) / cores if cores > 0 else 0.0)
    free = free_memory(up)
    used_cpu: defaultdict[str, float] = defaultdict(float)  # per host its VMs' CPU at the floor
    failover_cpu: defaultdict[str, float] = defaultdict(float)  # ... at their own floors (what a failover keeps)
    displaced: defaultdict[str, list[tuple[int, float]]] = defaultdict(list)  # per host its VMs' (memory, CPU)
    for v in up.managed():
        assert v.meta is not None
        need = min(v.meta.cpu_need_cores, n_ref)
        used_cpu[v.host] += need * max(floor, cluster.min_yield, v.meta.min_yield or 0.0)
        failover_cpu[v.host] += need * floor_of(cluster, v.meta)
        displaced[v.host].append((v.memory_bytes, need * floor_of(cluster, v.meta)))
    served = [h for h in up.hosts if h.name not in cluster.cordoned]
    fits: dict[str, int] = {}
    for h in served:
        fit = free[h.name] // shape.memory_bytes
        if per_vm_cpu > 0:
            fit = min(fit, int((h.cores - used_cpu[h.name] + FIT_TOLERANCE) // per_vm_cpu))
        fits[h.name] = max(fit, 0)
    count = sum(fits.values())
    if failures < 1:
        return count
    if len(served) <= failures:
        return 0
    unmanaged = unmanaged_memory(up)
    memory = sorted(max(h.usable_memory - unmanaged[h.name], 0) for h in served)
    cpus = sorted(float(h.cores) for h in served)
    running = sum(v.memory_bytes for v in up.managed())
    by_memory = (sum(memory[:-failures]) - running) // shape.memory_bytes
    new_cpu = cores * max(floor, cluster.min_yield)
    by_cpu = int((sum(cpus[:-failures]) - sum(failover_cpu.values()) + FIT_TOLERANCE) // new_cpu) \
        if new_cpu > 0 else count
    bound = max(min(count, by_memory, by_cpu), 0)
    if failures > 1:
        return bound
    # One failure, host by host: the failed host's new VMs need whole slots on the others, each VM fewer on a
    # survivor opening one; its running VMs need what the others have left after that.
    left = {h.name: (free[h.name] - fits[h.name] * shape.memory_bytes,
                     h.cores - failover_cpu[h.name] - fits[h.name] * new_cpu) for h in served}
    slots = {h: min(m // shape.memory_bytes, int((c + FIT_TOLERANCE) // new_cpu) if new_cpu > 0 else m)
             for h, (m, c) in left.items()}
    all_slots = sum(slots.values())
    spare_memory = sum(m for m, _ in left.values())
    spare_cpu = sum(c for _, c in left.values())
    fewer = 0
    for g in served:
        others = all_slots - slots[g.name]
        short = max(fits[g.name] - others, 0)  # VMs to take off survivors so that g's new VMs find slots
        old_memory = sum(m for m, _ in displaced[g.name])
        old_cpu = sum(c for _, c in displaced[g.name])
        rest_memory = spare_memory - left[g.name][0] - (fits[g.name] - short) * shape.memory_bytes
        rest_cpu = spare_cpu - left[g.name][1] - (fits[g.name] - short) * new_cpu
        more = max(-(-(old_memory - rest_memory) // shape.memory_bytes), 0)
        if new_cpu > 0:
            more = max(more, math.ceil((old_cpu - rest_cpu - FIT_TOLERANCE) / new_cpu))
        fewer = max(fewer, short + more)
    return max(min(bound, count - fewer), 0)


def headroom_for(cluster: Cluster, inventory: Inventory, shape: Request, *, failures: int | None = None,
                 min_yield: float | None = None, algorithm: str = "mcb8", options: SolveOptions | None = None,
                 sharing: Sharing | None = None) -> Headroom:
    """The largest number of VMs of ``shape`` that admission takes now (module docstring).

    ``failures``: room for that many host failures instead of the cluster file's ``failures_tolerated`` (bad
    input when not below the hosts' count); ``min_yield``: the shape's floor instead of :func:`floor_for`'s
    default.  Raises :class:`~vcsched.control.admission.HostsDown` when no host answers (exit 1).
    """
    if failures is not None:
        if failures < 0 or failures >= len(cluster.hosts):
            raise InputError(f"--failures: {failures} is not a whole number in [0, {len(cluster.hosts) - 1}] "
                             f"(cluster {cluster.name!r} has {len(cluster.hosts)} hosts)")
        cluster = dataclasses.replace(cluster, failures_tolerated=failures)
    template = shape.template if shape.template or shape.image or cluster.guest else NO_BOOT
    floor, floor_from = floor_for(cluster, inventory, min_yield)
    base = dataclasses.replace(shape, name=_free_name(inventory, cluster), template=template, min_yield=floor)
    options = options or SolveOptions()
    asked = 0

    def ask(n: int) -> Decision:
        nonlocal asked
        asked += 1
        request = dataclasses.replace(base, vms=n)
        decision = admit(cluster, inventory, request, algorithm, options, sharing, ordered=False)
        return keep_failover_room(cluster, inventory, decision, explain=False)

    start = estimate(cluster, inventory, base, floor, cluster.failures_tolerated) if inventory.up().hosts else 1
    best, refused = largest_admitted(ask, start)
    plan = best[1].plan if best is not None else None
    landed: Counter[str] = Counter(s.host for s in plan.steps if isinstance(s, CreateStep)) if plan else Counter()
    per_host = {h.name: landed[h.name] for h in inventory.hosts if landed[h.name]}  # the cluster file's order
    return Headroom(base, best[0] if best else 0, cluster.failures_tolerated, floor, floor_from,
                    per_host, plan.min_yield if plan else None,
                    plan.avg_yield if plan else None, refused[1].reason or "refused", plan, asked)


def largest_admitted(ask: Callable[[int], Decision], start: int) -> tuple[tuple[int, Decision] | None,
                                                                     tuple[int, Decision]]:
    """``(n, decision)`` of the largest ``n`` admitted (None: not even 1) and of ``n + 1``, refused.

    ``start`` (the per-host arithmetic's count, :func:`estimate`) is asked first with ``start + 1``: when the
    arithmetic is right, two admissions answer.  Otherwise steps from there double (up while admitted, down
    while refused) until the answer is bracketed, then the bracket is halved: about ``2 log2 |N - start|``
    admissions, never fewer than the two that make the answer admission's (N admitted, N+1 refused).
    """
    lo: tuple[int, Decision] | None = None
    hi: tuple[int, Decision] | None = None
    n = max(start, 1)
    d = ask(n)
    if d.admitted:
        lo, step = (n, d), 1
        while hi is None:
            d = ask(lo[0] + step)
            if d.admitted:
                lo, step = (lo[0] + step, d), 2 * step
            else:
                hi = (lo[0] + step, d)
    else:
        hi, step = (n, d), 1
        while lo is None and hi[0] > 1:
            m = max(hi[0] - step, 1)
            d = ask(m)
            if d.admitted:
                lo = (m, d)
            else:
                hi, step = (m, d), 2 * step
    while hi[0] - (lo[0] if lo else 0) > 1:
        mid = ((lo[0] if lo else 0) + hi[0]) // 2
        d = ask(mid)
        if d.admitted:
            lo = (mid, d)
        else:
            hi = (mid, d)
    return lo, hi
