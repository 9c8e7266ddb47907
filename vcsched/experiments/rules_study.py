"""The placement-rules study (docs/rules.md): what spread and pinning cost MCB8, and drains heuristic vs MILP.

1. **MCB8 with rules.**  Paper-protocol instances (section 4.1, parallel
   jobs as in section 5): 30 % of the virtual clusters (jobs of 2 tasks or
   more) made ``spread`` (required) and 10 % of the VMs pinned to a host
   drawn at random among those with memory left for them; MCB8's minimum
   yield against the same instance without rules.
2. **Drains.**  Small instances (4 hosts, 10 tasks, MCB8-placed, 30 % of the
   parallel jobs spread): host 0 drained under budgets 0, 10 % of the running
   bytes and unlimited, by the heuristic and by the MILP (the same greedy choice
   of which VMs leave, :mod:`vcsched.adaptation.drain`): VMs evacuated and minimum yield.

Pure: returns rows; the caller prints them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from vcsched.adaptation.drain import drain
from vcsched.adaptation.problem import AdaptProblem
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.model import REQUIRED, Instance, SolveOptions
from vcsched.solvers.registry import solve
from vcsched.units import GIB


def with_rules(instance: Instance, rng: np.random.Generator, spread: float = 0.3, pinned: float = 0.1) -> Instance:
    """``spread`` of the parallel jobs spread, ``pinned`` of the tasks pinned to a random host with memory room."""
    jobs = list(instance.jobs)
    parallel = [j for j, job in enumerate(jobs) if job.tasks > 1 and job.tasks <= instance.n_hosts]
    for j in rng.permutation(parallel)[: round(spread * len(parallel))]:
        jobs[int(j)] = dataclasses.replace(jobs[int(j)], spread=REQUIRED)
    free = instance.host_mem.copy()
    pins = np.full(instance.n_tasks, -1, dtype=np.int64)
    for t in rng.permutation(instance.n_tasks)[: round(pinned * instance.n_tasks)]:
        job = jobs[int(instance.task_job[t])]
        first = int(instance.job_first_task[int(instance.task_job[t])])
        mates = pins[first:first + job.tasks]
        ok = np.flatnonzero(free >= instance.task_mem[t])
        if job.spread == REQUIRED:
            ok = ok[~np.isin(ok, mates)]
        if len(ok):
            h = int(rng.choice(ok))
            pins[t] = h
            free[h] -= instance.task_mem[t]
    return dataclasses.replace(instance, jobs=tuple(jobs), pinned=tuple(int(p) for p in pins))


@dataclass(frozen=True)
class LossRow:
    hosts: int
    tasks: int
    slack: float
    seed: int
    plain: float | None
    ruled: float | None


def mcb8_loss(hosts: int, tasks: int, slacks: tuple[float, ...], seeds: int) -> list[LossRow]:
    rows = []
    for slack in slacks:
        for seed in range(seeds):
            inst = generate(GeneratorSpec(hosts, tasks, slack, parallel=True), seed)
            ruled = with_rules(inst, np.random.default_rng(1000 + seed))
            a, b = solve(inst, "mcb8"), solve(ruled, "mcb8")
            rows.append(LossRow(hosts, tasks, slack, seed, a.min_yield, b.min_yield))
    return rows


@dataclass(frozen=True)
class DrainRow:
    seed: int
    budget: str
    method: str
    on_host: int
    left: int
    min_yield: float | None
    seconds: float


def drain_study(seeds: int, hosts: int = 4, tasks: int = 10, slack: float = 0.5) -> list[DrainRow]:
    rows = []
    for seed in range(seeds):
        inst = generate(GeneratorSpec(hosts, tasks, slack, parallel=True), seed)
        inst = with_rules(inst, np.random.default_rng(2000 + seed), pinned=0.0)
        placed = solve(inst, "mcb8")
        if placed.allocation is None:
            continue
        current = np.asarray(placed.allocation.hosts, dtype=np.int64)
        task_bytes = np.round(inst.task_mem * GIB).astype(np.int64)
        on = int((current == 0).sum())
        for label, fraction in (("0", 0.0), ("10 %", 0.1), ("unlimited", math.inf)):
            budget = (1 << 62) if math.isinf(fraction) else int(fraction * task_bytes.sum())
            problem = AdaptProblem(inst, current, task_bytes, budget)
            for method in ("heuristic", "milp"):
                r = drain(problem, 0, method, SolveOptions(time_limit=60.0))
                rows.append(DrainRow(seed, label, method, on, on - len(r.stays), r.adapted.result.min_yield,
                                     r.adapted.result.runtime_s))
    return rows
