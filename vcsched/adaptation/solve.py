"""Solving the adaptation problem with either method, validated the same way."""

from __future__ import annotations

import time

import numpy as np

from vcsched.adaptation.heuristic import adapt_heuristic
from vcsched.adaptation.problem import AdaptProblem, AdaptResult, migrations, move_cost
from vcsched.errors import InputError
from vcsched.model import SolveOptions, SolveResult
from vcsched.solvers.registry import allocation_of
from vcsched.validate import check_allocation
from vcsched.yields import fits

ALGORITHMS = ("heuristic", "milp")


def solve_adapt(problem: AdaptProblem, algorithm: str = "heuristic",
                options: SolveOptions | None = None) -> AdaptResult:
    """Solve the adaptation problem with ``heuristic`` or ``milp``; the allocation is validated."""
    options = options or SolveOptions()
    if algorithm not in ALGORITHMS:
        raise InputError(f"algorithm: unknown adaptation algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    inst = problem.instance
    start = time.perf_counter()
    optimal: bool | None = None
    if algorithm == "milp":
        from vcsched.adaptation.milp import adapt_milp

        hosts, optimal, detail = adapt_milp(problem, options)
    else:
        hosts, detail = adapt_heuristic(problem, options.precision)
    if hosts is None:
        runtime = time.perf_counter() - start
        return AdaptResult(SolveResult(algorithm, False, None, None, None, runtime, optimal, detail=detail))
    hosts = np.asarray(hosts, dtype=np.int64)
    if not fits(inst, hosts):
        raise AssertionError(f"adapt {algorithm} returned a placement that overcommits memory "
                             "or puts a task where a fluid resource it needs has capacity 0")
    cost = move_cost(problem, hosts)
    if cost > problem.budget:
        raise AssertionError(f"adapt {algorithm} spent {cost} bytes, above the budget {problem.budget}")
    allocation = allocation_of(inst, hosts)  # every fluid resource, not CPU alone
    runtime = time.perf_counter() - start
    min_y, avg_y = allocation.min_yield(inst), allocation.avg_yield(inst)
    check_allocation(inst, allocation, min_yield=min_y, avg_yield=avg_y)
    result = SolveResult(algorithm, True, allocation, min_y, avg_y, runtime, optimal, detail=detail)
    return AdaptResult(result, tuple(migrations(problem, hosts)), cost, detail)

