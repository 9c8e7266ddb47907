"""Draining a host: the adaptation problem where the host is in maintenance and its VMs must leave, under a budget.

Taking a host out for a kernel update means emptying it by live migration
without breaking the rules (docs/rules.md) or any host's memory, and moving
no more bytes than the operator allows.  That is the adaptation problem of
section 6.1 (:mod:`vcsched.adaptation.problem`) with the drained host in
maintenance (nothing moves in) and every movable task on it in ``leave``;
:func:`vcsched.adaptation.solve.solve_adapt` solves it with either method,
and the remaining budget still buys yield elsewhere.

When the host cannot be emptied (the budget is too small, the other hosts
have no room, a rule forbids every host with room, or a VM is pinned there)
the result is the best *partial* drain: VMs are added to the evacuation
smallest first (the most VMs for the bytes) as long as a placement exists,
and every VM that stays gets its reason:

* ``pinned`` — it may never move;
* ``budget`` — its bytes do not fit in what the budget has left, or it
  could leave with an unlimited budget but not within this one;
* ``rule`` — hosts have memory for it, but each holds a VM of its spread
  virtual cluster (or is in maintenance);
* ``no room`` — no other host can take it even with an unlimited budget.

The same greedy choice of which VMs leave is used with the MILP (each try
exact), so the two methods are compared on the same question.

Speed.  Emptying the host is the residual packing of the heuristic (step 2),
fast at any size; the improvement moves after it (step 3) spend what is left
of the budget on yield elsewhere, and on a large cluster they can make
hundreds of migrations for seconds.  A drain gives them at most
:data:`IMPROVE_S` seconds per solve (an anytime phase: stopping only leaves
yield unbought, ``improve_stopped`` in the detail says so); on small clusters
they finish long before (docs/rules.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.adaptation.problem import AdaptProblem, AdaptResult, task_allowed
from vcsched.adaptation.solve import solve_adapt
from vcsched.errors import InputError
from vcsched.formats.units import format_size
from vcsched.model import REQUIRED, SolveOptions
from vcsched.units import MEMORY_TOLERANCE, UNLIMITED

PINNED, BUDGET, RULE, NO_ROOM = "pinned", "budget", "rule", "no room"
#: Seconds the heuristic's improvement moves may take in each solve of a drain (module docstring).
IMPROVE_S = 0.5


@dataclass(frozen=True)
class Stay:
    """A VM (task) that stays on the drained host, and why."""

    task: int
    reason: str  # PINNED, BUDGET, RULE or NO_ROOM
    detail: str


@dataclass(frozen=True)
class DrainResult:
    problem: AdaptProblem  # the problem solved: the host in maintenance, ``leave`` = the VMs that leave
    adapted: AdaptResult
    stays: tuple[Stay, ...]
    host: int

    @property
    def complete(self) -> bool:
        return self.adapted.result.feasible and not self.stays


def cordon(problem: AdaptProblem, host: int) -> AdaptProblem:
    """The problem with ``host`` in maintenance."""
    inst = problem.instance
    if not 0 <= host < inst.n_hosts:
        raise InputError(f"host: index {host} is not a host (0..{inst.n_hosts - 1})")
    hosts = tuple(dataclasses.replace(h, maintenance=True) if i == host else h for i, h in enumerate(inst.hosts))
    return dataclasses.replace(problem, instance=dataclasses.replace(inst, hosts=hosts), leave=())


def evacuation(problem: AdaptProblem, host: int) -> AdaptProblem:
    """The problem of emptying ``host``: in maintenance, every task on it not pinned in ``leave``.  A drain's
    first try, and each step of consolidating the spare room (:mod:`vcsched.adaptation.spare`)."""
    base = cordon(problem, host)
    on = np.flatnonzero(base.current == host)
    return dataclasses.replace(base, leave=tuple(int(t) for t in on[base.instance.task_pinned[on] < 0]))


def drain(problem: AdaptProblem, host: int, algorithm: str = "heuristic",
          options: SolveOptions | None = None, names: Sequence[str] | None = None) -> DrainResult:
    """Empty ``host`` within ``problem.budget`` (module docstring), or the best partial drain and why VMs stay.

    ``names``: each task's VM name, for the reasons (an operator knows ``web-1``, not "task 1 of 'web'", which
    need not even be the same VM); without it tasks are named by their index in their job."""
    base = cordon(problem, host)
    inst = base.instance
    on = np.flatnonzero(base.current == host)
    pinned = on[inst.task_pinned[on] >= 0]
    movable = on[inst.task_pinned[on] < 0]
    stays = [Stay(int(t), PINNED, f"{_vm(base, int(t), names)} is pinned to this host") for t in pinned]
    if not len(movable):
        return DrainResult(base, solve_adapt(base, algorithm, options, improve_s=IMPROVE_S), tuple(stays), host)
    full = evacuation(problem, host)
    result = solve_adapt(full, algorithm, options, improve_s=IMPROVE_S)
    if result.result.feasible:
        return DrainResult(full, result, tuple(stays), host)
    chosen: list[int] = []
    best_problem, best = base, solve_adapt(base, algorithm, options, improve_s=IMPROVE_S)
    # What leaving costs at least (memory, plus the disks when no open host shares the drained host's storage):
    # a lower bound, so the check below never refuses a VM the solve could move; the solve counts exactly.
    least = dict(zip(movable.tolist(), base.cheapest_move(movable).astype(np.int64).tolist(), strict=True))
    order = sorted(movable.tolist(), key=lambda t: least[t])
    for t in order:
        spent = sum(least[c] for c in chosen)
        if spent + least[t] > base.budget:
            stays.append(Stay(t, BUDGET, f"{_vm(base, t, names)} needs {format_size(least[t])} to move; "
                                         f"{format_size(base.budget - spent)} of the budget are left"))
            continue
        trial = dataclasses.replace(base, leave=(*chosen, t))
        r = solve_adapt(trial, algorithm, options, improve_s=IMPROVE_S)
        if r.result.feasible:
            chosen.append(t)
            best_problem, best = trial, r
            continue
        stays.append(_why(trial, t, algorithm, options, names))
    return DrainResult(best_problem, best, tuple(sorted(stays, key=lambda s: s.task)), host)


def _vm(problem: AdaptProblem, t: int, names: Sequence[str] | None = None) -> str:
    if names is not None:
        return names[t]
    inst = problem.instance
    j = int(inst.task_job[t])
    return f"task {t - int(inst.job_first_task[j])} of {inst.jobs[j].name!r}"


def _why(trial: AdaptProblem, t: int, algorithm: str, options: SolveOptions | None,
         names: Sequence[str] | None = None) -> Stay:
    """Why task ``t`` could not leave in ``trial`` (module docstring)."""
    inst = trial.instance
    run = trial.running
    mem = np.bincount(trial.current[run], weights=inst.task_mem[run], minlength=inst.n_hosts)
    # Memory, and where the task may go at all (not in maintenance, not its own host, every fluid resource it needs).
    room = (inst.host_mem - mem >= inst.task_mem[t] - MEMORY_TOLERANCE) & task_allowed(
        trial, np.array([t]), np.arange(inst.n_hosts))[0]
    j = int(inst.task_job[t])
    if room.any() and inst.jobs[j].spread == REQUIRED:
        first = int(inst.job_first_task[j])
        mates = trial.current[first:first + inst.jobs[j].tasks]
        if not (room & ~np.isin(np.arange(inst.n_hosts), mates)).any():
            return Stay(t, RULE, f"{_vm(trial, t, names)}: every host with room holds a VM of its spread "
                                 "virtual cluster")
    if solve_adapt(trial.with_budget(UNLIMITED), algorithm, options, improve_s=IMPROVE_S).result.feasible:
        return Stay(t, BUDGET, f"{_vm(trial, t, names)} could leave only by moving other VMs too, beyond the budget")
    return Stay(t, NO_ROOM, f"{_vm(trial, t, names)}: no other host can take it, whatever the budget")
