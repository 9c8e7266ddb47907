"""What a run measures, per class and overall, and confidence intervals over independent replications.

* **mean service rate** ``γ_k = λ_k E[S_k] / E[n_k]`` (Bonald & Roberts, "Enhanced
  Cluster Computing Performance through Proportional Fairness", §3.3: the
  mean size over the mean completion time, by Little's law; they write
  ``λ_k / E[n_k]`` with sizes of mean ``1/μ_k = 1``), with ``S_k`` the time a VC
  takes alone at full speed and ``E[n_k]`` the time-average number of class-k
  VCs in the system (waiting for memory included) over the measurement
  window.  1 at zero load; ``1 − ρ`` for processor sharing;
* completion time (arrival to end, waiting included): mean, 50th, 95th and
  99th percentile; **slowdown** (stretch): completion time over the time the
  VC would take alone at full speed; waiting time for memory;
* for a class of **permanent** VCs (never leaving): their mean yield, which is
  their service rate (Bonald & Roberts §3.4's ``γ_1 = Σ_n π(n) φ_1(n)``);
* per fluid resource, the mean **utilisation** (what the VCs get over the
  cluster's capacity); the time-average of **Jain's index** of the running VCs'
  yields (each VC's yield on its dominant resource) and of their **mean yield**
  (over the time some VC runs); under altruism, how much
  the altruistic VCs gave away, per resource.

The **warm-up** arrivals are not measured; the time averages run from the
first measured arrival to the last one, and the run continues (arrivals
included) until every measured VC has left, so that no completion time is
cut short.  Replications use independent seeds; a summary gives the mean
and the half-width of its 95 % Student-t confidence interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class ClassResult:
    name: str
    rate: float  # arrival rate λ_k used for γ_k
    size: float  # mean size E[S_k]: time alone at full speed
    mean_in_system: float
    service_rate: float | None  # γ_k; None for a class without arrivals
    completions: int
    mean_time: float | None
    p50_time: float | None
    p95_time: float | None
    p99_time: float | None
    mean_slowdown: float | None
    p95_slowdown: float | None
    mean_wait: float | None
    permanent_yield: float | None  # mean yield of the class's permanent VCs


@dataclass(frozen=True)
class RunResult:
    """One replication of one configuration."""

    policy: str
    replication: int
    seed: int
    classes: tuple[ClassResult, ...]
    utilisation: dict[str, float]
    jain: float
    given: dict[str, float]  # altruism: mean amount given away per resource, over capacity
    window: tuple[float, float]
    events: int
    wall_s: float
    migrated_bytes: int = 0
    engine: dict[str, int] = field(default_factory=dict)
    max_in_progress: int = 0
    mean_in_progress: float = 0.0
    completion: dict[int, float] = field(default_factory=dict, compare=False, repr=False)  # VC id -> its time
    mean_yield: float | None = None  # time average of the running VCs' mean yield (None: task-based mode)

    def to_dict(self, *, jobs: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not jobs:
            d.pop("completion")
        return d


class Tally:
    """Time integrals over the measurement window, accumulated event by event."""

    def __init__(self, n_classes: int, n_res: int) -> None:
        self.start = math.inf
        self.end = math.inf
        self.count = [0] * n_classes  # in the system now
        self.area = [0.0] * n_classes  # ∫ n_k dt
        self.perm_area = [0.0] * n_classes  # ∫ Σ permanent yields dt
        self.use = [0.0] * n_res  # now, all VCs
        self.use_area = [0.0] * n_res
        self.given = [0.0] * n_res
        self.given_area = [0.0] * n_res
        self.jain_area = 0.0
        self.jain_time = 0.0
        self.yield_area = 0.0  # ∫ (mean yield of the running VCs) dt, while some run
        self.busy_time = 0.0  # time with some VC running
        self.sum_y = 0.0
        self.sum_y2 = 0.0
        self.running = 0
        self.run_area = 0.0
        self.perm_rate = [0.0] * n_classes
        self.max_running = 0

    def advance(self, t0: float, t1: float) -> None:
        a, b = max(t0, self.start), min(t1, self.end)
        if b <= a:
            return
        dt = b - a
        for k, c in enumerate(self.count):
            if c:
                self.area[k] += c * dt
        for k, v in enumerate(self.perm_rate):
            if v:
                self.perm_area[k] += v * dt
        for r, u in enumerate(self.use):
            self.use_area[r] += u * dt
        for r, g in enumerate(self.given):
            if g:
                self.given_area[r] += g * dt
        if self.running and self.sum_y2 > 0:
            self.jain_area += self.sum_y * self.sum_y / (self.running * self.sum_y2) * dt
            self.jain_time += dt
        if self.running:
            self.yield_area += self.sum_y / self.running * dt
            self.busy_time += dt
        self.run_area += self.running * dt


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def class_result(name: str, rate: float, size: float, area: float, span: float, times: Sequence[float],
                 slowdowns: Sequence[float], waits: Sequence[float], perm_area: float, permanent: int
                 ) -> ClassResult:
    mean_n = area / span if span > 0 else 0.0
    return ClassResult(
        name=name, rate=rate, size=size, mean_in_system=mean_n,
        service_rate=(rate * size / mean_n if mean_n > 0 else None) if rate > 0 else None,
        completions=len(times),
        mean_time=float(np.mean(times)) if len(times) else None,
        p50_time=percentile(times, 50), p95_time=percentile(times, 95), p99_time=percentile(times, 99),
        mean_slowdown=float(np.mean(slowdowns)) if len(slowdowns) else None,
        p95_slowdown=percentile(slowdowns, 95),
        mean_wait=float(np.mean(waits)) if len(waits) else None,
        permanent_yield=perm_area / (span * permanent) if permanent and span > 0 else None,
    )


# ---------------------------------------------------------------------------------------------- replications


@dataclass(frozen=True)
class Estimate:
    """Mean over replications and the half-width of its 95 % confidence interval (None with one replication)."""

    mean: float
    ci: float | None
    n: int

    def contains(self, value: float, slack: float = 0.0) -> bool:
        half = (self.ci or 0.0) + slack
        return abs(self.mean - value) <= half

    def __str__(self) -> str:
        return f"{self.mean:.4f}" if self.ci is None else f"{self.mean:.4f} ± {self.ci:.4f}"


def estimate(values: Sequence[float | None]) -> Estimate | None:
    x = np.array([v for v in values if v is not None], dtype=float)
    if len(x) == 0:
        return None
    if len(x) == 1:
        return Estimate(float(x[0]), None, 1)
    from scipy.stats import t  # lazy: scipy costs ~0.4 s to import

    half = float(t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return Estimate(float(x.mean()), half, len(x))


CLASS_METRICS = ("service_rate", "mean_in_system", "mean_time", "p50_time", "p95_time", "p99_time",
                 "mean_slowdown", "p95_slowdown", "mean_wait", "permanent_yield")


@dataclass(frozen=True)
class Summary:
    """Every metric of one configuration over its replications."""

    policy: str
    replications: int
    classes: dict[str, dict[str, Estimate | None]]
    utilisation: dict[str, Estimate | None]
    jain: Estimate | None
    given: dict[str, Estimate | None]
    mean_yield: Estimate | None
    events: int
    wall_s: float
    migrated_bytes: Estimate | None
    mean_in_progress: Estimate | None
    max_in_progress: int
    engine: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        def est(e: Estimate | None) -> dict[str, Any] | None:
            return None if e is None else {"mean": e.mean, "ci95": e.ci, "n": e.n}

        return {
            "policy": self.policy, "replications": self.replications,
            "classes": {k: {m: est(e) for m, e in v.items()} for k, v in self.classes.items()},
            "utilisation": {r: est(e) for r, e in self.utilisation.items()},
            "jain": est(self.jain), "given": {r: est(e) for r, e in self.given.items()},
            "mean_yield": est(self.mean_yield),
            "events": self.events, "wall_s": self.wall_s, "migrated_bytes": est(self.migrated_bytes),
            "mean_in_progress": est(self.mean_in_progress), "max_in_progress": self.max_in_progress,
            "engine": self.engine,
        }


def summarize(runs: Sequence[RunResult]) -> Summary:
    if not runs:
        raise ValueError("summarize: no runs")
    names = [c.name for c in runs[0].classes]
    classes = {name: {m: estimate([getattr(r.classes[i], m) for r in runs]) for m in CLASS_METRICS}
               for i, name in enumerate(names)}
    engine: dict[str, int] = {}
    for r in runs:
        for k, v in r.engine.items():
            engine[k] = engine.get(k, 0) + v
    return Summary(
        policy=runs[0].policy, replications=len(runs), classes=classes,
        utilisation={res: estimate([r.utilisation[res] for r in runs]) for res in runs[0].utilisation},
        jain=estimate([r.jain for r in runs]),
        given={res: estimate([r.given[res] for r in runs]) for res in runs[0].given},
        mean_yield=estimate([r.mean_yield for r in runs]),
        events=sum(r.events for r in runs), wall_s=sum(r.wall_s for r in runs),
        migrated_bytes=estimate([float(r.migrated_bytes) for r in runs]),
        mean_in_progress=estimate([r.mean_in_progress for r in runs]),
        max_in_progress=max(r.max_in_progress for r in runs), engine=engine,
    )
