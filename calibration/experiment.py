"""The calibration protocol of paper section 7, over any backend that can cap CPU-bound subjects.

Phases, all on one physical CPU (the paper ran every VM on one CPU and the
experiment controller on the other):

1. **bare** — subject 0 outside any limit: the reference rate (the paper's
   "compute rate measured on the raw hardware");
2. **uncapped** — subject 0 under the mechanism with no limit: the overhead.
   Phases 1 and 2 alternate ``pairs`` times: the overhead is a fraction of a
   percent while a shared machine's speed drifts by percents, so one pair
   alone would mostly measure the drift;
3. **accuracy** — for n = 1..N concurrent subjects and every cap c with
   n * c <= 1: each runs capped at c; expected rate = c * bare;
4. **responsiveness** — subject 0 steps from a low cap to a high one and back;
   the response time is how long the rate takes to stay within the tolerance;
5. **bare again** — the reference is measured before and after and averaged,
   and the drift between the two is reported: on a shared machine it shows how
   much other load moved the baseline during the run.

Backends with no "outside" (a VM's vCPU time: see ``hypervisor.caps_probe``)
declare a ``nominal_bare`` rate instead and phases 1 and 5 are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from calibration.stats import (
    ErrorSummary,
    Trace,
    absolute_error,
    in_band_fraction,
    mean_rate,
    overhead,
    response_time,
    summarize_errors,
)
from vcsched.errors import InputError

SAMPLE_INTERVAL = 0.01  # controller polling period; the cgroup workload timestamps its own points
SETTLE = 0.3  # default wait after (re)starting or re-capping, before measuring: a few CFS periods


class Subjects(Protocol):
    """``count`` CPU-bound subjects on one CPU whose cap can be changed and whose progress can be read.

    ``poll`` returns the points ``(time, work, cpu seconds)`` observed since the
    previous poll: work in ``unit`` (what the paper measures: matrix
    multiplications), and the CPU time the subject was given (what a cap
    rations).  A backend that can only see CPU time returns it for both.
    """

    unit: str
    count: int
    nominal_bare: float | None
    default_window: float

    def resume(self, index: int) -> None: ...
    def pause(self, index: int) -> None: ...
    def set_cap(self, index: int, cap: float | None) -> None: ...
    def make_bare(self, index: int) -> None: ...
    def poll(self, index: int) -> Sequence[tuple[float, float, float]]: ...


@dataclass(frozen=True)
class Config:
    caps: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0)
    workers: int = 1
    duration: float = 2.0
    tolerance: float = 0.05
    steps: tuple[float, float] = (0.25, 0.75)
    window: float = 0.1
    stride: float = 0.01
    settle: float = SETTLE
    confirm: float | None = 1.0  # seconds the rate must stay in band to count as settled (None: to the end)
    pairs: int = 3  # alternating bare / uncapped measurements for the overhead

    def __post_init__(self) -> None:
        for i, c in enumerate(self.caps):
            if not 0 < c <= 1:
                raise InputError(f"caps[{i}]: {c:g} is outside (0, 1]")
        if not self.caps:
            raise InputError("caps: empty list")
        if self.workers < 1:
            raise InputError(f"workers: {self.workers} is below 1")
        if self.duration <= 0:
            raise InputError(f"duration: {self.duration:g} is not positive")
        if not 0 < self.tolerance < 1:
            raise InputError(f"tolerance: {self.tolerance:g} is outside (0, 1)")
        lo, hi = self.steps
        for name, c in (("low", lo), ("high", hi)):
            if not 0 < c <= 1:
                raise InputError(f"steps.{name}: {c:g} is outside (0, 1]")
        if lo >= hi:
            raise InputError(f"steps: low cap {lo:g} must be below high cap {hi:g}")
        if self.confirm is not None and self.confirm <= 0:
            raise InputError(f"confirm: {self.confirm:g} s is not positive")
        if self.pairs < 1:
            raise InputError(f"pairs: {self.pairs} is below 1")
        if self.settle < 0:
            raise InputError(f"settle: {self.settle:g} s is negative")
        if self.window <= 0 or self.window >= self.duration:
            raise InputError(f"window: {self.window:g} s must be positive and shorter than the duration")

    @property
    def effective_confirm(self) -> float | None:
        """The confirmation span actually used: ``confirm``, but never more than a hold can show."""
        return None if self.confirm is None else min(self.confirm, self.duration - self.window)

    def cap_runs(self) -> list[tuple[int, float]]:
        """(concurrent subjects, cap) pairs measured for accuracy: caps on one CPU sum to at most 1."""
        return [(n, c) for n in range(1, self.workers + 1) for c in self.caps if n * c <= 1 + 1e-9]

    def planned_seconds(self, bare_measured: bool) -> float:
        phase = self.settle + self.duration
        bare = (self.pairs + 1) * phase if bare_measured else 0.0
        return bare + self.pairs * phase + len(self.cap_runs()) * phase + self.settle + 3 * self.duration


@dataclass(frozen=True)
class Measured:
    """One subject over one measurement: work per second, and CPU seconds it was given per second."""

    rate: float
    share: float


@dataclass(frozen=True)
class CapRun:
    """n subjects capped at ``cap`` each: what they got against what the cap promises.

    Errors are absolute, in units of the bare value (the paper's "absolute
    error"): ``rate_errors`` on work done against ``cap * bare rate`` (the
    paper's metric), ``share_errors`` on CPU seconds per second received
    against ``cap`` itself (the cap's own currency and definition, immune to
    the machine running faster or slower meanwhile).
    """

    workers: int
    cap: float
    expected: Measured
    measured: tuple[Measured, ...]
    rate_errors: tuple[float, ...]
    share_errors: tuple[float, ...]


@dataclass(frozen=True)
class Step:
    """A cap change on a running subject and how long it took to follow (None: not within tolerance)."""

    from_cap: float
    to_cap: float
    at: float  # seconds from the start of the responsiveness traces
    rate_response: float | None
    share_response: float | None
    rate_in_band: float | None  # fraction of the hold's windows within the tolerance band
    share_in_band: float | None


@dataclass(frozen=True)
class Result:
    backend: str
    unit: str
    cpu: int
    config: Config
    bare_before: Measured | None
    bare_after: Measured | None
    bare: Measured  # mean of every bare measurement (or the nominal value)
    uncapped: Measured  # mean of the uncapped measurements
    bare_runs: tuple[Measured, ...]  # the paired bare measurements, in order (empty when nominal)
    uncapped_runs: tuple[Measured, ...]
    rate_overhead: float
    share_overhead: float
    runs: tuple[CapRun, ...]
    rate_error: ErrorSummary
    share_error: ErrorSummary
    steps: tuple[Step, ...]
    step_work: Trace  # subject 0 through the responsiveness phase (for the plot)
    step_cpu: Trace
    #: What was capped: ``cpu``, or ``disk``/``net`` (rates are then fractions of a reference rate of bytes/s:
    #: one guest uncapped, measured first; the "bare" rate is that nominal 1, and the "overhead" how far the
    #: uncapped runs strayed from it).
    resource: str = "cpu"

    @property
    def bare_drift(self) -> float | None:
        """Relative change of the bare rate between the start and the end of the run."""
        if self.bare_before is None or self.bare_after is None:
            return None
        return self.bare_after.rate / self.bare_before.rate - 1.0


Progress = Callable[[str, float], None]  # (what is running, seconds of the plan completed since last call)
Traces = tuple[Trace, Trace]  # (work, CPU time) of one subject


def _record(subjects: Subjects, indices: Sequence[int], seconds: float, progress: Progress, label: str) -> list[Traces]:
    """Poll the subjects for ``seconds``; one (work, CPU) trace pair each, points deduplicated by time."""
    points: list[list[tuple[float, float, float]]] = [[] for _ in indices]
    for i in indices:
        subjects.poll(i)  # drop what came before: a trace starts with this recording
    start = time.monotonic()
    last_tick = start
    while True:
        for k, i in enumerate(indices):
            for p in subjects.poll(i):
                if not points[k] or p[0] > points[k][-1][0]:
                    points[k].append(p)
        now = time.monotonic()
        if now - last_tick >= 0.1:
            progress(label, now - last_tick)
            last_tick = now
        if now - start >= seconds:
            break
        time.sleep(SAMPLE_INTERVAL)
    progress(label, time.monotonic() - last_tick)
    return [_split(p) for p in points]


def _split(points: Sequence[tuple[float, float, float]]) -> Traces:
    times = tuple(p[0] for p in points)
    return Trace(times, tuple(p[1] for p in points)), Trace(times, tuple(p[2] for p in points))


def _span(traces: Traces) -> Measured:
    """Mean rates between the first and last point: exact for self-timestamped points (see workload)."""
    work, cpu = traces
    if len(work.times) < 2 or work.times[-1] <= work.times[0]:
        raise RuntimeError("a subject made no progress during a measurement (is it frozen or dead?)")
    lo, hi = work.times[0], work.times[-1]
    return Measured(rate=mean_rate(work, lo, hi), share=mean_rate(cpu, lo, hi))


def measure(
    subjects: Subjects,
    indices: Sequence[int],
    duration: float,
    progress: Progress | None = None,
    label: str = "",
    settle: float = SETTLE,
) -> list[Measured]:
    """Run the given subjects together for ``settle + duration`` seconds; what each achieved (then paused)."""
    tick: Progress = progress or (lambda _label, _s: None)
    for i in indices:
        subjects.resume(i)
    try:
        time.sleep(settle)
        tick(label, settle)
        traces = _record(subjects, indices, duration, tick, label)
    finally:
        for i in indices:
            subjects.pause(i)
    return [_span(t) for t in traces]


def run(subjects: Subjects, cfg: Config, backend: str, cpu: int, progress: Progress | None = None) -> Result:
    """Run every phase and return the measurements.  The caller owns ``subjects`` (and closes it)."""
    if subjects.count < cfg.workers:
        raise ValueError(f"{subjects.count} subjects for {cfg.workers} workers")
    tick: Progress = progress or (lambda _label, _s: None)

    bare_runs: list[Measured] = []
    uncapped_runs: list[Measured] = []
    for k in range(cfg.pairs):
        if subjects.nominal_bare is None:
            subjects.make_bare(0)
            bare_runs += measure(subjects, [0], cfg.duration, tick, f"bare rate ({k + 1}/{cfg.pairs})", cfg.settle)
        subjects.set_cap(0, None)
        label = f"uncapped in the mechanism ({k + 1}/{cfg.pairs})"
        uncapped_runs += measure(subjects, [0], cfg.duration, tick, label, cfg.settle)
    uncapped = _mean(uncapped_runs)
    bare_before = bare_runs[0] if bare_runs else None
    bare_after = None

    runs_raw: list[tuple[int, float, list[Measured]]] = []
    for n, cap in cfg.cap_runs():
        for i in range(n):
            subjects.set_cap(i, cap)
        got = measure(subjects, list(range(n)), cfg.duration, tick, f"{n} x cap {cap:g}", cfg.settle)
        runs_raw.append((n, cap, got))

    lo, hi = cfg.steps
    subjects.set_cap(0, lo)
    subjects.resume(0)
    try:
        time.sleep(cfg.settle)
        tick("cap steps", cfg.settle)
        t0 = time.monotonic()
        marks: list[tuple[float, float, float]] = []  # (time of the change, from, to)
        segments = _record(subjects, [0], cfg.duration, tick, f"cap steps: {lo:g}")
        for before, after in ((lo, hi), (hi, lo)):
            marks.append((time.monotonic(), before, after))
            subjects.set_cap(0, after)
            segments += _record(subjects, [0], cfg.duration, tick, f"cap steps: {before:g} -> {after:g}")
    finally:
        subjects.pause(0)

    if subjects.nominal_bare is None:
        subjects.make_bare(0)
        (bare_after,) = measure(subjects, [0], cfg.duration, tick, "bare rate again (drift check)", cfg.settle)
        bare = _mean([*bare_runs, bare_after])
        paired_bare = _mean(bare_runs)
    else:
        bare = paired_bare = Measured(subjects.nominal_bare, subjects.nominal_bare)

    runs = tuple(_cap_run(n, cap, got, bare) for n, cap, got in runs_raw)
    work = _join([w for w, _ in segments], t0)
    cpu_trace = _join([c for _, c in segments], t0)

    confirm = cfg.effective_confirm

    def respond(trace: Trace, at: float, expected: float) -> float | None:
        return response_time(
            trace, at, expected, cfg.tolerance, cfg.window, cfg.stride, end=at + cfg.duration, confirm=confirm
        )

    def in_band(trace: Trace, at: float, expected: float) -> float | None:
        return in_band_fraction(trace, at, at + cfg.duration, expected, cfg.tolerance, cfg.window, cfg.stride)

    steps = tuple(
        Step(
            from_cap=before,
            to_cap=after,
            at=at - t0,
            rate_response=respond(work, at - t0, after * bare.rate),
            share_response=respond(cpu_trace, at - t0, after),
            rate_in_band=in_band(work, at - t0, after * bare.rate),
            share_in_band=in_band(cpu_trace, at - t0, after),
        )
        for at, before, after in marks
    )
    return Result(
        backend=backend,
        unit=subjects.unit,
        cpu=cpu,
        config=cfg,
        bare_before=bare_before,
        bare_after=bare_after,
        bare=bare,
        uncapped=uncapped,
        bare_runs=tuple(bare_runs),
        uncapped_runs=tuple(uncapped_runs),
        rate_overhead=overhead(paired_bare.rate, uncapped.rate),
        share_overhead=overhead(paired_bare.share, uncapped.share),
        runs=runs,
        rate_error=summarize_errors([e for r in runs for e in r.rate_errors]),
        share_error=summarize_errors([e for r in runs for e in r.share_errors]),
        steps=steps,
        step_work=work,
        step_cpu=cpu_trace,
        resource=getattr(subjects, "resource", "cpu"),
    )


def _mean(ms: Sequence[Measured]) -> Measured:
    return Measured(sum(m.rate for m in ms) / len(ms), sum(m.share for m in ms) / len(ms))


def _cap_run(n: int, cap: float, got: Sequence[Measured], bare: Measured) -> CapRun:
    expected = Measured(cap * bare.rate, cap)
    return CapRun(
        workers=n,
        cap=cap,
        expected=expected,
        measured=tuple(got),
        rate_errors=tuple(absolute_error(m.rate, expected.rate, bare.rate) for m in got),
        share_errors=tuple(absolute_error(m.share, expected.share, 1.0) for m in got),
    )


def _join(segments: Sequence[Trace], t0: float) -> Trace:
    """One trace from consecutive recordings of the same subject, times relative to ``t0``."""
    points: list[tuple[float, float]] = []
    for seg in segments:
        for t, w in zip(seg.times, seg.work, strict=True):
            if not points or t - t0 > points[-1][0]:
                points.append((t - t0, w))
    return Trace.from_points(points)
