"""The one binary search on the yield (vcsched.solvers.yield_search): its documented contract."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcsched.solvers.yield_search import bisect_yield


class Threshold:
    """A monotone predicate: feasible up to ``limit``; records every probe and answers with the probe itself."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.probes: list[float] = []

    def __call__(self, y: float) -> float | None:
        self.probes.append(y)
        return y if y <= self.limit else None


def test_the_first_probe_is_the_midpoint() -> None:
    pred = Threshold(0.3)
    bisect_yield(pred, 0.0, 0.8, 1e-3)
    assert pred.probes[0] == 0.4


def test_the_search_stops_once_the_interval_is_below_the_precision() -> None:
    pred = Threshold(0.3)
    s = bisect_yield(pred, 0.0, 1.0, 1e-3)
    assert 0 < s.gap < 1e-3
    assert len(pred.probes) == s.probes == 10  # 1 / 2**10 < 1e-3 <= 1 / 2**9


def test_it_returns_the_highest_successful_probe_and_what_the_predicate_returned_there() -> None:
    pred = Threshold(0.3)
    s = bisect_yield(pred, 0.0, 1.0, 1e-6)
    assert s.y == max(p for p in pred.probes if p <= 0.3)
    assert s.found == s.y
    assert 0.3 - 1e-6 < s.y <= 0.3


def test_nothing_found_when_every_probe_fails() -> None:
    s = bisect_yield(Threshold(-1.0), 0.0, 1.0, 1e-2)
    assert s.found is None and s.y is None and s.probes > 0


def test_there_is_always_at_least_one_probe() -> None:
    pred = Threshold(1.0)
    s = bisect_yield(pred, 0.0, 0.5, 0.9)
    assert pred.probes == [0.25] and s.found == 0.25


def test_the_ends_are_not_probed_unless_asked() -> None:
    pred = Threshold(1.0)
    bisect_yield(pred, 0.1, 0.9, 1e-3)
    assert all(0.1 < p < 0.9 for p in pred.probes)


def test_a_successful_upper_probe_ends_the_search() -> None:
    pred = Threshold(1.0)
    s = bisect_yield(pred, 0.0, 0.7, 1e-3, probe_upper=True)
    assert pred.probes == [0.7] and s.y == 0.7 and s.gap == 0.0


def test_a_failed_upper_probe_goes_on_with_the_bisection() -> None:
    pred = Threshold(0.5)
    s = bisect_yield(pred, 0.0, 0.8, 1e-3, probe_upper=True)
    assert pred.probes[:2] == [0.8, 0.4]
    assert s.y is not None and 0.5 - 1e-3 < s.y <= 0.5


def test_a_failed_lower_probe_ends_the_search_with_nothing() -> None:
    pred = Threshold(0.01)
    s = bisect_yield(pred, 0.1, 0.8, 1e-3, probe_upper=True, probe_lower=True)
    assert pred.probes == [0.8, 0.1] and s.found is None


def test_a_successful_lower_probe_is_kept_when_no_midpoint_succeeds() -> None:
    pred = Threshold(0.1)
    s = bisect_yield(pred, 0.1, 0.8, 1e-3, probe_lower=True)
    assert pred.probes[0] == 0.1 and s.y == 0.1 and s.found == 0.1


def test_the_precision_must_be_positive() -> None:
    with pytest.raises(ValueError, match="precision"):
        bisect_yield(Threshold(1.0), 0.0, 1.0, 0.0)


@settings(max_examples=200, deadline=None)
@given(limit=st.floats(-0.5, 1.5), upper=st.floats(0.01, 1.0), precision=st.sampled_from([1e-1, 1e-4, 1e-9]),
       probe_upper=st.booleans())
def test_a_monotone_predicate_is_solved_to_the_precision(limit: float, upper: float, precision: float,
                                                         probe_upper: bool) -> None:
    s = bisect_yield(Threshold(limit), 0.0, upper, precision, probe_upper=probe_upper)
    best = min(limit, upper)  # the highest feasible yield in (0, upper]
    if s.y is None:
        assert best < precision or best <= 0.0
    else:
        assert s.y <= best and best - s.y < precision
        assert s.found == s.y
    assert s.probes >= 1 and (s.gap == 0.0 or s.gap < precision)
