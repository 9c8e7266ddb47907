"""Local search on the bottleneck: raise the minimum yield of a placement by moving and swapping tasks.

With the placement fixed, the minimum yield is ``min(1, min_h C_h / L_h)``
(:mod:`vcsched.yields`; ``L_h`` is the CPU need placed on host ``h``), so
raising it means lowering the highest *relative load* ``r_h = L_h / C_h``: a
makespan problem on hosts of different speeds, with memory as a hard
constraint.  Memory never changes the yield; it only forbids moves.

:func:`descend` improves a memory-feasible placement until no single
move (a task to another host) or swap (two tasks on two hosts exchange
hosts) improves it.  A move or swap touches two hosts ``h1``, ``h2`` and is
taken only when it lowers ``max(r_h1, r_h2)``: the vector of relative loads
sorted in decreasing order then decreases lexicographically, so the search
cannot cycle and never raises the highest load (the minimum yield never
drops).  Hosts are tried from the most loaded down, and the first host with
an improving move or swap gets the best one (the lowest resulting
``max(r_h1, r_h2)``); so every step first tries to relieve the bottleneck,
the host that sets the minimum yield, and when that is impossible it
balances the next hosts, which often opens a way for the bottleneck later.
Hosts whose load is within capacity (``r_h <= 1``, yield 1) are left alone.

:func:`perturb` makes a few random memory-feasible swaps or moves (a
*kick*, seeded), so that :func:`iterated_search` can leave a local optimum:
kick the best placement found, descend, keep the result when it is better
(iterated local search).

Everything works on :class:`LoadState` (the placement and its per-host
loads), in place; the arrays are numpy, and every step is vectorized over
the tasks of one host times all tasks (swaps) or all hosts (moves).

On the resource vector (extra fluid resources, docs/policies.md) the minimum
yield is ``min(1, min_hr C_hr / L_hr)``, so a host's relative load is the
largest over its fluid resources, ``r_h = max_r L_hr / C_hr``, and everything
above holds with that ``r_h`` (a host without a resource a task needs gives
it ``r_h = inf``, so no step puts it there).  CPU alone: the same numbers as
before, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vcsched.model import Instance
from vcsched.yields import blocked_pairs, fluid_loads

#: A move must lower the pair's highest relative load by more than this (relative), so that rounding noise is
#: never taken for progress.
IMPROVEMENT = 1e-12
#: Memory may exceed a host's capacity by this much after a move (the registry accepts ``MEMORY_TOLERANCE``,
#: 1e-9; staying well inside keeps loads updated by subtraction and addition safe).
MEMORY_SLACK = 1e-11


def relative(load: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """The largest relative load ``max_r L_r / C_r`` over the last axis (the fluid resources).

    A resource of capacity 0 counts 0 while nothing there needs it and
    ``inf`` once something does (its tasks could only run at yield 0).  With
    CPU the only fluid resource this is ``L / C`` itself, bit for bit.
    """
    if np.all(cap > 0):
        return np.max(load / cap, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.max(np.where(cap > 0, load / cap, np.where(load > 0, np.inf, 0.0)), axis=-1)


def fluid_arrays(instance: Instance) -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """``(capacity, need per task, relative load)`` with a resource axis only on the resource vector.

    CPU alone keeps the flat arrays ``host_cpu``, ``task_alpha`` and plain
    division, so its numbers and its speed are what they always were.
    """
    if instance.has_extra_resources:
        return instance.host_capacity, instance.job_need[instance.task_job], relative
    return instance.host_cpu, instance.task_alpha, np.divide


@dataclass
class LoadState:
    """A placement and its per-host fluid-need and memory sums, kept in step by :meth:`move`.

    ``load`` is hosts x fluid resources on the resource vector (the CPU need
    per host when CPU is the only one, :func:`fluid_arrays`): a host's relative load is the largest
    over its resources (:func:`relative`), and everything below weighs that.
    """

    instance: Instance
    hosts: np.ndarray  # host of every task (int64)
    load: np.ndarray  # sum of fluid needs per host and resource
    mem: np.ndarray  # sum of memory per host

    @classmethod
    def of(cls, instance: Instance, hosts: np.ndarray) -> LoadState:
        hosts = np.array(hosts, dtype=np.int64)
        load = (fluid_loads(instance, hosts) if instance.has_extra_resources
                else np.bincount(hosts, weights=instance.task_alpha, minlength=instance.n_hosts))
        mem = np.bincount(hosts, weights=instance.task_mem, minlength=instance.n_hosts)
        return cls(instance, hosts, load, mem)

    def copy(self) -> LoadState:
        return LoadState(self.instance, self.hosts.copy(), self.load.copy(), self.mem.copy())

    def ratio(self) -> np.ndarray:
        """Relative load ``max_r L_hr / C_hr`` per host."""
        cap, _, rel = fluid_arrays(self.instance)
        return rel(self.load, cap)

    def max_ratio(self) -> float:
        return float(np.max(self.ratio())) if len(self.load) else 0.0

    def min_yield(self) -> float:
        """The placement's minimum yield, ``min(1, 1 / max_h r_h)``."""
        z = self.max_ratio()
        return 1.0 if z <= 1.0 else 1.0 / z

    def move(self, task: int, dest: int) -> None:
        src = int(self.hosts[task])
        inst = self.instance
        a = inst.job_need[inst.task_job[task]] if inst.has_extra_resources else inst.task_alpha[task]
        m = inst.task_mem[task]
        self.hosts[task] = dest
        self.load[src] -= a
        self.load[dest] += a
        self.mem[src] -= m
        self.mem[dest] += m


@dataclass(frozen=True)
class Step:
    """One improving change: ``task`` to ``dest``, and (a swap) ``other`` to ``task``'s host."""

    value: float  # the pair's highest relative load after the change
    task: int
    dest: int
    other: int = -1


def best_step(state: LoadState, h1: int, partners: np.ndarray | None = None) -> Step | None:
    """The move or swap off host ``h1`` that lowers ``max(r_h1, r_h2)`` the most, or None.

    ``partners`` restricts the other host ``h2`` (default: every host whose
    relative load is below ``h1``'s).
    """
    inst = state.instance
    cap_c, alpha, rel = fluid_arrays(inst)
    cap_m, tmem = inst.host_mem, inst.task_mem
    on = np.flatnonzero(state.hosts == h1)
    if not len(on):
        return None
    ratio = state.ratio()
    r1 = float(ratio[h1])
    level = r1 * (1.0 - IMPROVEMENT)
    ok_host = ratio < level
    if partners is not None:
        mask = np.zeros(len(cap_c), dtype=bool)
        mask[partners] = True
        ok_host &= mask
    ok_host[h1] = False
    if not ok_host.any():
        return None
    a1 = alpha[on]
    m1 = tmem[on]
    best: Step | None = None
    # Moves: task t (on h1) to host h.
    dests = np.flatnonzero(ok_host)
    new1 = rel(state.load[h1] - a1, cap_c[h1])
    new2 = rel(state.load[dests][None, :] + a1[:, None], cap_c[dests][None, :])
    value = np.maximum(new1[:, None], new2)
    fits = state.mem[dests][None, :] + m1[:, None] <= cap_m[dests][None, :] + MEMORY_SLACK
    value = np.where(fits, value, np.inf)
    i = int(np.argmin(value))
    v = float(value.flat[i])
    if v < level:
        ti, hi = divmod(i, len(dests))
        best = Step(v, int(on[ti]), int(dests[hi]))
    # Swaps: task t (on h1) with task u (on h2), only tasks u with a smaller CPU need help.
    others = np.flatnonzero(ok_host[state.hosts])
    if len(others):
        h2 = state.hosts[others]
        a2 = alpha[others]
        m2 = tmem[others]
        d_a = a1[:, None] - a2[None, :]  # fluid needs that leave h1
        d_m = m1[:, None] - m2[None, :]
        new1 = rel(state.load[h1] - d_a, cap_c[h1])
        new2 = rel(state.load[h2][None, :] + d_a, cap_c[h2][None, :])
        value = np.maximum(new1, new2)
        helps = (d_a > 0).any(axis=-1) if d_a.ndim == 3 else d_a > 0  # something leaves h1
        fits = ((state.mem[h1] - d_m <= cap_m[h1] + MEMORY_SLACK)
                & (state.mem[h2][None, :] + d_m <= cap_m[h2][None, :] + MEMORY_SLACK) & helps)
        value = np.where(fits, value, np.inf)
        i = int(np.argmin(value))
        v = float(value.flat[i])
        if v < level and (best is None or v < best.value):
            ti, ui = divmod(i, len(others))
            best = Step(v, int(on[ti]), int(h2[ui]), int(others[ui]))
    return best


def apply_step(state: LoadState, step: Step) -> None:
    src = int(state.hosts[step.task])
    state.move(step.task, step.dest)
    if step.other >= 0:
        state.move(step.other, src)


Clock = Callable[[], bool]  # True when the time is up


def descend(state: LoadState, out_of_time: Clock, *, max_steps: int | None = None,
            scan_hosts: int | None = None) -> int:
    """Improve ``state`` in place until no move or swap helps (see the module docstring); returns the steps made.

    ``scan_hosts`` bounds how many of the most loaded hosts are tried per step
    (default: all above capacity); ``max_steps`` bounds the steps (for
    reproducible tests).  Stops early when ``out_of_time()`` says so.
    """
    steps = 0
    while max_steps is None or steps < max_steps:
        if out_of_time():
            break
        ratio = state.ratio()
        order = np.argsort(-ratio, kind="stable")
        above = int(np.count_nonzero(ratio > 1.0))
        limit = above if scan_hosts is None else min(above, scan_hosts)
        improved = False
        for k, h1 in enumerate(order[:limit]):
            if k and out_of_time():  # a scan over many stuck hosts can be long at 1,000 hosts
                return steps
            step = best_step(state, int(h1))
            if step is not None:
                apply_step(state, step)
                steps += 1
                improved = True
                break
        if not improved:
            break  # a local optimum
    return steps


def perturb(state: LoadState, rng: np.random.Generator, kicks: int) -> int:
    """Make ``kicks`` random memory-feasible changes (a swap of two tasks on different hosts, else a move).

    Returns how many were made (a tries-limited draw can find none on a tightly packed instance).
    """
    inst = state.instance
    n_t, n_h = inst.n_tasks, inst.n_hosts
    if n_t < 2 or n_h < 2:
        return 0
    blocked = blocked_pairs(inst)[inst.task_job] if inst.has_extra_resources else None
    made = 0
    for _ in range(kicks):
        for _try in range(20):
            t, u = (int(x) for x in rng.integers(0, n_t, size=2))
            ht, hu = int(state.hosts[t]), int(state.hosts[u])
            if ht == hu or (blocked is not None and (blocked[t, hu] or blocked[u, ht])):
                continue
            d_m = inst.task_mem[t] - inst.task_mem[u]
            if (state.mem[hu] + d_m <= inst.host_mem[hu] + MEMORY_SLACK
                    and state.mem[ht] - d_m <= inst.host_mem[ht] + MEMORY_SLACK):
                state.move(t, hu)
                state.move(u, ht)
                made += 1
                break
            if state.mem[hu] + inst.task_mem[t] <= inst.host_mem[hu] + MEMORY_SLACK:
                state.move(t, hu)
                made += 1
                break
    return made
