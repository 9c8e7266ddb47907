"""Studies: every policy at every load, independent replications, one progress callback.

:func:`sweep` runs the fluid simulator (:mod:`vcsched.simulate.fluid`) and
:func:`sweep_tasks` the task-based one (:mod:`vcsched.simulate.tasks`) for
each (policy, load) point, ``replications`` times with independent seeds
(replication ``r`` of every point uses the same streams: the policies are
compared on the same arrivals), and summarise each point with confidence
intervals (:func:`vcsched.simulate.metrics.summarize`).  Like the other long
runs of :mod:`vcsched.experiments` they print nothing and report progress
through ``on_progress(done, total, description)``, first with ``done = 0`` and
last with ``done = total``; the unit is one arrival.

:func:`lateness` pairs two runs VC by VC (same seed: the same VCs): how many
finished later under altruism than under the fair policy alone, and by how much.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.experiments import OnProgress
from vcsched.simulate.fluid import Arrival, RunOptions, simulate
from vcsched.simulate.metrics import RunResult, Summary, summarize
from vcsched.simulate.tasks import TaskWorkload, simulate_tasks
from vcsched.simulate.workload import Workload, check_stable


@dataclass(frozen=True)
class Point:
    """One (policy, load) point of a study: its summary and the replications behind it."""

    policy: str
    load: float | None  # the most loaded resource's load; None: the workload's own rates (or a trace)
    summary: Summary
    runs: tuple[RunResult, ...]
    reference: Summary | None = None  # with altruism: the same policy without it, on the same arrivals
    lateness: tuple[Lateness, ...] = ()  # with altruism: per replication, paired against the reference

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"policy": self.policy, "load": self.load, **self.summary.to_dict()}
        if self.reference is not None:
            d["without_altruism"] = self.reference.to_dict()
            d["lateness"] = [dataclasses.asdict(x) for x in self.lateness]
        return d


def scaled(workload: Workload, load: float | None, *, trace: bool = False) -> Workload:
    """The workload at ``load`` (None: its own rates), refused if unstable (a finite trace always ends)."""
    w = workload if load is None else workload.scaled_to_load(load)
    if not trace:
        check_stable(w)
    return w


class _Progress:
    """A sweep's progress over its runs: each run reports within its own slice of the total."""

    def __init__(self, total: int, on_progress: OnProgress | None) -> None:
        self.total, self.on_progress, self.done = total, on_progress, 0
        if on_progress:
            on_progress(0, total, "starting")

    def run(self, label: str, length: int) -> OnProgress:
        """The callback of the next run (``length`` steps), reporting as ``label``."""
        offset, self.done = self.done, self.done + length

        def inner(d: int, _t: int, _desc: str) -> None:
            if self.on_progress:
                self.on_progress(offset + d, self.total, label)

        return inner

    def finish(self) -> None:
        if self.on_progress:
            self.on_progress(self.total, self.total, "done")


def sweep(workload: Workload, policies: Sequence[str], loads: Sequence[float | None], base: RunOptions,
          replications: int = 1, trace: Sequence[Arrival] | None = None,
          on_progress: OnProgress | None = None, tolerance: float = 0.05) -> list[Point]:
    """Every policy at every load (``None``: the workload's own rates), ``replications`` times each.

    With altruism, every replication is run a second time without it (same seed, same VCs) and the two are
    paired VC by VC (:func:`lateness`: the share of VCs finishing later by more than ``tolerance``).
    """
    workloads = [scaled(workload, load, trace=trace is not None) for load in loads]  # refuse before running
    if trace is not None and len(trace) <= base.warmup:
        raise InputError(f"trace: {len(trace)} arrivals, not more than the {base.warmup} of the warm-up")
    per_run = len(trace) if trace is not None else base.warmup + base.arrivals
    paired = base.altruism > 0
    progress = _Progress(len(loads) * len(policies) * replications * per_run * (2 if paired else 1), on_progress)
    points = []
    for load, w in zip(loads, workloads, strict=True):
        for policy in policies:
            runs, refs, late = [], [], []
            for r in range(replications):
                opts = dataclasses.replace(base, policy=policy, replication=r, record=base.record or paired)
                label = f"{policy}" + (f" load {load:g}" if load is not None else "") + f" rep {r + 1}/{replications}"
                variants = [(opts, label)]
                if paired:
                    variants.append((dataclasses.replace(opts, altruism=0.0), label + " (no altruism)"))
                out = []
                for o, lab in variants:
                    out.append(simulate(w, o, trace, progress.run(lab, per_run)))
                runs.append(out[0])
                if paired:
                    refs.append(out[1])
                    late.append(lateness(out[0], out[1], tolerance))
            points.append(Point(policy, load, summarize(runs), tuple(runs),
                                summarize(refs) if paired else None, tuple(late)))
    progress.finish()
    return points


def sweep_tasks(workload: TaskWorkload, policies: Sequence[str], loads: Sequence[float], *, arrivals: int,
                warmup: int, seed: int = 0, replications: int = 1, on_progress: OnProgress | None = None
                ) -> list[Point]:
    """The task-based mode (Bonald & Roberts §4) at every load, ``replications`` times each."""
    workloads = [workload.scaled_to_load(load) for load in loads]
    per_run = warmup + arrivals
    progress = _Progress(len(loads) * len(policies) * replications * per_run, on_progress)
    points = []
    for load, w in zip(loads, workloads, strict=True):
        for policy in policies:
            runs = []
            for r in range(replications):
                label = f"{policy} load {load:g} rep {r + 1}/{replications}"
                runs.append(simulate_tasks(w, policy, arrivals=arrivals, warmup=warmup, seed=seed, replication=r,
                                           on_progress=progress.run(label, per_run)))
            points.append(Point(policy, load, summarize(runs), tuple(runs)))
    progress.finish()
    return points


@dataclass(frozen=True)
class Lateness:
    """Paired per-VC comparison of a run against a reference run (same seed, same VCs)."""

    vcs: int
    mean_ratio: float  # mean of (completion time / reference completion time)
    later: float  # fraction of VCs finishing later than in the reference by more than ``tolerance``
    worst: float  # largest ratio
    p99: float
    tolerance: float
    mean_time: float
    reference_mean_time: float


def lateness(run: RunResult, reference: RunResult, tolerance: float = 0.05) -> Lateness:
    """How much later VCs finished in ``run`` than in ``reference`` (both recorded with ``record=True``)."""
    common = sorted(set(run.completion) & set(reference.completion))
    if not common:
        raise ValueError("lateness: no VC completed in both runs (were they recorded with record=True?)")
    mine = np.array([run.completion[i] for i in common])
    ref = np.array([reference.completion[i] for i in common])
    ratio = mine / ref
    return Lateness(vcs=len(common), mean_ratio=float(ratio.mean()), later=float(np.mean(ratio > 1 + tolerance)),
                    worst=float(ratio.max()), p99=float(np.percentile(ratio, 99)), tolerance=tolerance,
                    mean_time=float(mine.mean()), reference_mean_time=float(ref.mean()))
