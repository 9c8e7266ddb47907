"""A policy applied to a placement solver's result: the same placement, the policy's yields."""

from __future__ import annotations

import dataclasses

import numpy as np

from vcsched.model import Instance, SolveResult
from vcsched.policies.allocation import PolicyAllocation, PolicyOptions
from vcsched.policies.registry import allocate_policy


def reallocate(instance: Instance, result: SolveResult, policy: str,
               options: PolicyOptions | None = None) -> tuple[SolveResult, PolicyAllocation | None]:
    """``result`` with its allocation, minimum and mean yield replaced by the policy's (placement kept).

    ``yield`` on an instance whose only fluid resource is CPU returns ``result``
    untouched: the solver already ran that very computation, and its numbers
    stay bit for bit.  A result without a placement has nothing to allocate.
    """
    if result.allocation is None:
        return result, None
    palloc = allocate_policy(instance, result.allocation.hosts, policy, options)
    if policy == "yield" and not instance.has_extra_resources:
        return result, palloc
    y = np.asarray(palloc.yields)
    return dataclasses.replace(
        result, allocation=palloc.allocation(instance),
        min_yield=float(y.min()) if len(y) else 1.0, avg_yield=float(y.mean()) if len(y) else 1.0,
        runtime_s=result.runtime_s + palloc.runtime_s,
    ), palloc
