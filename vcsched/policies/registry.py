"""One registry of named sharing policies with one signature (like :mod:`vcsched.solvers.registry`).

A *policy* maps ``(instance, hosts, options)`` — ``hosts[t]`` the host index
of task t, a placement fixed beforehand — to one yield per job plus
policy-specific details.  :func:`allocate_policy` checks the input, times
the policy, derives what every VM gets of every fluid resource and the
dominant shares, and runs the one validator on the result.
"""

from __future__ import annotations

import math
import time

import numpy as np

from vcsched.constraints import capacities
from vcsched.errors import InputError
from vcsched.model import Instance
from vcsched.policies.allocation import Policy, PolicyAllocation, PolicyOptions
from vcsched.policies.alphafair import alpha_fair, pf
from vcsched.policies.drf import asset, drf, drf_pools
from vcsched.policies.hdrf import hdrf
from vcsched.policies.minyield import yield_policy
from vcsched.policies.shares import dominant_shares, pool_shares
from vcsched.validate import check_instance, check_yields

MAX_ALPHA = 100.0  # y^(1-alpha) over [1e-3, 1] spans 300 decades at alpha = 100: the conic solver's limit

#: Every sharing policy, by name: the one list (a policy module that fails to import fails here, loudly).
POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("yield", yield_policy, "vcsched's objective: max-min yield, then max mean yield (Stillwell et al.)"),
    Policy("drf", drf, "weighted Dominant Resource Fairness: lexicographic max-min of y_j D_j / w_j, "
                       "cluster-total shares"),
    Policy("drf-pools", drf_pools, "DRF with every (host, resource) pair its own pool (Bonald & Roberts' model)"),
    Policy("asset", asset, "asset fairness: lexicographic max-min of y_j A_j / w_j, A_j the sum of cluster shares"),
    Policy("pf", pf, "proportional fairness: max sum w_j log y_j (= CEEI with equal weights), cvxpy + Clarabel"),
    Policy("alpha-fair", alpha_fair, "alpha-fair: max sum w_j y_j^(1-a)/(1-a); a -> 1 is PF, a -> inf max-min "
                                     "(needs --alpha)", uses_alpha=True),
    Policy("hdrf", hdrf, "static hierarchical DRF over the tenant tree (H-DRF Algorithm 1, epsilon-filling)"),
)}


def policies() -> dict[str, Policy]:
    return dict(POLICIES)


def get(name: str) -> Policy:
    known = policies()
    if name not in known:
        raise InputError(f"policy: unknown policy {name!r} (known: {', '.join(sorted(known))})")
    return known[name]


def check_options(policy: Policy, options: PolicyOptions) -> None:
    """``alpha`` belongs to alpha-fair only, and must be in (0, MAX_ALPHA] there."""
    a = options.alpha
    if policy.uses_alpha:
        if a is None:
            raise InputError(f"alpha: policy {policy.name!r} needs an alpha (e.g. 2)")
        if isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a) or not 0 < a <= MAX_ALPHA:
            raise InputError(f"alpha: {a!r} must be a number in (0, {MAX_ALPHA:g}] "
                             f"(beyond that the alpha-fair optimum is numerically the max-min of the yields)")
    elif a is not None:
        raise InputError(f"alpha: only the alpha-fair policy takes an alpha, not {policy.name!r}")
    if not (isinstance(options.epsilon, int | float) and 0 < options.epsilon <= 0.1):
        raise InputError(f"epsilon: {options.epsilon!r} must be in (0, 0.1]")


def _placement(instance: Instance, hosts: object) -> np.ndarray:
    h = np.asarray(hosts)
    if h.ndim != 1 or len(h) != instance.n_tasks or (len(h) and not np.issubdtype(h.dtype, np.integer)):
        raise InputError(f"placement: expected {instance.n_tasks} host indices (one per task)")
    h = h.astype(np.int64)
    if len(h) and (h.min() < 0 or h.max() >= instance.n_hosts):
        raise InputError(f"placement: host index out of range 0..{instance.n_hosts - 1}")
    return h


def allocate_policy(instance: Instance, hosts: object, policy: str = "yield",
                    options: PolicyOptions | None = None) -> PolicyAllocation:
    """The allocation ``policy`` gives the placement ``hosts`` (task -> host index), validated."""
    pol = get(policy)
    options = options or PolicyOptions()
    check_options(pol, options)
    check_instance(instance)
    h = _placement(instance, hosts)
    start = time.perf_counter()
    result = pol.fn(instance, h, options)
    runtime = time.perf_counter() - start
    y = np.asarray(result.yields, dtype=float) + 0.0  # no -0.0 from a solver in the output
    check_yields(instance, h, y)
    if result.pool_shares:
        caps = capacities(instance, h)
        per_unit, where = pool_shares(caps, instance.n_jobs)
        dom = y * np.where(np.isfinite(per_unit), per_unit, 0.0)  # infinite only where y must be 0
        pools = tuple(caps.pair_name(instance, int(p)) for p in where)
    else:
        per_unit, where = dominant_shares(instance)
        dom = y * per_unit
        pools = tuple(instance.resources[int(r)] for r in where)
    vm_share = y[:, None] * instance.job_need
    return PolicyAllocation(
        policy=pol.name,
        hosts=tuple(int(x) for x in h),
        yields=tuple(float(v) for v in y),
        resources=instance.resources,
        vm_share=tuple(tuple(float(v) for v in row) for row in vm_share),
        dominant_share=tuple(float(v) for v in dom),
        dominant_pool=pools,
        runtime_s=runtime,
        detail=result.detail,
    )
