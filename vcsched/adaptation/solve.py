"""Solving the adaptation problem with either method, validated the same way.

Placement rules (docs/rules.md): contradictions are bad input
(:func:`vcsched.rules.check_rules`); preferred rules are tried as required
first and dropped when nothing is found within the budget; a required
``together`` job runs as one task (its tasks' bytes summed) when its VMs
share a host, and when they do not (the rule came after them) it is left as
it is and reported.  The result is validated in the adaptation's reading of
the rules (:func:`vcsched.adaptation.problem.adapt_rule_problems`).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from vcsched.adaptation.heuristic import adapt_heuristic
from vcsched.adaptation.milp import adapt_milp
from vcsched.adaptation.problem import AdaptProblem, AdaptResult, adapt_rule_problems, migrations, move_cost
from vcsched.errors import AllocationError, InputError
from vcsched.model import REQUIRED, Instance, Job, SolveOptions, SolveResult
from vcsched.rules import check_rules, describe, place_preferred_first, preferred_first
from vcsched.solvers.registry import allocation_of
from vcsched.validate import check_allocation
from vcsched.yields import fits

#: ``heuristic-best``: the heuristic with the anytime search ``best`` (at its default budget) instead of MCB8 for
#: its from-scratch re-placement candidate.
ALGORITHMS = ("heuristic", "heuristic-best", "milp")


def solve_adapt(problem: AdaptProblem, algorithm: str = "heuristic",
                options: SolveOptions | None = None, *, improve_s: float | None = None) -> AdaptResult:
    """Solve the adaptation problem with ``heuristic``, ``heuristic-best`` or ``milp``; the allocation is validated.

    ``improve_s`` bounds the heuristics' improvement moves in seconds
    (:func:`vcsched.adaptation.heuristic.adapt_heuristic`; the MILP ignores it).
    """
    options = options or SolveOptions()
    if algorithm not in ALGORITHMS:
        raise InputError(f"algorithm: unknown adaptation algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    inst = problem.instance
    start = time.perf_counter()
    optimal: bool | None = None
    if inst.has_rules:
        hosts, optimal, detail = _solve_ruled(problem, algorithm, options, improve_s)
    elif algorithm == "milp":
        hosts, optimal, detail = adapt_milp(problem, options)
    else:
        hosts, detail = adapt_heuristic(problem, options.precision,
                                        scratch="best" if algorithm == "heuristic-best" else "mcb8",
                                        improve_s=improve_s)
    if hosts is None:
        runtime = time.perf_counter() - start
        return AdaptResult(SolveResult(algorithm, False, None, None, None, runtime, optimal, detail=detail))
    return adapt_result(problem, hosts, algorithm, detail, start, optimal)


def adapt_result(problem: AdaptProblem, hosts: np.ndarray, algorithm: str, detail: dict[str, object],
                 start: float, optimal: bool | None = None) -> AdaptResult:
    """A placement of ``problem`` validated (memory, budget, rules, the allocation) and turned into its result:
    the one check every adaptation answer passes, the solvers' and the spare room's
    (:mod:`vcsched.adaptation.spare`).  ``start``: the :func:`time.perf_counter` value the work began at."""
    inst = problem.instance
    hosts = np.asarray(hosts, dtype=np.int64)
    if not fits(inst, hosts):
        raise AssertionError(f"adapt {algorithm} returned a placement that overcommits memory "
                             "or puts a task where a fluid resource it needs has capacity 0")
    cost = move_cost(problem, hosts)
    if cost > problem.budget:
        raise AssertionError(f"adapt {algorithm} spent {cost} bytes, above the budget {problem.budget}")
    if inst.has_rules:  # the adaptation's reading of the rules (a VM may stay on a host in maintenance)
        broken = adapt_rule_problems(_without_rules_left(problem, detail), hosts)
        if broken:
            raise AllocationError([f"adapt {algorithm}: {p}" for p in broken])
        inst = capacities_only(inst)  # the allocation is then checked for capacities alone
    allocation = allocation_of(inst, hosts)  # every fluid resource, not CPU alone
    runtime = time.perf_counter() - start
    min_y, avg_y = allocation.min_yield(inst), allocation.avg_yield(inst)
    check_allocation(inst, allocation, min_yield=min_y, avg_yield=avg_y)
    if allocation.notes:  # what the allocation fell back on (the average-yield LP failed), said
        detail = {**detail, "fallback": list(allocation.notes)}
    result = SolveResult(algorithm, True, allocation, min_y, avg_y, runtime, optimal, detail=detail)
    return AdaptResult(result, tuple(migrations(problem, hosts)), cost, detail)


def capacities_only(instance: Instance) -> Instance:
    """The instance without rules (its allocation is checked for capacities; the rules separately)."""
    return dataclasses.replace(instance, pinned=(), hosts=tuple(dataclasses.replace(h, maintenance=False)
                                                               for h in instance.hosts),
                               jobs=tuple(dataclasses.replace(j, spread=None, together=None) for j in instance.jobs))


def _without_rules_left(problem: AdaptProblem, detail: dict[str, object]) -> AdaptProblem:
    """The problem without the rules the solve left unmet on purpose (preferred, or broken before it ran)."""
    left = detail.get("rules_left_as_is")
    if not isinstance(left, list) or not left:
        return problem
    names = set(left)
    jobs = tuple(dataclasses.replace(j, spread=None, together=None) if j.name in names else j
                 for j in problem.instance.jobs)
    return dataclasses.replace(problem, instance=dataclasses.replace(problem.instance, jobs=jobs))


def _contract(problem: AdaptProblem) -> tuple[AdaptProblem, np.ndarray, list[str]]:
    """Required-together jobs whose VMs share a host (or are all new) as one task; the others' rule dropped.

    Returns the contracted problem, the contracted task of every original task, and the jobs whose rule
    was dropped because their VMs already run on several hosts.
    """
    inst = problem.instance
    jobs: list[Job] = []
    task_of = np.empty(inst.n_tasks, dtype=np.int64)
    current, task_bytes, pinned, leave = [], [], [], []
    disks = problem.disk_bytes
    disk_bytes: list[int] = []
    split: list[str] = []
    leaving = problem.leaving
    new_t = 0
    for j, job in enumerate(inst.jobs):
        first = int(inst.job_first_task[j])
        sl = slice(first, first + job.tasks)
        cur = problem.current[sl]
        homes = set(cur.tolist())
        if job.together == REQUIRED and job.tasks > 1 and len(homes) == 1:
            k = job.tasks
            jobs.append(dataclasses.replace(job, cpu_need=k * job.cpu_need, memory=k * job.memory, tasks=1,
                                            needs=tuple((r, k * v) for r, v in job.needs), together=None))
            task_of[sl] = new_t
            current.append(int(cur[0]))
            task_bytes.append(int(problem.task_bytes[sl].sum()))
            if disks is not None:
                disk_bytes.append(int(disks[sl].sum()))
            pinned.append(int(inst.task_pinned[sl].max()))
            if leaving[sl].any():
                leave.append(new_t)
            new_t += 1
            continue
        if job.together == REQUIRED and job.tasks > 1:
            split.append(job.name)
            job = dataclasses.replace(job, together=None)
        jobs.append(job)
        task_of[sl] = np.arange(new_t, new_t + job.tasks)
        current.extend(int(c) for c in cur)
        task_bytes.extend(int(b) for b in problem.task_bytes[sl])
        if disks is not None:
            disk_bytes.extend(int(b) for b in disks[sl])
        pinned.extend(int(p) for p in inst.task_pinned[sl])
        leave.extend(new_t + i for i in range(job.tasks) if leaving[first + i])
        new_t += job.tasks
    contracted = dataclasses.replace(inst, jobs=tuple(jobs), pinned=tuple(pinned) if any(p >= 0 for p in pinned)
                                     else ())
    return (AdaptProblem(contracted, np.array(current, dtype=np.int64), np.array(task_bytes, dtype=np.int64),
                         problem.budget, tuple(leave),
                         None if disks is None else np.array(disk_bytes, dtype=np.int64), problem.host_storage),
            task_of, split)


def _spread_broken_now(problem: AdaptProblem) -> list[str]:
    """Required-spread jobs whose running VMs share a host now (the rule came after them)."""
    inst = problem.instance
    out = []
    for j, job in enumerate(inst.jobs):
        if job.spread != REQUIRED or job.tasks < 2:
            continue
        first = int(inst.job_first_task[j])
        cur = problem.current[first:first + job.tasks]
        cur = cur[cur >= 0]
        if len(set(cur.tolist())) < len(cur):
            out.append(job.name)
    return out


def _solve_ruled(problem: AdaptProblem, algorithm: str, options: SolveOptions,
                 improve_s: float | None = None) -> tuple[np.ndarray | None, bool | None, dict[str, object]]:
    """Either method under the rules (module docstring), through the one rule loop
    (:func:`vcsched.rules.place_preferred_first`): preferred first, then required only, then — when a spread
    rule is broken now and the budget may not allow its repair — with those rules left as they are."""
    inst = problem.instance
    check_rules(inst)
    tries = preferred_first(inst)
    broken = _spread_broken_now(problem)
    if broken:  # a repair the budget may not allow: last try, with those rules left as they are
        tries.append(dataclasses.replace(tries[-1], jobs=tuple(
            dataclasses.replace(j, spread=None) if j.name in broken else j for j in tries[-1].jobs)))
    detail: dict[str, object] = {}
    optimal: list[bool | None] = [None]
    split: list[str] = []

    def place(attempt: Instance) -> np.ndarray | None:
        contracted, task_of, split[:] = _contract(dataclasses.replace(problem, instance=attempt))
        if algorithm == "milp":
            hosts, optimal[0], sub = adapt_milp(contracted, options)
        else:
            hosts, sub = adapt_heuristic(contracted, options.precision,
                                         scratch="best" if algorithm == "heuristic-best" else "mcb8",
                                         improve_s=improve_s)
        detail.update(sub)
        return None if hosts is None else np.asarray(hosts, dtype=np.int64)[task_of]

    ruled = place_preferred_first(
        inst, place, lambda attempt: f"no placement within the budget honours the rules ({describe(attempt)})",
        tries=tries, screen=False)
    detail.update(ruled.report)
    if ruled.hosts is None:
        return None, optimal[0], detail
    if broken and ruled.attempt == len(tries) - 1:
        split = split + broken
        detail["spread_left"] = [f"spread: {name!r} keeps several VMs on one host (the budget does not "
                                 "allow the repair)" for name in broken]
    if split:
        detail["rules_left_as_is"] = split
        detail["together_split"] = [f"together: {name!r} already runs on several hosts; left as it is"
                                    for name in split]
    return ruled.hosts, optimal[0], detail
