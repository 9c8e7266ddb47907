"""``yield``: vcsched's own objective (Stillwell et al., "Resource Allocation using Virtual Clusters", §3.5, §5).

Maximise the minimum yield ``Y``, then, keeping every ``y_j >= Y``, the mean
yield.  On an instance with CPU as its only fluid resource this *is*
:func:`vcsched.yields.allocate`, bit for bit.  With extra fluid resources
the same two phases run on every (host, resource) row: ``Y = min(1, min_p
C_p / L_p)``, then one LP (HiGHS) for the mean.  Weights and tenants are
ignored: this objective has none.  Note that "max-min, then max mean" is not
the lexicographic max-min that ``drf`` computes (docs/policies.md §3).
"""

from __future__ import annotations

import numpy as np

from vcsched.model import Instance
from vcsched.policies.allocation import PolicyOptions
from vcsched.policies.constraints import capacities
from vcsched.policies.registry import PolicyResult, register
from vcsched.yields import allocate


@register("yield", "vcsched's objective: max-min yield, then max mean yield (Stillwell et al.)")
def yield_policy(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    if not instance.has_extra_resources:
        alloc = allocate(instance, hosts)
        y = alloc.yields(instance)
        return PolicyResult(y, {"min_yield": alloc.min_yield(instance), "avg_yield": alloc.avg_yield(instance)})
    caps = capacities(instance, hosts)
    full = caps.load(np.ones(instance.n_jobs))
    used = full > 0
    y_min = float(min(1.0, np.min(caps.capacity[used] / full[used]))) if used.any() else 1.0
    y = np.full(instance.n_jobs, y_min)
    if y_min < 1.0 and instance.n_jobs:
        from scipy.optimize import linprog  # here: `yield` on CPU alone never needs scipy (~0.4 s to load)

        res = linprog(c=-np.ones(instance.n_jobs), A_ub=caps.matrix, b_ub=caps.capacity,
                      bounds=np.column_stack((y, np.ones(instance.n_jobs))), method="highs")
        if res.status == 0:
            y = np.clip(res.x, y_min, 1.0)
            # HiGHS meets rows to ~1e-9: scale the part above Y back until every row fits exactly.
            over = caps.load(y) - caps.capacity
            if (over > 0).any():
                base = caps.load(np.full(instance.n_jobs, y_min))
                extra = caps.load(y - y_min)
                # Only the rows that overflow: a row HiGHS met with room left may carry a rounding-sized
                # ``extra`` over a ``base`` already at capacity, and its ratio would shrink everything.
                ok = (extra > 0) & (over > 0)
                shrink = float(np.min(np.where(ok, (caps.capacity - base) / np.where(ok, extra, 1.0), 1.0)))
                y = y_min + (y - y_min) * min(1.0, max(0.0, shrink))
    return PolicyResult(y, {"min_yield": float(y.min()) if len(y) else 1.0,
                            "avg_yield": float(y.mean()) if len(y) else 1.0})
