"""The VCSched model (paper sections 2.2-2.3 and 5): hosts, jobs, allocations, results.

Units: CPU and memory are fractions of a *reference host* (capacity 1, 1).
Heterogeneous hosts carry other capacities in the same units.  A job has
``tasks`` identical tasks (one VM each); every task of a job needs CPU
``cpu_need`` (``alpha``) when alone and memory ``memory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Host:
    name: str
    cpu: float = 1.0
    memory: float = 1.0


@dataclass(frozen=True)
class Job:
    name: str
    cpu_need: float
    memory: float
    tasks: int = 1


@dataclass(frozen=True)
class Instance:
    """A placement problem.  Tasks are numbered job by job: job 0's tasks first.

    The numpy views below are derived once and cached because every solver's
    inner loop wants flat per-task arrays rather than nested dataclasses.
    """

    hosts: tuple[Host, ...]
    jobs: tuple[Job, ...]

    @property
    def n_hosts(self) -> int:
        return len(self.hosts)

    @property
    def n_jobs(self) -> int:
        return len(self.jobs)

    @cached_property
    def n_tasks(self) -> int:
        return sum(j.tasks for j in self.jobs)

    @cached_property
    def task_job(self) -> np.ndarray:
        """Job index of every task (length ``n_tasks``)."""
        return np.repeat(np.arange(self.n_jobs), [j.tasks for j in self.jobs])

    @cached_property
    def job_first_task(self) -> np.ndarray:
        """Index of each job's first task; job j owns tasks [first[j], first[j] + k_j)."""
        counts = np.array([j.tasks for j in self.jobs], dtype=np.int64)
        return np.concatenate(([0], np.cumsum(counts)[:-1])) if len(counts) else counts

    @cached_property
    def job_alpha(self) -> np.ndarray:
        return np.array([j.cpu_need for j in self.jobs], dtype=float)

    @cached_property
    def job_mem(self) -> np.ndarray:
        return np.array([j.memory for j in self.jobs], dtype=float)

    @cached_property
    def job_tasks(self) -> np.ndarray:
        return np.array([j.tasks for j in self.jobs], dtype=np.int64)

    @cached_property
    def task_alpha(self) -> np.ndarray:
        return self.job_alpha[self.task_job]

    @cached_property
    def task_mem(self) -> np.ndarray:
        return self.job_mem[self.task_job]

    @cached_property
    def host_cpu(self) -> np.ndarray:
        return np.array([h.cpu for h in self.hosts], dtype=float)

    @cached_property
    def host_mem(self) -> np.ndarray:
        return np.array([h.memory for h in self.hosts], dtype=float)

    @cached_property
    def has_parallel_jobs(self) -> bool:
        return any(j.tasks > 1 for j in self.jobs)


@dataclass(frozen=True)
class Allocation:
    """Where every task runs and the CPU fraction each job's tasks get.

    ``hosts[t]`` is the host index of task ``t``; ``cpu[j]`` is the CPU
    fraction (reference-host units) given to *each* task of job ``j`` — one
    value per job because a parallel job moves at its slowest task's pace
    (section 5), so unequal fractions would only waste CPU.
    """

    hosts: tuple[int, ...]
    cpu: tuple[float, ...]

    def yields(self, instance: Instance) -> np.ndarray:
        return np.asarray(self.cpu, dtype=float) / instance.job_alpha

    def min_yield(self, instance: Instance) -> float:
        return float(self.yields(instance).min()) if instance.n_jobs else 1.0

    def avg_yield(self, instance: Instance) -> float:
        """Mean per-*job* yield (section 5: per job, so splitting a job into tasks buys nothing)."""
        return float(self.yields(instance).mean()) if instance.n_jobs else 1.0


@dataclass(frozen=True)
class SolveOptions:
    """Knobs shared by all algorithms; each algorithm reads the ones it understands."""

    seed: int = 0
    time_limit: float | None = None
    max_attempts: int = 500_000
    precision: float = 1e-4


@dataclass(frozen=True)
class SolveResult:
    """What ``vcsched solve`` reports.

    ``optimal`` is True/False only for exact methods (did the MILP prove
    optimality within its time limit); None for heuristics.  ``bound`` is set
    by bound-only methods (``lpbound``), which have no allocation.
    """

    algorithm: str
    feasible: bool
    allocation: Allocation | None
    min_yield: float | None
    avg_yield: float | None
    runtime_s: float
    optimal: bool | None = None
    bound: float | None = None
    detail: dict[str, object] = field(default_factory=dict)
