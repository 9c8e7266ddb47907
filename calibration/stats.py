"""Pure statistics on progress traces: effective rate, error, overhead, response time.

Paper section 7 (assumption H5) judges CPU caps by three numbers, all computed
here from plain data so they can be tested on synthetic traces:

* **overhead** — slowdown of an uncapped subject under the capping mechanism
  relative to the bare hardware rate (Xen: 0.27% on average);
* **absolute error** — ``|effective rate - cap * bare rate|`` expressed in
  percentage points of the bare rate (Xen: 0.72% average, 5.99% worst);
* **response time** — delay after a cap change until the effective rate agrees
  with the new cap (Xen: under one second).

A *trace* is a subject's cumulative work sampled at increasing times.  Work
between two samples is assumed to grow linearly; the cgroup workload writes a
sample at the end of every small batch of DGEMMs, so that assumption holds to
within one batch (see ``calibration.workload``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Trace:
    """Cumulative work of one subject: ``work[i]`` units done by time ``times[i]`` (seconds)."""

    times: tuple[float, ...]
    work: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times) != len(self.work):
            raise ValueError(f"trace has {len(self.times)} times but {len(self.work)} work values")
        if any(b < a for a, b in zip(self.times, self.times[1:], strict=False)):
            raise ValueError("trace times must not decrease")

    @classmethod
    def from_points(cls, points: Sequence[tuple[float, float]]) -> Trace:
        return cls(tuple(float(t) for t, _ in points), tuple(float(w) for _, w in points))

    def work_at(self, t: float | np.ndarray) -> np.ndarray:
        """Work done by time ``t`` (linear between samples); outside the trace it is undefined."""
        lo, hi = self.times[0], self.times[-1]
        ts = np.atleast_1d(np.asarray(t, dtype=float))
        if ts.size and (ts.min() < lo - 1e-9 or ts.max() > hi + 1e-9):
            raise ValueError(f"time outside the trace [{lo:.3f}, {hi:.3f}] s")
        return np.interp(ts, np.asarray(self.times), np.asarray(self.work))


def mean_rate(trace: Trace, start: float, end: float) -> float:
    """Average work per second over ``[start, end]``."""
    if end <= start:
        raise ValueError(f"empty interval [{start}, {end}]")
    w = trace.work_at(np.array([start, end]))
    return float((w[1] - w[0]) / (end - start))


def window_rates(trace: Trace, start: float, end: float, window: float, stride: float) -> tuple[np.ndarray, np.ndarray]:
    """Rates over the windows ``[s, s + window]`` for ``s = start, start + stride, ...`` ending by ``end``.

    Returns ``(window starts, rates)``.  A window as long as the CFS period
    (100 ms) sees exactly one quota's worth of run time whatever its phase,
    which is why the CLI uses that length by default.
    """
    if window <= 0 or stride <= 0:
        raise ValueError("window and stride must be positive")
    n = int(np.floor((end - window - start) / stride + 1e-9)) + 1
    if n <= 0:
        return np.empty(0), np.empty(0)
    starts = start + stride * np.arange(n)
    rates = (trace.work_at(starts + window) - trace.work_at(starts)) / window
    return starts, rates


def absolute_error(measured: float, expected: float, bare: float) -> float:
    """``|measured - expected|`` as a fraction of the bare rate (the paper's 'absolute error')."""
    if bare <= 0:
        raise ValueError(f"bare rate must be positive, got {bare}")
    return abs(measured - expected) / bare


def overhead(bare: float, uncapped: float) -> float:
    """Slowdown of an uncapped subject under the mechanism: ``1 - uncapped / bare`` (negative = faster)."""
    if bare <= 0:
        raise ValueError(f"bare rate must be positive, got {bare}")
    return 1.0 - uncapped / bare


def response_time(
    trace: Trace,
    step_at: float,
    expected: float,
    tolerance: float,
    window: float,
    stride: float,
    end: float | None = None,
    confirm: float | None = None,
) -> float | None:
    """Seconds after ``step_at`` from which every ``window``-long rate stays within ±tolerance of ``expected``.

    The tolerance is relative to the new expected rate ("within 5% of the new
    expected rate").  Windows start every ``stride`` seconds from ``step_at``
    and look forward, so a response of 0 means the very first window after the
    change already agreed.

    "Stays" means until ``end`` (default, and at the latest: the end of the
    trace) when ``confirm`` is None; otherwise for ``confirm`` seconds of
    window starts.  The confirmed form lets a later disturbance by other load
    on a shared CPU not erase a cap that did take effect; ``in_band_fraction``
    reports how often the rate was out of the band anyway.  ``None`` means it
    never settled — reported as such, never as a number.
    """
    if expected <= 0:
        raise ValueError(f"expected rate must be positive, got {expected}")
    stop = trace.times[-1] if end is None else min(end, trace.times[-1])
    starts, rates = window_rates(trace, step_at, stop, window, stride)
    if starts.size == 0:
        return None
    bad = np.abs(rates - expected) > tolerance * expected
    if confirm is not None:
        need = round(confirm / stride) + 1  # consecutive in-band window starts covering ``confirm`` seconds
        good_run = 0
        for k, b in enumerate(bad):
            good_run = 0 if b else good_run + 1
            if good_run >= need:
                return float(starts[k - need + 1] - step_at)
        return None
    if not bad.any():
        return 0.0
    last_bad = int(np.flatnonzero(bad)[-1])
    if last_bad == starts.size - 1:
        return None
    return float(starts[last_bad + 1] - step_at)


def in_band_fraction(
    trace: Trace, start: float, end: float, expected: float, tolerance: float, window: float, stride: float
) -> float | None:
    """Fraction of the ``window``-long rates in ``[start, end]`` within ±tolerance (relative) of ``expected``."""
    starts, rates = window_rates(trace, start, min(end, trace.times[-1]), window, stride)
    if starts.size == 0:
        return None
    return float(np.mean(np.abs(rates - expected) <= tolerance * expected))


@dataclass(frozen=True)
class ErrorSummary:
    """Mean and worst absolute error (fractions of the bare rate) over ``count`` measurements."""

    mean: float
    worst: float
    count: int


def summarize_errors(errors: Sequence[float]) -> ErrorSummary:
    if not errors:
        raise ValueError("no measurements to summarize")
    a = np.asarray(errors, dtype=float)
    return ErrorSummary(mean=float(a.mean()), worst=float(a.max()), count=int(a.size))
