"""The adaptation problem of paper section 6.1: a cluster where some tasks already run, and a byte budget.

Some tasks already run: ``current[t]`` is the host task ``t`` runs on, or -1
for a new arrival (departed jobs are simply absent).  Moving a running task
costs its memory size in bytes (a live migration copies at least that much),
plus its disks' bytes when it moves to a host with other storage
(``disk_bytes`` and ``host_storage``; without them, as in the paper, memory
only); placing a new arrival costs nothing.  The total cost of the new placement must
stay within ``budget`` bytes.  Budget 0 keeps every running task where it is
and only re-caps CPU; a budget of at least the total running bytes allows a
free re-placement.

Placement rules (docs/rules.md) carry over with one difference: a host in
maintenance takes no task that does not run there already (no new VM, no
migration in), but the tasks running on it may stay, unless they are in
``leave`` — the tasks that must move off their host (a drain,
:mod:`vcsched.adaptation.drain`).  Pinned tasks (``Instance.pinned``, their
current host) never move.  :func:`task_allowed` is that rule for any tasks
and hosts.

Solved by :mod:`vcsched.adaptation.heuristic` (ours) or
:mod:`vcsched.adaptation.milp` (the paper's), through
:func:`vcsched.adaptation.solve.solve_adapt`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vcsched.errors import InputError
from vcsched.formats.instance import instance_from_dict
from vcsched.formats.units import parse_size
from vcsched.model import Instance, SolveResult
from vcsched.rules import rule_problems
from vcsched.units import GIB
from vcsched.yields import blocked_pairs

DEFAULT_HOST_MEMORY_BYTES = GIB  # bytes of one reference-host memory unit when the instance does not say


def parse_budget(where: str, value: Any) -> int:
    """A migration byte budget: a size (0 allowed) or "unlimited"."""
    return parse_size(where, value, allow_zero=True, allow_unlimited=True)


@dataclass(frozen=True)
class AdaptProblem:
    """The section 6.1 problem: an instance, where its tasks run now, what moving each costs, the budget.

    ``current[t]`` is a host index or -1 (new arrival); ``task_bytes[t]`` the
    bytes moving task ``t`` costs (all tasks of a job are equal).  Optional,
    for clusters whose hosts do not all share storage: ``disk_bytes[t]`` the
    bytes of task ``t``'s disks and ``host_storage[h]`` a storage group per
    host; a move between groups also copies the disks, so it costs
    ``task_bytes[t] + disk_bytes[t]`` (:meth:`move_bytes`).
    """

    instance: Instance
    current: np.ndarray
    task_bytes: np.ndarray
    budget: int
    #: Tasks that must leave the host they run on (a drain); they may go anywhere else the rules allow.
    leave: tuple[int, ...] = ()
    disk_bytes: np.ndarray | None = None
    host_storage: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.instance.n_tasks
        if self.current.shape != (n,) or self.task_bytes.shape != (n,):
            raise InputError(f"adaptation problem: {n} tasks but {self.current.shape} current hosts "
                             f"and {self.task_bytes.shape} byte sizes")
        if self.budget < 0:
            raise InputError(f"budget: {self.budget} bytes is negative")
        if (self.disk_bytes is None) != (self.host_storage is None):
            raise InputError("adaptation problem: disk_bytes and host_storage go together")
        if self.disk_bytes is not None and self.host_storage is not None and (
                self.disk_bytes.shape != (n,) or self.host_storage.shape != (self.instance.n_hosts,)):
            raise InputError(f"adaptation problem: {n} tasks and {self.instance.n_hosts} hosts but "
                             f"{self.disk_bytes.shape} disk sizes and {self.host_storage.shape} storage groups")

    @property
    def copies_disks(self) -> bool:
        """Whether some move costs more than memory (a task with disks, hosts with other storage)."""
        return (self.disk_bytes is not None and self.host_storage is not None and bool(self.disk_bytes.any())
                and len(np.unique(self.host_storage)) > 1)

    def move_bytes(self, tasks: np.ndarray | int, dests: np.ndarray | int) -> np.ndarray:
        """Bytes of moving each of ``tasks`` from where it runs now to ``dests`` (broadcast together).

        Memory, plus the disks when the destination's storage group differs
        from the current host's.  (Whether the task moves at all is the
        caller's business: this is the price *if* it does.)
        """
        t = np.asarray(tasks)
        mem = self.task_bytes[t].astype(float)
        if not self.copies_disks:
            return np.broadcast_to(mem, np.broadcast(t, np.asarray(dests)).shape).astype(float)
        assert self.disk_bytes is not None and self.host_storage is not None
        cur = self.current[t]
        other = self.host_storage[np.asarray(dests)] != self.host_storage[np.clip(cur, 0, None)]
        return mem + np.where(other & (cur >= 0), self.disk_bytes[t].astype(float), 0.0)

    def cheapest_move(self, tasks: np.ndarray) -> np.ndarray:
        """Per task, the fewest bytes moving it off its host can cost: to an open host of its own storage group
        if there is one, else memory + disks (a drain's lower bound before the destination is known)."""
        t = np.asarray(tasks, dtype=np.int64)
        if not self.copies_disks or not len(t):
            return self.task_bytes[t].astype(float)
        dests = np.flatnonzero(~self.closed)
        if not len(dests):
            return self.move_bytes(t, self.current[t])
        cost = self.move_bytes(t[:, None], dests[None, :])
        cost = np.where(dests[None, :] == self.current[t][:, None], np.inf, cost)
        return np.where(np.isinf(cost.min(axis=1)), self.move_bytes(t, self.current[t]), cost.min(axis=1))

    @property
    def running(self) -> np.ndarray:
        """Mask of tasks that run now (moving them costs bytes)."""
        return self.current >= 0

    def with_budget(self, budget: int) -> AdaptProblem:
        return dataclasses.replace(self, budget=budget)

    @property
    def closed(self) -> np.ndarray:
        """Hosts that take no task not running there: in maintenance, or drained (a ``leave`` task runs there)."""
        closed = self.instance.host_cordoned.copy()
        if self.leave:
            closed[self.current[np.asarray(self.leave, dtype=np.int64)]] = True
        return closed

    def cordoned(self) -> AdaptProblem:
        """The same problem with every drained host in maintenance in the instance itself."""
        closed = self.closed
        if (closed == self.instance.host_cordoned).all():
            return self
        hosts = tuple(dataclasses.replace(h, maintenance=True) if closed[i] else h
                      for i, h in enumerate(self.instance.hosts))
        return dataclasses.replace(self, instance=dataclasses.replace(self.instance, hosts=hosts))

    @property
    def leaving(self) -> np.ndarray:
        """Mask of tasks that must leave their current host."""
        mask = np.zeros(self.instance.n_tasks, dtype=bool)
        if self.leave:
            mask[np.asarray(self.leave, dtype=np.int64)] = True
        return mask


def task_allowed(problem: AdaptProblem, tasks: np.ndarray, dests: np.ndarray) -> np.ndarray:
    """``allowed[i, k]``: may task ``tasks[i]`` be on host ``dests[k]`` (module docstring)?  Spread is separate.

    The adaptation's reading of :func:`vcsched.rules.allowed_matrix`: a host in maintenance (or drained)
    still allows the tasks that run there, unless they must leave; and, as everywhere, a host with none
    of a fluid resource the task needs allows it nowhere (it would run at yield 0 there), not even
    where it runs now.
    """
    inst = problem.instance
    tasks = np.asarray(tasks, dtype=np.int64)
    dests = np.asarray(dests, dtype=np.int64)
    d = dests[None, :]
    cur = problem.current[tasks][:, None]
    pins = inst.task_pinned[tasks][:, None]
    ok = ~problem.closed[d] | (d == cur)
    ok = ok & ((pins < 0) | (d == pins))
    if problem.leave:
        ok = ok & ~(problem.leaving[tasks][:, None] & (d == cur))
    if inst.has_extra_resources:
        ok = ok & ~blocked_pairs(inst)[np.ix_(inst.task_job[tasks], dests)]
    return ok


def may_stay(problem: AdaptProblem) -> np.ndarray:
    """Per task: may it stay on the host it runs on (:func:`task_allowed` there)?  True for new arrivals."""
    inst = problem.instance
    pins = inst.task_pinned
    ok = ~problem.leaving & ((pins < 0) | (pins == problem.current))
    if inst.has_extra_resources:
        run = problem.running
        ok = ok & ~(run & blocked_pairs(inst)[inst.task_job, problem.current.clip(min=0)])
    return ok


def allowed_matrix(problem: AdaptProblem) -> np.ndarray:
    """:func:`task_allowed` for every task and host (for the MILP: small problems)."""
    inst = problem.instance
    return task_allowed(problem, np.arange(inst.n_tasks), np.arange(inst.n_hosts))


def adapt_rule_problems(problem: AdaptProblem, hosts: np.ndarray) -> list[str]:
    """Every required rule a placement breaks in the adaptation's reading (module docstring)."""
    inst = problem.instance
    hosts = np.asarray(hosts, dtype=np.int64)
    out = []
    ok = (~problem.closed[hosts] | (hosts == problem.current)) & ((inst.task_pinned < 0)
                                                                      | (hosts == inst.task_pinned))
    ok &= ~(problem.leaving & (hosts == problem.current))
    for t in np.flatnonzero(~ok)[:5]:
        j = int(inst.task_job[t])
        out.append(f"task {int(t - inst.job_first_task[j])} of {inst.jobs[j].name!r} may not be on "
                   f"{inst.hosts[int(hosts[t])].name!r} (maintenance, pinned or draining)")
    plain = dataclasses.replace(inst, pinned=(), hosts=tuple(dataclasses.replace(h, maintenance=False)
                                                            for h in inst.hosts))
    return out + rule_problems(plain, hosts)


def move_cost(problem: AdaptProblem, hosts: np.ndarray) -> int:
    """Bytes migrated to go from ``problem.current`` to ``hosts``: running tasks that change host."""
    hosts = np.asarray(hosts)
    moved = problem.running & (hosts != problem.current)
    if not problem.copies_disks:
        return int(problem.task_bytes[moved].sum())
    t = np.flatnonzero(moved)
    return int(problem.move_bytes(t, hosts[t]).sum())


@dataclass(frozen=True)
class Migration:
    job: str
    task: int
    source: int
    target: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "task": self.task, "from": self.source, "to": self.target, "bytes": self.bytes}


def migrations(problem: AdaptProblem, hosts: np.ndarray) -> list[Migration]:
    """The live migrations a placement asks for, in task order."""
    inst = problem.instance
    out = []
    for t in np.flatnonzero(problem.running & (np.asarray(hosts) != problem.current)):
        j = int(inst.task_job[t])
        out.append(Migration(inst.jobs[j].name, int(t - inst.job_first_task[j]), int(problem.current[t]),
                             int(hosts[t]), int(problem.move_bytes(int(t), int(hosts[t])))))
    return out


@dataclass(frozen=True)
class AdaptResult:
    """A :class:`SolveResult` plus the migrations it needs and their total bytes."""

    result: SolveResult
    migrations: tuple[Migration, ...] = ()
    migrated_bytes: int = 0
    detail: dict[str, object] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- parsing

ADAPT_TOP_FIELDS = frozenset({"host_memory_bytes"})
ADAPT_JOB_FIELDS = frozenset({"current", "memory_bytes"})


def problem_from_dict(raw: Any, budget: int) -> AdaptProblem:
    """Parse the ``solve`` instance format extended with ``current``/``memory_bytes`` per job.

    ``current`` lists a host index or null per task (null: a new arrival);
    a job without it is all new.  ``memory_bytes`` is what moving one task
    costs; it defaults to the job's memory fraction times the instance's
    ``host_memory_bytes`` (default 1 GiB per reference host).
    """
    instance = instance_from_dict(raw, extra_top=ADAPT_TOP_FIELDS, extra_job=ADAPT_JOB_FIELDS)
    assert isinstance(raw, Mapping)  # instance_from_dict checked it
    host_bytes = DEFAULT_HOST_MEMORY_BYTES
    if "host_memory_bytes" in raw:
        host_bytes = parse_size("host_memory_bytes", raw["host_memory_bytes"])
        if host_bytes == 0:
            raise InputError("host_memory_bytes: must be above 0")
    current = np.full(instance.n_tasks, -1, dtype=np.int64)
    task_bytes = np.zeros(instance.n_tasks, dtype=np.int64)
    for j, (job, raw_job) in enumerate(zip(instance.jobs, raw["jobs"], strict=True)):
        first = int(instance.job_first_task[j])
        where = f"jobs[{j}]"
        if "memory_bytes" in raw_job:
            b = parse_size(f"{where}.memory_bytes", raw_job["memory_bytes"], allow_zero=True)
        else:
            b = round(job.memory * host_bytes)
        task_bytes[first:first + job.tasks] = b
        cur = raw_job.get("current")
        if cur is None:
            continue
        if not isinstance(cur, list) or len(cur) != job.tasks:
            raise InputError(f"{where}.current: expected a list of {job.tasks} host indices or nulls, got {cur!r}")
        for t, h in enumerate(cur):
            if h is None:
                continue
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < instance.n_hosts:
                raise InputError(f"{where}.current[{t}]: {h!r} is not a host index in 0..{instance.n_hosts - 1}")
            current[first + t] = h
    return AdaptProblem(instance, current, task_bytes, budget)

