"""Specification of the calibration statistics, on synthetic traces with known answers."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calibration.experiment import Config, run
from calibration.report import markdown, plot, result_to_dict
from calibration.stats import (
    Trace,
    absolute_error,
    in_band_fraction,
    mean_rate,
    overhead,
    response_time,
    summarize_errors,
    window_rates,
)
from vcsched.errors import InputError


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


# --- the protocol (calibration.experiment) on simulated subjects --------------------


class SimulatedSubjects:
    """Subjects whose caps take effect exactly and at once: the protocol must report zero error.

    ``slowdown`` makes every capped or uncapped run that much slower than bare,
    as a mechanism's overhead would.
    """

    unit = "ops/s"
    nominal_bare: float | None = None
    default_window = 0.1

    def __init__(self, count: int, bare: float = 1000.0, slowdown: float = 0.0):
        self.count, self.bare, self.slowdown = count, bare, slowdown
        self.cap: list[float | None] = [None] * count
        self.in_group = [False] * count
        self.running = [False] * count
        self.work = [0.0] * count
        self.since = [time.monotonic()] * count

    def _speed(self, i: int) -> float:
        if not self.running[i]:
            return 0.0
        if not self.in_group[i]:
            return self.bare
        c = self.cap[i]
        return self.bare * (1 - self.slowdown) * (1.0 if c is None else c)

    def _advance(self, i: int) -> float:
        now = time.monotonic()
        self.work[i] += self._speed(i) * (now - self.since[i])
        self.since[i] = now
        return now

    def resume(self, i: int) -> None:
        self._advance(i)
        self.running[i] = True

    def pause(self, i: int) -> None:
        self._advance(i)
        self.running[i] = False

    def set_cap(self, i: int, cap: float | None) -> None:
        self._advance(i)
        self.in_group[i], self.cap[i] = True, cap

    def make_bare(self, i: int) -> None:
        self._advance(i)
        self.in_group[i] = False

    def poll(self, i: int) -> list[tuple[float, float, float]]:
        now = self._advance(i)
        return [(now, self.work[i], self.work[i] / self.bare)]


FAST = Config(caps=(0.25, 0.5), workers=2, duration=0.12, steps=(0.25, 0.75), window=0.04, stride=0.01, settle=0.02)
ONE = Config(caps=(0.5,), duration=0.12, window=0.04, settle=0.02, pairs=2)


def test_exact_caps_give_zero_error_and_immediate_response() -> None:
    result = run(SimulatedSubjects(2), FAST, backend="sim", cpu=0)
    assert [(r.workers, r.cap) for r in result.runs] == [(1, 0.25), (1, 0.5), (2, 0.25), (2, 0.5)]
    assert result.bare.rate == pytest.approx(1000.0, rel=1e-3)
    assert result.rate_error.worst < 1e-3
    assert result.share_error.worst < 1e-3
    assert all(s.rate_response == 0.0 and s.share_response == 0.0 for s in result.steps)
    assert [(s.from_cap, s.to_cap) for s in result.steps] == [(0.25, 0.75), (0.75, 0.25)]


def test_a_mechanism_that_slows_work_shows_as_overhead_and_error() -> None:
    exact = run(SimulatedSubjects(1), ONE, backend="sim", cpu=0)
    assert exact.rate_overhead == pytest.approx(0.0, abs=1e-3)
    slow = run(SimulatedSubjects(1, slowdown=0.04), ONE, backend="sim", cpu=0)
    assert slow.rate_overhead == pytest.approx(0.04, abs=2e-3)
    (r,) = slow.runs
    assert r.rate_errors[0] == pytest.approx(0.02, abs=2e-3)  # 0.5 x 4% of the bare rate


def test_only_caps_that_fit_one_cpu_together_are_measured() -> None:
    cfg = Config(caps=(0.1, 0.25, 0.5, 1.0), workers=4)
    assert cfg.cap_runs() == [(1, 0.1), (1, 0.25), (1, 0.5), (1, 1.0), (2, 0.1), (2, 0.25), (2, 0.5),
                              (3, 0.1), (3, 0.25), (4, 0.1), (4, 0.25)]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"caps": (0.5, 1.2)}, "caps[1]"), ({"duration": 0.0}, "duration"), ({"workers": 0}, "workers"),
     ({"steps": (0.75, 0.25)}, "steps"), ({"tolerance": 0.0}, "tolerance"), ({"window": 5.0}, "window"),
     ({"settle": -1.0}, "settle"), ({"pairs": 0}, "pairs")],
)
def test_config_names_the_bad_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError, match=re.escape(field)):
        Config(**kwargs)


def test_json_document_carries_every_measurement() -> None:
    result = run(SimulatedSubjects(1), ONE, backend="sim", cpu=3)
    doc = json.loads(json.dumps(result_to_dict(result, {"loadavg_1m": 0.1})))
    assert doc["cpu"] == 3 and doc["conditions"] == {"loadavg_1m": 0.1}
    assert doc["runs"][0]["cap"] == 0.5 and len(doc["runs"][0]["measured"]) == 1
    assert doc["xen_reference"]["max_error"] == 0.0599
    assert len(doc["overhead_pairs"]) == 2 and doc["overhead_pairs"][0]["bare"]["rate"] > 0
    assert "| mean absolute error |" in markdown(result)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    result = run(SimulatedSubjects(1), ONE, backend="sim", cpu=0)
    out = tmp_path / "calib.png"
    plot(result, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_confirmed_response_ignores_a_disturbance_after_the_rate_held() -> None:
    # Same trace as above: in band from the step on, a stall 1.0 s later.  Held for 0.5 s: settled at once.
    t = np.arange(0, 3.0005, 0.001)
    rate = np.where((t >= 2.0) & (t < 2.1), 0.0, 50.0)
    work = np.concatenate([[0.0], np.cumsum(rate[:-1] * 0.001)])
    trace = Trace(tuple(t), tuple(work))
    assert response_time(trace, 1.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.01, confirm=0.5) == 0.0


def test_confirmed_response_needs_the_whole_confirmation_span() -> None:
    trace = step_trace(before=100.0, after=50.0, step_at=1.0, lag=0.35, duration=3.0)
    rt = response_time(trace, 1.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.01, confirm=0.5)
    assert rt == pytest.approx(0.35, abs=0.011)
    assert response_time(trace, 1.0, expected=50.0, tolerance=0.05, window=0.1, stride=0.01, confirm=5.0) is None


def test_in_band_fraction_counts_windows_within_tolerance() -> None:
    trace = step_trace(before=100.0, after=50.0, step_at=1.0, lag=0.0, duration=3.0)
    # Windows start at 0.50, 0.51, ..., 1.40 (91 of them); one starting before 0.995 s holds more than
    # 5 ms of the old rate (2.5/s too much on 50/s) and is out of band: 41 of 91 are in.
    frac = in_band_fraction(trace, 0.5, 1.5, expected=50.0, tolerance=0.05, window=0.1, stride=0.01)
    assert frac is not None
    assert frac == pytest.approx(41 / 91, abs=0.012)
