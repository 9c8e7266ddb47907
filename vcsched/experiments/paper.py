"""The paper's experiments (section 4; parallel jobs, section 5) as plain data and pure functions.

The pieces, in the order a run uses them:

* :func:`specs` — the instance families of the small, large and parallel sets;
* :func:`work_items` — one item per (family, instance number), each with its
  own seed derived from the run's seed, so any item can be re-run alone and
  the result does not depend on how items are spread over processes;
* :func:`run_item` — generate the instance, run every algorithm through the
  registry, validate every allocation with the one validator, return records;
* :func:`run_items` — many items, in worker processes, reporting progress;
* :func:`resumable_records` and :func:`missing_items` — what an earlier run's
  saved records already cover, and what is left to run;
* :func:`degradation` and the other aggregations — the report's numbers;
* :func:`report_markdown` — the report as a string (writing it is the CLI's job).

``run_item`` measures solver time (``SolveResult.runtime_s``); it performs no
I/O, so :func:`run_items` can run it in worker processes.  Reading and saving
records files is the caller's job.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from vcsched.errors import InputError, VcschedError
from vcsched.experiments import OnProgress
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.experiments.workers import map_items
from vcsched.model import SolveOptions
from vcsched.solvers.registry import solve
from vcsched.units import YIELD_TOLERANCE
from vcsched.validate import allocation_problems

SETS = ("small", "large", "parallel")
SLACKS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CVS = (0.25, 0.75)
SET_TASKS = {"small": (6, 8, 10, 12), "large": (100, 250, 500), "parallel": (100, 250, 500)}
SET_HOSTS = {"small": 4, "large": 64, "parallel": 64}
PAPER_INSTANCES = {"small": 10, "large": 100, "parallel": 100}
BOUND = "lpbound"
EXACT = "milp"
REFERENCE = "mcb8"

# Paper section 4 (docs/model.md, experiment protocol): % degradation from best, (avg, max).
PAPER_DEGRADATION: dict[str, dict[str, tuple[float, float]]] = {
    "small": {
        "mcb8": (1.06, 40.45), "mcb5": (1.60, 38.67), "mcb6": (1.83, 37.61), "mcb7": (3.91, 40.71),
        "mcb3": (11.76, 55.73), "mcb2": (14.21, 48.30), "mcb1": (14.90, 55.84), "mcb4": (17.32, 46.95),
    },
    "large": {
        "mcb8": (0.09, 3.16), "mcb5": (0.25, 3.50), "mcb6": (0.46, 16.68), "mcb7": (1.04, 48.39),
        "mcb3": (4.07, 64.71), "mcb2": (8.68, 46.68), "mcb1": (10.97, 73.33), "mcb4": (14.80, 61.20),
    },
}
PAPER_MCB_RANKING = ("mcb8", "mcb5", "mcb6", "mcb7", "mcb3", "mcb2", "mcb1", "mcb4")


#: ``name@S`` in a run's algorithm list runs ``name`` with its own time limit of S seconds (e.g. ``best@0.1``),
#: so that one run can compare budgets while the MILP keeps the run's limit; records carry the label.
BUDGET_MARK = "@"


def parse_label(label: str) -> tuple[str, float | None]:
    """``"best@0.1"`` -> ``("best", 0.1)``; a plain name -> ``(name, None)`` (the run's time limit applies)."""
    name, mark, budget = label.partition(BUDGET_MARK)
    if not mark:
        return label, None
    try:
        seconds = float(budget)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise InputError(f"algorithm: {label!r}: the time limit after {BUDGET_MARK!r} must be a number above 0")
    return name, seconds


def budget_label(name: str, seconds: float) -> str:
    """The label :func:`parse_label` reads back: ``budget_label("best", 0.1) == "best@0.1"``."""
    return f"{name}{BUDGET_MARK}{seconds:g}"


def specs(set_name: str, tasks: Sequence[int] | None = None) -> list[GeneratorSpec]:
    """The families of a set: tasks x slack x cv_mem x cv_cpu (section 4.1).

    ``tasks`` restricts the task counts (e.g. a reduced large set); each must
    be one of the set's own counts so the results stay comparable to the paper.
    """
    if set_name not in SETS:
        raise InputError(f"set: unknown experiment set {set_name!r} (known: {', '.join(SETS)})")
    counts = SET_TASKS[set_name]
    if tasks is not None:
        unknown = [t for t in tasks if t not in counts]
        if unknown:
            raise InputError(f"tasks: {unknown[0]} is not a task count of the {set_name} set "
                             f"({', '.join(map(str, counts))})")
        counts = tuple(t for t in counts if t in tasks)
    return [
        GeneratorSpec(hosts=SET_HOSTS[set_name], tasks=j, slack=s, cv_mem=cm, cv_cpu=cc,
                      parallel=set_name == "parallel")
        for j in counts for s in SLACKS for cm in CVS for cc in CVS
    ]


@dataclass(frozen=True)
class WorkItem:
    """One instance to generate and solve with every algorithm of the run."""

    set_name: str
    spec_index: int
    instance: int
    spec: GeneratorSpec
    seed: int
    algorithms: tuple[str, ...]
    time_limit: float | None

    @property
    def key(self) -> tuple[str, int, int]:
        """The instance it is about, as :attr:`Record.key` names it."""
        return (self.set_name, self.spec_index, self.instance)


def instance_seed(run_seed: int, spec_index: int, instance: int) -> int:
    """A 63-bit seed per instance, from numpy's SeedSequence: independent streams, stable across runs."""
    state = np.random.SeedSequence([run_seed, spec_index, instance]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def work_items(
    set_name: str,
    n_instances: int,
    algorithms: Sequence[str],
    *,
    seed: int = 0,
    time_limit: float | None = None,
    tasks: Sequence[int] | None = None,
) -> list[WorkItem]:
    """Items numbered by the family's place in the *full* set and the instance number.

    Seeds depend only on (run seed, family, instance number), so a reduced set
    (``tasks``) or fewer instances per family are subsets of the full run, and
    a run can later be extended with more instances.
    """
    if n_instances < 1:
        raise InputError(f"instances: {n_instances} must be at least 1")
    if not algorithms:
        raise InputError("algorithms: at least one algorithm is needed")
    for label in algorithms:
        parse_label(label)  # refuses a bad budget before anything runs
    specs(set_name, tasks)  # validates the task counts
    return [
        WorkItem(set_name, i, k, spec, instance_seed(seed, i, k), tuple(algorithms), time_limit)
        for i, spec in enumerate(specs(set_name))
        if tasks is None or spec.tasks in tasks
        for k in range(n_instances)
    ]


@dataclass(frozen=True)
class Record:
    """One algorithm on one instance.  ``min_yield`` is the bound for ``lpbound``."""

    set_name: str
    spec_index: int
    instance: int
    seed: int
    hosts: int
    tasks: int
    jobs: int
    slack: float
    cv_mem: float
    cv_cpu: float
    algorithm: str
    feasible: bool
    min_yield: float | None
    avg_yield: float | None
    runtime_s: float
    optimal: bool | None = None
    error: str | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        """Identifies the instance the record is about."""
        return (self.set_name, self.spec_index, self.instance)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a missing run time (the solver raised) becomes null rather than NaN."""
        d = asdict(self)
        if math.isnan(self.runtime_s):
            d["runtime_s"] = None
        return d

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Record:
        names = {f.name for f in fields(cls)}
        missing = names - set(raw) - {"optimal", "error"}
        if missing:
            raise InputError(f"record: missing field {sorted(missing)[0]!r}")
        kept = {k: v for k, v in raw.items() if k in names}
        if kept["runtime_s"] is None:
            kept["runtime_s"] = math.nan
        return cls(**kept)


def run_item(item: WorkItem) -> list[Record]:
    """Generate one instance and run every algorithm on it, validating each allocation.

    An algorithm given as ``name@S`` (:func:`parse_label`) runs with a time limit of S seconds instead of the
    item's.
    A solver that raises, or returns an allocation the validator rejects,
    gets a record with ``error`` set and ``feasible=False``: one bad instance
    must not lose an hour of results, and the report lists every error.
    """
    instance = generate(item.spec, item.seed)
    options = SolveOptions(seed=item.seed % 2**32, time_limit=item.time_limit)
    blank = Record(
        set_name=item.set_name, spec_index=item.spec_index, instance=item.instance, seed=item.seed,
        hosts=item.spec.hosts, tasks=item.spec.tasks, jobs=instance.n_jobs, slack=item.spec.slack,
        cv_mem=item.spec.cv_mem, cv_cpu=item.spec.cv_cpu,
        algorithm="", feasible=False, min_yield=None, avg_yield=None, runtime_s=math.nan,
    )
    records = []
    for label in item.algorithms:
        name, budget = parse_label(label)
        try:
            result = solve(instance, name, options if budget is None else replace(options, time_limit=budget))
        except (VcschedError, ArithmeticError, ValueError, RuntimeError) as exc:
            records.append(replace(blank, algorithm=label, error=f"{type(exc).__name__}: {exc}"))
            continue
        error = None
        if result.allocation is not None:
            problems = allocation_problems(instance, result.allocation, min_yield=result.min_yield,
                                           avg_yield=result.avg_yield)
            if problems:
                error = "invalid allocation: " + "; ".join(problems[:3])
        records.append(replace(
            blank, algorithm=label, feasible=result.feasible and error is None,
            min_yield=result.min_yield, avg_yield=result.avg_yield, runtime_s=result.runtime_s,
            optimal=result.optimal, error=error,
        ))
    return records


def run_items(items: Sequence[WorkItem], jobs: int = 1,
              on_progress: OnProgress | None = None) -> Iterator[list[Record]]:
    """:func:`run_item` on each item, in ``jobs`` worker processes (in this one when ``jobs`` is 1).

    Yields each item's records as soon as they are there (in completion order
    with workers), so that the caller can save them as it goes; the results
    do not depend on ``jobs``.  ``on_progress`` is called here, in the
    caller's process: once before the first item, then after each.
    """
    return map_items(run_item, items, jobs, on_progress)


# ---------------------------------------------------------------- resuming a run

#: Run parameters that must match for a resumed run to reuse earlier records.
#: (More instances per family or more task counts are fine: seeds do not depend on them.)
RESUME_KEYS = ("set", "seed", "algorithms", "time_limit")


@dataclass(frozen=True)
class Resumable:
    """What an earlier run left: the records of the instances it finished, and the wall time it took."""

    records: list[Record]
    wall_s: float


def resumable_records(doc: Any, meta: Mapping[str, Any], source: str) -> Resumable:
    """The records of a saved run (``doc``: ``{"meta": ..., "records": [...]}``) that a run with ``meta`` reuses.

    Only whole instances (a record for each of the run's algorithms) of the
    run's task counts are kept.  A saved run with other parameters
    (:data:`RESUME_KEYS`), or with more instances per family than this run,
    is an InputError naming ``source`` (the file it came from).
    """
    old = doc.get("meta", {}) if isinstance(doc, dict) else {}
    for key in RESUME_KEYS:
        if old.get(key) != meta[key]:
            raise InputError(f"{source} was made with {key}={old.get(key)!r}, this run has "
                             f"{key}={meta[key]!r}; use another --output")
    if int(old.get("instances_per_spec", 0)) > meta["instances_per_spec"]:
        raise InputError(f"{source} has {old.get('instances_per_spec')} instances per family, more than "
                         f"this run's {meta['instances_per_spec']}; use at least as many")
    wanted = set(meta["tasks"])
    records = [r for r in (Record.from_dict(x) for x in doc.get("records", [])) if r.tasks in wanted]
    per_instance: dict[tuple[str, int, int], int] = {}
    for r in records:
        per_instance[r.key] = per_instance.get(r.key, 0) + 1
    complete = {k for k, n in per_instance.items() if n == len(meta["algorithms"])}
    return Resumable([r for r in records if r.key in complete], float(old.get("wall_s", 0.0)))


def missing_items(items: Iterable[WorkItem], records: Iterable[Record]) -> list[WorkItem]:
    """The items whose instance has no records yet: what is left of a run."""
    done = {r.key for r in records}
    return [i for i in items if i.key not in done]


def in_run_order(records: Iterable[Record], algorithms: Sequence[str]) -> list[Record]:
    """Records by family, instance, and the run's algorithm order: the same file whatever the workers did."""
    order = {n: i for i, n in enumerate(algorithms)}
    return sorted(records, key=lambda r: (r.spec_index, r.instance, order[r.algorithm]))


# ---------------------------------------------------------------- aggregation


def by_instance(records: Iterable[Record]) -> dict[tuple[str, int, int], dict[str, Record]]:
    out: dict[tuple[str, int, int], dict[str, Record]] = defaultdict(dict)
    for r in records:
        out[r.key][r.algorithm] = r
    return dict(out)


def best_min_yield(per_algo: dict[str, Record], among: Collection[str] | None = None) -> float | None:
    """Highest minimum yield any placing algorithm (of ``among``, if given) found.

    The LP bound is never "best": it is not a placement.
    """
    found = [r.min_yield for a, r in per_algo.items()
             if a != BOUND and (among is None or a in among) and r.feasible and r.min_yield is not None]
    return max(found) if found else None


@dataclass(frozen=True)
class Degradation:
    """% degradation from best (section 4.2) over the instances where the algorithm succeeded."""

    algorithm: str
    avg: float
    max: float
    succeeded: int
    failed: int  # instances some algorithm solved but this one did not


def degradation(records: Iterable[Record], among: Collection[str] | None = None) -> dict[str, Degradation]:
    """Per algorithm: avg and max of ``100 (best - mine) / best`` where it succeeded.

    ``among`` restricts both the candidates for "best" and the rows: the
    paper's Tables 1 and 7 compare the eight MCB variants among themselves.
    """
    values: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    algos: set[str] = set()
    for per_algo in by_instance(records).values():
        best = best_min_yield(per_algo, among)
        for a, r in per_algo.items():
            if a == BOUND or (among is not None and a not in among):
                continue
            algos.add(a)
            if best is None:
                continue
            if r.feasible and r.min_yield is not None:
                values[a].append(percent_gap(r.min_yield, best))
            else:
                failed[a] += 1
    return {
        a: Degradation(a, statistics.fmean(values[a]) if values[a] else math.nan,
                       max(values[a]) if values[a] else math.nan, len(values[a]), failed[a])
        for a in sorted(algos)
    }


def ranking(table: dict[str, Degradation], algorithms: Sequence[str]) -> list[str]:
    """``algorithms`` ordered by average degradation (best first), those without results last."""
    present = [a for a in algorithms if a in table and not math.isnan(table[a].avg)]
    return sorted(present, key=lambda a: table[a].avg)


def failures_by_slack(records: Iterable[Record]) -> dict[str, dict[float, int]]:
    """Per algorithm and slack: instances some algorithm solved but this one did not."""
    out: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for per_algo in by_instance(records).values():
        if best_min_yield(per_algo) is None:
            continue
        for a, r in per_algo.items():
            if a != BOUND and not r.feasible:
                out[a][r.slack] += 1
    return {a: dict(v) for a, v in out.items()}


def unsolved_by_slack(records: Iterable[Record]) -> dict[float, tuple[int, int]]:
    """Per slack: (instances no algorithm placed, instances)."""
    out: dict[float, list[int]] = defaultdict(lambda: [0, 0])
    for per_algo in by_instance(records).values():
        slack = next(iter(per_algo.values())).slack
        out[slack][1] += 1
        if best_min_yield(per_algo) is None:
            out[slack][0] += 1
    return {s: (v[0], v[1]) for s, v in sorted(out.items())}


def mean_by(records: Iterable[Record], attr: str, group: str) -> dict[str, dict[Any, float]]:
    """Mean of ``attr`` per algorithm and value of ``group`` over successful records."""
    acc: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        value = getattr(r, attr)
        ok = r.error is None and (attr == "runtime_s" or r.feasible)
        if ok and value is not None and not (isinstance(value, float) and math.isnan(value)):
            acc[r.algorithm][getattr(r, group)].append(float(value))
    return {a: {g: statistics.fmean(v) for g, v in sorted(gs.items())} for a, gs in acc.items()}


@dataclass(frozen=True)
class Gap:
    """Mean and max of ``100 (upper - lower) / upper`` and how many instances it is over."""

    mean: float
    max: float
    count: int


def percent_gap(value: float, reference: float) -> float:
    """``100 (reference - value) / reference``: how far ``value`` is below ``reference``, in % of it."""
    return 100.0 * (reference - value) / reference


def _gap(gaps: list[float]) -> Gap:
    if not gaps:
        return Gap(math.nan, math.nan, 0)
    return Gap(statistics.fmean(gaps), max(gaps), len(gaps))


def milp_gaps(records: Iterable[Record], heuristic: str = REFERENCE) -> dict[str, Gap]:
    """On instances the MILP solved to proven optimality: how far below it ``heuristic`` is,
    and how far above it the LP bound is (paper: about 2% and 4% on the small set)."""
    below: list[float] = []
    above: list[float] = []
    for per_algo in by_instance(records).values():
        m = per_algo.get(EXACT)
        if m is None or not m.feasible or not m.optimal or m.min_yield is None:
            continue
        h = per_algo.get(heuristic)
        if h is not None and h.feasible and h.min_yield is not None:
            below.append(percent_gap(h.min_yield, m.min_yield))
        b = per_algo.get(BOUND)
        if b is not None and b.feasible and b.min_yield is not None:
            above.append(-percent_gap(b.min_yield, m.min_yield))  # the bound's excess, in % of the optimum
    return {"heuristic_below_milp": _gap(below), "bound_above_milp": _gap(above)}


def bound_gap_by_slack(records: Iterable[Record], heuristic: str = REFERENCE) -> dict[float, Gap]:
    """``100 (LP bound - heuristic) / LP bound`` per slack (paper: MCB8 near 0 for s >= 0.3 at scale)."""
    gaps: dict[float, list[float]] = defaultdict(list)
    for per_algo in by_instance(records).values():
        b, h = per_algo.get(BOUND), per_algo.get(heuristic)
        if b and h and b.feasible and h.feasible and b.min_yield is not None and h.min_yield is not None:
            gaps[h.slack].append(percent_gap(h.min_yield, b.min_yield))
    return {s: _gap(g) for s, g in sorted(gaps.items())}


def milp_status(records: Iterable[Record]) -> dict[str, int]:
    """How the MILP runs ended: proven optimal, placement without proof (time limit), nothing found."""
    out = {"optimal": 0, "not_proven": 0, "no_placement": 0, "error": 0}
    for r in records:
        if r.algorithm != EXACT:
            continue
        if r.error:
            out["error"] += 1
        elif r.feasible and r.optimal:
            out["optimal"] += 1
        elif r.feasible:
            out["not_proven"] += 1
        else:
            out["no_placement"] += 1
    return out


@dataclass(frozen=True)
class AnytimeSummary:
    """How one algorithm (typically ``best`` at one budget) does against the MILP, MCB8 and the LP bound.

    Percentages are ``percent_gap`` per instance, then averaged: ``below_milp``
    over instances where both it and the MILP (proven optimal) placed;
    ``below_bound`` and ``reference_below_bound`` over the instances where it
    *and* the reference placed (the same instances for both, so they compare);
    ``closed`` = ``1 - below_bound.mean / reference_below_bound.mean`` (the share
    of the reference's mean gap to the bound it closes) and ``closed_each`` the
    mean of that share per instance, over the instances where the reference is
    more than 1e-9 below the bound; ``gain`` = ``100 (mine - reference) /
    reference``.  ``failed_milp_feasible``: instances the MILP placed and it did
    not; ``worse`` / ``better``: instances below / above the reference (by more
    than 1e-9 relative); ``time``: mean and max seconds (the registry's
    ``runtime_s``).
    """

    algorithm: str
    instances: int
    below_milp: Gap
    failed_milp_feasible: int
    below_bound: Gap
    reference_below_bound: Gap
    closed: float
    closed_each: float
    gain: Gap
    worse: int
    better: int
    failed_reference_placed: int
    mean_s: float
    max_s: float


def anytime_summary(records: Iterable[Record], algorithm: str, reference: str = REFERENCE) -> AnytimeSummary:
    """:class:`AnytimeSummary` of ``algorithm`` against ``reference`` (MCB8), the MILP and the LP bound."""
    below_milp: list[float] = []
    below_bound: list[float] = []
    ref_below: list[float] = []
    closed_each: list[float] = []
    gains: list[float] = []
    times: list[float] = []
    failed_milp = worse = better = failed_ref = n = 0
    for per_algo in by_instance(records).values():
        mine = per_algo.get(algorithm)
        if mine is None:
            continue
        n += 1
        if not math.isnan(mine.runtime_s):
            times.append(mine.runtime_s)
        placed = mine.feasible and mine.min_yield is not None
        m, b, ref = per_algo.get(EXACT), per_algo.get(BOUND), per_algo.get(reference)
        if m is not None and m.feasible and m.min_yield is not None:
            if not placed:
                failed_milp += 1
            elif m.optimal:
                below_milp.append(percent_gap(mine.min_yield, m.min_yield))  # type: ignore[arg-type]
        ref_placed = ref is not None and ref.feasible and ref.min_yield is not None
        if ref_placed and not placed:
            failed_ref += 1
        if not (placed and ref_placed):
            continue
        assert mine.min_yield is not None and ref is not None and ref.min_yield is not None
        gains.append(100.0 * (mine.min_yield - ref.min_yield) / ref.min_yield)
        if mine.min_yield < ref.min_yield * (1 - YIELD_TOLERANCE):
            worse += 1
        elif mine.min_yield > ref.min_yield * (1 + YIELD_TOLERANCE):
            better += 1
        if b is not None and b.feasible and b.min_yield is not None:
            g_mine, g_ref = percent_gap(mine.min_yield, b.min_yield), percent_gap(ref.min_yield, b.min_yield)
            below_bound.append(g_mine)
            ref_below.append(g_ref)
            if g_ref > 1e-7:
                closed_each.append(1.0 - g_mine / g_ref)
    mine_gap, ref_gap = _gap(below_bound), _gap(ref_below)
    closed = 1.0 - mine_gap.mean / ref_gap.mean if ref_gap.count and ref_gap.mean > 0 else math.nan
    return AnytimeSummary(
        algorithm=algorithm, instances=n, below_milp=_gap(below_milp), failed_milp_feasible=failed_milp,
        below_bound=mine_gap, reference_below_bound=ref_gap, closed=closed,
        closed_each=statistics.fmean(closed_each) if closed_each else math.nan, gain=_gap(gains),
        worse=worse, better=better, failed_reference_placed=failed_ref,
        mean_s=statistics.fmean(times) if times else math.nan, max_s=max(times) if times else math.nan,
    )


def _anytime_section(records: Sequence[Record], labels: Sequence[str]) -> list[str]:
    rows = []
    for a in labels:
        s = anytime_summary(records, a)
        rows.append([a, str(s.instances), _fmt(s.below_milp.mean), _fmt(s.below_milp.max),
                     str(s.failed_milp_feasible), _fmt(s.gain.mean), f"{s.better}/{s.worse}",
                     _fmt(s.below_bound.mean), _fmt(s.reference_below_bound.mean),
                     _fmt(100 * s.closed, 1), _fmt(100 * s.closed_each, 1),
                     _fmt(1e3 * s.mean_s, 1), _fmt(1e3 * s.max_s, 1)])
    return ["", "## Anytime search against MCB8, the MILP and the LP bound", "",
            f"Per instance, then averaged (`vcsched.experiments.paper.anytime_summary`): % below the MILP optimum "
            f"(proven optima only) and failures where the MILP placed; % gain over {REFERENCE} and instances "
            f"better/worse than it; % below the LP bound for the algorithm and for {REFERENCE} on the same "
            f"instances; share of {REFERENCE}'s mean gap closed (ratio of the means, and mean of the per-instance "
            "shares); solver time (`runtime_s`, ms).", "",
            _table(["algorithm", "instances", "below MILP avg %", "max %", "failed (MILP placed)",
                    f"gain over {REFERENCE} %", "better/worse", "below bound %", f"{REFERENCE} below bound %",
                    "gap closed %", "closed per inst. %", "mean ms", "max ms"], rows)]


# ---------------------------------------------------------------- report


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _degradation_table(table: dict[str, Degradation], order: Sequence[str],
                       paper: dict[str, tuple[float, float]]) -> str:
    rows = []
    for a in order:
        d = table.get(a)
        p = paper.get(a)
        row = [a, _fmt(d.avg if d else None), _fmt(d.max if d else None),
               str(d.succeeded if d else 0), str(d.failed if d else 0)]
        rows.append(row + ([_fmt(p[0]) if p else "", _fmt(p[1]) if p else ""] if paper else []))
    header = ["algorithm", "avg %", "max %", "placed", "failed"]
    return _table(header + (["paper avg %", "paper max %"] if paper else []), rows)


def report_markdown(records: Sequence[Record], meta: dict[str, Any]) -> str:
    """The run's report: every table the paper's section 4 discusses that this run has data for."""
    set_name = str(meta.get("set", "?"))
    algos = [a for a in meta.get("algorithms", []) if a != BOUND]
    n_inst = len(by_instance(records))
    out = [f"# vcsched experiment: {set_name} set", ""]
    out.append(
        f"{n_inst} instances ({meta.get('instances_per_spec')} per family, {meta.get('families')} families, "
        f"task counts {meta.get('tasks')}), run seed {meta.get('seed')}, "
        f"algorithms {', '.join(meta.get('algorithms', []))}, "
        f"MILP time limit {meta.get('time_limit')} s, {meta.get('jobs')} worker processes, wall time "
        f"{_fmt(meta.get('wall_s'), 0)} s on {meta.get('machine', '?')}; code {meta.get('code', '?')}."
    )
    paper = PAPER_DEGRADATION.get(set_name, {})
    mcbs = [a for a in algos if a in PAPER_MCB_RANKING]
    if len(mcbs) > 1:
        table = degradation(records, among=mcbs)
        out += ["", "## MCB variants: % degradation from best (section 4.2.1, Tables 1 and 7)", "",
                "As in the paper's tables, best = highest minimum yield among the MCB variants on the instance; "
                "averages and maxima over the instances where the variant found a placement."]
        out += ["", _degradation_table(table, ranking(table, mcbs), paper)]
        order = ranking(table, mcbs)
        if len(order) == len(PAPER_MCB_RANKING):
            same = tuple(order) == PAPER_MCB_RANKING
            out += ["", f"Ranking by average degradation: {', '.join(order)} "
                        f"({'the same as' if same else 'differs from'} the paper's {', '.join(PAPER_MCB_RANKING)})."]
    table = degradation(records)
    out += ["", "## All algorithms: % degradation from best", "",
            "best = highest minimum yield any algorithm of this run found on the instance (the LP bound excluded)."]
    order = ranking(table, algos) + [a for a in algos if a not in ranking(table, algos)]
    out += ["", _degradation_table(table, order, {})]
    unsolved = unsolved_by_slack(records)
    fails = failures_by_slack(records)
    slacks = list(unsolved)
    out += ["", "## Failures vs slack", "",
            "Instances on which the algorithm found no placement although another algorithm did; "
            "last row: instances no algorithm placed."]
    rows = [[a, *[str(fails.get(a, {}).get(s, 0)) for s in slacks]] for a in algos]
    rows.append(["(none placed)", *[f"{unsolved[s][0]}/{unsolved[s][1]}" for s in slacks]])
    out += ["", _table(["algorithm", *[f"s={s:g}" for s in slacks]], rows)]
    for attr, title in (("min_yield", "Minimum yield vs slack"), ("avg_yield", "Average yield vs slack")):
        means = mean_by(records, attr, "slack")
        names = [*algos, BOUND] if attr == "min_yield" else algos
        out += ["", f"## {title}", "", "Mean over the instances the algorithm placed"
                + (" (lpbound: the bound)." if attr == "min_yield" else ".")]
        rows = [[a, *[_fmt(means.get(a, {}).get(s), 3) for s in slacks]] for a in names if a in means]
        out += ["", _table(["algorithm", *[f"s={s:g}" for s in slacks]], rows)]
    times = mean_by(records, "runtime_s", "tasks")
    task_counts = sorted({r.tasks for r in records})
    out += ["", "## Run time vs tasks", "", "Mean solver time in ms (`runtime_s` from the registry, "
            "which includes the average-yield phase)."]
    rows = [[a, *[_fmt(1e3 * times[a][t], 2) if t in times.get(a, {}) else "–" for t in task_counts]]
            for a in [*algos, BOUND] if a in times]
    out += ["", _table(["algorithm", *[f"J={t}" for t in task_counts]], rows)]
    if EXACT in algos:
        st = milp_status(records)
        g = milp_gaps(records)
        out += ["", "## MILP and LP bound (section 4.2)", "",
                f"MILP runs: {st['optimal']} proven optimal, {st['not_proven']} placement without proof "
                f"(time limit), {st['no_placement']} no placement, {st['error']} errors.", "",
                _table(["comparison", "mean %", "max %", "instances", "paper"], [
                    [f"{REFERENCE} below the MILP optimum", _fmt(g['heuristic_below_milp'].mean),
                     _fmt(g['heuristic_below_milp'].max), str(g['heuristic_below_milp'].count), "about 2%"],
                    ["LP bound above the MILP optimum", _fmt(g['bound_above_milp'].mean),
                     _fmt(g['bound_above_milp'].max), str(g['bound_above_milp'].count), "about 4%"],
                ])]
    if REFERENCE in algos:
        bg = bound_gap_by_slack(records)
        out += ["", f"## {REFERENCE} vs the LP bound by slack", "",
                f"`100 (bound - {REFERENCE}) / bound` where both exist (paper, large set: near 0 for s >= 0.3, "
                "8% at 0.2, 37% at 0.1)."]
        out += ["", _table(["slack", "mean %", "max %", "instances"],
                           [[f"{s:g}", _fmt(g.mean), _fmt(g.max), str(g.count)] for s, g in bg.items()])]
    anytime = [a for a in algos if parse_label(a)[1] is not None or parse_label(a)[0] == "best"]
    if anytime:
        out += _anytime_section(records, anytime)
    errors = [r for r in records if r.error]
    out += ["", "## Errors", ""]
    if errors:
        out.append(f"{len(errors)} solver errors or invalid allocations (counted as failures):")
        out += [f"- {r.algorithm} on family {r.spec_index} instance {r.instance} (seed {r.seed}): {r.error}"
                for r in errors[:50]]
    else:
        out.append("None: every allocation passed `vcsched.validate`.")
    return "\n".join(out) + "\n"
