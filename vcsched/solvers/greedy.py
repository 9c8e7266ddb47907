"""Greedy placement with and without backtracking: GR, SG, GB, SGB (paper section 3.3).

GR takes the tasks in the given order (a parallel job's tasks are separate
tasks, numbered job by job) and puts each on the host with the least CPU
load where its memory fits, ties going to the lowest host index.  SG does the
same after a stable sort by memory, largest first, so that the awkward tasks
go while there is still room.  CPU never makes a placement fail (it only
lowers the yield); memory does, so GR/SG fail when a task fits nowhere.

*Load* is the sum of the CPU needs (``alpha``) already on the host, divided by
the host's CPU capacity ``C_h``.  The paper has identical unit hosts, where
the division changes nothing; for heterogeneous hosts ``load / C_h`` is what
the host's yield depends on (``min(1, C_h / load)``, see :mod:`vcsched.yields`),
so the greedy keeps balancing the quantity the objective cares about.

On the resource vector (extra fluid resources such as disk and network,
docs/policies.md) every algorithm here is the same with a host's load the
largest of its relative loads over the fluid resources, and with a host that
has none of a resource a task needs counted as one the task does not fit
(like a host without the memory): a task there could only run at yield 0.

GB and SGB run GR's and SG's choices as a depth-first search: when a task
fits nowhere they go back to the latest task that still has an untried host
(hosts tried in the greedy's order at that point) and continue from there.
The search is bounded by ``options.max_attempts`` placement attempts (one
attempt = one task put on one host; the paper uses 500,000).  The search is
an explicit stack, not recursion: 500-task instances would overflow Python's
recursion limit, and the loop below touches only plain lists (measured on
the shared 2-core development machine: a hopeless 64-host instance with 100
to 500 tasks stops at the 500,000-attempt bound after 0.9 to 1.5 s).

Pruning of equivalent hosts.  At one depth, two candidate hosts with the
same capacities (C_h, M_h) and the same current CPU and memory loads (exact
float equality, in practice: two empty identical hosts) lead to isomorphic
subtrees: relabelling the two hosts maps every completion of one onto a
completion of the other with the same memory feasibility.  So if the first
subtree is exhausted without success, the second one would be too; skipping
it changes neither whether the search succeeds nor which placement it
returns first, only how many attempts it spends.  Because attempts spent on
duplicates are saved, the pruned search reaches further within the same
bound than the paper's unpruned one; the ``attempts`` count in the result's
``detail`` is the number actually made.  When the search runs out of choices
before the bound, the instance is proved infeasible (``exhausted``): no
placement fits in memory (and, on the resource vector, gives every task a
host with each fluid resource it needs).

Placement rules (docs/rules.md): pinned tasks are placed first (they load
their hosts and are not part of the order), a host in maintenance is never a
candidate (it closes the (task, host) pair exactly as a missing fluid
resource does: :func:`vcsched.rules.job_hosts`), and a host that already
holds a task of a spread job is not a candidate for another of its tasks.
The pruning of equivalent hosts then also compares the spread groups present
(two hosts are equivalent only when they hold the same ones).
"""

from __future__ import annotations

import numpy as np

from vcsched.model import Instance, SolveOptions
from vcsched.rules import allowed_matrix, job_hosts, spread_groups
from vcsched.solvers.algorithm import Placement, Placer
from vcsched.units import MEMORY_TOLERANCE


def task_order(instance: Instance, *, sort_by_memory: bool) -> list[int]:
    """GR's order (as given) or SG's (memory descending, stable so equal memory keeps the given order).

    Pinned tasks are left out: they are placed where they are pinned before the others (:func:`_pinned_start`).
    """
    if not sort_by_memory:
        order = list(range(instance.n_tasks))
    else:
        order = [int(t) for t in np.argsort(-instance.task_mem, kind="stable")]
    if instance.has_rules:
        pins = instance.task_pinned
        order = [t for t in order if pins[t] < 0]
    return order


class _Spread:
    """The spread groups (required anti-affinity) present on each host while a pass places tasks."""

    def __init__(self, instance: Instance) -> None:
        self.active = instance.has_rules
        self.group = spread_groups(instance).tolist() if self.active else []
        self.on: list[set[int]] = [set() for _ in range(instance.n_hosts)] if self.active else []

    def ok(self, t: int, h: int) -> bool:
        """Host ``h`` holds no task of ``t``'s spread job (True when ``t``'s job is not spread)."""
        if not self.active:
            return True
        g = self.group[t]
        return g < 0 or g not in self.on[h]

    def add(self, t: int, h: int) -> None:
        if self.active and self.group[t] >= 0:
            self.on[h].add(self.group[t])

    def remove(self, t: int, h: int) -> None:
        if self.active and self.group[t] >= 0:
            self.on[h].discard(self.group[t])

    def state(self, h: int) -> frozenset[int]:
        return frozenset(self.on[h]) if self.active else frozenset()


class _HostLoads:
    """Per-host relative loads over the fluid resources, and which hosts each task may use.

    A host's *load* is the largest of its relative loads ``sum need_r / C_hr``
    over the fluid resources: its yield is ``min(1, C_hr / L_hr)`` over its
    resources, so that is the quantity the objective cares about.  With CPU
    the only fluid resource it is section 3.3's ``load / C_h``, computed with
    the same floating-point operations as always (the CPU-only results are
    pinned bit for bit).  A host without a resource the task needs, or in
    maintenance, is not one the task fits (:func:`vcsched.rules.job_hosts`).
    Plain lists, not numpy: the loops below touch one host at a time.
    """

    def __init__(self, instance: Instance) -> None:
        self.cap = instance.host_capacity.tolist()
        self.need = instance.job_need.tolist()
        self.job = instance.task_job.tolist()
        self.loads = [[0.0] * len(instance.resources) for _ in range(instance.n_hosts)]
        self.load = [0.0] * instance.n_hosts
        allowed = job_hosts(instance)
        if instance.has_extra_resources:
            self.allowed: list[list[bool]] = allowed.tolist()
        else:  # maintenance alone: one row shared by every job
            self.allowed = [allowed[0].tolist()] * instance.n_jobs if instance.n_jobs else []

    def ok(self, t: int) -> list[bool]:
        """Hosts task ``t`` may use (maintenance, fluid resources; memory and spread are the caller's)."""
        return self.allowed[self.job[t]]

    def add(self, t: int, h: int, sign: float = 1.0) -> None:
        """Put task ``t`` on host ``h`` (``sign=-1``: take it off again)."""
        row, cap = self.loads[h], self.cap[h]
        for r, x in enumerate(self.need[self.job[t]]):
            if x > 0:
                if sign > 0:
                    row[r] += x / cap[r]
                else:
                    row[r] -= x / cap[r]
        self.load[h] = max(row)

    def state(self, h: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """What makes two hosts interchangeable at this point: capacities and loads per resource."""
        return tuple(self.cap[h]), tuple(self.loads[h])


def _pinned_start(instance: Instance, hosts: np.ndarray, free_mem: list[float], loads: _HostLoads,
                  spread: _Spread) -> bool:
    """Place the pinned tasks where they are pinned; False when their memory overflows a host, or a host
    lacks a fluid resource a task pinned to it needs."""
    if not instance.has_rules:
        return True
    pinned = np.flatnonzero(instance.task_pinned >= 0)
    if not len(pinned):
        return True
    at_pin = allowed_matrix(instance, pinned)
    for i, t in enumerate(pinned.tolist()):
        h = int(instance.task_pinned[t])
        if not at_pin[i, h]:
            return False
        hosts[t] = h
        free_mem[h] -= float(instance.task_mem[t])
        loads.add(t, h)
        spread.add(t, h)
        if free_mem[h] < 0:
            return False
    return True


def greedy(instance: Instance, order: list[int]) -> np.ndarray | None:
    """One greedy pass: each task on the least-loaded host where it fits; None if one fits nowhere.

    On an instance with extra fluid resources (disk, net, ...: docs/policies.md)
    the load is the largest relative load over them (:class:`_HostLoads`).
    """
    n_hosts = instance.n_hosts
    free_mem = (instance.host_mem + MEMORY_TOLERANCE).tolist()
    mem = instance.task_mem.tolist()
    loads = _HostLoads(instance)
    load = loads.load
    spread = _Spread(instance)
    hosts = np.empty(instance.n_tasks, dtype=np.int64)
    if not _pinned_start(instance, hosts, free_mem, loads, spread):
        return None
    for t in order:
        m = mem[t]
        ok = loads.ok(t)
        best = -1
        best_load = 0.0
        for h in range(n_hosts):
            if free_mem[h] >= m and ok[h] and (best < 0 or load[h] < best_load) and spread.ok(t, h):
                best, best_load = h, load[h]
        if best < 0:
            return None
        hosts[t] = best
        free_mem[best] -= m
        loads.add(t, best)
        spread.add(t, best)
    return hosts


def backtracking(instance: Instance, order: list[int], max_attempts: int) -> tuple[np.ndarray | None, int, bool]:
    """Depth-first search over the greedy's host choices.

    Returns ``(hosts or None, attempts made, exhausted)``; ``exhausted`` is True
    when every choice was tried, i.e. no placement fits (memory, the rules, and
    on the resource vector a host for every task with each fluid resource it needs).
    """
    n_tasks, n_hosts = len(order), instance.n_hosts
    cap_mem = instance.host_mem.tolist()
    free_mem = (instance.host_mem + MEMORY_TOLERANCE).tolist()
    mem = instance.task_mem.tolist()
    loads = _HostLoads(instance)
    load = loads.load
    spread = _Spread(instance)
    host_range = range(n_hosts)
    start = np.empty(instance.n_tasks, dtype=np.int64)
    if not _pinned_start(instance, start, free_mem, loads, spread):
        return None, 0, True
    if n_tasks == 0:
        return start, 0, True

    def candidates(t: int) -> list[int]:
        """Hosts where task ``t`` fits, in greedy order, one per class of equivalent hosts."""
        m, ok = mem[t], loads.ok(t)
        fit = sorted((load[h], h) for h in host_range if free_mem[h] >= m and ok[h] and spread.ok(t, h))
        out: list[int] = []
        seen: set[tuple[object, ...]] = set()
        for _, h in fit:
            state = (*loads.state(h), cap_mem[h], free_mem[h], spread.state(h))
            if state not in seen:
                seen.add(state)
                out.append(h)
        return out

    chosen = [0] * n_tasks  # host of the task at each depth
    cands: list[list[int]] = [candidates(order[0])]
    pos = [0]
    depth = 0
    attempts = 0
    while True:
        level = cands[depth]
        p = pos[depth]
        if p < len(level):
            if attempts >= max_attempts:
                return None, attempts, False
            h = level[p]
            pos[depth] = p + 1
            t = order[depth]
            attempts += 1
            free_mem[h] -= mem[t]
            loads.add(t, h)
            spread.add(t, h)
            chosen[depth] = h
            depth += 1
            if depth == n_tasks:
                hosts = start.copy()
                hosts[order] = chosen
                return hosts, attempts, False
            if len(cands) > depth:
                cands[depth] = candidates(order[depth])
                pos[depth] = 0
            else:
                cands.append(candidates(order[depth]))
                pos.append(0)
        else:
            depth -= 1
            if depth < 0:
                return None, attempts, True
            h = chosen[depth]
            t = order[depth]
            free_mem[h] += mem[t]
            loads.add(t, h, -1.0)
            spread.remove(t, h)


def greedy_placer(sort_by_memory: bool) -> Placer:
    """GR (``sort_by_memory`` False) or SG as a registry placer."""
    def place(instance: Instance, options: SolveOptions) -> Placement:
        hosts = greedy(instance, task_order(instance, sort_by_memory=sort_by_memory))
        return Placement(hosts=hosts)

    return place


def backtracking_placer(sort_by_memory: bool) -> Placer:
    """GB (``sort_by_memory`` False) or SGB as a registry placer, bounded by ``max_attempts``."""
    def place(instance: Instance, options: SolveOptions) -> Placement:
        order = task_order(instance, sort_by_memory=sort_by_memory)
        hosts, attempts, exhausted = backtracking(instance, order, options.max_attempts)
        detail: dict[str, object] = {"attempts": attempts, "max_attempts": options.max_attempts}
        if hosts is None:
            detail["stopped"] = "no memory-feasible placement exists" if exhausted else "attempt bound reached"
        return Placement(hosts=hosts, detail=detail)

    return place

