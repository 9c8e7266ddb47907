"""How many more VMs of one shape fit in a running cluster: ``vcsched headroom`` (Ganeti's ``hspace``).

Pure.  The answer is admission's own (:func:`vcsched.control.admission.admit`, then
:func:`vcsched.control.failover.keep_failover_room` as ``vcsched place`` runs them), asked of
requests of ``n`` VMs of the shape: the largest ``n`` admitted.  No separate approximation, so that
``headroom`` says N exactly when ``place`` admits N such VMs and refuses N+1.

**The search.**  Admission is taken as monotone in ``n`` (one more VM never makes a request fit that
did not).  ``n`` doubles from 1 while admitted, then the gap between the last admitted and the first
refused count is halved: about ``2 log2 N`` admissions.  Every count the answer rests on was asked:
N admitted, N+1 refused (its reason is the answer's :attr:`Headroom.limit`).  Memory alone bounds
the search (VMs are rigid in memory: no host takes more than its free memory holds), so the count one
above that bound is refused for memory at once.

**The question's knobs.**  ``failures`` replaces the cluster file's ``failures_tolerated`` (room kept
for the loss of any that many hosts); ``min_yield`` is the shape's request floor, as a request's
``min_yield`` (the cluster file's still applies when higher).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from vcsched.control.admission import Decision, admit, free_memory
from vcsched.control.failover import keep_failover_room
from vcsched.control.sharing import Sharing
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.formats.request import Request
from vcsched.inventory import Inventory
from vcsched.model import SolveOptions
from vcsched.plans.plan import Plan
from vcsched.plans.steps import CreateStep

#: The virtual cluster the question's VMs are named after (a suffix is added when the cluster has one already).
NAME = "headroom"

#: A stand-in boot for a cluster without a ``[guest]``: the question's plan is never applied.
NO_BOOT = "(headroom: never booted)"


@dataclass(frozen=True)
class Headroom:
    """The answer: ``count`` more VMs of ``shape`` fit, ``per_host`` of them on each host (hosts with none left
    out), at a predicted ``min_yield``/``avg_yield`` for the whole cluster (None when none fits), with room kept
    for ``failures`` host failures; ``limit``: why one more is refused (admission's reason)."""

    shape: Request
    count: int
    failures: int
    floor: float | None
    per_host: dict[str, int]
    min_yield: float | None
    avg_yield: float | None
    limit: str
    plan: Plan | None

    def to_dict(self) -> dict[str, object]:
        s = self.shape
        return {"vm": {"vcpus": s.vcpus, "memory": s.memory_bytes, "cpu_cores": s.cpu_cores, "cpu_need": s.cpu_need,
                       "disk_bps": s.disk_bps, "net_bps": s.net_bps},
                "count": self.count, "failures": self.failures, "min_yield_floor": self.floor,
                "per_host": self.per_host, "min_yield": self.min_yield, "avg_yield": self.avg_yield,
                "limit": self.limit}


def _free_name(inventory: Inventory, cluster: Cluster) -> str:
    """A virtual-cluster name no running VM, virtual cluster or host starts with (the request's VMs are NAME-i)."""
    taken = [*inventory.clusters(), *(v.name for v in inventory.vms), *cluster.host_names]
    for i in range(len(taken) + 1):
        name = NAME if i == 0 else f"{NAME}{i}"
        if not any(t.startswith(name) for t in taken):
            return name
    raise AssertionError("unreachable: one of len(taken) + 1 names is free")


def memory_bound(inventory: Inventory, cluster: Cluster, memory_bytes: int) -> int:
    """The most VMs of ``memory_bytes`` the free memory of the up hosts in service holds (the search's cap)."""
    up = inventory.up()
    free = free_memory(up)
    return sum(free[h.name] // memory_bytes for h in up.hosts if h.name not in cluster.cordoned)


def headroom_for(cluster: Cluster, inventory: Inventory, shape: Request, *, failures: int | None = None,
                 min_yield: float | None = None, algorithm: str = "mcb8", options: SolveOptions | None = None,
                 sharing: Sharing | None = None) -> Headroom:
    """The largest number of VMs of ``shape`` that admission takes now (module docstring).

    ``failures``: room for that many host failures instead of the cluster file's ``failures_tolerated`` (bad
    input when not below the hosts' count); ``min_yield``: the shape's floor instead of its own.  Raises
    :class:`~vcsched.control.admission.HostsDown` when no host answers (exit 1).
    """
    if failures is not None:
        if failures < 0 or failures >= len(cluster.hosts):
            raise InputError(f"--failures: {failures} is not a whole number in [0, {len(cluster.hosts) - 1}] "
                             f"(cluster {cluster.name!r} has {len(cluster.hosts)} hosts)")
        cluster = dataclasses.replace(cluster, failures_tolerated=failures)
    template = shape.template if shape.template or shape.image or cluster.guest else NO_BOOT
    base = dataclasses.replace(shape, name=_free_name(inventory, cluster), template=template,
                               min_yield=shape.min_yield if min_yield is None else min_yield)
    options = options or SolveOptions()

    def ask(n: int) -> Decision:
        request = dataclasses.replace(base, vms=n)
        return keep_failover_room(cluster, inventory, admit(cluster, inventory, request, algorithm, options, sharing))

    best, refused = largest_admitted(ask, memory_bound(inventory, cluster, shape.memory_bytes))
    plan = best[1].plan if best is not None else None
    landed: Counter[str] = Counter(s.host for s in plan.steps if isinstance(s, CreateStep)) if plan else Counter()
    per_host = {h.name: landed[h.name] for h in inventory.hosts if landed[h.name]}  # the cluster file's order
    return Headroom(base, best[0] if best else 0, cluster.failures_tolerated, base.min_yield,
                    per_host, plan.min_yield if plan else None,
                    plan.avg_yield if plan else None, refused[1].reason or "refused", plan)


def largest_admitted(ask: Callable[[int], Decision], cap: int) -> tuple[tuple[int, Decision] | None,
                                                                   tuple[int, Decision]]:
    """``(n, decision)`` of the largest ``n`` admitted (None: not even 1) and of ``n + 1``, refused: doubling,
    then bisection.  ``cap`` (memory's bound) stops the doubling at ``cap + 1``, which memory refuses at once;
    should admission take it all the same (the bound rounded), doubling goes on: admission decides, not the cap."""
    lo: tuple[int, Decision] | None = None
    n = 1
    while True:
        d = ask(n)
        if not d.admitted:
            hi = (n, d)
            break
        lo = (n, d)
        n = 2 * n if n > cap else min(2 * n, cap + 1)  # past the bound (rounding): admission still decides
    while hi[0] - (lo[0] if lo else 0) > 1:
        mid = ((lo[0] if lo else 0) + hi[0]) // 2
        d = ask(mid)
        if d.admitted:
            lo = (mid, d)
        else:
            hi = (mid, d)
    return lo, hi
