"""What ``vcsched status`` and ``vcsched top`` report of a live cluster beyond its raw inventory.

The CLI reads the hosts and renders; the numbers are computed here, from
the same model as admission and adaptation (:func:`vcsched.control.admission.existing_jobs`,
:func:`vcsched.control.admission.model_hosts`), so that ``status`` and ``top``
say what the deciding commands would see:

* a managed VM's *predicted yield* is what its cap gives it, ``cap / need``
  (paper section 2.3), 1 when uncapped;
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
from scipy.sparse import csr_matrix

from vcsched.constraints import capacities
from vcsched.control.admission import existing_jobs, model_hosts
from vcsched.control.sharing import Sharing, check_vms, host_capacities, needed_resources, references
from vcsched.formats.cluster import Cluster
from vcsched.inventory import Inventory, VmState
from vcsched.model import Instance
from vcsched.policies.shares import cluster_shares
from vcsched.units import YIELD_TOLERANCE


def predicted_yield(vm: VmState) -> float | None:
    """The yield a managed VM's cap gives it (section 2.3: y = a / alpha, both in cores here)."""
    if vm.meta is None or not vm.active:
        return None
    if vm.cap_cores is None:
        return 1.0  # uncapped: nothing holds it below its need
    return min(1.0, vm.cap_cores / vm.meta.cpu_need_cores)


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


def virtual_clusters(cluster: Cluster, inv: Inventory, sharing: Sharing) -> list[dict[str, Any]]:
    """Each running virtual cluster's yield (its VMs' lowest cap / need), weight, tenant and dominant share
    (module docstring), one dict each, in the order of :func:`vcsched.control.admission.existing_jobs`.

    A virtual cluster is known by its name: the model splits one whose VMs differ in need or memory into
    several jobs (``web/0.5/134217728``, ``web/0.8/134217728``: a job's tasks are alike), and they are put back
    together here, its share summed over its jobs on each resource (or pool) before the largest is taken.
    """
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
    names = list(dict.fromkeys(str(vms[0].cluster) for vms in of_job))
    group = np.array([names.index(str(vms[0].cluster)) for vms in of_job], dtype=np.int64)
    job_yield = np.array([min(predicted_yield(v) or 0.0 for v in vms) for vms in of_job])
    # weights[j, g]: job j's yield if it belongs to virtual cluster g, so that shares @ weights sums each
    # virtual cluster's jobs, every one at its own yield.
    weights = csr_matrix((job_yield, (np.arange(instance.n_jobs), group)), shape=(instance.n_jobs, len(names)))
    if sharing.policy == "drf-pools":
        caps = capacities(instance, np.asarray(existing.hosts, dtype=np.int64))
        held = np.asarray((caps.matrix @ weights).todense(), dtype=float)  # pairs x virtual clusters
        with np.errstate(divide="ignore", invalid="ignore"):
            room = np.where(caps.capacity > 0, caps.capacity, 1.0)[:, None]
            share = np.where(caps.capacity[:, None] > 0, held / room, np.where(held > 0, np.inf, 0.0))
        pool_of, nothing_held = caps.pair_names(instance), "-"
        share = share[::-1]  # among equal shares the last pair is named, as pool_shares does
        pool_of.reverse()
    else:
        share = np.asarray((weights.T @ cluster_shares(instance)).T, dtype=float)  # resources x virtual clusters
        pool_of = list(instance.resources)
        nothing_held = pool_of[0]  # as numpy's argmax of a row of zeros names the first resource
    out = []
    for g, name in enumerate(names):
        jobs = [j for j in range(instance.n_jobs) if group[j] == g]
        vms = [v for j in jobs for v in of_job[j]]
        meta = vms[0].meta
        assert meta is not None
        column = share[:, g] if share.size else np.zeros(0)
        top = int(np.argmax(column)) if column.size and column.max() > 0 else -1
        dominant = float(column[top]) if top >= 0 and np.isfinite(column[top]) else 0.0
        first = instance.jobs[jobs[0]]
        out.append({"name": name, "vms": len(vms), "weight": first.weight, "tenant": first.tenant,
                    "yield": min(float(job_yield[j]) for j in jobs), "dominant_share": dominant,
                    "dominant_pool": pool_of[top] if top >= 0 else nothing_held,
                    "min_yield": meta.min_yield,
                    **{k: v for k, v in (("disk_bps", meta.disk_bps), ("net_bps", meta.net_bps)) if v is not None}})
    return out
