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
from vcsched.model import Allocation, Instance, SolveOptions, SolveResult
from vcsched.yields import allocate, fits, fits_in_memory


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


def allocation_of(instance: Instance, hosts: np.ndarray) -> Allocation:
    """The min-yield allocation of a placement, then the average-yield phase (section 3.5), on every fluid resource.

    CPU alone: :func:`vcsched.yields.allocate`.  With extra fluid resources every
    one of them must hold, not CPU alone: the ``yield`` policy's two phases.
    """
    if instance.has_extra_resources:
        from vcsched.policies.registry import allocate_policy

        return allocate_policy(instance, hosts, "yield").allocation(instance)
    return allocate(instance, hosts)


def solve(instance: Instance, algorithm: str, options: SolveOptions | None = None) -> SolveResult:
    algo = get(algorithm)
    options = options or SolveOptions()
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
    if placement.hosts is None:
        runtime = time.perf_counter() - start
        return SolveResult(algo.name, False, None, None, None, runtime, placement.optimal, detail=placement.detail)
    hosts = np.asarray(placement.hosts, dtype=np.int64)
    if not fits_in_memory(instance, hosts):
        raise AllocationError([f"{algo.name} returned a placement that overcommits memory"])
    if not fits(instance, hosts):
        raise AllocationError([f"{algo.name} put a task on a host without a fluid resource it needs (yield 0)"])
    allocation = allocation_of(instance, hosts)
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
