"""One registry of named sharing policies with one signature (like :mod:`vcsched.solvers.registry`).

A *policy* maps ``(instance, hosts, options)`` — ``hosts[t]`` the host index
of task t, a placement fixed beforehand — to one yield per job plus
policy-specific details.  :func:`allocate_policy` checks the input, times
the policy, derives what every VM gets of every fluid resource and the
dominant shares, and runs the one validator on the result.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vcsched.errors import InputError
from vcsched.formats.instance import check_instance
from vcsched.model import Instance
from vcsched.policies.allocation import PolicyAllocation, PolicyOptions
from vcsched.policies.constraints import capacities
from vcsched.policies.shares import dominant_shares, pool_shares
from vcsched.validate import check_yields


@dataclass(frozen=True)
class PolicyResult:
    """What a policy function returns: yields, and optionally its own dominant shares and details."""

    yields: np.ndarray
    detail: dict[str, object] = field(default_factory=dict)
    pool_shares: bool = False  # True: report per-(host, resource) dominant shares (drf-pools)


PolicyFn = Callable[[Instance, np.ndarray, PolicyOptions], PolicyResult]


@dataclass(frozen=True)
class Policy:
    name: str
    fn: PolicyFn
    summary: str
    uses_alpha: bool = False


MAX_ALPHA = 100.0  # y^(1-alpha) over [1e-3, 1] spans 300 decades at alpha = 100: the conic solver's limit

_REGISTRY: dict[str, Policy] = {}
# Modules whose import registers policies, loaded on first use; the conic ones
# import cvxpy only when they run.
_MODULES = ("vcsched.policies.minyield", "vcsched.policies.drf", "vcsched.policies.alphafair",
            "vcsched.policies.hdrf")
_loaded = False


def register(name: str, summary: str, *, uses_alpha: bool = False) -> Callable[[PolicyFn], PolicyFn]:
    def deco(fn: PolicyFn) -> PolicyFn:
        _REGISTRY[name] = Policy(name, fn, summary, uses_alpha=uses_alpha)
        return fn

    return deco


def _load() -> None:
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(mod)
        _loaded = True


def policies() -> dict[str, Policy]:
    _load()
    return dict(_REGISTRY)


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
