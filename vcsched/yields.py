"""Yields of a fixed placement and the average-yield phase (paper sections 3.5 and 5).

With the placement fixed, the best common minimum yield is
``min(1, min_h C_h / L_h)`` where ``L_h`` is the sum of the CPU needs of the
tasks on host ``h``: giving every job ``Y * alpha`` fills the tightest host.
That holds for parallel jobs too, since a common ``Y`` does not care which
host a task sits on.

The second phase keeps the placement and every ``y_j >= Y`` and maximizes
the mean per-job yield.  For sequential jobs the per-host greedy "smallest
CPU need first" is optimal by an exchange argument (section 3.5); parallel
jobs couple hosts through the equal-fraction constraint, so they get a small
LP (section 5).

With extra fluid resources (disk, network: docs/policies.md) the same two
phases run on every (host, resource) row (:mod:`vcsched.constraints`):
``Y = min(1, min_p C_p / L_p)``, then the same LP.  That is the ``yield``
sharing policy, and what every placing algorithm's result is allocated with.

The LP is solved by HiGHS, which meets rows to about 1e-9: on the rows it
overflows, the part of the yields above ``Y`` is scaled back until every row
holds exactly (one repair, :func:`_average_phase`).  Should the LP fail, the phase is skipped and the
allocation says so (``Allocation.notes``): every job keeps the minimum yield.
"""

from __future__ import annotations

import numpy as np

from vcsched.constraints import capacities
from vcsched.model import Allocation, Instance
from vcsched.units import MEMORY_TOLERANCE


def host_loads(instance: Instance, hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(CPU need, memory) summed per host for a task->host placement."""
    cpu = np.bincount(hosts, weights=instance.task_alpha, minlength=instance.n_hosts)
    mem = np.bincount(hosts, weights=instance.task_mem, minlength=instance.n_hosts)
    return cpu, mem


def fits_in_memory(instance: Instance, hosts: np.ndarray) -> bool:
    _, mem = host_loads(instance, hosts)
    return bool(np.all(mem <= instance.host_mem + MEMORY_TOLERANCE))


def blocked_pairs(instance: Instance) -> np.ndarray:
    """``jobs x hosts``: True where the job needs a fluid resource the host has none of.

    A task there could only run at yield 0, so every placing algorithm treats
    such a host as one the task does not fit, like a host without the memory
    (an instance whose only fluid resource is CPU has none: hosts have CPU).
    """
    need = instance.job_need[:, None, :] > 0
    empty = instance.host_capacity[None, :, :] <= 0
    return np.any(need & empty, axis=2)


def fits(instance: Instance, hosts: np.ndarray) -> bool:
    """Memory fits on every host, and no task sits on a host without a fluid resource it needs."""
    if not fits_in_memory(instance, hosts):
        return False
    if not instance.has_extra_resources:
        return True
    h = np.asarray(hosts, dtype=np.int64)
    return not bool(blocked_pairs(instance)[instance.task_job, h].any())


def fluid_loads(instance: Instance, hosts: np.ndarray, tasks: np.ndarray | None = None) -> np.ndarray:
    """``hosts x resources``: the fluid needs placed on every host (column 0 = CPU), of ``tasks`` (default all)."""
    need = instance.job_need[instance.task_job]
    idx = np.arange(instance.n_tasks) if tasks is None else np.asarray(tasks, dtype=np.int64)
    h = np.asarray(hosts, dtype=np.int64)[idx]
    d = need.shape[1]
    return np.stack([np.bincount(h, weights=need[idx, r], minlength=instance.n_hosts) for r in range(d)],
                    axis=1).reshape(instance.n_hosts, d).astype(float)


def common_yield(capacity: np.ndarray, load: np.ndarray) -> float:
    """``min(1, min C / L)`` over the entries with a load: the highest yield every loaded entry allows.

    The one formula behind every "best common yield": a placement's (per host, or per (host, resource)
    row), the bound of section 3.1 (totals), the level running VMs allow by themselves.  1 when nothing is
    loaded; 0 where a load meets capacity 0.
    """
    used = load > 0
    if not used.any():
        return 1.0
    return float(min(1.0, np.min(capacity[used] / load[used])))


def placement_min_yield(instance: Instance, hosts: np.ndarray) -> float:
    """The highest common yield a placement allows (memory is not checked here).

    With extra fluid resources, the tightest (host, resource) pair sets it:
    ``min(1, min_hr C_hr / L_hr)``, 0 when a task sits where a resource it
    needs has capacity 0.
    """
    if instance.has_extra_resources:
        return common_yield(instance.host_capacity, fluid_loads(instance, hosts))
    cpu, _ = host_loads(instance, hosts)
    return common_yield(instance.host_cpu, cpu)


def _sequential_phase(instance: Instance, hosts: np.ndarray, lows: float | np.ndarray) -> np.ndarray:
    """Per host, hand spare CPU to tasks by increasing CPU need (vectorized greedy), each task starting at its
    low yield (one for all, or one per job: :func:`floored_lows`).  Smallest need first stays optimal from any
    starting point: a core given to a task of need ``a`` adds ``1 / a`` to the sum of yields."""
    alpha = instance.task_alpha
    low = np.broadcast_to(np.asarray(lows, dtype=float), alpha.shape)  # one task per job: task order == job order
    order = np.lexsort((alpha, hosts))  # by host, then by alpha ascending
    h_sorted = hosts[order]
    # One level for all: the host loads as every placement has summed them, bit for bit (the results are pinned:
    # tests/test_cpu_only_baseline.py); per-job lows: each job's low share of its host.
    base: np.ndarray = (float(lows) * host_loads(instance, hosts)[0] if np.ndim(lows) == 0
                        else np.bincount(hosts, weights=low * alpha, minlength=instance.n_hosts))
    spare = np.maximum(instance.host_cpu - base, 0.0)
    want = (1.0 - low[order]) * alpha[order]
    cum = np.cumsum(want)
    starts = np.searchsorted(h_sorted, np.arange(instance.n_hosts))
    before_in_host = cum - want - np.concatenate(([0.0], cum))[starts[h_sorted]]
    give = np.clip(spare[h_sorted] - before_in_host, 0.0, want)
    task_cpu = np.empty_like(alpha)
    task_cpu[order] = low[order] * alpha[order] + give
    return np.minimum(task_cpu, alpha)


def _average_phase(matrix: object, capacity: np.ndarray, min_yield: float | np.ndarray, n_jobs: int
                   ) -> tuple[np.ndarray, str | None]:
    """The LP of the average-yield phase (section 5): maximize sum_j y_j, Y <= y_j <= 1, ``matrix @ y <= capacity``.

    Returns the yields and, when the LP fails (it cannot for a ``Y`` the placement admits), a note saying
    the phase was skipped: every job then keeps ``Y``, which is safe.  HiGHS meets rows to about 1e-9, so on
    a row it overflows the part of each job's yield above ``Y`` is scaled back by the largest factor that
    makes the row fit exactly, each job taking the least factor of the rows it is on; a job on no
    overflowing row keeps its part (one global factor would take it from every job whenever a bottleneck
    row, already full at ``Y``, carries a rounding-sized extra).
    """
    # Imported here, not at the top: scipy.optimize costs ~0.4 s to import, more than a whole
    # sequential-job ``vcsched solve`` at 64 x 500 takes; only parallel jobs and extra resources need the LP.
    from scipy.optimize import linprog

    floor = np.broadcast_to(np.asarray(min_yield, dtype=float), (n_jobs,)).copy()  # Y, or each job's low
    res = linprog(c=-np.ones(n_jobs), A_ub=matrix, b_ub=capacity,
                  bounds=np.column_stack((floor, np.ones(n_jobs))), method="highs")
    if res.status != 0:
        return floor, (f"average-yield phase skipped: its LP failed ({res.message}); every job keeps the "
                       f"minimum yield {float(floor.min()) if n_jobs else 1.0:.6g}")
    y = np.clip(res.x, floor, 1.0)
    over = np.asarray(matrix @ y, dtype=float) - capacity
    if (over > 0).any():
        from scipy.sparse import coo_matrix  # lazy: scipy costs ~0.4 s to import

        base = np.asarray(matrix @ floor, dtype=float)
        extra = np.asarray(matrix @ (y - floor), dtype=float)
        bad = np.flatnonzero((over > 0) & (extra > 0))
        # Each overflowing row allows its jobs this fraction of their part above Y; a job keeps the least
        # fraction over the rows it is on, so every row fits and a job on none of them keeps all of its part.
        allowed = np.clip((capacity[bad] - base[bad]) / extra[bad], 0.0, 1.0)
        entries = coo_matrix(matrix).tocsr()[bad].tocoo()
        factor = np.ones(n_jobs)
        np.minimum.at(factor, entries.col, allowed[entries.row])
        y = floor + (y - floor) * factor
    return y, None


def _parallel_phase(instance: Instance, hosts: np.ndarray, lows: float | np.ndarray
                    ) -> tuple[np.ndarray, str | None]:
    """LP: maximize sum_j y_j, low_j <= y_j <= 1, sum_j n_jh alpha_j y_j <= C_h (CPU fractions, and the note)."""
    from scipy.sparse import csr_matrix  # with the LP (see _average_phase)

    # n_jh * alpha_j as a sparse (host x job) matrix, summing duplicate entries.
    a = csr_matrix((instance.task_alpha, (hosts, instance.task_job)), shape=(instance.n_hosts, instance.n_jobs))
    y, note = _average_phase(a, instance.host_cpu, lows, instance.n_jobs)
    return y * instance.job_alpha, note


def floored_lows(instance: Instance, hosts: np.ndarray, floors: np.ndarray) -> tuple[np.ndarray, float]:
    """Floors first, then the common level: per job ``max(theta_j * floor_j, L)``, and the least ``theta_j``.

    A floor is a promise (a request's ``min_yield``): a plain common yield shares a host's CPU equally and may
    give a VM with a floor less than it although the floors fit (a host failure's restarts, placed at the
    floors: docs/failures.md).  ``theta_j`` is 1 when the floors fit every (host, resource) row job ``j`` is
    on; on a row where they do not (a failed host's VM restarted below its floor), every floor there is scaled
    down together to the largest fraction that fits (:func:`common_yield` of the row), rather than one VM
    taking what is left — possibly nothing — and a job on several rows takes its least fraction.  Rows whose
    floors fit keep them whole.  ``L`` is the highest level at which every row still holds, bisected to 2^-50
    from below so that the lows always fit.
    """
    hosts = np.asarray(hosts, dtype=np.int64)
    floors = np.clip(np.asarray(floors, dtype=float), 0.0, 1.0)
    if instance.n_jobs == 0:
        return floors, 1.0
    if instance.has_extra_resources:
        caps = capacities(instance, hosts)
        capacity = caps.capacity
        entries = caps.matrix.tocoo()
        row_of, job_of = entries.row, entries.col  # each (row, job) a job loads

        def load(y: np.ndarray) -> np.ndarray:
            return np.asarray(caps.matrix @ y, dtype=float)
    else:  # CPU alone: the rows are the hosts (no sparse matrix, no scipy import for `status`'s headroom)
        capacity = instance.host_cpu
        row_of, job_of = hosts, instance.task_job

        def load(y: np.ndarray) -> np.ndarray:
            return np.bincount(hosts, weights=instance.task_alpha * y[instance.task_job], minlength=instance.n_hosts)

    floor_load = load(floors)
    row_theta = np.minimum(1.0, np.divide(capacity, floor_load, out=np.ones_like(capacity, dtype=float),
                                          where=floor_load > 0))
    theta = np.ones(instance.n_jobs)
    np.minimum.at(theta, job_of, row_theta[row_of])
    floors = floors * theta

    def holds(level: float) -> bool:
        return bool(np.all(load(np.maximum(floors, level)) <= capacity * (1 + 1e-12) + 1e-12))

    lo, hi = (1.0, 1.0) if holds(1.0) else (0.0, 1.0)
    while hi - lo > 2.0 ** -50:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return np.maximum(floors, lo), float(theta.min())


def fluid_yields(instance: Instance, hosts: np.ndarray, *, average_phase: bool = True,
                 lows: np.ndarray | None = None) -> tuple[np.ndarray, str | None]:
    """Per job, the yields of both phases on every (host, fluid resource) row, and the LP's note if any.

    ``lows``: each job's least yield (:func:`floored_lows`) instead of the common minimum."""
    caps = capacities(instance, hosts)
    y_min = common_yield(caps.capacity, caps.load(np.ones(instance.n_jobs))) if lows is None else lows
    if not average_phase or np.min(y_min, initial=1.0) >= 1.0 or instance.n_jobs == 0:
        return np.broadcast_to(np.asarray(y_min, dtype=float), (instance.n_jobs,)).copy(), None
    return _average_phase(caps.matrix, caps.capacity, y_min, instance.n_jobs)


def allocate(instance: Instance, hosts: np.ndarray, *, average_phase: bool = True,
             floors: np.ndarray | None = None) -> Allocation:
    """The allocation of a placement: min-yield CPU fractions, then the average-yield phase.

    On every fluid resource when the instance has extra ones (:func:`fluid_yields`).  A skipped phase is
    in ``notes``.  ``floors`` (a yield per job): floors first, then the common level (:func:`floored_lows`),
    then the average phase above each job's low; where floors do not all fit the placement they are scaled
    down together (said in ``notes``).
    """
    hosts = np.asarray(hosts, dtype=np.int64)
    note: str | None = None
    lows, theta = (None, 1.0) if floors is None else floored_lows(instance, hosts, floors)
    floor_note = (f"floors scaled to {theta:.4f} of themselves where they do not all fit this placement"
                  if theta < 1.0 else None)
    if instance.has_extra_resources:
        y, note = fluid_yields(instance, hosts, average_phase=average_phase, lows=lows)
        cpu = y * instance.job_alpha
    else:
        y_min = placement_min_yield(instance, hosts) if lows is None else lows
        if not average_phase or np.min(y_min, initial=1.0) >= 1.0 or instance.n_jobs == 0:
            cpu = y_min * instance.job_alpha
        elif instance.has_parallel_jobs:
            cpu, note = _parallel_phase(instance, hosts, y_min)
        else:
            cpu = _sequential_phase(instance, hosts, y_min)
    notes = tuple(n for n in (floor_note, note) if n is not None)
    return Allocation(hosts=tuple(int(h) for h in hosts), cpu=tuple(float(c) for c in cpu), notes=notes)
