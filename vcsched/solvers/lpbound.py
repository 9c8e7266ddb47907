"""The LP relaxation's optimum in closed form (section 3.1).

With ``e`` relaxed to [0, 1], every job can be spread evenly over all hosts,
so the only limits are total CPU and total memory:
``Y_LP = min(1, sum_h C_h / sum_j k_j alpha_j)`` when memory fits in total.
It bounds every real placement from above; it is not itself a placement.
"""

from __future__ import annotations

from vcsched.model import Instance, SolveOptions
from vcsched.solvers.registry import Placement, register


def lp_bound(instance: Instance) -> float | None:
    """Upper bound on the minimum yield, or None when memory does not fit even fractionally."""
    if instance.n_tasks == 0:
        return 1.0
    if float(instance.task_mem.sum()) > float(instance.host_mem.sum()) + 1e-12:
        return None
    return float(min(1.0, instance.host_cpu.sum() / instance.task_alpha.sum()))


@register("lpbound", "closed-form optimum of the LP relaxation: an upper bound, not a placement", bound_only=True)
def _lpbound(instance: Instance, options: SolveOptions) -> Placement:
    return Placement(hosts=None, bound=lp_bound(instance))
