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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vcsched.constraints import capacities
from vcsched.control.admission import existing_jobs, model_hosts
from vcsched.control.observe import Estimate
from vcsched.control.sharing import Sharing, check_vms, host_capacities, needed_resources, references
from vcsched.formats.cluster import Cluster
from vcsched.inventory import Inventory, VmState
from vcsched.model import Instance
from vcsched.plans.reasons import yield_of
from vcsched.policies.shares import cluster_shares
from vcsched.units import YIELD_TOLERANCE

if TYPE_CHECKING:  # scipy is imported by drf-pools alone: loading it costs ~0.2 s of every status (docs/benchmarks.md)
    from scipy.sparse import csr_matrix


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
    dict each, in the order of :func:`vcsched.control.admission.existing_jobs`.

    A virtual cluster is known by its name: the model splits one whose VMs differ in need or memory into
    several jobs (``web/0.5/134217728``, ``web/0.8/134217728``: a job's tasks are alike), and they are put back
    together here, its share summed over its jobs on each resource (or pool) before the largest is taken.
    """
    estimates = estimates or {}
    up = inv.up()
    managed = up.managed()
    if not managed:
        return []
    check_vms(cluster, managed)
    refs = references(cluster, up, needed_resources(v.meta for v in managed if v.meta is not None))
    existing = existing_jobs(up, managed, refs=refs)
    instance = Instance(model_hosts(up, host_capacities(cluster, up, refs)), existing.jobs)
    of_job: list[list[VmState]] = [[] for _ in instance.jobs]
    for t, v in enumerate(existing.vms):
        of_job[int(instance.task_job[t])].append(v)
    jobs_of: dict[str, list[int]] = {}  # virtual cluster -> its jobs, in job order (one pass: 1,000s of jobs)
    for j, vms in enumerate(of_job):
        jobs_of.setdefault(str(vms[0].cluster), []).append(j)
    names = list(jobs_of)
    group = np.empty(instance.n_jobs, dtype=np.int64)
    for g, jobs in enumerate(jobs_of.values()):
        group[jobs] = g
    lowest_of_job: list[VmYield | None] = []  # per job, its lowest yield (the one definition: vm_yield)
    for vms in of_job:
        ys = [vy for v in vms if (vy := vm_yield(v, estimates.get(v.name))) is not None]
        lowest_of_job.append(min(ys, key=lambda vy: (vy.value, not vy.upper_bound)) if ys else None)
    job_yield = np.array([vy.value if vy is not None else 0.0 for vy in lowest_of_job])
    if sharing.policy == "drf-pools":
        from scipy.sparse import csr_matrix  # lazy: scipy costs ~0.4 s to import (only under drf-pools)

        # weights[j, g]: job j's yield if it belongs to virtual cluster g, so that shares @ weights sums each
        # virtual cluster's jobs, every one at its own yield.
        weights = csr_matrix((job_yield, (np.arange(instance.n_jobs), group)), shape=(instance.n_jobs, len(names)))
        share, top, pool_of, nothing_held = _pool_dominance(instance, existing.hosts, weights)
    else:
        # Each virtual cluster's jobs summed, every one at its own yield: resources x virtual clusters.
        shares = cluster_shares(instance)
        summed = np.zeros((len(names), shares.shape[1]))
        np.add.at(summed, group, job_yield[:, None] * shares)
        dense = summed.T
        top = np.argmax(dense, axis=0) if dense.size else np.zeros(len(names), dtype=np.int64)
        share = dense.max(axis=0) if dense.size else np.zeros(len(names))
        pool_of = list(instance.resources)
        nothing_held = pool_of[0] if pool_of else "-"  # as numpy's argmax of zeros names the first resource
    out = []
    for g, (name, jobs) in enumerate(jobs_of.items()):
        vms = [v for j in jobs for v in of_job[j]]
        meta = vms[0].meta
        assert meta is not None
        held = float(share[g])
        first = instance.jobs[jobs[0]]
        lowest = min((vy for j in jobs if (vy := lowest_of_job[j]) is not None),
                     key=lambda vy: (vy.value, not vy.upper_bound), default=None)
        out.append({"name": name, "vms": len(vms), "weight": first.weight, "tenant": first.tenant,
                    "yield": lowest.value if lowest is not None else 0.0,
                    "yield_upper_bound": lowest is not None and lowest.upper_bound,
                    "dominant_share": held if np.isfinite(held) else 0.0,
                    "dominant_pool": pool_of[int(top[g])] if held != 0 else nothing_held,
                    "min_yield": meta.min_yield,
                    **{k: v for k, v in (("disk_bps", meta.disk_bps), ("net_bps", meta.net_bps)) if v is not None}})
    return out


def _pool_dominance(instance: Instance, hosts: Sequence[int], weights: csr_matrix
                    ) -> tuple[np.ndarray, np.ndarray, list[str], str]:
    """Under ``drf-pools``: each virtual cluster's largest share of one (host, resource) pair — its jobs' loads
    on the pair over the pair's capacity (``inf`` on a pair of capacity 0 it needs) — and which pair, among
    equals the last, as :func:`vcsched.policies.shares.pool_shares` names it; sparse throughout (1,000 hosts)."""
    from scipy.sparse import diags  # lazy: scipy costs ~0.4 s to import (only under drf-pools)

    caps = capacities(instance, np.asarray(hosts, dtype=np.int64))
    per_unit = 1.0 / np.where(caps.capacity > 0, caps.capacity, 1.0)
    held = (diags(per_unit) @ caps.matrix @ weights).tocsr()[::-1].tocsc()  # pairs (last first) x clusters
    n = weights.shape[1]
    share = np.asarray(held.max(axis=0).todense(), dtype=float).ravel() if held.shape[0] else np.zeros(n)
    top = np.asarray(held.argmax(axis=0), dtype=np.int64).ravel() if held.shape[0] else np.zeros(n, np.int64)
    top = held.shape[0] - 1 - top  # back to the pairs' own order
    needs_none = caps.capacity <= 0
    if needs_none.any():  # a pair of capacity 0 that a virtual cluster needs: an infinite share
        ones = weights.copy()
        ones.data[:] = 1.0
        on_none = (caps.matrix[needs_none] @ ones).tocsc()
        rows = np.flatnonzero(needs_none)
        for g in np.flatnonzero(np.asarray(on_none.max(axis=0).todense()).ravel() > 0):
            share[g] = np.inf
            top[g] = rows[int(on_none[:, g].argmax())]
    return share, top, caps.pair_names(instance), "-"
