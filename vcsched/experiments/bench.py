"""What ``vcsched bench`` times, which solver is too slow for which size, and the timing runs themselves.

The cases are fixed, seeded instances of the paper's protocol (section 4.1),
so two machines time the same work.  Some algorithms do not scale and are
skipped above a size, each with the reason printed in the table: a benchmark
that silently drops a solver would read as if it had run.

:func:`run_bench` does the timing and reports how far it got through an
``on_progress(done, total, description)`` callback; it prints nothing, so the
CLI draws the progress bar and the tables, and Python callers get the values.
The CLI times whole processes (the start-up rows, ``cli/bench.py``); this
module runs no process.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from vcsched.adaptation.drain import drain
from vcsched.adaptation.problem import AdaptProblem
from vcsched.adaptation.solve import solve_adapt
from vcsched.errors import InputError
from vcsched.experiments import OnProgress
from vcsched.experiments.adaptation import TraceSpec, apply_change, initial_state, problem_for, random_change
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.experiments.paper import parse_label
from vcsched.model import SolveOptions
from vcsched.solvers.registry import solve
from vcsched.validate import check_allocation

BENCH_SEED = 20080101
BENCH_SLACK = 0.3
BENCH_CV = 0.5


@dataclass(frozen=True)
class BenchCase:
    hosts: int
    tasks: int

    @property
    def name(self) -> str:
        return f"{self.hosts}x{self.tasks}"

    def spec(self) -> GeneratorSpec:
        return GeneratorSpec(hosts=self.hosts, tasks=self.tasks, slack=BENCH_SLACK, cv_mem=BENCH_CV, cv_cpu=BENCH_CV)


DEFAULT_CASES = (BenchCase(4, 12), BenchCase(64, 500), BenchCase(1000, 10_000))

# Largest task count each slow algorithm is timed at, and why (costs: the paper's section 4.2).
TASK_LIMITS: dict[str, tuple[int, str]] = {
    "milp": (12, "exact MILP: exponential; only the small size "
                 "(paper, GLPK on its small set: 28.7 s mean, 11,549 s worst)"),
    "rrnd": (500, "solves the MILP's LP relaxation with J*H columns (paper: about 650 s at 500 tasks)"),
    "rrnz": (500, "solves the MILP's LP relaxation with J*H columns (paper: about 650 s at 500 tasks)"),
    "gb": (500, "backtracking bounded by 500,000 placement attempts of O(H) each; not timed at this size"),
    "sgb": (500, "backtracking bounded by 500,000 placement attempts of O(H) each; not timed at this size"),
}


#: Anytime algorithms are timed at their own default budget, not at the bench's time limit (they would spend
#: all of it); ``name@S`` (:func:`vcsched.experiments.paper.parse_label`) times them at S seconds instead.
OWN_BUDGET = frozenset({"best"})


def row_time_limit(algorithm: str, time_limit: float) -> float | None:
    """The time limit a row runs with: the label's budget, the algorithm's own default, or the bench's."""
    name, budget = parse_label(algorithm)
    if budget is not None:
        return budget
    return None if name in OWN_BUDGET else time_limit


def skip_reason(algorithm: str, case: BenchCase) -> str | None:
    """Why ``algorithm`` is not timed on ``case``, or None when it is."""
    limit = TASK_LIMITS.get(parse_label(algorithm)[0])
    if limit is not None and case.tasks > limit[0]:
        return f"skipped above {limit[0]} tasks: {limit[1]}"
    return None


def parse_cases(text: str) -> tuple[BenchCase, ...]:
    """``"4x12,64x500"`` -> cases; each HxJ with H, J >= 1."""
    cases = []
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)x(\d+)", part)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise InputError(f"--sizes: {part!r} is not HOSTSxTASKS (e.g. 64x500)")
        case = BenchCase(int(m.group(1)), int(m.group(2)))
        case.spec()  # raises InputError when the memory mean would exceed one host
        cases.append(case)
    if not cases:
        raise InputError("--sizes: at least one size is needed")
    return tuple(cases)


@dataclass(frozen=True)
class Timing:
    """Repeated runs of one algorithm on one case."""

    algorithm: str
    case: str
    runs_s: tuple[float, ...]
    feasible: bool
    min_yield: float | None
    skipped: str | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.runs_s) if self.runs_s else None


# ---------------------------------------------------------------- adaptation

#: Budgets the adaptation heuristic is timed at, as fractions of the running VMs' bytes (inf: unlimited).
ADAPT_BUDGETS = (0.0, 0.1, math.inf)
ADAPT_PREFIX = "adapt"
#: The drain row: host 0 emptied within 10 % of the running bytes (timed on each case with ``adapt``).
DRAIN_ROW = "drain 10 %"


def adapt_row_name(budget_fraction: float) -> str:
    return f"{ADAPT_PREFIX} {'unlimited' if math.isinf(budget_fraction) else f'{100 * budget_fraction:g} %'}"


def adapt_problem(case: BenchCase, budget_fraction: float) -> AdaptProblem:
    """A fixed adaptation problem of ``case``'s size: an MCB8-placed instance after one round of changes.

    The round is the adaptation study's (docs/adapt-results.md): about 10 % of
    the jobs leave, 10 % arrive and 10 % get a new CPU need; moving a task
    costs its memory fraction of a 1 GiB host.
    """
    spec = TraceSpec(case.hosts, case.tasks, BENCH_SLACK, cv_mem=BENCH_CV, cv_cpu=BENCH_CV)
    instance, hosts, rng = initial_state(spec, BENCH_SEED)
    changed, current = apply_change(instance, hosts, random_change(spec, instance, 1, rng))
    return problem_for(changed, current, budget_fraction)


# ---------------------------------------------------------------- the timing runs


def run_bench(cases: Sequence[BenchCase], algorithms: Sequence[str], *, repeat: int = 5, time_limit: float = 60.0,
              adapt: bool = False, on_progress: OnProgress | None = None) -> list[Timing]:
    """Time each of ``algorithms`` ``repeat`` times on each case, then (``adapt``) the adaptation heuristic.

    Every run goes through :func:`vcsched.solvers.registry.solve`, the path
    ``vcsched solve`` takes, and every allocation is checked by the one
    validator; an algorithm too slow for a case (:func:`skip_reason`) gets a
    row with the reason instead of runs.  The ``adapt`` rows time
    ``solve_adapt(..., "heuristic")`` on :func:`adapt_problem` at each of
    :data:`ADAPT_BUDGETS`.  ``time_limit`` applies to milp/rrnd/rrnz; ``best``
    runs at its own default budget, and an algorithm given as ``name@S`` at
    S seconds (:func:`row_time_limit`).  Rows come case by case, in the
    order given, the adaptation rows last.  ``on_progress`` is told before each row is timed
    (and once when all are).
    """
    work = [(c, a) for c in cases for a in algorithms]
    adapt_work = [(c, b) for c in cases for b in ADAPT_BUDGETS] if adapt else []
    total = len(work) + len(adapt_work) + (len(cases) if adapt else 0)

    def progress(done: int, description: str) -> None:
        if on_progress is not None:
            on_progress(done, total, description)

    progress(0, "generating instances")
    timed = {c.name for c, a in work if not skip_reason(a, c)}
    instances = {c.name: generate(c.spec(), BENCH_SEED) for c in cases if c.name in timed}
    timings: list[Timing] = []
    for case, algo in work:
        progress(len(timings), f"{algo} on {case.name}")
        reason = skip_reason(algo, case)
        if reason:
            timings.append(Timing(algo, case.name, (), False, None, reason))
            continue
        inst = instances[case.name]
        runs, feasible, min_yield = [], False, None
        for _ in range(repeat):
            result = solve(inst, parse_label(algo)[0],
                           SolveOptions(seed=BENCH_SEED, time_limit=row_time_limit(algo, time_limit)))
            if result.allocation is not None:
                check_allocation(inst, result.allocation, min_yield=result.min_yield, avg_yield=result.avg_yield)
            runs.append(result.runtime_s)
            feasible, min_yield = result.feasible, result.min_yield
        timings.append(Timing(algo, case.name, tuple(runs), feasible, min_yield))
    for case, budget in adapt_work:
        name = adapt_row_name(budget)
        progress(len(timings), f"{name} on {case.name}")
        problem = adapt_problem(case, budget)
        runs, feasible, min_yield = [], False, None
        for _ in range(repeat):
            adapted = solve_adapt(problem, "heuristic")  # validates the allocation and the budget itself
            runs.append(adapted.result.runtime_s)
            feasible, min_yield = adapted.result.feasible, adapted.result.min_yield
        timings.append(Timing(name, case.name, tuple(runs), feasible, min_yield))
    for case in cases if adapt else ():
        # Drain planning (docs/rules.md): host 0 in maintenance, its VMs leave within 10 % of the running bytes.
        progress(len(timings), f"{DRAIN_ROW} on {case.name}")
        problem = adapt_problem(case, 0.1)
        runs, feasible, min_yield = [], False, None
        for _ in range(repeat):
            started = time.perf_counter()
            drained = drain(problem, 0)
            runs.append(time.perf_counter() - started)
            feasible, min_yield = drained.complete, drained.adapted.result.min_yield
        timings.append(Timing(DRAIN_ROW, case.name, tuple(runs), feasible, min_yield))
    progress(total, "done")
    return timings


# ---------------------------------------------------------------- whole processes

#: The size of the instance whose ``vcsched solve``, start to exit, ``vcsched bench`` times (the paper's large set).
STARTUP_CASE = BenchCase(64, 500)
STARTUP_PREFIX = "cli"
POLICIES_PREFIX = "policies"  # the sharing policies' rows (vcsched.experiments.policy_bench), timed by the CLI
#: ``Timing.case`` of a whole-process row.
WHOLE_PROCESS = "whole process"
