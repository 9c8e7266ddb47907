"""``best``: an anytime search for the highest minimum yield within a time budget.

MCB8 is the paper's best heuristic (section 3.4; 2 % below the MILP optimum on
its small set, docs/results.md).  ``best`` starts where MCB stops and keeps
improving while its budget lasts:

1. **Start.**  MCB8, then the other seven MCB orders (paper's ranking:
   MCB5, 6, 7, 3, 2, 1, 4) while they fit in :data:`START_SHARE` of the
   budget (each costs about what MCB8 did; at 64 x 500 all eight take ~8 ms,
   at 1,000 x 10,000 only a few fit in the default budget); the placement
   with the highest minimum yield is the start.  When no variant places
   every task (memory is tight), the sorted greedy SG and its backtracking
   SGB (section 3.3, attempts in proportion to the budget, :data:`RESCUE_ATTEMPTS_PER_S`) are tried.
2. **Local search on the bottleneck** (:mod:`vcsched.solvers.local_search`):
   moves and swaps off the hosts that set the minimum yield until none
   helps, then iterated local search (random kicks from the best placement,
   seeded by ``options.seed``, and descent again) until the budget is spent.
3. **Exact MILP on small instances** (at most :data:`MILP_MAX_VARIABLES`
   task-host pairs, the paper's small set has at most 48): after
   :data:`LOCAL_SHARE_SMALL` of the budget, HiGHS gets the rest, on the
   makespan form of the MILP (:class:`vcsched.solvers.milp.MakespanModel`,
   the same optimum as section 2.5's, ~6x faster), with the best placement's
   value as a cutoff (``Z <= Z_best (1 + 1e-7)``).  It either finds a better
   placement, proves the best one optimal, or runs out of time.  HiGHS is
   given no starting solution: scipy's ``milp`` takes none, and passing one
   through scipy's private HiGHS bindings was measured to gain nothing
   (8.06 s against 8.41 s in all on 28 twelve-task instances).  When MCB,
   SG and SGB all fail, the MILP (no cutoff) also looks for a first placement, if
   the budget has :data:`MILP_MIN_S` left (:data:`MILP_IMPORT_S` when scipy is not imported yet).

At every moment the search holds a valid placement, so it can stop anywhere.
It stops early when the placement reaches the LP bound (section 3.1:
``min(1, sum C_h / sum alpha)``, so nothing can beat it) or when HiGHS proves
it optimal.  It never returns a lower minimum yield than MCB8 on the same
instance: MCB8 always runs first, in full even when it alone outlasts the
budget, and every later phase only replaces the placement with a strictly
better one.  The registry then runs the average-yield phase (section 3.5) on
the final placement.

**Budget.**  ``options.time_limit`` seconds of wall-clock time, default
:data:`DEFAULT_BUDGET_S` (0.1 s: below the ~0.1 s a user notices in an
interactive command, enough for the local search to close most of MCB8's gap
to the LP bound at 64 hosts x 500 tasks, and about 5x MCB8's own time at
1,000 x 10,000, docs/benchmarks.md).  The budget covers the whole search but
not the average-yield phase; a search that finishes early (optimal) returns
early.  **Results depend on the machine's speed and load**: the kicks are
seeded, so two runs make the same sequence of changes, but where the clock
stops that sequence differs from run to run.  For reproducible results,
:func:`best_placement` takes ``max_kicks`` (and the budget can be made
large), which makes the search deterministic for a given seed.

``detail`` of the result: ``budget_s``, ``search_s`` (time the search used),
``start`` (algorithm and minimum yield), ``mcb8_min_yield``, ``starts``
(variants run), ``local_search`` (descent steps, kicks, improvements),
``milp`` (when run: status, nodes, seconds, its bound), ``lp_bound``,
``lp_gap_percent`` (``100 (bound - Y) / bound``), ``upper_bound`` (the LP
bound, or HiGHS's better bound when it has one), ``gap_percent`` (to it) and
``stopped`` (why it stopped).

**The resource vector.**  On an instance with fluid resources besides CPU
(disk, net, ...: docs/policies.md) every phase judges the whole vector: the
MCB starts pack it (:mod:`vcsched.solvers.mcb_vector`), SG/SGB balance the
largest relative load, the local search lowers ``max_r L_hr / C_hr`` (a
host's yield is set by its tightest resource), the makespan MILP has a row
per (host, resource), and the LP bound is taken over every resource.  A
placement is valid when memory fits and no task sits on a host without a
fluid resource it needs; MCB8 still runs first, so ``best`` never ends below it.

Instances with placement rules (docs/rules.md) skip step 2: the moves and
swaps know nothing of maintenance, pins or spread.  Steps 1 and 3 honour them
(every MCB variant, SG, SGB and the MILP do), and a placement that breaks
one is never kept.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vcsched.model import Instance, SolveOptions
from vcsched.rules import rule_problems
from vcsched.solvers.algorithm import Placement
from vcsched.solvers.greedy import backtracking, greedy, task_order
from vcsched.solvers.local_search import LoadState, descend, perturb
from vcsched.solvers.lpbound import lp_bound
from vcsched.solvers.milp import build_makespan_model, placement_from, solve_makespan
from vcsched.solvers.search import search as mcb_search
from vcsched.units import SEARCH_PRECISION, SOLVER_TOLERANCE, YIELD_TOLERANCE
from vcsched.yields import fits, placement_min_yield

DEFAULT_BUDGET_S = 0.1
#: The MCB variants, in the paper's ranking (section 4.2.1): MCB8 first and always.
START_VARIANTS = ("mcb8", "mcb5", "mcb6", "mcb7", "mcb3", "mcb2", "mcb1", "mcb4")
#: Variants after MCB8 run only while their expected end (elapsed + MCB8's time) is within this share of the budget.
START_SHARE = 0.5
#: Backtracking attempts for SGB when no MCB variant places every task, per second of budget (an attempt costs
#: ~2.5 us at 64 hosts), at least 1,000 and at most section 3.3's 500,000; a count, not a clock, so that
#: whether SGB finds a placement depends on the budget only.
RESCUE_ATTEMPTS_PER_S = 200_000
#: Instances with at most this many task-host pairs get the exact MILP (the paper's small set: 4 x 12 = 48).
MILP_MAX_VARIABLES = 100
#: On those, the local search gets this share of the budget (and stops sooner when it stalls), HiGHS the rest.
LOCAL_SHARE_SMALL = 0.25
#: Kicks without improvement after which the local search on a MILP-sized instance hands over to HiGHS.
STALL_KICKS = 300
#: HiGHS is not started with less time than this left: its set-up alone takes a few ms ...
MILP_MIN_S = 0.02
#: ... or, in a process that has not imported scipy.optimize yet, than this: the import alone takes ~0.35 s
#: (once per process; vcsched imports scipy lazily so that commands that do not need it start fast).
MILP_IMPORT_S = 0.5
#: Iterated local search: at most this many random changes per kick, and back to the best placement after
#: this many kicks without improvement.
MAX_KICK = 3
RESTART_AFTER = 50


#: HiGHS proves its optimum to this relative gap (its MIP tolerances): ours is optimal when within it.
HIGHS_OPTIMALITY = 1e-6


@dataclass
class _LocalStats:
    descent_steps: int = 0
    kicks: int = 0
    improvements: int = 0


@dataclass
class _Search:
    """The state of one search: the clock, the best placement so far, and what happened."""

    instance: Instance
    budget: float
    started: float
    bound: float | None
    best: np.ndarray | None = None
    best_y: float = -1.0
    source: str = ""
    local: _LocalStats | None = None
    infeasible: str | None = None  # who proved that no placement fits (SGB or HiGHS)
    detail: dict[str, object] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        return self.budget - self.elapsed()

    def clock(self, until: float) -> Callable[[], bool]:
        """A predicate for the local search: True once ``until`` seconds of the budget are gone."""
        deadline = self.started + until
        return lambda: time.perf_counter() >= deadline

    def offer(self, hosts: np.ndarray | None, source: str) -> bool:
        """Keep ``hosts`` when it is a valid placement with a strictly higher minimum yield; True if kept."""
        if hosts is None or not fits(self.instance, hosts):
            return False
        if self.instance.has_rules and rule_problems(self.instance, hosts):
            return False
        y = placement_min_yield(self.instance, hosts)
        if self.best is not None and y <= self.best_y * (1.0 + YIELD_TOLERANCE):
            return False
        self.best, self.best_y, self.source = np.array(hosts, dtype=np.int64), y, source
        return True

    @property
    def at_bound(self) -> bool:
        return self.bound is not None and self.best is not None and self.best_y >= self.bound * (1.0 - YIELD_TOLERANCE)


def best_placement(instance: Instance, *, budget_s: float = DEFAULT_BUDGET_S, seed: int = 0,
                   precision: float = SEARCH_PRECISION, max_kicks: int | None = None) -> Placement:
    """The ``best`` search (module docstring); ``max_kicks`` bounds the iterated local search (reproducible runs)."""
    search = _Search(instance, budget_s, time.perf_counter(), lp_bound(instance))
    detail = search.detail
    detail["budget_s"] = budget_s
    optimal = False
    stopped = "time budget spent"
    if instance.n_tasks == 0:
        search.best, search.best_y, optimal, stopped = np.empty(0, dtype=np.int64), 1.0, True, "no tasks"
    elif search.bound is None:
        optimal, stopped = True, "memory does not fit even fractionally: no placement exists (section 3.1)"
    else:
        y8 = _start(search, precision)
        detail["mcb8_min_yield"] = y8
        small = instance.n_tasks * instance.n_hosts <= MILP_MAX_VARIABLES
        if search.best is None and small and not search.infeasible and search.remaining() >= _milp_min_s():
            optimal = _exact(search, cutoff=False)
        if search.infeasible:
            fit = "on every resource" if instance.has_extra_resources else "in memory"
            optimal, stopped = True, f"{search.infeasible} proved that no placement fits {fit}"
        elif search.best is None:
            stopped = "no placement found"
        else:
            detail["start"] = {"algorithm": search.source, "min_yield": search.best_y}
            local_until = budget_s * LOCAL_SHARE_SMALL if small else budget_s
            stall = STALL_KICKS if small else None
            if not search.at_bound and not optimal:
                _local_search(search, local_until, seed, max_kicks, stall)
            if small and not search.at_bound and not optimal and search.remaining() >= _milp_min_s():
                optimal = _exact(search, cutoff=True)
            if small and not search.at_bound and not optimal and search.remaining() > 0:
                # HiGHS did not run (too little time left) or stopped without a proof: search on to the end.
                _local_search(search, budget_s, seed + 1, max_kicks, None)
            if search.at_bound:
                optimal, stopped = True, "reached the LP bound (section 3.1): optimal"
            elif optimal:
                stopped = "HiGHS proved the placement optimal"
            elif max_kicks is not None and search.remaining() > 0:
                stopped = "kick limit reached"
            # Belt and braces for the guarantee: never below MCB8.
            if y8 is not None and search.best_y < y8:  # pragma: no cover - every phase only keeps improvements
                raise AssertionError("best fell below MCB8")
    detail["search_s"] = search.elapsed()
    if search.local is not None:
        detail["local_search"] = vars(search.local)
    detail["stopped"] = stopped
    if search.best is not None and search.bound is not None:
        detail["min_yield"] = search.best_y
        detail["lp_bound"] = search.bound
        detail["lp_gap_percent"] = 100.0 * (search.bound - search.best_y) / search.bound
        milp_bound = detail.pop("milp_bound", None)
        upper = min(search.bound, milp_bound) if isinstance(milp_bound, float) else search.bound
        upper = max(upper, search.best_y) if optimal else upper
        detail["upper_bound"] = upper
        detail["gap_percent"] = 100.0 * (upper - search.best_y) / upper
        detail["source"] = search.source
    return Placement(hosts=search.best, optimal=optimal, detail=detail)


def _milp_min_s() -> float:
    """The least budget left worth starting HiGHS with: its set-up, plus scipy's import if not done yet."""
    return MILP_MIN_S if "scipy.optimize" in sys.modules else MILP_IMPORT_S


def _mcb(instance: Instance, variant: str, precision: float) -> np.ndarray | None:
    """One MCB variant's placement: the 2-D search, or the d-dimensional one on the resource vector."""
    return mcb_search(instance, variant, None, precision).hosts


def _start(search: _Search, precision: float) -> float | None:
    """Step 1: MCB8, the other MCB orders while they fit, else SG / SGB.  Returns MCB8's minimum yield."""
    instance = search.instance
    ran: list[str] = []
    y8: float | None = None
    t8 = 0.0
    for variant in START_VARIANTS:
        if variant != "mcb8" and (search.elapsed() + t8 > START_SHARE * search.budget or search.at_bound):
            break
        t = time.perf_counter()
        hosts = _mcb(instance, variant, precision)
        ran.append(variant)
        if variant == "mcb8":
            t8 = time.perf_counter() - t
            y8 = None if hosts is None else placement_min_yield(instance, hosts)
        search.offer(hosts, variant)
    search.detail["starts"] = ran
    if search.best is None:
        search.offer(greedy(instance, task_order(instance, sort_by_memory=True)), "sg")
    if search.best is None:
        attempts = int(min(500_000, max(1_000, RESCUE_ATTEMPTS_PER_S * search.budget)))
        hosts, _, exhausted = backtracking(instance, task_order(instance, sort_by_memory=True), attempts)
        search.offer(hosts, "sgb")
        search.infeasible = "SGB's exhaustive search" if exhausted else None
    return y8


def _local_search(search: _Search, until: float, seed: int, max_kicks: int | None, stall: int | None) -> None:
    """Step 2: descent, then iterated local search, until ``until`` seconds of the budget (or a stall)."""
    assert search.best is not None
    if search.instance.has_rules:  # the moves know no rules (module docstring)
        return
    out_of_time = search.clock(until)
    if search.local is None:
        search.local = _LocalStats()
    stats = search.local
    best = LoadState.of(search.instance, search.best)
    stats.descent_steps += descend(best, out_of_time)
    if search.offer(best.hosts, "local search"):
        stats.improvements += 1
    rng = np.random.default_rng(seed)
    current = best.copy()
    since = 0
    while not out_of_time() and not search.at_bound:
        if max_kicks is not None and stats.kicks >= max_kicks:
            break
        if stall is not None and since >= stall:
            break
        trial = current.copy()
        perturb(trial, rng, int(rng.integers(1, MAX_KICK + 1)))
        stats.descent_steps += descend(trial, out_of_time)
        stats.kicks += 1
        since += 1
        if search.offer(trial.hosts, "local search"):
            stats.improvements += 1
            since = 0
        # Walk on: keep the kicked placement when it is as good as the best (a plateau), else go back.
        if trial.min_yield() >= search.best_y * (1.0 - YIELD_TOLERANCE):
            current = trial
        elif since % RESTART_AFTER == 0:
            current = LoadState.of(search.instance, search.best)


def _exact(search: _Search, *, cutoff: bool) -> bool:
    """Step 3: HiGHS on the makespan form for the rest of the budget; True when it proves the best optimal."""
    instance = search.instance
    z_max = None
    if cutoff and search.best is not None:
        z_max = (1.0 / search.best_y if search.best_y < 1.0 else 1.0) * (1.0 + SOLVER_TOLERANCE)
    t = time.perf_counter()
    model = build_makespan_model(instance, z_max=z_max)
    sol = solve_makespan(model, max(search.remaining(), 0.0))
    info: dict[str, object] = {"status": sol.message, "seconds": time.perf_counter() - t,
                               "cutoff_min_yield": search.best_y if cutoff else None}
    if "nodes" in sol.detail:
        info["nodes"] = sol.detail["nodes"]
    if sol.x is not None and search.offer(placement_from(model, sol.x), "milp"):
        info["improved"] = True
    bound = sol.detail.get("dual_bound")
    if isinstance(bound, float):
        info["bound"] = bound
        search.detail["milp_bound"] = bound
    search.detail["milp"] = info
    if not cutoff and sol.infeasible and search.best is None:
        search.infeasible = "HiGHS"
    if not sol.optimal or search.best is None or sol.objective is None:
        return False
    # HiGHS's optimum (to its tolerances): ours is optimal when it is at least as good.
    return search.best_y >= sol.objective * (1.0 - HIGHS_OPTIMALITY)


def best(instance: Instance, options: SolveOptions) -> Placement:
    """``best`` as a registry placer: :func:`best_placement` within ``--time-limit`` (its budget)."""
    budget = DEFAULT_BUDGET_S if options.time_limit is None else options.time_limit
    return best_placement(instance, budget_s=budget, seed=options.seed, precision=options.precision)
