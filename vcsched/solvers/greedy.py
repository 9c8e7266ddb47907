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
before the bound, the instance is proved memory-infeasible (``exhausted``).

Placement rules (docs/rules.md): pinned tasks are placed first (they load
their hosts and are not part of the order), a host in maintenance is never a
candidate, and a host that already holds a task of a spread job is not a
candidate for another of its tasks.  The pruning of equivalent hosts then
also compares the spread groups present (two hosts are equivalent only when
they hold the same ones).
"""

from __future__ import annotations

import numpy as np

from vcsched.model import Instance, SolveOptions
from vcsched.rules import spread_groups
from vcsched.solvers.registry import Placement, Placer, register
from vcsched.yields import MEMORY_TOLERANCE


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


class _Rules:
    """What the greedy passes need of the rules: allowed hosts, spread groups, and the groups on each host."""

    def __init__(self, instance: Instance) -> None:
        self.active = instance.has_rules
        self.open = (~instance.host_cordoned).tolist()
        self.group = spread_groups(instance).tolist()
        self.on: list[set[int]] = [set() for _ in range(instance.n_hosts)]

    def ok(self, t: int, h: int) -> bool:
        if not self.active:
            return True
        g = self.group[t]
        return self.open[h] and (g < 0 or g not in self.on[h])

    def add(self, t: int, h: int) -> None:
        if self.active and self.group[t] >= 0:
            self.on[h].add(self.group[t])

    def remove(self, t: int, h: int) -> None:
        if self.active and self.group[t] >= 0:
            self.on[h].discard(self.group[t])


def _pinned_start(instance: Instance, hosts: np.ndarray, free_mem: list[float], rules: _Rules,
                  load: list[float] | None = None) -> bool:
    """Place the pinned tasks where they are pinned; False when their memory overflows a host."""
    if not rules.active:
        return True
    for t in np.flatnonzero(instance.task_pinned >= 0):
        h = int(instance.task_pinned[t])
        hosts[t] = h
        free_mem[h] -= float(instance.task_mem[t])
        if load is not None:
            load[h] += float(instance.task_alpha[t] / instance.host_cpu[h])
        rules.add(int(t), h)
        if free_mem[h] < 0:
            return False
    return True


def greedy(instance: Instance, order: list[int]) -> np.ndarray | None:
    """One greedy pass: each task on the least-loaded host where its memory fits; None if one fits nowhere."""
    n_hosts = instance.n_hosts
    cap_cpu = instance.host_cpu.tolist()
    free_mem = (instance.host_mem + MEMORY_TOLERANCE).tolist()
    alpha = instance.task_alpha.tolist()
    mem = instance.task_mem.tolist()
    load = [0.0] * n_hosts  # CPU need placed, relative to capacity
    hosts = np.empty(instance.n_tasks, dtype=np.int64)
    rules = _Rules(instance)
    if not _pinned_start(instance, hosts, free_mem, rules, load):
        return None
    for t in order:
        m = mem[t]
        best = -1
        best_load = 0.0
        for h in range(n_hosts):
            if free_mem[h] >= m and (best < 0 or load[h] < best_load) and rules.ok(t, h):
                best, best_load = h, load[h]
        if best < 0:
            return None
        hosts[t] = best
        free_mem[best] -= m
        load[best] += alpha[t] / cap_cpu[best]
        rules.add(t, best)
    return hosts


def greedy_vector(instance: Instance, order: list[int]) -> np.ndarray | None:
    """GR/SG on the resource vector (an instance with extra fluid resources, docs/policies.md).

    The same pass as :func:`greedy`, with a host's load the largest of its
    relative loads over every fluid resource (``sum need_r / C_hr``; a
    resource the host has none of, needed by a task already there, makes it
    infinite): the yield of a host is ``min(1, C_hr / L_hr)`` over its
    resources, so this is again the quantity the objective cares about.
    Instances whose only fluid resource is CPU never come here.
    """
    n_hosts = instance.n_hosts
    cap = instance.host_capacity
    free_mem = (instance.host_mem + MEMORY_TOLERANCE).tolist()
    mem = instance.task_mem.tolist()
    need = instance.job_need[instance.task_job]
    with np.errstate(divide="ignore", invalid="ignore"):
        # rel[t, h, r] is never built whole: one task's row against every host at a time.
        inv = np.where(cap > 0, 1.0 / np.where(cap > 0, cap, 1.0), np.inf)
    loads = np.zeros_like(cap)  # hosts x resources, relative
    load = [0.0] * n_hosts
    hosts = np.empty(instance.n_tasks, dtype=np.int64)
    rules = _Rules(instance)
    if not _pinned_start(instance, hosts, free_mem, rules):
        return None

    def put(t: int, h: int) -> None:
        with np.errstate(invalid="ignore"):
            add = np.where(need[t] > 0, need[t] * inv[h], 0.0)
        loads[h] += add
        load[h] = float(loads[h].max())

    for p in np.flatnonzero(instance.task_pinned >= 0) if rules.active else ():
        put(int(p), int(instance.task_pinned[p]))
    for t in order:
        m = mem[t]
        best = -1
        best_load = 0.0
        for h in range(n_hosts):
            if free_mem[h] >= m and (best < 0 or load[h] < best_load) and rules.ok(t, h):
                best, best_load = h, load[h]
        if best < 0:
            return None
        hosts[t] = best
        free_mem[best] -= m
        put(t, best)
        rules.add(t, best)
    return hosts


def backtracking(instance: Instance, order: list[int], max_attempts: int) -> tuple[np.ndarray | None, int, bool]:
    """Depth-first search over the greedy's host choices.

    Returns ``(hosts or None, attempts made, exhausted)``; ``exhausted`` is True
    when every choice was tried, i.e. no memory-feasible placement exists.
    """
    n_tasks, n_hosts = len(order), instance.n_hosts
    cap_cpu = instance.host_cpu.tolist()
    cap_mem = instance.host_mem.tolist()
    free_mem = (instance.host_mem + MEMORY_TOLERANCE).tolist()
    alpha = instance.task_alpha.tolist()
    mem = instance.task_mem.tolist()
    need = [alpha[t] / cap_cpu[h] for t in range(instance.n_tasks) for h in range(n_hosts)]  # t*H + h
    load = [0.0] * n_hosts
    host_range = range(n_hosts)
    rules = _Rules(instance)
    start = np.empty(instance.n_tasks, dtype=np.int64)
    if not _pinned_start(instance, start, free_mem, rules, load):
        return None, 0, True
    if n_tasks == 0:
        return start, 0, True

    def candidates(t: int) -> list[int]:
        """Hosts where task ``t`` fits, in greedy order, one per class of equivalent hosts."""
        m = mem[t]
        fit = sorted((load[h], h) for h in host_range if free_mem[h] >= m and rules.ok(t, h))
        out: list[int] = []
        seen: set[tuple[float, float, float, float, frozenset[int]]] = set()
        for _, h in fit:
            state = (cap_cpu[h], cap_mem[h], load[h], free_mem[h], frozenset(rules.on[h]) if rules.active
                     else frozenset())
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
            load[h] += need[t * n_hosts + h]
            rules.add(t, h)
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
            load[h] -= need[t * n_hosts + h]
            rules.remove(t, h)


def _greedy_placer(sort_by_memory: bool) -> Placer:
    def place(instance: Instance, options: SolveOptions) -> Placement:
        run = greedy_vector if instance.has_extra_resources else greedy
        hosts = run(instance, task_order(instance, sort_by_memory=sort_by_memory))
        return Placement(hosts=hosts)

    return place


def _backtracking_placer(sort_by_memory: bool) -> Placer:
    def place(instance: Instance, options: SolveOptions) -> Placement:
        order = task_order(instance, sort_by_memory=sort_by_memory)
        hosts, attempts, exhausted = backtracking(instance, order, options.max_attempts)
        detail: dict[str, object] = {"attempts": attempts, "max_attempts": options.max_attempts}
        if hosts is None:
            detail["stopped"] = "no memory-feasible placement exists" if exhausted else "attempt bound reached"
        return Placement(hosts=hosts, detail=detail)

    return place


register("gr", "greedy: tasks in given order, each on the least CPU-loaded host where memory fits (sec. 3.3)")(
    _greedy_placer(False)
)
register("sg", "sorted greedy: GR after sorting tasks by memory, largest first (sec. 3.3)")(_greedy_placer(True))
register("gb", "greedy with depth-first backtracking, bounded by --max-attempts (sec. 3.3)")(
    _backtracking_placer(False)
)
register("sgb", "sorted greedy with depth-first backtracking, bounded by --max-attempts (sec. 3.3)")(
    _backtracking_placer(True)
)
