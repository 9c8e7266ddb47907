"""Placement under a sharing policy (docs/policies.md §8; the design note's §5.3).

Two ways, chosen per policy:

* **level** — the policy has a single fill level ``L`` and gives job ``j`` the
  yield ``y_j(L) = min(1, rho_j L)``: ``yield`` (``rho_j = 1``), ``drf``
  (weighted: ``rho_j = w_j / D_j``, cluster shares) and ``asset``
  (``rho_j = w_j / A_j``).  Cluster shares do not depend on the placement,
  so the rates are known before placing, and MCB's binary search bisects on
  that level (:func:`vcsched.solvers.mcb_vector.search_level`; on an
  instance whose only fluid resource is CPU, the 2-D kernel with each job's
  CPU need ``y_j(L) alpha_j``).  The policy then allocates on the placement
  found: at least that level for every job, since the water-filling's first
  level is the highest common one.
* **max-min** — every other policy (``drf-pools``, whose pool shares depend on
  the placement; ``pf``, ``alpha-fair`` and ``hdrf``, which have no single
  level) and every algorithm that is not an MCB variant: the algorithm places
  for the max-min yield on the resource vector (every placing algorithm
  weighs every fluid resource, docs/policies.md §8) and the policy allocates
  on that placement.

:func:`place_policy` returns the solver's result with the policy's yields and
the :class:`~vcsched.policies.allocation.PolicyAllocation`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.formats.instance import check_instance
from vcsched.model import Instance, SolveOptions, SolveResult
from vcsched.policies.allocation import PolicyAllocation, PolicyOptions
from vcsched.policies.registry import allocate_policy, check_options, get
from vcsched.policies.shares import asset_shares, dominant_shares

#: Policies whose allocation is a single fill level, placed by bisecting on it.
LEVEL_POLICIES = ("yield", "drf", "asset")


def level_rates(instance: Instance, policy: str) -> np.ndarray | None:
    """``rho_j`` of a single-level policy (module docstring), or None for the others."""
    if policy == "yield":
        return np.ones(instance.n_jobs)
    if policy == "drf":
        per_unit, _ = dominant_shares(instance)
        return instance.job_weight / per_unit
    if policy == "asset":
        return instance.job_weight / asset_shares(instance)
    return None


def placement_method(policy: str, algorithm: str) -> str:
    """``level`` or ``max-min``: how :func:`place_policy` places for ``policy`` with ``algorithm``."""
    from vcsched.solvers.mcb import VARIANTS

    return "level" if policy in LEVEL_POLICIES and algorithm in VARIANTS else "max-min"


@dataclass(frozen=True)
class PolicyPlacement:
    result: SolveResult  # the placement, with the policy's allocation and yields
    allocation: PolicyAllocation | None  # None when nothing was placed
    method: str  # "level" or "max-min"


def _level_placer(instance: Instance, variant: str, rates: np.ndarray, precision: float) -> tuple[
        np.ndarray | None, dict[str, object]]:
    from vcsched.solvers import mcb
    from vcsched.solvers.mcb_vector import level_bound, level_yields, normalised_rates, search_level
    from vcsched.solvers.yield_search import bisect_yield

    if instance.has_extra_resources:
        s = search_level(instance, variant, rates, precision)
        return s.hosts, {"backend": "vector", "probes": s.probes, "probe_level": s.level, "search_gap": s.gap,
                         "level_bound": s.bound}
    # CPU and memory only: the 2-D kernels (C when built) with each job's CPU need at the level.
    rho = normalised_rates(rates)
    bound = level_bound(instance, rho)
    if bound is None:
        return None, {"backend": mcb.DEFAULT_BACKEND, "probes": 0, "level_bound": None}
    kernel = mcb.KERNELS[mcb.DEFAULT_BACKEND]
    var = mcb.VARIANTS[variant]

    def probe(level: float) -> np.ndarray | None:
        cpu = level_yields(rho, level)[instance.task_job] * instance.task_alpha
        return kernel(mcb.sorted_lists(var, cpu, instance.task_mem), instance.host_cpu, instance.host_mem)

    s2 = bisect_yield(probe, 0.0, bound, precision)
    return s2.found, {"backend": mcb.DEFAULT_BACKEND, "probes": s2.probes, "probe_level": s2.y,
                      "search_gap": s2.gap, "level_bound": bound}


def place_policy(instance: Instance, policy: str = "yield", algorithm: str = "mcb8",
                 options: SolveOptions | None = None, policy_options: PolicyOptions | None = None
                 ) -> PolicyPlacement:
    """Place ``instance`` for ``policy`` with ``algorithm`` and allocate with the policy (module docstring).

    ``yield`` on an instance whose only fluid resource is CPU is exactly
    :func:`vcsched.solvers.registry.solve`, bit for bit.
    """
    from vcsched.solvers.registry import get as get_algorithm
    from vcsched.solvers.registry import solve

    pol = get(policy)
    policy_options = policy_options or PolicyOptions()
    check_options(pol, policy_options)
    algo = get_algorithm(algorithm)
    if algo.bound_only:
        raise InputError(f"algorithm: {algorithm!r} computes a bound, not a placement")
    check_instance(instance)
    options = options or SolveOptions()
    method = placement_method(policy, algorithm)
    if method == "max-min" or (policy == "yield" and not instance.has_extra_resources):
        base = solve(instance, algorithm, options)
    else:
        rates = level_rates(instance, policy)
        assert rates is not None
        start = time.perf_counter()
        hosts, detail = _level_placer(instance, algorithm, rates, options.precision)
        runtime = time.perf_counter() - start
        if hosts is None:
            return PolicyPlacement(SolveResult(algorithm, False, None, None, None, runtime, detail=detail), None,
                                   method)
        level_alloc = allocate_policy(instance, hosts, policy, policy_options)
        y = np.asarray(level_alloc.yields)
        result = SolveResult(algorithm, True, level_alloc.allocation(instance),
                             float(y.min()) if len(y) else 1.0, float(y.mean()) if len(y) else 1.0,
                             runtime + level_alloc.runtime_s, None, detail=detail | {"placement": "level"})
        return PolicyPlacement(result, level_alloc, method)
    if base.allocation is None:
        return PolicyPlacement(base, None, method)
    from vcsched.policies.placed import reallocate

    result, palloc = reallocate(instance, base, policy, policy_options)
    if policy == "yield" and not instance.has_extra_resources:
        return PolicyPlacement(result, palloc, method)  # today's solve, untouched
    return PolicyPlacement(dataclasses.replace(result, detail={**result.detail, "placement": "max-min"}), palloc,
                           method)
