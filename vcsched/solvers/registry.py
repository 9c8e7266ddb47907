"""One registry of named algorithms with one signature (cf. Nova's weighers).

A *placer* maps ``(instance, options)`` to a :class:`Placement`: task->host
indices, or None when it found nothing.  :func:`solve` times it, derives the
min-yield CPU fractions, runs the average-yield phase (every placing
algorithm is followed by it, section 3.5), checks memory, and returns a
:class:`SolveResult`.  Bound-only methods (``lpbound``) return a bound instead.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vcsched.errors import AllocationError, InputError
from vcsched.model import Instance, SolveOptions, SolveResult
from vcsched.yields import allocate, fits_in_memory


@dataclass(frozen=True)
class Placement:
    hosts: np.ndarray | None
    optimal: bool | None = None
    bound: float | None = None
    detail: dict[str, object] = field(default_factory=dict)


Placer = Callable[[Instance, SolveOptions], Placement]


@dataclass(frozen=True)
class Algorithm:
    name: str
    placer: Placer
    summary: str
    exact: bool = False
    bound_only: bool = False


_REGISTRY: dict[str, Algorithm] = {}
# Modules whose import registers algorithms; loaded on first use so that
# importing the core stays cheap.
_MODULES = ("vcsched.solvers.mcb", "vcsched.solvers.greedy", "vcsched.solvers.rounding", "vcsched.solvers.milp",
            "vcsched.solvers.lpbound", "vcsched.solvers.anytime")
_loaded = False


def register(
    name: str, summary: str, *, exact: bool = False, bound_only: bool = False
) -> Callable[[Placer], Placer]:
    def deco(fn: Placer) -> Placer:
        _REGISTRY[name] = Algorithm(name, fn, summary, exact=exact, bound_only=bound_only)
        return fn

    return deco


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # a real missing dependency, not a module not yet written
                raise
    _loaded = True


def algorithms() -> dict[str, Algorithm]:
    _load()
    return dict(_REGISTRY)


def get(name: str) -> Algorithm:
    algos = algorithms()
    if name not in algos:
        raise InputError(f"algorithm: unknown algorithm {name!r} (known: {', '.join(sorted(algos))})")
    return algos[name]


def solve(instance: Instance, algorithm: str, options: SolveOptions | None = None) -> SolveResult:
    """Run ``algorithm`` on ``instance``; placement rules (docs/rules.md) go through :func:`_solve_with_rules`."""
    algo = get(algorithm)
    options = options or SolveOptions()
    if instance.has_rules and not algo.bound_only:
        return _solve_with_rules(instance, algo, options)
    start = time.perf_counter()
    placement = algo.placer(instance, options)
    if algo.bound_only:
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
    return _finish(instance, algo, placement, start)


def _finish(instance: Instance, algo: Algorithm, placement: Placement, start: float) -> SolveResult:
    """The CPU fractions (min-yield, then average-yield phase) of a placement, timed from ``start``."""
    if placement.hosts is None:
        runtime = time.perf_counter() - start
        return SolveResult(algo.name, False, None, None, None, runtime, placement.optimal, detail=placement.detail)
    hosts = np.asarray(placement.hosts, dtype=np.int64)
    if not fits_in_memory(instance, hosts):
        raise AllocationError([f"{algo.name} returned a placement that overcommits memory"])
    if instance.has_extra_resources:  # every fluid resource must hold, not CPU alone: the yield policy's phases
        from vcsched.policies.registry import allocate_policy

        allocation = allocate_policy(instance, hosts, "yield").allocation(instance)
    else:
        allocation = allocate(instance, hosts)
    runtime = time.perf_counter() - start
    return SolveResult(
        algorithm=algo.name,
        feasible=True,
        allocation=allocation,
        min_yield=allocation.min_yield(instance),
        avg_yield=allocation.avg_yield(instance),
        runtime_s=runtime,
        optimal=placement.optimal,
        detail=placement.detail,
    )


def place_with_rules(instance: Instance, placer: Placer, options: SolveOptions,
                     name: str = "placer") -> tuple[Placement, dict[str, object]]:
    """Run ``placer`` so that it honours the rules of ``instance`` (docs/rules.md), and say how it went.

    Contradictions are bad input (:func:`vcsched.rules.check_rules`).  Preferred
    rules are tried as required first; when that finds no placement they are
    dropped, and the ones the placement misses are reported.  Required
    ``together`` jobs are contracted to one task each (:func:`vcsched.rules.contract_together`),
    so the placer only ever sees maintenance, pins and spread, which every
    placer honours.  A placement that breaks a required rule is a bug
    (:class:`AllocationError`).  Returns the placement (hosts of the original
    tasks, or None) and the ``rules`` report.
    """
    from vcsched.rules import (
        check_rules,
        contract_together,
        describe,
        harden,
        has_soft,
        rule_problems,
        soft_unmet,
        unsatisfiable,
        without_soft,
    )

    check_rules(instance)
    report: dict[str, object] = {"rules": describe(instance)}
    tries = [harden(instance), without_soft(instance)] if has_soft(instance) else [instance]
    placement = Placement(hosts=None)
    reasons = []
    for i, attempt in enumerate(tries):
        reason = unsatisfiable(attempt)
        if reason is not None:
            reasons.append(reason)
            continue
        contraction = contract_together(attempt)
        placement = placer(contraction.instance, options)
        if placement.hosts is not None:
            hosts = contraction.expand(placement.hosts)
            problems = rule_problems(attempt, hosts)
            if problems:
                raise AllocationError([f"{name} broke a rule: {p}" for p in problems])
            placement = Placement(hosts, placement.optimal, placement.bound, placement.detail)
            if i > 0:
                report["preferred_dropped"] = True
            unmet = soft_unmet(instance, hosts)
            if unmet:
                report["unmet_preferred"] = unmet
            return placement, report
        reasons.append(f"{name} found no placement that honours the rules ({describe(attempt)})")
    report["infeasible"] = reasons[-1] if reasons else "no placement"
    return placement, report


def _solve_with_rules(instance: Instance, algo: Algorithm, options: SolveOptions) -> SolveResult:
    start = time.perf_counter()
    placement, report = place_with_rules(instance, algo.placer, options, algo.name)
    placement = Placement(placement.hosts, placement.optimal, placement.bound, {**placement.detail, **report})
    return _finish(instance, algo, placement, start)
