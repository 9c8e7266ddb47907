"""The LP relaxation's optimum in closed form (section 3.1).

With ``e`` relaxed to [0, 1], every job can be spread evenly over all hosts,
so the only limits are total CPU and total memory:
``Y_LP = min(1, sum_h C_h / sum_j k_j alpha_j)`` when memory fits in total.
It bounds every real placement from above; it is not itself a placement.
With extra fluid resources (disk, net, ...) every resource bounds it alike:
``min(1, min_r sum_h C_hr / sum_j k_j need_jr)``.
"""

from __future__ import annotations

import numpy as np

from vcsched.model import Instance, SolveOptions
from vcsched.solvers.algorithm import Placement
from vcsched.units import FIT_TOLERANCE
from vcsched.yields import common_yield


def lp_bound(instance: Instance) -> float | None:
    """Upper bound on the minimum yield, or None when memory does not fit even fractionally."""
    if instance.n_tasks == 0:
        return 1.0
    if float(instance.task_mem.sum()) > float(instance.host_mem.sum()) + FIT_TOLERANCE:
        return None
    if instance.has_extra_resources:  # per fluid resource: its total capacity over its total need at yield 1
        return common_yield(instance.host_capacity.sum(axis=0), instance.job_tasks @ instance.job_need)
    return common_yield(np.array([instance.host_cpu.sum()]), np.array([instance.task_alpha.sum()]))


def lpbound(instance: Instance, options: SolveOptions) -> Placement:
    """``lpbound`` as a registry entry: the bound, no placement."""
    return Placement(hosts=None, bound=lp_bound(instance))
