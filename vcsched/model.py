"""The VCSched model (paper sections 2.2-2.3 and 5): hosts, jobs, allocations, results.

Units: CPU and memory are fractions of a *reference host* (capacity 1, 1).
Heterogeneous hosts carry other capacities in the same units.  A job has
``tasks`` identical tasks (one VM each); every task of a job needs CPU
``cpu_need`` (``alpha``) when alone and memory ``memory``.

Multi-resource sharing (docs/policies.md) adds optional *extra fluid
resources* (``disk``, ``net``, ...): a host's ``capacity`` and a job's per-task
``needs``, in fractions of the reference host like CPU.  Fluid means a job at
yield ``y`` gets ``y * need`` of every one of them, as it gets ``y * cpu_need``
of CPU; memory stays rigid.  A resource missing from a host's ``capacity`` has
capacity 0 there.  ``weight`` and ``tenant`` matter only to the sharing
policies (weighted DRF, PF, H-DRF over the ``tenants`` tree).  With none of
these set, everything means exactly what it meant before.

Placement rules (docs/rules.md), all optional: a host in ``maintenance``
(cordoned) receives no task, except tasks pinned to it; a job may be
``spread`` (anti-affinity: at most one of its tasks per host) or
``together`` (affinity: all its tasks on one host), each ``"required"`` or
``"preferred"`` (honoured when a placement exists with it, reported when
not); ``Instance.pinned`` fixes tasks to hosts.  :mod:`vcsched.rules`
derives what the solvers consume from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from vcsched.units import CPU as CPU  # re-exported: the model names its resources
from vcsched.units import SEARCH_PRECISION

REQUIRED = "required"
"""A hard placement rule: every placement honours it, or there is none."""
PREFERRED = "preferred"
"""A soft placement rule: honoured when some placement honours it, reported when not."""
RULE_LEVELS = (REQUIRED, PREFERRED)

Amounts = tuple[tuple[str, float], ...]
"""Extra fluid resources as ``(name, amount)`` pairs sorted by name: hashable, unlike a dict."""


def amounts(pairs: Iterable[tuple[str, float]]) -> Amounts:
    """Normalise ``(name, amount)`` pairs (any order; a dict's ``.items()``) to the stored form."""
    return tuple(sorted((str(k), float(v)) for k, v in pairs))


@dataclass(frozen=True)
class Host:
    name: str
    cpu: float = 1.0
    memory: float = 1.0
    capacity: Amounts = ()
    maintenance: bool = False  # cordoned: receives no task except those pinned to it

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity", amounts(self.capacity))

    def capacity_of(self, resource: str) -> float:
        """Capacity of a fluid resource; 0 for one this host does not list."""
        if resource == CPU:
            return self.cpu
        return dict(self.capacity).get(resource, 0.0)


@dataclass(frozen=True)
class Job:
    name: str
    cpu_need: float
    memory: float
    tasks: int = 1
    needs: Amounts = ()
    weight: float = 1.0
    tenant: str | None = None
    spread: str | None = None  # REQUIRED / PREFERRED: at most one task per host
    together: str | None = None  # REQUIRED / PREFERRED: all tasks on one host

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", amounts(self.needs))

    def need_of(self, resource: str) -> float:
        """Per-task need of a fluid resource when alone; 0 for one the job does not list."""
        if resource == CPU:
            return self.cpu_need
        return dict(self.needs).get(resource, 0.0)


@dataclass(frozen=True)
class Tenant:
    """A node of the tenant tree (organisations; H-DRF).  Roots have no ``parent``.

    Jobs are the leaves: a job names its tenant; a job without one hangs
    directly under the (implicit) root, beside the root tenants.
    """

    name: str
    weight: float = 1.0
    parent: str | None = None


@dataclass(frozen=True)
class Instance:
    """A placement problem.  Tasks are numbered job by job: job 0's tasks first.

    The numpy views below are derived once and cached because every solver's
    inner loop wants flat per-task arrays rather than nested dataclasses.
    """

    hosts: tuple[Host, ...]
    jobs: tuple[Job, ...]
    tenants: tuple[Tenant, ...] = ()
    #: Per task, the host index it is pinned to (-1: free); empty: nothing pinned.
    pinned: tuple[int, ...] = ()

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

    @cached_property
    def resources(self) -> tuple[str, ...]:
        """Fluid resources: ``cpu`` first, then every extra one a host or job names, sorted."""
        extra = {k for h in self.hosts for k, _ in h.capacity} | {k for j in self.jobs for k, _ in j.needs}
        return (CPU, *sorted(extra - {CPU}))

    @cached_property
    def has_extra_resources(self) -> bool:
        return len(self.resources) > 1

    @cached_property
    def host_capacity(self) -> np.ndarray:
        """Fluid capacity per host and resource (``n_hosts x len(resources)``), column 0 = CPU."""
        return np.array([[h.capacity_of(r) for r in self.resources] for h in self.hosts], dtype=float).reshape(
            self.n_hosts, len(self.resources))

    @cached_property
    def job_need(self) -> np.ndarray:
        """Per-task fluid need per job and resource (``n_jobs x len(resources)``), column 0 = ``cpu_need``."""
        return np.array([[j.need_of(r) for r in self.resources] for j in self.jobs], dtype=float).reshape(
            self.n_jobs, len(self.resources))

    @cached_property
    def job_weight(self) -> np.ndarray:
        return np.array([j.weight for j in self.jobs], dtype=float)

    @cached_property
    def has_rules(self) -> bool:
        """Any placement rule at all (maintenance, spread, together, pinned)?  False: the paper's problem."""
        return (any(h.maintenance for h in self.hosts) or any(j.spread or j.together for j in self.jobs)
                or any(p >= 0 for p in self.pinned))

    @cached_property
    def task_pinned(self) -> np.ndarray:
        """Host index each task is pinned to, -1 when free (length ``n_tasks``)."""
        if not self.pinned:
            return np.full(self.n_tasks, -1, dtype=np.int64)
        return np.asarray(self.pinned, dtype=np.int64)

    @cached_property
    def host_cordoned(self) -> np.ndarray:
        return np.array([h.maintenance for h in self.hosts], dtype=bool)


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
    #: What the computation fell back on, said to the user (e.g. the average-yield phase skipped).
    notes: tuple[str, ...] = field(default=(), compare=False)

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
    precision: float = SEARCH_PRECISION


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
