"""The capacity rows of a fixed placement: one per (host, fluid resource) pair.

With the placement fixed, every sharing policy works on the same linear
constraints over the yields (docs/policies.md §1)::

    sum_j n_jh * need_jr * y_j <= C_hr     for every host h and fluid resource r
    0 <= y_j <= 1

where ``n_jh`` is how many of job j's VMs sit on host h.  Memory is rigid: it
constrains only the placement, never the yields, so it has no row here.
Only pairs that some placed VM needs get a row; a pair whose capacity is 0
but that a VM needs is a row too, and it pins those jobs to yield 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vcsched.model import Instance
from vcsched.units import SATURATION_TOLERANCE

if TYPE_CHECKING:  # scipy is imported where a matrix is built: loading it costs ~0.4 s, and `yield` needs none
    from scipy.sparse import csr_matrix


@dataclass(frozen=True)
class Capacities:
    """``matrix @ y <= capacity``: rows are (host, resource) pairs, columns are jobs.

    ``matrix[p, j] = n_jh * need_jr`` for the pair ``p = (host[p], resource[p])``.
    """

    matrix: csr_matrix
    capacity: np.ndarray
    host: np.ndarray
    resource: np.ndarray

    @property
    def n_pairs(self) -> int:
        return len(self.capacity)

    def load(self, yields: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix @ yields, dtype=float)

    def saturated(self, yields: np.ndarray, *, rtol: float = SATURATION_TOLERANCE) -> np.ndarray:
        """Pairs whose load is within ``rtol`` (relative to capacity, absolute for capacity 0) of capacity."""
        return self.load(yields) >= self.capacity - rtol * np.maximum(self.capacity, 1.0)

    def pair_name(self, instance: Instance, p: int) -> str:
        """``host:resource``, e.g. ``h3:disk``."""
        return f"{instance.hosts[int(self.host[p])].name}:{instance.resources[int(self.resource[p])]}"

    def pair_names(self, instance: Instance) -> list[str]:
        hosts, res = [h.name for h in instance.hosts], instance.resources
        return [f"{hosts[h]}:{res[r]}" for h, r in zip(self.host.tolist(), self.resource.tolist(), strict=True)]


def vms_per_host(instance: Instance, hosts: np.ndarray) -> csr_matrix:
    """``n_jh`` as a sparse (job x host) matrix of VM counts."""
    from scipy.sparse import csr_matrix  # lazy: scipy costs ~0.4 s to import

    return csr_matrix(
        (np.ones(instance.n_tasks), (instance.task_job, hosts)), shape=(instance.n_jobs, instance.n_hosts)
    )


def capacities(instance: Instance, hosts: np.ndarray) -> Capacities:
    """The rows of a placement (task -> host index), vectorised over every (job, host, resource)."""
    from scipy.sparse import coo_matrix  # lazy: scipy costs ~0.4 s to import

    hosts = np.asarray(hosts, dtype=np.int64)
    counts = vms_per_host(instance, hosts).tocoo()  # duplicates summed: one entry per (job, host)
    n_res = len(instance.resources)
    need = instance.job_need[counts.row]  # (entries x resources)
    e, r = np.nonzero(need > 0)
    rows = counts.col[e] * n_res + r  # pair id before compaction: host * R + resource
    values = counts.data[e] * need[e, r]
    used, pair = np.unique(rows, return_inverse=True)
    matrix = coo_matrix((values, (pair, counts.row[e])), shape=(len(used), instance.n_jobs)).tocsr()
    host, resource = used // n_res, used % n_res
    return Capacities(matrix=matrix, capacity=instance.host_capacity[host, resource].astype(float),
                      host=host, resource=resource)
