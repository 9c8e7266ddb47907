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
"""

from __future__ import annotations

import numpy as np

from vcsched.model import Allocation, Instance

MEMORY_TOLERANCE = 1e-9


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


def placement_min_yield(instance: Instance, hosts: np.ndarray) -> float:
    """The highest common yield a placement allows (memory is not checked here).

    With extra fluid resources, the tightest (host, resource) pair sets it:
    ``min(1, min_hr C_hr / L_hr)``, 0 when a task sits where a resource it
    needs has capacity 0.
    """
    if instance.has_extra_resources:
        load = fluid_loads(instance, hosts)
        used = load > 0
        if not used.any():
            return 1.0
        return float(min(1.0, np.min(instance.host_capacity[used] / load[used])))
    cpu, _ = host_loads(instance, hosts)
    used = cpu > 0
    if not used.any():
        return 1.0
    return float(min(1.0, np.min(instance.host_cpu[used] / cpu[used])))


def _sequential_phase(instance: Instance, hosts: np.ndarray, min_yield: float) -> np.ndarray:
    """Per host, hand spare CPU to tasks by increasing CPU need (vectorized greedy)."""
    alpha = instance.task_alpha
    order = np.lexsort((alpha, hosts))  # by host, then by alpha ascending
    h_sorted = hosts[order]
    cpu_load, _ = host_loads(instance, hosts)
    spare = np.maximum(instance.host_cpu - min_yield * cpu_load, 0.0)
    want = (1.0 - min_yield) * alpha[order]
    cum = np.cumsum(want)
    starts = np.searchsorted(h_sorted, np.arange(instance.n_hosts))
    before_in_host = cum - want - np.concatenate(([0.0], cum))[starts[h_sorted]]
    give = np.clip(spare[h_sorted] - before_in_host, 0.0, want)
    task_cpu = np.empty_like(alpha)
    task_cpu[order] = min_yield * alpha[order] + give
    return np.minimum(task_cpu, alpha)  # one task per job: task order == job order


def _parallel_phase(instance: Instance, hosts: np.ndarray, min_yield: float) -> np.ndarray:
    """LP: maximize sum_j y_j, Y <= y_j <= 1, sum_j n_jh alpha_j y_j <= C_h."""
    # Imported here, not at the top: scipy.optimize costs ~0.4 s to import, more than a whole
    # sequential-job ``vcsched solve`` at 64 x 500 takes; only parallel jobs need the LP.
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    n_jobs, n_hosts = instance.n_jobs, instance.n_hosts
    # n_jh * alpha_j as a sparse (host x job) matrix, summing duplicate entries.
    a = csr_matrix(
        (instance.task_alpha, (hosts, instance.task_job)), shape=(n_hosts, n_jobs)
    )
    res = linprog(
        c=-np.ones(n_jobs),
        A_ub=a,
        b_ub=instance.host_cpu,
        bounds=np.column_stack((np.full(n_jobs, min_yield), np.ones(n_jobs))),
        method="highs",
    )
    if res.status != 0:  # cannot happen for a Y the placement admits; keep the safe answer
        y = np.full(n_jobs, min_yield)
    else:
        y = np.clip(res.x, min_yield, 1.0)
        # HiGHS satisfies rows to ~1e-9; shave any excess so capacity holds exactly.
        load = a @ y
        over = load > instance.host_cpu
        if over.any():
            y = np.full(n_jobs, min_yield) + (y - min_yield) * 0.999999
    return y * instance.job_alpha


def allocate(instance: Instance, hosts: np.ndarray, *, average_phase: bool = True) -> Allocation:
    """The allocation of a placement: min-yield CPU fractions, then the average-yield phase."""
    hosts = np.asarray(hosts, dtype=np.int64)
    y = placement_min_yield(instance, hosts)
    if not average_phase or y >= 1.0 or instance.n_jobs == 0:
        cpu = y * instance.job_alpha
    elif instance.has_parallel_jobs:
        cpu = _parallel_phase(instance, hosts, y)
    else:
        cpu = _sequential_phase(instance, hosts, y)
    return Allocation(hosts=tuple(int(h) for h in hosts), cpu=tuple(float(c) for c in cpu))
