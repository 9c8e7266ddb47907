"""Exact weighted water-filling on the (host, resource) rows of a fixed placement (docs/policies.md §3).

Every job j grows its yield at its own rate ``rho_j`` along a common level
``t`` (``y_j = rho_j * t``) until it *freezes*: at its upper limit (yield 1),
or when a (host, resource) pair it needs saturates.  This is Bonald &
Roberts' water filling ("Enhanced Cluster Computing Performance through
Proportional Fairness", §2.3) with the bottleneck a (host, resource) pair.  On a
packing polytope it gives the lexicographic max-min of ``y_j / rho_j``:
DRF with ``rho_j = w_j / D_j``, asset fairness with ``w_j / A_j``, plain
max-min yield with ``rho = 1``.  The result is Pareto-efficient: every job
ends at its limit or needs a saturated pair.

The algorithm is event-driven rather than a loop over small steps, so it is
exact (no step size) and runs in O(nnz log nnz): each pair's load is
``F_p + G_p * t`` (F from frozen jobs, G the growth from active ones), its
saturation level ``(C_p - F_p) / G_p`` only *rises* as jobs freeze, so a
heap of stale levels is re-checked lazily when popped.  Jobs reaching their
limit are events too, taken in level order.  Pure Python over plain lists:
the loop touches each (job, pair) entry a bounded number of times, and at
10,000 VMs that is faster than per-event numpy calls.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from vcsched.constraints import Capacities


@dataclass(frozen=True)
class WaterFill:
    """Yields, the level at which each job froze, and why (pair index, or -1 for its limit)."""

    yields: np.ndarray
    level: np.ndarray
    frozen_by: np.ndarray
    events: int


def waterfill(caps: Capacities, rates: np.ndarray, limits: np.ndarray | None = None) -> WaterFill:
    """Grow ``y = rates * t`` with freezing; ``rates[j] == 0`` pins job j at 0 (it cannot grow)."""
    rates = np.asarray(rates, dtype=float)
    n_jobs = len(rates)
    lim = (np.ones(n_jobs) if limits is None else np.asarray(limits, dtype=float)).tolist()
    by_job = caps.matrix.T.tocsr()  # job -> (pair, coefficient)
    by_pair = caps.matrix  # pair -> (job, coefficient)
    j_ptr, j_pair, j_coef = by_job.indptr.tolist(), by_job.indices.tolist(), by_job.data.tolist()
    p_ptr, p_job = by_pair.indptr.tolist(), by_pair.indices.tolist()
    cap = caps.capacity.tolist()
    rho = rates.tolist()

    # growth per pair from every job that can grow, and how many such jobs touch it
    growth = np.asarray(caps.matrix @ rates, dtype=float).tolist()
    active_on = np.diff(caps.matrix.indptr).tolist()
    fixed = [0.0] * caps.n_pairs
    y = [0.0] * n_jobs
    level = [0.0] * n_jobs
    frozen_by = [-1] * n_jobs
    active = [True] * n_jobs

    def freeze(j: int, yj: float, t: float, why: int) -> None:
        active[j] = False
        y[j] = yj
        level[j] = t
        frozen_by[j] = why
        r = rho[j]
        for k in range(j_ptr[j], j_ptr[j + 1]):
            p, c = j_pair[k], j_coef[k]
            fixed[p] += c * yj
            active_on[p] -= 1
            growth[p] = growth[p] - c * r if active_on[p] else 0.0

    n_active = n_jobs
    for j in range(n_jobs):
        if rho[j] <= 0.0 or lim[j] <= 0.0:
            freeze(j, 0.0, 0.0, -1)
            n_active -= 1
    # jobs in order of the level at which they reach their limit
    lim_a = np.asarray(lim)
    with np.errstate(divide="ignore"):
        limit_level = np.where(rates > 0, lim_a / np.where(rates > 0, rates, 1.0), np.inf)
    by_limit = np.argsort(limit_level, kind="stable").tolist()
    limit_level_l = limit_level.tolist()
    nxt = 0
    heap = [(cap[p] / growth[p] if growth[p] > 0 else float("inf"), p) for p in range(caps.n_pairs)]
    heapq.heapify(heap)
    events = 0
    inf = float("inf")
    t_last = 0.0  # levels only rise; rounding must not take one back
    while n_active:
        while nxt < n_jobs and not active[by_limit[nxt]]:
            nxt += 1
        t_limit = limit_level_l[by_limit[nxt]] if nxt < n_jobs else inf
        t_pair, p = heap[0] if heap else (inf, -1)
        if p >= 0:
            g = growth[p]
            true = (cap[p] - fixed[p]) / g if g > 0 else inf
            if true > t_pair:  # stale: the pair's level rose since it was pushed
                heapq.heapreplace(heap, (true, p))
                continue
            t_pair = max(true, t_last)
        events += 1
        if t_limit <= t_pair:
            j = by_limit[nxt]
            t_last = max(t_limit, t_last)
            freeze(j, lim[j], t_last, -1)
            n_active -= 1
            continue
        if t_pair == inf:  # cannot happen: every active job needs some pair and grows
            raise AssertionError("water filling: active jobs with no bottleneck")
        heapq.heappop(heap)
        t_last = t_pair
        # freeze() inlined: this loop runs once per job and dominates at 10,000 jobs
        for k in range(p_ptr[p], p_ptr[p + 1]):
            j = p_job[k]
            if active[j]:
                active[j] = False
                r = rho[j]
                y[j] = yj = min(r * t_pair, lim[j])
                level[j] = t_pair
                frozen_by[j] = p
                for e in range(j_ptr[j], j_ptr[j + 1]):
                    q, c = j_pair[e], j_coef[e]
                    fixed[q] += c * yj
                    left = active_on[q] - 1
                    active_on[q] = left
                    growth[q] = growth[q] - c * r if left else 0.0
                n_active -= 1
    return WaterFill(yields=np.asarray(y, dtype=float), level=np.asarray(level),
                     frozen_by=np.asarray(frozen_by, dtype=np.int64), events=events)
