"""What ``vcsched status`` and ``vcsched top`` report of a live cluster beyond its raw inventory.

The CLI reads the hosts and renders; the numbers are computed here, from
the same model as admission and adaptation (:func:`vcsched.control.admission.existing_jobs`,
:func:`vcsched.control.admission.model_hosts`), so that ``status`` and ``top``
say what the deciding commands would see:

* a managed VM's *yield* is what its cap gives it, ``cap / need`` (paper
  section 2.3), 1 when uncapped — one number everywhere (:func:`vm_yield`:
  `status`, `top`, the controller's metrics and decisions, recommendations),
  over its *estimated* need where there is an estimate
  (:mod:`vcsched.control.observe`), else its declared need.  Where the
  estimate is censored (a lower bound on the need), the yield is an upper
  bound, shown ``≤0.62``: the VM may get less than that share of its need;
* a virtual cluster's yield is its VMs' lowest; its dominant share is that
  yield times its share of the cluster per unit of yield (docs/policies.md
  §2), on cluster totals (its dominant resource), or under ``drf-pools`` on
  its most loaded (host, resource) pair;
* a yield is below its floor when it misses the ``min_yield`` it was
  admitted with by more than :data:`vcsched.units.YIELD_TOLERANCE`;
* a host's load is the sum of its managed running VMs' caps, the cores all
  its VMs were measured using, and the memory of its running VMs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vcsched.constraints import capacities
from vcsched.control.admission import existing_jobs, model_hosts
from vcsched.control.observe import Estimate
from vcsched.control.sharing import Sharing, check_vms, host_capacities, needed_resources, references
from vcsched.formats.cluster import Cluster
from vcsched.inventory import Inventory, VmState
from vcsched.model import Instance
from vcsched.plans.reasons import yield_of
from vcsched.policies.shares import dominant_shares, pool_shares
from vcsched.units import YIELD_TOLERANCE


@dataclass(frozen=True)
class VmYield:
    """A managed VM's yield and what it is over: the one definition (module docstring)."""

    value: float  # cap over need, at most 1
    need_cores: float  # the need it is over: the estimate when there is one, else the declared need
    declared_cores: float
    estimated_cores: float | None
    #: The estimate is censored (a lower bound on the need): the VM's true yield may be lower than ``value``.
    upper_bound: bool = False

    def shown(self, digits: int = 3) -> str:
        """``0.620``, or ``≤0.620`` for an upper bound."""
        return ("≤" if self.upper_bound else "") + f"{self.value:.{digits}f}"

    def to_dict(self) -> dict[str, Any]:
        return {"yield": self.value, "yield_upper_bound": self.upper_bound, "yield_need_cores": self.need_cores,
                "declared_need_cores": self.declared_cores, "estimated_need_cores": self.estimated_cores}


def vm_yield(vm: VmState, estimate: Estimate | None = None) -> VmYield | None:
    """The yield a running managed VM's cap gives it (section 2.3: y = a / alpha, both in cores here) over its
    estimated need (``estimate``, when there is one) or its declared need; None for an unmanaged or stopped VM.
    An uncapped VM has 1: nothing holds it below its need."""
    if vm.meta is None or not vm.active:
        return None
    declared = vm.meta.cpu_need_cores
    need = estimate.estimate if estimate is not None else declared
    value = 1.0 if vm.cap_cores is None else yield_of(vm.cap_cores, need)
    return VmYield(value, need, declared, None if estimate is None else estimate.estimate,
                   estimate is not None and estimate.censored and value < 1.0)


def predicted_yield(vm: VmState, estimate: Estimate | None = None) -> float | None:
    """:func:`vm_yield`'s number alone."""
    y = vm_yield(vm, estimate)
    return None if y is None else y.value


def below_floor(y: float | None, floor: float | None) -> bool:
    """Whether a yield misses the floor (``min_yield``) it was admitted with."""
    return y is not None and floor is not None and y < floor - YIELD_TOLERANCE


@dataclass(frozen=True)
class HostLoad:
    """What one host carries: the sum of its managed running VMs' caps (cores), the cores its VMs used
    (None: none of them measured), and the memory of its running VMs (bytes)."""

    caps_cores: float
    measured_cores: float | None
    memory_used_bytes: int


def host_load(inv: Inventory, host: str, measured: Mapping[str, float | None]) -> HostLoad:
    """:class:`HostLoad` of ``host``; ``measured``: cores each VM used over the same window."""
    on = inv.vms_on(host)
    used = [x for v in on if (x := measured.get(v.name)) is not None]
    return HostLoad(sum(v.cap_cores or 0.0 for v in on if v.managed and v.active),
                    sum(used) if used else None,
                    sum(v.memory_bytes for v in on if v.active))


def virtual_clusters(cluster: Cluster, inv: Inventory, sharing: Sharing,
                     estimates: Mapping[str, Estimate] | None = None) -> list[dict[str, Any]]:
    """Each running virtual cluster's yield (its VMs' lowest :func:`vm_yield`, over ``estimates`` where given;
    ``yield_upper_bound`` when that lowest is one), weight, tenant and dominant share (module docstring), one
    dict each, in the order of :func:`vcsched.control.admission.existing_jobs`."""
    estimates = estimates or {}
    up = inv.up()
    managed = up.managed()
    if not managed:
        return []
    check_vms(cluster, managed)
    refs = references(cluster, up, needed_resources(v.meta for v in managed if v.meta is not None))
    existing = existing_jobs(up, managed, refs=refs)
    instance = Instance(model_hosts(up, host_capacities(cluster, up, refs)), existing.jobs)
    if sharing.policy == "drf-pools":
        caps = capacities(instance, np.asarray(existing.hosts, dtype=np.int64))
        per_unit, where = pool_shares(caps, instance.n_jobs)
        pools = [caps.pair_name(instance, int(p)) if p >= 0 else "-" for p in where]
    else:
        per_unit, where = dominant_shares(instance)
        pools = [instance.resources[int(r)] for r in where]
    of_job: list[list[VmState]] = [[] for _ in instance.jobs]
    for t, v in enumerate(existing.vms):
        of_job[int(instance.task_job[t])].append(v)
    out = []
    for j, job in enumerate(instance.jobs):
        vms = of_job[j]
        ys = [vy for v in vms if (vy := vm_yield(v, estimates.get(v.name))) is not None]
        lowest = min(ys, key=lambda vy: (vy.value, not vy.upper_bound)) if ys else None
        y = lowest.value if lowest is not None else 0.0
        meta = vms[0].meta
        assert meta is not None
        share = float(y * per_unit[j]) if np.isfinite(per_unit[j]) else 0.0
        out.append({"name": job.name, "vms": len(vms), "weight": job.weight, "tenant": job.tenant,
                    "yield": y, "yield_upper_bound": lowest is not None and lowest.upper_bound,
                    "dominant_share": share, "dominant_pool": pools[j], "min_yield": meta.min_yield,
                    **{k: v for k, v in (("disk_bps", meta.disk_bps), ("net_bps", meta.net_bps)) if v is not None}})
    return out
