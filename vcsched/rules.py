"""Placement rules (docs/rules.md): what operators need every week, in the form the solvers consume.

The model (:mod:`vcsched.model`) carries the rules where they belong: a host
in ``maintenance`` (cordoned), a job that is ``spread`` (anti-affinity) or
``together`` (affinity), each ``"required"`` or ``"preferred"``, and tasks
``pinned`` to hosts.  This module turns them into cheap data:

* :func:`spread_groups` — per task, its job's index when the job is spread
  (required), else -1: "at most one task of a group per host" is one integer
  comparison in every kernel;
* pinned tasks are *fixed*: placers take them off the list and place the
  rest around them (:func:`pinned_split`); a cordoned host takes nothing else;
* :func:`job_hosts` / :func:`allowed_matrix` — where each task may go: one
  mask for maintenance, pins and, on the resource vector, the hosts with every
  fluid resource the task needs, read by every placing algorithm;
* ``together`` is removed altogether by :func:`contract_together`: a job whose
  ``k`` tasks must share a host is exactly one task with ``k`` times the CPU
  need and memory (the same yield on the same host), so every algorithm
  honours it without knowing about it;
* soft (``preferred``) rules are tried as hard ones first and dropped when
  that finds no placement (:func:`harden`, :func:`without_soft`); which ones
  a placement misses is reported (:func:`soft_unmet`).

:func:`check_rules` refuses contradictions (bad input: a job both spread and
together, two tasks of a spread job pinned to one host, a together job pinned
to two hosts, a pin to an unknown host) and :func:`unsatisfiable` names the
rule a cluster simply cannot meet (more spread tasks than schedulable hosts,
a together job larger than every host, pinned tasks that overflow their host).
:func:`rule_problems` is the validator's check of a placement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.model import PREFERRED, REQUIRED, Instance, Job
from vcsched.units import MEMORY_TOLERANCE
from vcsched.yields import blocked_pairs


def spread_groups(instance: Instance) -> np.ndarray:
    """Per task: its job's index when the job is spread (required), else -1."""
    flag = np.array([j.spread == REQUIRED and j.tasks > 1 for j in instance.jobs], dtype=bool)
    if not flag.any():
        return np.full(instance.n_tasks, -1, dtype=np.int64)
    return np.where(flag[instance.task_job], instance.task_job, -1).astype(np.int64)


def has_spread(instance: Instance) -> bool:
    return any(j.spread == REQUIRED and j.tasks > 1 for j in instance.jobs)


def has_soft(instance: Instance) -> bool:
    return any(PREFERRED in (j.spread, j.together) for j in instance.jobs)


def job_hosts(instance: Instance) -> np.ndarray:
    """``jobs x hosts``: where an unpinned task of each job may be placed.

    The one eligibility test every placing algorithm shares: a host in
    maintenance takes no new task (a rule), and a host with none of a fluid
    resource the job needs (:func:`vcsched.yields.blocked_pairs`, on the
    resource vector) is one the task does not fit, since it could only run at
    yield 0 there.  Both close a (job, host) pair the same way.  Read-only (a
    broadcast view when only maintenance matters); pinned tasks: :func:`allowed_matrix`.
    """
    open_hosts = np.broadcast_to(~instance.host_cordoned, (instance.n_jobs, instance.n_hosts))
    if not instance.has_extra_resources:
        return open_hosts
    return open_hosts & ~blocked_pairs(instance)


def allowed_matrix(instance: Instance, tasks: np.ndarray | None = None) -> np.ndarray:
    """``allowed[i, h]`` for ``tasks`` (default every task) and every host: :func:`job_hosts`, but a pinned
    task's own host alone (in maintenance or not), and there too only with every fluid resource it needs.

    Tasks x hosts: for the small instances the MILP solves, or a pool of tasks.
    """
    idx = np.arange(instance.n_tasks) if tasks is None else np.asarray(tasks, dtype=np.int64)
    allowed = job_hosts(instance)[instance.task_job[idx]]  # fancy indexing: a writable copy
    pins = instance.task_pinned[idx]
    p = np.flatnonzero(pins >= 0)
    if len(p):
        row = np.zeros((len(p), instance.n_hosts), dtype=bool)
        row[np.arange(len(p)), pins[p]] = True
        if instance.has_extra_resources:
            row &= ~blocked_pairs(instance)[instance.task_job[idx[p]]]
        allowed[p] = row
    return allowed


def effective_pins(instance: Instance) -> np.ndarray:
    """Per task: its pin, or for a task of a required-together job the host one of its job's tasks is pinned to."""
    pins = instance.task_pinned.copy()
    for j, job in enumerate(instance.jobs):
        if job.together == REQUIRED and job.tasks > 1:
            first = int(instance.job_first_task[j])
            top = int(pins[first:first + job.tasks].max())
            if top >= 0:
                pins[first:first + job.tasks] = top
    return pins


# ---------------------------------------------------------------------------------------------- transforms


def _with_jobs(instance: Instance, jobs: tuple[Job, ...]) -> Instance:
    return dataclasses.replace(instance, jobs=jobs)


def harden(instance: Instance) -> Instance:
    """Every preferred rule made required (the first try of a placement with soft rules)."""
    return _with_jobs(instance, tuple(dataclasses.replace(
        j, spread=REQUIRED if j.spread else None, together=REQUIRED if j.together else None) for j in instance.jobs))


def without_soft(instance: Instance) -> Instance:
    """Every preferred rule dropped (the fallback when no placement honours them)."""
    return _with_jobs(instance, tuple(dataclasses.replace(
        j, spread=j.spread if j.spread == REQUIRED else None,
        together=j.together if j.together == REQUIRED else None) for j in instance.jobs))


def preferred_first(instance: Instance) -> list[Instance]:
    """The tries of a placement: its preferred rules as required, then without them; the instance alone when it
    has no preferred rule."""
    return [harden(instance), without_soft(instance)] if has_soft(instance) else [instance]


@dataclass(frozen=True)
class RuledPlacement:
    """What :func:`place_preferred_first` found: hosts of the original tasks (None: nothing), the try, the report."""

    hosts: np.ndarray | None
    attempt: int | None  # index of the try that placed (None: none did)
    report: dict[str, object]


def place_preferred_first(instance: Instance, place: Callable[[Instance], np.ndarray | None],
                          refusal: Callable[[Instance], str], *, tries: Sequence[Instance] | None = None,
                          screen: bool = True) -> RuledPlacement:
    """The one rule-retry loop: each try in turn (default :func:`preferred_first`) until ``place`` finds hosts.

    Every placement under rules goes through here — a solve (:func:`vcsched.solvers.registry.place_with_rules`),
    a placement under a sharing policy, an admission and an adaptation — so preferred rules mean one thing
    everywhere: honoured when some placement honours them, else dropped and the ones missed reported
    (``preferred_dropped``, ``unmet_preferred``).  Contradictions are bad input (:func:`check_rules`).
    ``screen``: a try whose required rules no placement can meet (:func:`unsatisfiable`) is not run and its
    reason is kept (the adaptation does not screen: there a VM may stay on a host in maintenance).  When no
    try places, ``infeasible`` holds the last try's reason: the screen's, else ``refusal(try)``.
    """
    check_rules(instance)
    report: dict[str, object] = {"rules": describe(instance)}
    reasons: list[str] = []
    for i, attempt in enumerate(preferred_first(instance) if tries is None else tries):
        reason = unsatisfiable(attempt) if screen else None
        if reason is not None:
            reasons.append(reason)
            continue
        hosts = place(attempt)
        if hosts is None:
            reasons.append(refusal(attempt))
            continue
        if i > 0 and has_soft(instance):
            report["preferred_dropped"] = True
        unmet = soft_unmet(instance, hosts)
        if unmet:
            report["unmet_preferred"] = unmet
        return RuledPlacement(hosts, i, report)
    report["infeasible"] = reasons[-1] if reasons else "no placement"
    return RuledPlacement(None, None, report)


@dataclass(frozen=True)
class Contraction:
    """An instance whose required-together jobs are single tasks, and the way back to the original's tasks."""

    instance: Instance
    task_of: np.ndarray  # for every original task, the contracted task that carries it

    def expand(self, hosts: np.ndarray) -> np.ndarray:
        return np.asarray(hosts, dtype=np.int64)[self.task_of]


def contract_together(instance: Instance) -> Contraction:
    """Each required-together job of ``k > 1`` tasks as one task needing ``k`` times as much (module docstring)."""
    if not any(j.together == REQUIRED and j.tasks > 1 for j in instance.jobs):
        return Contraction(instance, np.arange(instance.n_tasks, dtype=np.int64))
    jobs: list[Job] = []
    task_of = np.empty(instance.n_tasks, dtype=np.int64)
    pinned: list[int] = []
    new_t = 0
    for j, job in enumerate(instance.jobs):
        first = int(instance.job_first_task[j])
        pins = instance.task_pinned[first:first + job.tasks]
        if job.together == REQUIRED and job.tasks > 1:
            k = job.tasks
            jobs.append(dataclasses.replace(job, cpu_need=k * job.cpu_need, memory=k * job.memory, tasks=1,
                                            needs=tuple((r, k * v) for r, v in job.needs), together=None,
                                            spread=None))
            task_of[first:first + k] = new_t
            pinned.append(int(pins.max()))  # check_rules made every pin of the job the same host
            new_t += 1
        else:
            jobs.append(job)
            task_of[first:first + job.tasks] = np.arange(new_t, new_t + job.tasks)
            pinned.extend(int(p) for p in pins)
            new_t += job.tasks
    contracted = dataclasses.replace(instance, jobs=tuple(jobs),
                                     pinned=tuple(pinned) if any(p >= 0 for p in pinned) else ())
    return Contraction(contracted, task_of)


@dataclass(frozen=True)
class PinnedSplit:
    """The tasks a placer places (``free``) and the ones pinned in place (``fixed``, on ``fixed_hosts``)."""

    free: np.ndarray
    fixed: np.ndarray
    fixed_hosts: np.ndarray

    def mem_load(self, instance: Instance) -> np.ndarray:
        return np.bincount(self.fixed_hosts, weights=instance.task_mem[self.fixed], minlength=instance.n_hosts)

    def cpu_load(self, instance: Instance) -> np.ndarray:
        """CPU need (``alpha``, at yield 1) the pinned tasks put on each host."""
        return np.bincount(self.fixed_hosts, weights=instance.task_alpha[self.fixed], minlength=instance.n_hosts)


def pinned_split(instance: Instance) -> PinnedSplit:
    fixed = np.flatnonzero(instance.task_pinned >= 0).astype(np.int64)
    free = np.flatnonzero(instance.task_pinned < 0).astype(np.int64)
    return PinnedSplit(free, fixed, instance.task_pinned[fixed].astype(np.int64))


@dataclass(frozen=True)
class HostGroups:
    """Spread groups already present on each host before a kernel runs (CSR: ``ptr[h]:ptr[h + 1]``)."""

    ptr: np.ndarray
    groups: np.ndarray

    @staticmethod
    def of(n_hosts: int, hosts: np.ndarray, groups: np.ndarray) -> HostGroups:
        keep = groups >= 0
        h, g = np.asarray(hosts, dtype=np.int64)[keep], np.asarray(groups, dtype=np.int64)[keep]
        order = np.argsort(h, kind="stable")
        counts = np.bincount(h, minlength=n_hosts)
        ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return HostGroups(ptr, g[order].astype(np.int64))

    @staticmethod
    def empty(n_hosts: int) -> HostGroups:
        return HostGroups(np.zeros(n_hosts + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))


def combine(free: np.ndarray, free_hosts: np.ndarray, split: PinnedSplit, n_tasks: int) -> np.ndarray:
    """Hosts of every task: the placer's for the free tasks, the pins for the rest."""
    hosts = np.empty(n_tasks, dtype=np.int64)
    hosts[free] = free_hosts
    hosts[split.fixed] = split.fixed_hosts
    return hosts


# ---------------------------------------------------------------------------------------------- checks


def _job_where(instance: Instance, j: int) -> str:
    return f"jobs[{j}] ({instance.jobs[j].name!r})"


def check_rules(instance: Instance) -> None:
    """Contradictory or malformed rules: :class:`InputError` naming the rule and the values (exit 2)."""
    if instance.pinned and len(instance.pinned) != instance.n_tasks:
        raise InputError(f"pinned: {len(instance.pinned)} entries for {instance.n_tasks} tasks")
    pins = instance.task_pinned
    bad = np.flatnonzero((pins < -1) | (pins >= instance.n_hosts))
    if len(bad):
        t = int(bad[0])
        raise InputError(f"{_job_where(instance, int(instance.task_job[t]))}.pinned: host index {int(pins[t])} is "
                         f"not a host (0..{instance.n_hosts - 1})")
    for j, job in enumerate(instance.jobs):
        where = _job_where(instance, j)
        for field, value in (("spread", job.spread), ("together", job.together)):
            if value is not None and value not in (REQUIRED, PREFERRED):
                raise InputError(f"{where}.{field}: {value!r} is not {REQUIRED!r} or {PREFERRED!r}")
        if job.spread and job.together and job.tasks > 1:
            raise InputError(f"{where}: both spread ({job.spread}) and together ({job.together}); a virtual cluster "
                             "cannot be on one host and on different hosts at once")
        if not (job.spread or job.together):  # pins alone contradict nothing
            continue
        first = int(instance.job_first_task[j])
        jp = pins[first:first + job.tasks]
        jp = jp[jp >= 0]
        if job.together == REQUIRED and len(set(jp.tolist())) > 1:
            names = sorted({instance.hosts[int(h)].name for h in jp})
            raise InputError(f"{where}: together (required) but its VMs are pinned to {', '.join(names)}")
        if job.spread == REQUIRED and len(jp) != len(set(jp.tolist())):
            dup = next(int(h) for h in jp if int((jp == h).sum()) > 1)
            raise InputError(f"{where}: spread (required) but two of its VMs are pinned to "
                             f"{instance.hosts[dup].name!r}")


def unsatisfiable(instance: Instance) -> str | None:
    """The required rule no placement on these hosts can meet, in one line; None when none is obviously so.

    Not a proof that a placement exists when None: packing may still fail.
    """
    pins = instance.task_pinned
    open_hosts = ~instance.host_cordoned
    mem_pinned = np.bincount(pins[pins >= 0], weights=instance.task_mem[pins >= 0], minlength=instance.n_hosts)
    over = np.flatnonzero(mem_pinned > instance.host_mem + MEMORY_TOLERANCE)
    if len(over):
        h = int(over[0])
        return (f"pinned: the VMs pinned to {instance.hosts[h].name!r} need {mem_pinned[h]:.4g} memory, above its "
                f"{instance.host_mem[h]:.4g}")
    for j, job in enumerate(instance.jobs):
        if job.tasks < 2 or REQUIRED not in (job.spread, job.together):
            continue
        first = int(instance.job_first_task[j])
        jp = pins[first:first + job.tasks]
        if job.spread == REQUIRED:
            usable = open_hosts.copy()
            usable[jp[jp >= 0]] = True
            if job.tasks > int(usable.sum()):
                return (f"spread: virtual cluster {job.name!r} has {job.tasks} VMs but only {int(usable.sum())} "
                        f"hosts can take one ({int(instance.host_cordoned.sum())} in maintenance)")
        if job.together == REQUIRED:
            need = job.tasks * job.memory
            homes = np.flatnonzero(open_hosts) if not (jp >= 0).any() else jp[jp >= 0][:1]
            if not len(homes) or need > float(instance.host_mem[homes].max()) + MEMORY_TOLERANCE:
                return (f"together: virtual cluster {job.name!r} needs {need:.4g} memory on one host, more than "
                        "any host it may use has")
    if not open_hosts.any() and (pins < 0).any():
        return "maintenance: every host is in maintenance; nothing can be placed"
    return None


def rule_problems(instance: Instance, hosts: np.ndarray, *, levels: tuple[str, ...] = (REQUIRED,)) -> list[str]:
    """Every rule of the given levels the placement breaks, one line each naming the rule (empty: none)."""
    hosts = np.asarray(hosts, dtype=np.int64)
    problems: list[str] = []
    pins = instance.task_pinned
    for t in np.flatnonzero((pins >= 0) & (hosts != pins))[:5]:
        j = int(instance.task_job[t])
        problems.append(f"pinned: task {int(t - instance.job_first_task[j])} of {instance.jobs[j].name!r} is on "
                        f"{instance.hosts[int(hosts[t])].name!r}, pinned to {instance.hosts[int(pins[t])].name!r}")
    if REQUIRED in levels:
        new_on_cordoned = instance.host_cordoned[hosts] & (effective_pins(instance) != hosts)
        for t in np.flatnonzero(new_on_cordoned)[:5]:
            j = int(instance.task_job[t])
            problems.append(f"maintenance: a task of {instance.jobs[j].name!r} is on "
                            f"{instance.hosts[int(hosts[t])].name!r}, which is in maintenance")
    for j, job in enumerate(instance.jobs):
        if job.tasks < 2 or (job.spread not in levels and job.together not in levels):
            continue
        first = int(instance.job_first_task[j])
        on = hosts[first:first + job.tasks]
        if job.spread in levels and len(set(on.tolist())) < job.tasks:
            problems.append(f"spread: virtual cluster {job.name!r} has several VMs on one host")
        if job.together in levels and len(set(on.tolist())) > 1:
            problems.append(f"together: virtual cluster {job.name!r} is on {len(set(on.tolist()))} hosts")
    return problems


def soft_unmet(instance: Instance, hosts: np.ndarray) -> list[str]:
    """The preferred rules the placement does not honour (reported, not refused)."""
    if not has_soft(instance):
        return []
    soft_only = dataclasses.replace(instance, pinned=(), hosts=tuple(
        dataclasses.replace(h, maintenance=False) for h in instance.hosts))
    return rule_problems(soft_only, hosts, levels=(PREFERRED,))


def describe(instance: Instance) -> str:
    """The rules of an instance in one short line (for reports)."""
    parts = []
    for kind in ("spread", "together"):
        names = [f"{j.name}{'' if getattr(j, kind) == REQUIRED else '?'}" for j in instance.jobs if getattr(j, kind)]
        if names:
            parts.append(f"{kind}: {', '.join(names)}")
    n_pinned = int((instance.task_pinned >= 0).sum())
    if n_pinned:
        parts.append(f"{n_pinned} pinned")
    cordoned = [h.name for h in instance.hosts if h.maintenance]
    if cordoned:
        parts.append(f"maintenance: {', '.join(cordoned)}")
    return "; ".join(parts) or "none"

