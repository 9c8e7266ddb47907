"""The max-min family on a fixed placement: ``drf`` (weighted), ``drf-pools`` and ``asset``.

All three are the exact water-filling of :mod:`vcsched.policies.waterfill`
with a different rate per job, i.e. the lexicographic max-min of
``y_j / rho_j`` (docs/policies.md §3):

* ``drf`` — Dominant Resource Fairness (the DRF notes, "Dominant Resource Fairness: Fair Allocation of Multiple
  Resource Types";
  Bonald & Roberts §2.3), weighted: ``rho_j = w_j / D_j`` with ``D_j`` the
  dominant share per unit yield on **cluster totals**
  (:func:`vcsched.policies.shares.dominant_shares`).  So the weighted
  dominant shares ``y_j D_j / w_j`` are max-min fair, capacities being
  enforced per (host, resource).  With all weights 1 this is plain DRF.
* ``drf-pools`` — Bonald & Roberts' reading of DRF when every (host,
  resource) pair is its own pool (their model, §2.1, has J pools; docs/policies.md
  §2): job j needs ``a_jp = n_jh need_jr / C_hr`` of pool p per unit
  yield, and ``rho_j = w_j / max_p a_jp``.  A job's share is then its share of
  its most loaded *pair*, not of the cluster: a job whose VMs crowd one host
  counts as big even if the cluster is large.  On one host the two readings
  coincide.  BR's properties (sharing incentive, strategy-proofness, scale
  invariance) are proved in exactly this model.
* ``asset`` — asset fairness (the DRF notes): ``rho_j = w_j / A_j`` with
  ``A_j = sum_r sigma_jr``, equalising the total share spent.  It violates
  the sharing incentive and bottleneck fairness (tests show the notes'
  counterexamples).

CEEI is not here: in this fluid model it has the same maximiser as
proportional fairness (docs/policies.md §3), see :mod:`vcsched.policies.alphafair`.
"""

from __future__ import annotations

import numpy as np

from vcsched.constraints import Capacities, capacities
from vcsched.model import Instance
from vcsched.policies.allocation import PolicyOptions, PolicyResult
from vcsched.policies.shares import asset_shares, dominant_shares, pool_shares
from vcsched.policies.waterfill import waterfill


def maxmin(instance: Instance, caps: Capacities, rates: np.ndarray) -> PolicyResult:
    """Water-fill with ``rates`` and report the level and the bottleneck of every job."""
    fill = waterfill(caps, rates)
    names = np.array([*caps.pair_names(instance), "yield 1", "none"], dtype=object)
    why = np.where(fill.frozen_by >= 0, fill.frozen_by, np.where(fill.yields >= 1, caps.n_pairs, caps.n_pairs + 1))
    bottleneck = tuple(names[why].tolist())
    return PolicyResult(fill.yields, {"levels": fill.level.tolist(),
                                      "bottleneck": bottleneck, "events": fill.events})


def drf_rates(instance: Instance) -> np.ndarray:
    """``w_j / D_j`` on cluster totals (the DRF filling rate of each job)."""
    per_unit, _ = dominant_shares(instance)
    return instance.job_weight / per_unit


def drf(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    return maxmin(instance, capacities(instance, hosts), drf_rates(instance))


def drf_pools(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    caps = capacities(instance, hosts)
    per_unit, _ = pool_shares(caps, instance.n_jobs)
    with np.errstate(divide="ignore"):
        rates = np.where(np.isfinite(per_unit), instance.job_weight / per_unit, 0.0)
    result = maxmin(instance, caps, rates)
    return PolicyResult(result.yields, result.detail, pool_shares=True)


def asset(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    return maxmin(instance, capacities(instance, hosts), instance.job_weight / asset_shares(instance))
