"""Invariants every registered placing algorithm must keep, checked on random small instances.

The algorithm list comes from :func:`vcsched.solvers.registry.algorithms`, so new
algorithms (e.g. mcb1..mcb8) are covered as soon as they register.  The exact
MILP is the referee: no algorithm may beat its proved optimum, none may place
an instance it proved infeasible, and none may beat the LP bound (section 3.1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vcsched.model import Host, Instance, Job, SolveOptions, SolveResult
from vcsched.solvers.lpbound import lp_bound
from vcsched.solvers.registry import algorithms, solve
from vcsched.validate import check_allocation

# Bounded so that one example stays well under a second on a shared 2-core machine;
# the properties do not depend on the bounds.
OPTIONS = SolveOptions(seed=7, time_limit=10.0, max_attempts=20_000)
# derandomize: the counts below (how many cases really exercised each property) must not depend on the run.  With a
# fresh seed per run, a fresh clone once drew instances of which only 32 results were feasible (50 needed) and failed.
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                             derandomize=True)

fraction = st.floats(min_value=0.02, max_value=1.0, allow_nan=False)


@st.composite
def instances(draw: st.DrawFn, max_hosts: int = 4, max_jobs: int = 8) -> Instance:
    n_hosts = draw(st.integers(1, max_hosts))
    heterogeneous = draw(st.booleans())
    capacity = st.floats(min_value=0.5, max_value=2.0) if heterogeneous else st.just(1.0)
    hosts = tuple(Host(f"h{i}", cpu=draw(capacity), memory=draw(capacity)) for i in range(n_hosts))
    n_jobs = draw(st.integers(1, max_jobs))
    jobs = tuple(
        Job(f"j{i}", cpu_need=draw(fraction), memory=draw(fraction), tasks=draw(st.integers(1, 3)))
        for i in range(n_jobs)
    )
    return Instance(hosts=hosts, jobs=jobs)


def placing_algorithms() -> list[str]:
    return sorted(name for name, algo in algorithms().items() if not algo.bound_only)


def run_all(instance: Instance) -> dict[str, SolveResult]:
    return {name: solve(instance, name, OPTIONS) for name in placing_algorithms()}


def test_the_registry_holds_the_paper_algorithms() -> None:
    assert {"gr", "sg", "gb", "sgb", "rrnd", "rrnz", "milp"} <= set(placing_algorithms())


# Each property below holds vacuously on an instance where its premise fails (nothing feasible, MILP not
# optimal, ...), so each test counts the cases that really exercised it and fails if there were too few: a
# generator drifting towards instances that test nothing must not stay green.


def test_every_feasible_result_is_a_valid_allocation() -> None:
    seen: Counter[str] = Counter()

    @PROPERTY_SETTINGS
    @given(instances())
    def check(instance: Instance) -> None:
        for name, result in run_all(instance).items():
            if result.feasible:
                seen["feasible"] += 1
                assert result.allocation is not None, name
                check_allocation(instance, result.allocation, min_yield=result.min_yield,
                                 avg_yield=result.avg_yield)

    check()
    assert seen["feasible"] >= 50, seen


def test_no_algorithm_beats_the_lp_bound() -> None:
    seen: Counter[str] = Counter()

    @PROPERTY_SETTINGS
    @given(instances())
    def check(instance: Instance) -> None:
        bound = lp_bound(instance)
        for name, result in run_all(instance).items():
            if result.feasible:
                seen["feasible"] += 1
                assert bound is not None, f"{name} placed an instance whose total memory does not fit"
                assert result.min_yield is not None
                assert result.min_yield <= bound + 1e-9, name

    check()
    assert seen["feasible"] >= 50, seen


# Instances the MILP proves in well under a second, and a time limit no load reaches: how many optima are
# proved must not depend on how busy the machine is (with 10 s on 8 jobs, a loaded CI machine proved 4 of 25).
# An instance without a proved optimum tests nothing here: hypothesis draws another instead (assume).
SMALL_OPTIONS = replace(OPTIONS, time_limit=300.0)


def test_no_algorithm_beats_a_proved_milp_optimum() -> None:
    seen: Counter[str] = Counter()

    @settings(PROPERTY_SETTINGS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(instances(max_hosts=3, max_jobs=4))
    def check(instance: Instance) -> None:
        exact = solve(instance, "milp", SMALL_OPTIONS)
        assume(exact.optimal and exact.feasible)
        seen["proved optimum"] += 1
        assert exact.min_yield is not None
        for name in placing_algorithms():
            result = solve(instance, name, SMALL_OPTIONS)
            if result.feasible:
                assert result.min_yield is not None
                assert result.min_yield <= exact.min_yield + 1e-6, name

    check()
    assert seen["proved optimum"] >= 20, seen


def test_no_algorithm_places_an_instance_the_milp_proved_infeasible() -> None:
    seen: Counter[str] = Counter()

    @PROPERTY_SETTINGS
    @given(instances())
    def check(instance: Instance) -> None:
        results = run_all(instance)
        exact = results["milp"]
        if exact.feasible or not exact.optimal:
            return
        seen["proved infeasible"] += 1
        for name, result in results.items():
            assert not result.feasible, name

    check()
    assert seen["proved infeasible"] >= 3, seen


def test_an_exhausted_backtracking_search_agrees_with_the_milp() -> None:
    seen: Counter[str] = Counter()

    @PROPERTY_SETTINGS
    @given(instances())
    def check(instance: Instance) -> None:
        exact = solve(instance, "milp", OPTIONS)
        for name in ("gb", "sgb"):
            result = solve(instance, name, OPTIONS)
            if result.detail.get("stopped") == "no memory-feasible placement exists":
                seen["exhausted"] += 1
                assert not exact.feasible, name
            if exact.optimal and not exact.feasible:
                seen["proved infeasible"] += 1
                assert not result.feasible, name

    check()
    assert seen["exhausted"] >= 3 and seen["proved infeasible"] >= 3, seen


def test_backtracking_succeeds_whenever_its_greedy_does() -> None:
    seen: Counter[str] = Counter()

    @PROPERTY_SETTINGS
    @given(instances())
    def check(instance: Instance) -> None:
        for greedy, backtracking in (("gr", "gb"), ("sg", "sgb")):
            first = solve(instance, greedy, OPTIONS)
            second = solve(instance, backtracking, OPTIONS)
            if first.feasible:
                seen["greedy placed"] += 1
                assert second.allocation is not None and first.allocation is not None
                assert second.allocation.hosts == first.allocation.hosts

    check()
    assert seen["greedy placed"] >= 5, seen


@PROPERTY_SETTINGS
@given(instances())
def test_every_algorithm_is_reproducible_for_a_fixed_seed(instance: Instance) -> None:
    first, second = run_all(instance), run_all(instance)
    for name, result in first.items():
        if name == "milp" and not result.optimal:
            continue  # a time-limited search may stop at a different incumbent
        again = second[name]
        assert result.feasible == again.feasible, name
        if result.allocation is not None and again.allocation is not None:
            assert result.allocation.hosts == again.allocation.hosts, name
