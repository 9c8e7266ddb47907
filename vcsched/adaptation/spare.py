"""The room left once every floor and the target yield hold: consolidate it (empty hosts) or spread it (even them).

The adaptation's objective (:mod:`vcsched.adaptation.problem`) is the minimum
yield.  Once the placement it finds gives every VM the yield the cluster
targets (``power_yield``, 1.0 by default) with every floor kept, that
objective has nothing left to buy, and the budget it did not spend can buy
something else.  The cluster file's ``spare`` says what (docs/power.md,
"Spread or consolidate"):

* ``consolidate`` (the default): the fewest hosts in use, so that hosts can
  sleep.  Hosts are emptied one at a time, the cheapest to empty first, each by
  the evacuation a drain makes (:func:`vcsched.adaptation.drain.evacuation`:
  the host and every empty host in maintenance, its VMs made to leave), and a
  host is emptied only when the whole evacuation fits the budget left;
* ``spread``: the hosts' free memory and free CPU as even as possible.  Its
  score is Ganeti hbal's pair of cluster-score components for them: the
  population standard deviation, over the hosts open (not in maintenance, not
  drained), of each host's free memory fraction ``1 − memory used / memory``
  plus that of its free CPU fraction ``1 − CPU need placed / cores`` (needs,
  not caps: what the VMs would use at yield 1).  Lower is better.  Single
  moves, as hbal's, each the one that lowers the score most, until none lowers
  it by :data:`SPREAD_MIN_GAIN` over the number of open hosts within the budget left.

Guarantees, for both: no VM's yield goes down and so no floor breaks (a move
keeps every host's load within what the minimum yield already found allows,
and below yield 1 the allocation's per-VM yields are checked after every step);
the placement rules, memory and the budget are checked as for any adaptation
answer (:func:`vcsched.adaptation.solve.adapt_result`, which the final
placement goes through); and a caller's check of the whole placement
(``Spare.accept``: the live layer's ``failures_tolerated`` room) is asked after
every step, a step it refuses being undone.  Nothing is done when the minimum
yield is below the target.

Pure, like the rest of the core: a problem and an answer in, an answer out.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vcsched.adaptation.drain import IMPROVE_S, evacuation
from vcsched.adaptation.heuristic import CANDIDATE_HOSTS, fluid_layout, host_ratio, move_allowed, placed_loads
from vcsched.adaptation.problem import AdaptProblem, AdaptResult, move_cost
from vcsched.adaptation.solve import adapt_result, capacities_only, solve_adapt
from vcsched.errors import InputError
from vcsched.formats.power import SPARE_MODES
from vcsched.model import SolveOptions
from vcsched.rules import spread_groups
from vcsched.solvers.registry import allocation_of
from vcsched.units import MEMORY_TOLERANCE, YIELD_TOLERANCE
from vcsched.yields import placement_min_yield

CONSOLIDATE, SPREAD = SPARE_MODES
#: Score points (sum of the two standard deviations) a spread move must lower the score by, times the number of
#: open hosts: below it a move costs a migration for an evenness nobody can see (hbal stops on a minimum gain
#: too, ``--min-gain``).  Per host because one move changes two hosts, whose share of a standard deviation
#: over ``n`` hosts shrinks as ``1 / n``: 0.005 on 8 hosts, 0.0004 on 100.
SPREAD_MIN_GAIN = 0.04
#: (task, destination) pairs tried per spread step when the cluster is large: those of the hosts furthest
#: from the mean, as the improvement moves restrict theirs (:data:`vcsched.adaptation.heuristic.CANDIDATE_HOSTS`).
MAX_PAIRS = 2_000_000

#: ``Spare.accept``: None when a placement (a host per task) keeps what the caller guards, else why not.
Accept = Callable[[np.ndarray], "str | None"]


@dataclass(frozen=True)
class Spare:
    """What to do with the room above the target yield (module docstring)."""

    mode: str  # CONSOLIDATE or SPREAD
    target_yield: float = 1.0
    accept: Accept | None = None

    def __post_init__(self) -> None:
        if self.mode not in SPARE_MODES:
            raise InputError(f"spare: {self.mode!r} is not one of {', '.join(repr(m) for m in SPARE_MODES)}")
        if not 0 < self.target_yield <= 1:
            raise InputError(f"power_yield: {self.target_yield!r} is not in (0, 1]")


@dataclass(frozen=True)
class SpareScore:
    """How even and how packed a placement is, over the open hosts (module docstring)."""

    free_memory_stddev: float
    free_cpu_stddev: float
    hosts_empty: int
    hosts_open: int

    @property
    def spread(self) -> float:
        """The spread score: both standard deviations summed (lower: more even)."""
        return self.free_memory_stddev + self.free_cpu_stddev

    @property
    def hosts_used(self) -> int:
        return self.hosts_open - self.hosts_empty

    def to_dict(self) -> dict[str, Any]:
        return {"score": round(self.spread, 6), "free_memory_stddev": round(self.free_memory_stddev, 6),
                "free_cpu_stddev": round(self.free_cpu_stddev, 6), "hosts_empty": self.hosts_empty,
                "hosts_used": self.hosts_used}


def _free_fractions(problem: AdaptProblem, hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every host's free memory and free CPU fractions (CPU: needs placed over cores, both in reference units)."""
    inst = problem.instance
    mem = np.bincount(hosts, weights=inst.task_mem, minlength=inst.n_hosts)
    cpu = np.bincount(hosts, weights=inst.task_alpha, minlength=inst.n_hosts)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.where(inst.host_mem > 0, 1 - mem / inst.host_mem, 0.0),
                np.where(inst.host_cpu > 0, 1 - cpu / inst.host_cpu, 0.0))


def spare_score(problem: AdaptProblem, hosts: np.ndarray) -> SpareScore:
    """The :class:`SpareScore` of a placement (a host per task) of ``problem``'s instance."""
    hosts = np.asarray(hosts, dtype=np.int64)
    open_ = ~problem.closed
    fm, fc = _free_fractions(problem, hosts)
    used = np.bincount(hosts, minlength=problem.instance.n_hosts) > 0
    if not open_.any():
        return SpareScore(0.0, 0.0, 0, 0)
    return SpareScore(float(fm[open_].std()), float(fc[open_].std()), int((open_ & ~used).sum()),
                      int(open_.sum()))


def spend_spare(problem: AdaptProblem, adapted: AdaptResult, spare: Spare, algorithm: str = "heuristic",
                options: SolveOptions | None = None) -> AdaptResult:
    """``adapted`` (an answer to ``problem``) with the budget it left spent on ``spare`` (module docstring).

    The result's detail carries ``spare``: the mode, the score of the placement now (``problem.current``,
    new arrivals left out), of the answer before this step and after it, the moves it added, and why it did
    nothing when it did nothing.
    """
    start = time.perf_counter()
    result = adapted.result
    if result.allocation is None:
        return adapted
    first = np.asarray(result.allocation.hosts, dtype=np.int64)
    now = problem.current.copy()
    now[now < 0] = first[now < 0]  # new arrivals where the answer puts them: the score of what runs now
    report: dict[str, Any] = {"mode": spare.mode, "target_yield": spare.target_yield,
                              "now": spare_score(problem, now).to_dict(),
                              "before": spare_score(problem, first).to_dict()}
    y0 = float(result.min_yield or 0.0)
    why = None
    if y0 < spare.target_yield - YIELD_TOLERANCE:
        why = f"the minimum yield {y0:.4f} is below the target yield {spare.target_yield:g}"
    elif adapted.migrated_bytes >= problem.budget:
        why = "no budget left"
    elif spare.accept is not None and (refused := spare.accept(first)) is not None:
        why = f"the placement already breaks what must hold ({refused})"
    if why is not None:
        return with_spare_report(adapted, {**report, "after": report["before"], "moves": 0, "bytes": 0, "skipped": why})
    check = _Check(problem, first, y0, spare.accept)
    if spare.mode == SPREAD:
        hosts = spread(problem, first, check)
    else:
        hosts = consolidate(problem, first, check, algorithm, options)
    moves = int((hosts != first).sum())
    report.update(after=spare_score(problem, hosts).to_dict(), moves=moves,
                  bytes=move_cost(problem, hosts) - adapted.migrated_bytes, refused=check.refused[:5],
                  seconds=round(time.perf_counter() - start, 3))
    if not moves:
        return with_spare_report(adapted, report)
    final = adapt_result(problem, hosts, result.algorithm, dict(result.detail), start - result.runtime_s,
                         result.optimal)
    if final.result.min_yield is None or final.result.min_yield < y0 - YIELD_TOLERANCE:
        raise AssertionError(f"spare {spare.mode} lowered the minimum yield from {y0} to {final.result.min_yield}")
    return with_spare_report(final, report)


def spare_bought(report: object) -> str | None:
    """What a ``spare`` report (:func:`spend_spare`'s detail) bought, in words, or None when nothing: hosts
    emptied (consolidate) or a lower spread score (spread)."""
    if not isinstance(report, dict) or not report.get("moves") or "after" not in report:
        return None
    before, after = report["now"], report["after"]
    if report["mode"] == CONSOLIDATE:
        emptied = after["hosts_empty"] - before["hosts_empty"]
        return f"spare consolidate: {emptied} more host(s) empty" if emptied > 0 else None
    drop = before["score"] - after["score"]
    return f"spare spread: score {before['score']:.4f} -> {after['score']:.4f}" if drop > YIELD_TOLERANCE else None


def with_spare_report(adapted: AdaptResult, report: dict[str, Any]) -> AdaptResult:
    """``adapted`` with ``report`` as ``spare`` in its detail (and its result's, which ``--json`` prints)."""
    detail = {**adapted.detail, "spare": report}
    return dataclasses.replace(adapted, detail=detail,
                               result=dataclasses.replace(adapted.result, detail={**adapted.result.detail,
                                                                                  "spare": report}))


class _Check:
    """What every step must keep (module docstring): no yield lower than the answer's, the caller's ``accept``."""

    def __init__(self, problem: AdaptProblem, first: np.ndarray, y0: float, accept: Accept | None) -> None:
        self.problem, self.accept = problem, accept
        #: The least ratio of capacity to load a host may have: the minimum yield never drops below y0.
        self.floor = min(1.0, y0)
        plain = capacities_only(problem.instance)
        self.plain = plain
        #: Below yield 1 the average-yield phase hands out the rest: each job's yield is checked after each step.
        self.yields = None if y0 >= 1 - YIELD_TOLERANCE else allocation_of(plain, first).yields(plain)
        self.refused: list[str] = []

    def why_not(self, hosts: np.ndarray) -> str | None:
        if placement_min_yield(self.plain, hosts) < self.floor - YIELD_TOLERANCE:
            return "the minimum yield would drop"
        if self.yields is not None:
            got = allocation_of(self.plain, hosts).yields(self.plain)
            if (got < self.yields - YIELD_TOLERANCE).any():
                return "a virtual cluster's yield would drop"
        why = self.accept(hosts) if self.accept is not None else None
        if why is not None:
            self.refused.append(why)
        return why


def spread(problem: AdaptProblem, hosts: np.ndarray, check: _Check) -> np.ndarray:
    """Single moves, each the one that lowers the spread score most (module docstring), within the budget."""
    inst = problem.instance
    hosts = np.asarray(hosts, dtype=np.int64).copy()
    open_ = np.flatnonzero(~problem.closed)
    n = len(open_)
    if n < 2:
        return hosts
    cap, need, vec = fluid_layout(inst)
    load = placed_loads(inst, hosts)
    mem = np.bincount(hosts, weights=inst.task_mem, minlength=inst.n_hosts)
    spent = move_cost(problem, hosts)
    groups = spread_groups(inst) if inst.has_rules else None
    if groups is not None and not (groups >= 0).any():
        groups = None
    movable = np.ones(inst.n_tasks, dtype=bool)
    movable &= ~problem.closed[hosts]  # what sits on a host in maintenance is the drain's business
    if inst.has_rules:
        movable &= inst.task_pinned < 0
    refused: set[tuple[int, int]] = set()
    for _ in range(4 * inst.n_tasks + 100):
        fm, fc = _free_fractions(problem, hosts)
        score = float(fm[open_].std() + fc[open_].std())
        srcs, dests = open_, open_
        if len(open_) > CANDIDATE_HOSTS and int(movable.sum()) * n > MAX_PAIRS:
            off = np.abs(fm[open_] - fm[open_].mean()) + np.abs(fc[open_] - fc[open_].mean())
            srcs = dests = open_[np.argsort(-off)[:CANDIDATE_HOSTS]]
        tasks = np.flatnonzero(movable & np.isin(hosts, srcs))
        if not len(tasks):
            break
        src = hosts[tasks][:, None]
        d = dests[None, :]
        dm = inst.task_mem[tasks][:, None]
        dc_ = inst.task_alpha[tasks][:, None]
        gain = score - (_std_after(fm, open_, src, d, dm / inst.host_mem[src], dm / inst.host_mem[d])
                        + _std_after(fc, open_, src, d, dc_ / inst.host_cpu[src], dc_ / inst.host_cpu[d]))
        cur = problem.current[tasks][:, None]
        running = cur >= 0
        cost = (np.where(running & (cur != d), problem.move_bytes(tasks[:, None], d), 0.0)
                - np.where(running & (cur != src), problem.move_bytes(tasks[:, None], src), 0.0))
        a = need[tasks][:, None, ...]
        ok = ((d != src) & (gain >= SPREAD_MIN_GAIN / n) & (spent + cost <= problem.budget)
              & (mem[d] + dm <= inst.host_mem[d] + MEMORY_TOLERANCE)
              & (host_ratio(cap[dests][None, ...], load[dests][None, ...] + a, vec) >= check.floor - YIELD_TOLERANCE))
        if refused:
            for t, h in refused:
                ok &= ~((tasks[:, None] == t) & (d == h))
        if ok.any() and (inst.has_rules or inst.has_extra_resources):
            ok &= move_allowed(problem, hosts, tasks, dests, groups)
        if not ok.any():
            break
        i, k = np.unravel_index(int(np.argmax(np.where(ok, gain, -np.inf))), gain.shape)
        t, s, h = int(tasks[i]), int(hosts[tasks[i]]), int(dests[k])
        hosts[t] = h
        if check.why_not(hosts) is not None:
            hosts[t] = s
            refused.add((t, h))
            continue
        load[s] -= need[t]
        load[h] += need[t]
        mem[s] -= inst.task_mem[t]
        mem[h] += inst.task_mem[t]
        spent += int(cost[i, k])
    return hosts


def _std_after(f: np.ndarray, open_: np.ndarray, src: np.ndarray, dst: np.ndarray, up: np.ndarray,
               down: np.ndarray) -> np.ndarray:
    """The standard deviation of ``f`` over ``open_`` after each move: ``f[src] += up``, ``f[dst] -= down``
    (broadcast; ``src``/``dst`` are open hosts, never equal where it matters)."""
    n = len(open_)
    s1, s2 = f[open_].sum(), (f[open_] ** 2).sum()
    fs, fd = f[src], f[dst]
    s1 = s1 + up - down
    s2 = s2 - fs ** 2 + (fs + up) ** 2 - fd ** 2 + (fd - down) ** 2
    return np.sqrt(np.maximum(s2 / n - (s1 / n) ** 2, 0.0))


def consolidate(problem: AdaptProblem, hosts: np.ndarray, check: _Check, algorithm: str = "heuristic",
                options: SolveOptions | None = None) -> np.ndarray:
    """Empty hosts one at a time, the fewest bytes first, each by a drain's evacuation into the hosts in use."""
    inst = problem.instance
    hosts = np.asarray(hosts, dtype=np.int64).copy()
    tried: set[int] = set()
    while True:
        used = np.bincount(hosts, minlength=inst.n_hosts) > 0
        open_used = used & ~problem.closed
        if open_used.sum() < 2:
            return hosts
        pinned = np.zeros(inst.n_hosts, dtype=bool)
        if inst.has_rules:
            pinned[hosts[inst.task_pinned >= 0]] = True
        left = problem.budget - move_cost(problem, hosts)
        # What emptying each host costs at least: its running tasks' bytes from where they are now.
        stage_bytes = np.where(problem.running, problem.task_bytes, 0)
        bytes_on = np.bincount(hosts, weights=stage_bytes, minlength=inst.n_hosts)
        mem = np.bincount(hosts, weights=inst.task_mem, minlength=inst.n_hosts)
        room = float((inst.host_mem - mem)[open_used].sum())
        candidates = [int(h) for h in np.flatnonzero(open_used & ~pinned) if int(h) not in tried
                      and bytes_on[h] <= left and mem[h] <= room - (inst.host_mem[h] - mem[h]) + MEMORY_TOLERANCE]
        emptied = False
        for h in sorted(candidates, key=lambda h: (bytes_on[h], mem[h], h)):
            tried.add(h)
            stage = _stage(problem, hosts, h, ~used, left)
            answer = solve_adapt(evacuation(stage, h), algorithm, options, improve_s=IMPROVE_S)
            if answer.result.allocation is None:
                continue
            new = np.asarray(answer.result.allocation.hosts, dtype=np.int64)
            if (new == h).any() or move_cost(problem, new) > problem.budget or check.why_not(new) is not None:
                continue
            hosts, emptied = new, True
            break
        if not emptied:
            return hosts


def _stage(problem: AdaptProblem, hosts: np.ndarray, host: int, empty: np.ndarray, budget: int) -> AdaptProblem:
    """The problem of emptying ``host`` from ``hosts`` with ``budget`` bytes: every task where ``hosts`` puts it
    (new arrivals of ``problem`` still cost nothing to move), the hosts ``empty`` now in maintenance as well (a
    VM moved to an empty host would only empty another), the rest as in ``problem``."""
    inst = problem.instance
    closed = problem.closed | empty
    machines = tuple(dataclasses.replace(m, maintenance=True) if closed[i] and not m.maintenance else m
                     for i, m in enumerate(inst.hosts))
    return dataclasses.replace(problem, instance=dataclasses.replace(inst, hosts=machines), current=hosts.copy(),
                               task_bytes=np.where(problem.running, problem.task_bytes, 0), budget=int(budget),
                               leave=())
