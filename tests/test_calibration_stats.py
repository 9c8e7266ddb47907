"""Specification of the calibration statistics, on synthetic traces with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calibration.stats import (
    Trace,
    absolute_error,
    mean_rate,
    overhead,
    response_time,
    summarize_errors,
    window_rates,
)


def steady(rate: float, duration: float, dt: float = 0.01, t0: float = 0.0) -> Trace:
    t = t0 + np.arange(0, duration + dt / 2, dt)
    return Trace(tuple(t), tuple(rate * (t - t0)))


def cfs_bursts(bare: float, cap: float, duration: float, period: float = 0.1, dt: float = 0.001) -> Trace:
    """A subject that runs at ``bare`` for ``cap * period`` at the start of every period, then is throttled."""
    t = np.arange(0, duration + dt / 2, dt)
    full, part = np.divmod(t, period)
    work = bare * (full * cap * period + np.minimum(part, cap * period))
    return Trace(tuple(t), tuple(work))


def step_trace(before: float, after: float, step_at: float, lag: float, duration: float) -> Trace:
    """Rate ``before`` until ``step_at + lag``, then ``after`` (the cap took ``lag`` seconds to bite)."""
    t = np.arange(0, duration + 0.0005, 0.001)
    switch = step_at + lag
    work = np.where(t < switch, before * t, before * switch + after * (t - switch))
    return Trace(tuple(t), tuple(work))


def test_mean_rate_of_a_steady_trace_is_its_rate() -> None:
    assert mean_rate(steady(250.0, 2.0), 0.3, 1.7) == pytest.approx(250.0)


def test_mean_rate_interpolates_between_samples() -> None:
    trace = Trace((0.0, 1.0), (0.0, 10.0))
    assert mean_rate(trace, 0.25, 0.75) == pytest.approx(10.0)


def test_mean_rate_refuses_an_interval_outside_the_trace() -> None:
    with pytest.raises(ValueError, match="outside the trace"):
        mean_rate(steady(1.0, 1.0), 0.5, 2.0)


def test_trace_refuses_decreasing_times() -> None:
    with pytest.raises(ValueError, match="must not decrease"):
        Trace((0.0, 1.0, 0.5), (0.0, 1.0, 2.0))


def test_cfs_throttled_trace_averages_to_cap_times_bare() -> None:
    assert mean_rate(cfs_bursts(400.0, 0.25, 3.0), 0.0, 3.0) == pytest.approx(100.0)


@given(phase=st.floats(min_value=0.0, max_value=0.099), cap=st.sampled_from([0.05, 0.1, 0.25, 0.5, 0.75]))
def test_a_window_of_one_cfs_period_sees_exactly_one_quota_whatever_its_phase(phase: float, cap: float) -> None:
    trace = cfs_bursts(1000.0, cap, 1.0)
    _, rates = window_rates(trace, phase, phase + 0.1, window=0.1, stride=0.1)
    assert rates[0] == pytest.approx(1000.0 * cap, rel=1e-6)


def test_window_rates_cover_the_interval_with_the_given_stride() -> None:
    starts, rates = window_rates(steady(10.0, 1.0), 0.0, 1.0, window=0.2, stride=0.1)
    assert starts == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    assert rates == pytest.approx([10.0] * 9)


def test_absolute_error_is_in_units_of_the_bare_rate() -> None:
    # 25% cap of a 400/s subject expects 100/s; measuring 104/s is 1 point of the bare rate off.
    assert absolute_error(104.0, 100.0, 400.0) == pytest.approx(0.01)


def test_overhead_is_the_relative_slowdown_of_the_uncapped_rate() -> None:
    assert overhead(bare=200.0, uncapped=199.0) == pytest.approx(0.005)
    assert overhead(bare=200.0, uncapped=201.0) == pytest.approx(-0.005)


def test_summary_reports_mean_and_worst() -> None:
    s = summarize_errors([0.01, 0.03, 0.02])
    assert (s.mean, s.worst, s.count) == (pytest.approx(0.02), pytest.approx(0.03), 3)


def test_immediate_cap_change_has_zero_response_time() -> None:
    trace = step_trace(before=100.0, after=50.0, step_at=1.0, lag=0.0, duration=3.0)
    assert response_time(trace, 1.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.01) == 0.0


def test_response_time_is_the_lag_before_the_new_rate_holds() -> None:
    # Windows look forward: the first window entirely after the switch starts at the switch itself.
    trace = step_trace(before=100.0, after=50.0, step_at=1.0, lag=0.35, duration=3.0)
    rt = response_time(trace, 1.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.01)
    assert rt is not None
    assert rt == pytest.approx(0.35, abs=0.011)


def test_upward_step_response_time_is_measured_the_same_way() -> None:
    trace = step_trace(before=25.0, after=75.0, step_at=0.5, lag=0.2, duration=2.0)
    rt = response_time(trace, 0.5, expected=75.0, tolerance=0.05, window=0.1, stride=0.01)
    assert rt is not None
    assert rt == pytest.approx(0.2, abs=0.011)


def test_response_time_is_none_when_the_rate_never_settles() -> None:
    trace = step_trace(before=100.0, after=50.0, step_at=1.0, lag=5.0, duration=3.0)
    assert response_time(trace, 1.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.01) is None


def test_a_late_excursion_resets_the_response_time() -> None:
    # Settles at once, but a 100 ms stall at t=2.0 s means the rate did not *stay* in tolerance before it.
    t = np.arange(0, 3.0005, 0.001)
    rate = np.where((t >= 2.0) & (t < 2.1), 0.0, 50.0)
    work = np.concatenate([[0.0], np.cumsum(rate[:-1] * 0.001)])
    trace = Trace(tuple(t), tuple(work))
    rt = response_time(trace, 1.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.01)
    assert rt is not None
    assert rt == pytest.approx(1.1, abs=0.011)


def test_tolerance_is_relative_to_the_expected_rate() -> None:
    # 4% slow: inside a 5% tolerance, outside a 3% one.
    trace = steady(48.0, 2.0)
    assert response_time(trace, 0.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.05) == 0.0
    assert response_time(trace, 0.0, expected=50.0, tolerance=0.03, window=0.1, stride=0.05) is None
