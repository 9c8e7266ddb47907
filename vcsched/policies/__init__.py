"""Multi-resource sharing policies on a fixed placement (docs/policies.md).

Given an instance and a placement (task -> host), a policy chooses one yield
per job under every (host, fluid resource) capacity and ``y <= 1``:

* ``yield`` — vcsched's objective (max-min yield, then mean yield);
* ``drf`` — weighted Dominant Resource Fairness on cluster-total shares;
* ``drf-pools`` — DRF with each (host, resource) pair a pool (Bonald & Roberts);
* ``asset`` — asset fairness;
* ``pf`` — proportional fairness (= CEEI with equal weights);
* ``alpha-fair`` — the alpha-fair family (alpha -> 1: PF, alpha -> inf: max-min);
* ``hdrf`` — static hierarchical DRF over the tenant tree.

Sources, cited by title: T. Bonald and J. Roberts, "Enhanced Cluster
Computing Performance through Proportional Fairness" (BR); "Dominant Resource
Fairness: Fair Allocation of Multiple Resource Types" (Ghodsi et al.'s DRF, in
the form of lecture notes; "the DRF notes"); A. Bhattacharya et al.,
"Hierarchical Scheduling for Diverse Datacenter Workloads" (H-DRF).

Everything here is pure: values in, values out.
"""

from __future__ import annotations

from vcsched.policies.allocation import PolicyAllocation, PolicyOptions
from vcsched.policies.registry import allocate_policy, get, policies

__all__ = ["PolicyAllocation", "PolicyOptions", "allocate_policy", "get", "policies"]
