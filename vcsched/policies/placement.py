"""Placement under a sharing policy (docs/policies.md §8; the design note's §5.3).

Two ways, chosen per policy:

* **level** — the policy has a single fill level ``L`` and gives job ``j`` the
  yield ``y_j(L) = min(1, rho_j L)``: ``yield`` (``rho_j = 1``), ``drf``
  (weighted: ``rho_j = w_j / D_j``, cluster shares) and ``asset``
  (``rho_j = w_j / A_j``).  Cluster shares do not depend on the placement,
  so the rates are known before placing, and MCB's binary search bisects on
  that level (:func:`vcsched.solvers.search.search`: the vector kernel, or on an
  instance whose only fluid resource is CPU the 2-D kernel with each job's
  CPU need ``y_j(L) alpha_j``), under the rules like every placer.  The policy then allocates on the placement
  found: at least that level for every job, since the water-filling's first
  level is the highest common one.
* **max-min** — every other policy (``drf-pools``, whose pool shares depend on
  the placement; ``pf``, ``alpha-fair`` and ``hdrf``, which have no single
  level) and every algorithm that is not an MCB variant: the algorithm places
  for the max-min yield on the resource vector (every placing algorithm
  weighs every fluid resource, docs/policies.md §8) and the policy allocates
  on that placement.

:func:`place_policy` returns the solver's result with the policy's yields and
the :class:`~vcsched.policies.allocation.PolicyAllocation`.  Both ways go
through the one rule loop (:func:`vcsched.solvers.registry.place_with_rules`):
every rule holds under every policy, and unmet preferred ones are reported.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.model import Instance, SolveOptions, SolveResult
from vcsched.policies.allocation import PolicyAllocation, PolicyOptions
from vcsched.policies.placed import reallocate
from vcsched.policies.registry import allocate_policy, check_options, get
from vcsched.policies.shares import asset_shares, dominant_shares
from vcsched.solvers.algorithm import Placement, Placer
from vcsched.solvers.mcb import VARIANTS
from vcsched.solvers.registry import get as get_algorithm
from vcsched.solvers.registry import place_with_rules, solve
from vcsched.solvers.search import search
from vcsched.validate import check_instance

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
    return "level" if policy in LEVEL_POLICIES and algorithm in VARIANTS else "max-min"


@dataclass(frozen=True)
class PolicyPlacement:
    result: SolveResult  # the placement, with the policy's allocation and yields
    allocation: PolicyAllocation | None  # None when nothing was placed
    method: str  # "level" or "max-min"


def level_placer(variant: str, rates: np.ndarray) -> Placer:
    """MCB ``variant``'s search on the fill level of ``rates`` (one per job) as a placer.

    The search's probe (:func:`vcsched.solvers.search.residual_probe`) honours maintenance, pins and spread;
    :func:`vcsched.solvers.registry.place_with_rules` adds ``together`` and the preferred rules, as for every
    placer.  ``rates`` stay the original jobs': the rule loop keeps one job per job.
    """

    def place(instance: Instance, options: SolveOptions) -> Placement:
        s = search(instance, variant, rates, options.precision)
        return Placement(s.hosts, detail={"backend": s.backend, "probes": s.probes, "probe_level": s.level,
                                          "search_gap": s.gap, "level_bound": s.bound})

    return place


def place_policy(instance: Instance, policy: str = "yield", algorithm: str = "mcb8",
                 options: SolveOptions | None = None, policy_options: PolicyOptions | None = None
                 ) -> PolicyPlacement:
    """Place ``instance`` for ``policy`` with ``algorithm`` and allocate with the policy (module docstring).

    ``yield`` on an instance whose only fluid resource is CPU is exactly
    :func:`vcsched.solvers.registry.solve`, bit for bit.  Placement rules hold on both ways, with the same
    report (``unmet_preferred``, ``preferred_dropped``, ``infeasible``).
    """
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
        placer = level_placer(algorithm, rates)
        if instance.has_rules:
            placement, report = place_with_rules(instance, placer, options, algorithm)
            detail = {**placement.detail, **report}
        else:
            placement = placer(instance, options)
            detail = dict(placement.detail)
        runtime = time.perf_counter() - start
        if placement.hosts is None:
            return PolicyPlacement(SolveResult(algorithm, False, None, None, None, runtime, detail=detail), None,
                                   method)
        level_alloc = allocate_policy(instance, placement.hosts, policy, policy_options)
        y = np.asarray(level_alloc.yields)
        result = SolveResult(algorithm, True, level_alloc.allocation(instance),
                             float(y.min()) if len(y) else 1.0, float(y.mean()) if len(y) else 1.0,
                             runtime + level_alloc.runtime_s, None, detail=detail | {"placement": "level"})
        return PolicyPlacement(result, level_alloc, method)
    if base.allocation is None:
        return PolicyPlacement(base, None, method)
    result, palloc = reallocate(instance, base, policy, policy_options)
    if policy == "yield" and not instance.has_extra_resources:
        return PolicyPlacement(result, palloc, method)  # today's solve, untouched
    return PolicyPlacement(dataclasses.replace(result, detail={**result.detail, "placement": "max-min"}), palloc,
                           method)
