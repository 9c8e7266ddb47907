"""``yield``: vcsched's own objective (Stillwell et al., "Resource Allocation using Virtual Clusters", §3.5, §5).

Maximise the minimum yield ``Y``, then, keeping every ``y_j >= Y``, the mean
yield: :func:`vcsched.yields.allocate`, the very allocation every placing
algorithm's result gets, on CPU or on every (host, resource) row.  Weights
and tenants are ignored: this objective has none.  Note that "max-min, then
max mean" is not the lexicographic max-min that ``drf`` computes
(docs/policies.md §3).
"""

from __future__ import annotations

import numpy as np

from vcsched.model import Instance
from vcsched.policies.allocation import PolicyOptions, PolicyResult
from vcsched.yields import allocate, fluid_yields


def yield_policy(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    note: str | None
    if instance.has_extra_resources:
        y, note = fluid_yields(instance, hosts)
    else:
        alloc = allocate(instance, hosts)
        y, note = alloc.yields(instance), (alloc.notes[0] if alloc.notes else None)
    detail: dict[str, object] = {"min_yield": float(y.min()) if len(y) else 1.0,
                                 "avg_yield": float(y.mean()) if len(y) else 1.0}
    if note is not None:
        detail["fallback"] = note
    return PolicyResult(y, detail)
