"""One registry of named algorithms with one signature (cf. Nova's weighers).

A *placer* maps ``(instance, options)`` to a :class:`Placement`: task->host
indices, or None when it found nothing (:mod:`vcsched.solvers.algorithm`).
:data:`ALGORITHMS` names every one of them in one literal table: an algorithm
module that fails to import fails here, loudly.  :func:`solve` times a placer,
runs it under the placement rules (:func:`place_with_rules`), derives the
allocation — the min-yield CPU fractions and the average-yield phase that
follows every placing algorithm (section 3.5) — checks memory, and returns a
:class:`SolveResult`.  Bound-only methods (``lpbound``) return a bound instead.
"""

from __future__ import annotations

import time

import numpy as np

from vcsched.errors import AllocationError, InputError
from vcsched.model import Allocation, Instance, SolveOptions, SolveResult
from vcsched.rules import contract_together, describe, place_preferred_first, rule_problems
from vcsched.solvers.algorithm import Algorithm, Placement, Placer
from vcsched.solvers.anytime import DEFAULT_BUDGET_S, best
from vcsched.solvers.greedy import backtracking_placer, greedy_placer
from vcsched.solvers.lpbound import lpbound
from vcsched.solvers.mcb import VARIANTS
from vcsched.solvers.milp import solve_exact
from vcsched.solvers.rounding import EPSILON, rounding_placer
from vcsched.solvers.search import mcb_placer
from vcsched.yields import allocate, fits, fits_in_memory

__all__ = ["ALGORITHMS", "Algorithm", "Placement", "Placer", "algorithms", "allocation_of", "get",
           "place_with_rules", "solve"]

#: Every algorithm, by name: the one list the CLI, the experiments and the benchmarks read.
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    *(Algorithm(name, mcb_placer(name), f"multi-capacity bin packing, lists sorted by {v.summary} (section 3.4)")
      for name, v in VARIANTS.items()),
    Algorithm("gr", greedy_placer(False),
              "greedy: tasks in given order, each on the least CPU-loaded host where memory fits (sec. 3.3)"),
    Algorithm("sg", greedy_placer(True), "sorted greedy: GR after sorting tasks by memory, largest first (sec. 3.3)"),
    Algorithm("gb", backtracking_placer(False),
              "greedy with depth-first backtracking, bounded by --max-attempts (sec. 3.3)"),
    Algorithm("sgb", backtracking_placer(True),
              "sorted greedy with depth-first backtracking, bounded by --max-attempts (sec. 3.3)"),
    Algorithm("rrnd", rounding_placer(None),
              "randomized rounding of the MILP's LP relaxation (HiGHS), seeded by --seed (sec. 3.2)"),
    Algorithm("rrnz", rounding_placer(EPSILON),
              "RRND with zero LP values raised to 0.01 so every host stays possible (sec. 3.2)"),
    Algorithm("milp", solve_exact,
              "exact MILP (sec. 2.5, 5) solved with HiGHS; --time-limit makes it return its incumbent", exact=True),
    Algorithm("lpbound", lpbound, "closed-form optimum of the LP relaxation: an upper bound, not a placement",
              bound_only=True),
    Algorithm("best", best, "anytime: best of MCB1-8, local search on the bottleneck, exact MILP on small "
                            f"instances; --time-limit is its budget (default {DEFAULT_BUDGET_S:g} s)"),
)}


def algorithms() -> dict[str, Algorithm]:
    return dict(ALGORITHMS)


def get(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise InputError(f"algorithm: unknown algorithm {name!r} (known: {', '.join(sorted(ALGORITHMS))})")
    return ALGORITHMS[name]


def allocation_of(instance: Instance, hosts: np.ndarray) -> Allocation:
    """The min-yield allocation of a placement, then the average-yield phase (section 3.5), on every fluid
    resource (:func:`vcsched.yields.allocate`)."""
    return allocate(instance, hosts)


def solve(instance: Instance, algorithm: str, options: SolveOptions | None = None) -> SolveResult:
    """Run ``algorithm`` on ``instance``; placement rules (docs/rules.md) go through :func:`place_with_rules`."""
    algo = get(algorithm)
    options = options or SolveOptions()
    start = time.perf_counter()
    if algo.bound_only:
        placement = algo.placer(instance, options)
        runtime = time.perf_counter() - start
        return SolveResult(
            algorithm=algo.name,
            feasible=placement.bound is not None,
            allocation=None,
            min_yield=placement.bound,
            avg_yield=None,
            runtime_s=runtime,
            optimal=None,
            bound=placement.bound,
            detail=placement.detail,
        )
    if instance.has_rules:
        placement, report = place_with_rules(instance, algo.placer, options, algo.name)
        placement = Placement(placement.hosts, placement.optimal, placement.bound, {**placement.detail, **report})
    else:
        placement = algo.placer(instance, options)
    return finish(instance, algo.name, placement, start)


def finish(instance: Instance, name: str, placement: Placement, start: float) -> SolveResult:
    """The allocation (min-yield, then average-yield phase) of a placement as a result, timed from ``start``.

    What the allocation fell back on (``Allocation.notes``) is in the detail as ``fallback``.
    """
    if placement.hosts is None:
        runtime = time.perf_counter() - start
        return SolveResult(name, False, None, None, None, runtime, placement.optimal, detail=placement.detail)
    hosts = np.asarray(placement.hosts, dtype=np.int64)
    if not fits_in_memory(instance, hosts):
        raise AllocationError([f"{name} returned a placement that overcommits memory"])
    if not fits(instance, hosts):
        raise AllocationError([f"{name} put a task on a host without a fluid resource it needs (yield 0)"])
    allocation = allocation_of(instance, hosts)
    runtime = time.perf_counter() - start
    detail = placement.detail if not allocation.notes else {**placement.detail, "fallback": list(allocation.notes)}
    return SolveResult(
        algorithm=name,
        feasible=True,
        allocation=allocation,
        min_yield=allocation.min_yield(instance),
        avg_yield=allocation.avg_yield(instance),
        runtime_s=runtime,
        optimal=placement.optimal,
        detail=detail,
    )


def place_with_rules(instance: Instance, placer: Placer, options: SolveOptions,
                     name: str = "placer") -> tuple[Placement, dict[str, object]]:
    """Run ``placer`` so that it honours the rules of ``instance`` (docs/rules.md), and say how it went.

    The tries and the report are the one rule loop's (:func:`vcsched.rules.place_preferred_first`: preferred
    rules as required first, then dropped and the ones missed reported).  In each try required ``together``
    jobs are contracted to one task each (:func:`vcsched.rules.contract_together`), so the placer only ever
    sees maintenance, pins and spread, which every placer honours.  A placement that breaks a required rule
    is a bug (:class:`AllocationError`).  Returns the placement (hosts of the original tasks, or the last
    try's empty one) and the ``rules`` report.
    """
    last = [Placement(hosts=None)]

    def place(attempt: Instance) -> np.ndarray | None:
        contraction = contract_together(attempt)
        placement = placer(contraction.instance, options)
        last[0] = placement
        if placement.hosts is None:
            return None
        hosts = contraction.expand(placement.hosts)
        problems = rule_problems(attempt, hosts)
        if problems:
            raise AllocationError([f"{name} broke a rule: {p}" for p in problems])
        last[0] = Placement(hosts, placement.optimal, placement.bound, placement.detail)
        return hosts

    ruled = place_preferred_first(
        instance, place, lambda attempt: f"{name} found no placement that honours the rules ({describe(attempt)})")
    return last[0], ruled.report
