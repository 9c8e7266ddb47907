"""The one allocation validator: used by solver tests, the CLI, benchmarks and experiments.

Every constraint of the model is checked with a small absolute tolerance,
because solvers (LP/MILP in particular) return floating-point values.

Two views of the same constraints: :func:`allocation_problems` checks an
:class:`Allocation` (CPU fraction per job, what the placement solvers
return); :func:`yield_problems` checks a placement and one yield per job
(what the sharing policies return).  Both check every fluid resource of every
host (CPU and the extra ones, a job at yield ``y`` using ``y * need`` of each)
and memory, and every required placement rule (:func:`vcsched.rules.rule_problems`:
maintenance, spread, together, pinned).
"""

from __future__ import annotations

import numpy as np

from vcsched.errors import AllocationError, InputError
from vcsched.model import Allocation, Instance
from vcsched.rules import rule_problems
from vcsched.units import VALIDATION_TOLERANCE


def allocation_problems(
    instance: Instance,
    allocation: Allocation,
    *,
    min_yield: float | None = None,
    avg_yield: float | None = None,
    tol: float = VALIDATION_TOLERANCE,
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
    problems = _out_of_range(instance, hosts)
    if problems:
        return problems
    cpu = np.asarray(allocation.cpu, dtype=float)
    for j, job in enumerate(instance.jobs):
        if not np.isfinite(cpu[j]) or cpu[j] < -tol or cpu[j] > job.cpu_need + tol:
            problems.append(f"job {job.name!r}: cpu {cpu[j]!r} outside [0, cpu_need={job.cpu_need}]")
    problems += _placement_problems(instance, hosts, cpu, cpu / instance.job_alpha, tol)
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


def _extra_resource_problems(instance: Instance, hosts: np.ndarray, yields: np.ndarray, tol: float) -> list[str]:
    """Every extra fluid resource (not CPU) over capacity on some host, for jobs at ``yields``."""
    problems: list[str] = []
    task_y = yields[instance.task_job]
    for r, name in enumerate(instance.resources[1:], start=1):
        load = np.bincount(hosts, weights=task_y * instance.job_need[instance.task_job, r],
                           minlength=instance.n_hosts)
        cap = instance.host_capacity[:, r]
        for h in np.flatnonzero(load > cap + tol):
            problems.append(f"host {instance.hosts[h].name!r}: {name} {load[h]:.6f} exceeds capacity {cap[h]:g}")
    return problems


def yield_problems(instance: Instance, hosts: object, yields: object, *,
                   tol: float = VALIDATION_TOLERANCE) -> list[str]:
    """Every way a placement (task -> host index) with one yield per job breaks the model.

    Checks: one host per task, each existing; one yield per job, each finite
    and in [0, 1]; every fluid resource (CPU included) and memory within
    capacity on every host.
    """
    hosts_a = np.asarray(hosts, dtype=np.int64).ravel()
    y = np.asarray(yields, dtype=float).ravel()
    if len(hosts_a) != instance.n_tasks:
        return [f"{len(hosts_a)} task placements for {instance.n_tasks} tasks"]
    if len(y) != instance.n_jobs:
        return [f"{len(y)} yields for {instance.n_jobs} jobs"]
    problems = _out_of_range(instance, hosts_a)
    if problems:
        return problems
    for j, job in enumerate(instance.jobs):
        if not np.isfinite(y[j]) or y[j] < -tol or y[j] > 1 + tol:
            problems.append(f"job {job.name!r}: yield {float(y[j])!r} outside [0, 1]")
    if problems:
        return problems
    return _placement_problems(instance, hosts_a, y * instance.job_alpha, y, tol)


def _out_of_range(instance: Instance, hosts: np.ndarray) -> list[str]:
    """Tasks placed on a host index that does not exist (the first five)."""
    bad = np.flatnonzero((hosts < 0) | (hosts >= instance.n_hosts))
    return [f"task {t} of job {instance.jobs[int(instance.task_job[t])].name!r}: host index {int(hosts[t])} out of "
            "range" for t in bad[:5]]


def _placement_problems(instance: Instance, hosts: np.ndarray, cpu: np.ndarray, y: np.ndarray,
                        tol: float) -> list[str]:
    """CPU (``cpu`` per job) and memory within every host's capacity, every extra fluid resource at the
    yields ``y``, and every required placement rule."""
    problems: list[str] = []
    cpu_load = np.bincount(hosts, weights=cpu[instance.task_job], minlength=instance.n_hosts)
    mem_load = np.bincount(hosts, weights=instance.task_mem, minlength=instance.n_hosts)
    for h, host in enumerate(instance.hosts):
        if cpu_load[h] > host.cpu + tol:
            problems.append(f"host {host.name!r}: CPU {cpu_load[h]:.6f} exceeds capacity {host.cpu}")
        if mem_load[h] > host.memory + tol:
            problems.append(f"host {host.name!r}: memory {mem_load[h]:.6f} exceeds capacity {host.memory}")
    if instance.has_rules:
        problems += rule_problems(instance, hosts)
    if instance.has_extra_resources:
        problems += _extra_resource_problems(instance, hosts, y, tol)
    return problems


def check_yields(instance: Instance, hosts: object, yields: object) -> None:
    """Raise :class:`AllocationError` listing every broken constraint of a placement and its yields."""
    problems = yield_problems(instance, hosts, yields)
    if problems:
        raise AllocationError(problems)


# ---------------------------------------------------------------------------------------------- the instance


def check_unique(kind: str, names: list[str]) -> None:
    """Names of ``kind`` (hosts, jobs, tenants, ...) are unique: the first repeat is bad input naming it."""
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise InputError(f"{kind}[{i}].name: duplicate name {n!r}")
        seen.add(n)


def check_instance(instance: Instance) -> None:
    """The checks that span fields: names, weights, the tenant tree, resources no host has.

    The parser runs it on every document; the sharing policies run it on
    instances built in Python, so both meet the same one-line errors.
    """
    check_unique("hosts", [h.name for h in instance.hosts])
    check_unique("jobs", [j.name for j in instance.jobs])
    check_unique("tenants", [t.name for t in instance.tenants])
    for i, h in enumerate(instance.hosts):
        for name, value in h.capacity:
            if not (value >= 0 and value < float("inf")):  # also false for NaN
                raise InputError(f"hosts[{i}].capacity.{name}: {value!r} must be a finite number at least 0")
    for i, t in enumerate(instance.tenants):
        if not (t.weight > 0 and t.weight < float("inf")):
            raise InputError(f"tenants[{i}].weight: {t.weight!r} must be a finite number above 0")
    for i, j in enumerate(instance.jobs):
        if not (j.weight > 0 and j.weight < float("inf")):
            raise InputError(f"jobs[{i}].weight: {j.weight!r} must be a finite number above 0")
        for name, value in j.needs:
            if not (0 <= value <= 1):
                raise InputError(f"jobs[{i}].needs.{name}: {value!r} is not in [0, 1]")
    _check_tenant_tree(instance)
    total = dict(zip(instance.resources, instance.host_capacity.sum(axis=0), strict=True))
    for i, j in enumerate(instance.jobs):
        for name, value in j.needs:
            if value > 0 and total[name] <= 0:
                raise InputError(f"jobs[{i}].needs.{name}: no host has capacity for {name!r}")


def _check_tenant_tree(instance: Instance) -> None:
    index = {t.name: i for i, t in enumerate(instance.tenants)}
    for i, t in enumerate(instance.tenants):
        if t.parent is not None and t.parent not in index:
            raise InputError(f"tenants[{i}].parent: unknown tenant {t.parent!r}")
    for i, t in enumerate(instance.tenants):
        path, node = [t.name], t.parent
        while node is not None:
            path.append(node)
            if node == t.name:
                raise InputError(f"tenants[{i}].parent: cycle {' -> '.join(path)}")
            node = instance.tenants[index[node]].parent
            if len(path) > len(instance.tenants) + 1:  # a cycle above t, reported at its own members
                break
    for i, j in enumerate(instance.jobs):
        if j.tenant is not None and j.tenant not in index:
            raise InputError(f"jobs[{i}].tenant: unknown tenant {j.tenant!r}")
