"""How much of the cluster a job holds per unit of yield: dominant, asset and per-pool shares.

All three are *per unit of yield*: a job at yield ``y`` holds ``y`` times
them.  Memory is rigid and never part of a share (docs/policies.md §2).

* Cluster shares (the default reading, docs/policies.md §2):
  ``sigma_jr = k_j * need_jr / C_r^tot`` with ``C_r^tot`` the cluster's total
  capacity of resource ``r``.  The **dominant share** per unit yield is
  ``D_j = max_r sigma_jr`` ("Dominant Resource Fairness: Fair Allocation of
  Multiple Resource Types"), its argmax the job's
  **dominant resource**; the **asset share** is ``A_j = sum_r sigma_jr``.
* Pool shares (Bonald & Roberts' reading, "Enhanced Cluster Computing
  Performance through Proportional Fairness", §2.1): every (host, resource) pair is its own pool
  ``p``, of capacity ``C_p``; the job needs ``a_jp = n_jh * need_jr / C_p`` of it
  per unit yield, and its dominant share per unit yield is ``max_p a_jp``.
  A pair of capacity 0 that the job needs gives an infinite share: the job can
  only have yield 0.
"""

from __future__ import annotations

import numpy as np

from vcsched.constraints import Capacities
from vcsched.model import Instance


def cluster_totals(instance: Instance) -> np.ndarray:
    """``C_r^tot``: each fluid resource summed over all hosts."""
    return instance.host_capacity.sum(axis=0)


def cluster_shares(instance: Instance) -> np.ndarray:
    """``sigma_jr = k_j * need_jr / C_r^tot`` (``n_jobs x resources``); 0 where nobody has the resource."""
    totals = cluster_totals(instance)
    demand = instance.job_need * instance.job_tasks[:, None]
    return np.divide(demand, totals, out=np.zeros_like(demand), where=totals > 0)


def dominant_shares(instance: Instance) -> tuple[np.ndarray, np.ndarray]:
    """``(D_j, index of the dominant resource)`` per job, on cluster totals."""
    sigma = cluster_shares(instance)
    if instance.n_jobs == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    return sigma.max(axis=1), sigma.argmax(axis=1)


def asset_shares(instance: Instance) -> np.ndarray:
    """``A_j = sum_r sigma_jr``: the total share a job "spends" per unit yield (asset fairness)."""
    return cluster_shares(instance).sum(axis=1)


def pool_shares(caps: Capacities, n_jobs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(max_p a_jp, the argmax row of caps)`` per job; ``inf`` for a job needing a pair of capacity 0."""
    a = caps.matrix.tocoo()
    cap = caps.capacity[a.row]
    with np.errstate(divide="ignore"):
        share = np.where(cap > 0, a.data / np.where(cap > 0, cap, 1.0), np.inf)
    best = np.full(n_jobs, -1.0)
    where = np.full(n_jobs, -1, dtype=np.int64)
    # Sort by (job, share) and keep each job's last entry: its largest share.
    order = np.lexsort((share, a.col))
    last = np.r_[a.col[order][1:] != a.col[order][:-1], True] if len(order) else np.zeros(0, dtype=bool)
    best[a.col[order][last]] = share[order][last]
    where[a.col[order][last]] = a.row[order][last]
    return best, where
