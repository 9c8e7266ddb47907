"""The one allocation validator: used by solver tests, the CLI, benchmarks and experiments.

Every constraint of the model is checked with a small absolute tolerance,
because solvers (LP/MILP in particular) return floating-point values.
"""

from __future__ import annotations

import numpy as np

from vcsched.errors import AllocationError
from vcsched.model import Allocation, Instance

TOLERANCE = 1e-6


def allocation_problems(
    instance: Instance,
    allocation: Allocation,
    *,
    min_yield: float | None = None,
    avg_yield: float | None = None,
    tol: float = TOLERANCE,
) -> list[str]:
    """Every way ``allocation`` breaks the model; empty when it is valid.

    Checks: each task on exactly one existing host; host CPU and memory within
    capacity; ``0 <= cpu <= alpha`` per job (one fraction per job, so all of a
    job's tasks share it by construction); reported yields equal recomputed ones.
    """
    problems: list[str] = []
    if len(allocation.hosts) != instance.n_tasks:
        problems.append(f"{len(allocation.hosts)} task placements for {instance.n_tasks} tasks")
        return problems
    if len(allocation.cpu) != instance.n_jobs:
        problems.append(f"{len(allocation.cpu)} CPU fractions for {instance.n_jobs} jobs")
        return problems
    hosts = np.asarray(allocation.hosts, dtype=np.int64)
    bad = np.flatnonzero((hosts < 0) | (hosts >= instance.n_hosts))
    for t in bad[:5]:
        job = instance.jobs[int(instance.task_job[t])]
        problems.append(f"task {t} of job {job.name!r}: host index {int(hosts[t])} out of range")
    if len(bad):
        return problems
    cpu = np.asarray(allocation.cpu, dtype=float)
    for j, job in enumerate(instance.jobs):
        if not np.isfinite(cpu[j]) or cpu[j] < -tol or cpu[j] > job.cpu_need + tol:
            problems.append(f"job {job.name!r}: cpu {cpu[j]!r} outside [0, cpu_need={job.cpu_need}]")
    task_cpu = cpu[instance.task_job]
    cpu_load = np.bincount(hosts, weights=task_cpu, minlength=instance.n_hosts)
    mem_load = np.bincount(hosts, weights=instance.task_mem, minlength=instance.n_hosts)
    for h, host in enumerate(instance.hosts):
        if cpu_load[h] > host.cpu + tol:
            problems.append(f"host {host.name!r}: CPU {cpu_load[h]:.6f} exceeds capacity {host.cpu}")
        if mem_load[h] > host.memory + tol:
            problems.append(f"host {host.name!r}: memory {mem_load[h]:.6f} exceeds capacity {host.memory}")
    if min_yield is not None and instance.n_jobs:
        actual = allocation.min_yield(instance)
        if abs(actual - min_yield) > tol:
            problems.append(f"reported min_yield {min_yield!r} but allocation gives {actual!r}")
    if avg_yield is not None and instance.n_jobs:
        actual = allocation.avg_yield(instance)
        if abs(actual - avg_yield) > tol:
            problems.append(f"reported avg_yield {avg_yield!r} but allocation gives {actual!r}")
    return problems


def check_allocation(
    instance: Instance,
    allocation: Allocation,
    *,
    min_yield: float | None = None,
    avg_yield: float | None = None,
) -> None:
    """Raise :class:`AllocationError` listing every broken constraint."""
    problems = allocation_problems(instance, allocation, min_yield=min_yield, avg_yield=avg_yield)
    if problems:
        raise AllocationError(problems)
