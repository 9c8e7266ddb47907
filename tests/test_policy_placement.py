"""Placement on the resource vector and under a sharing policy (solvers.mcb_vector, policies.placement)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcsched.errors import InputError
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.model import Host, Instance, Job
from vcsched.policies.placement import LEVEL_POLICIES, level_rates, place_policy, placement_method
from vcsched.policies.registry import allocate_policy
from vcsched.solvers import mcb
from vcsched.solvers import mcb_vector as mv
from vcsched.solvers import search as levels
from vcsched.solvers.registry import solve
from vcsched.validate import check_yields


def with_disk(instance: Instance, seed: int = 0, mean: float = 0.3) -> Instance:
    rng = np.random.default_rng(seed)
    hosts = tuple(Host(h.name, h.cpu, h.memory, (("disk", 1.0), ("net", 1.0))) for h in instance.hosts)
    jobs = tuple(Job(j.name, j.cpu_need, j.memory, j.tasks,
                     (("disk", float(rng.uniform(0.01, 2 * mean))), ("net", float(rng.uniform(0.01, 2 * mean)))))
                 for j in instance.jobs)
    return Instance(hosts, jobs)


def generated(seed: int, hosts: int = 8, tasks: int = 40, parallel: bool = True) -> Instance:
    spec = GeneratorSpec(hosts=hosts, tasks=tasks, slack=0.5, cv_mem=0.5, cv_cpu=0.5, parallel=parallel)
    return generate(spec, np.random.default_rng(seed))


# --- the d-dimensional kernel --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(sorted(mcb.VARIANTS)))
def test_the_vector_kernel_in_two_dimensions_makes_the_2d_kernels_decisions(seed: int, variant: str) -> None:
    rng = np.random.default_rng(seed)
    n, h = int(rng.integers(1, 30)), int(rng.integers(1, 6))
    c, m = rng.uniform(0.01, 0.6, n), rng.uniform(0.01, 0.5, n)
    tie = rng.random(n) < 0.2
    c[tie] = m[tie]  # ties go to the memory list in both
    hc, hm = rng.uniform(0.3, 1.3, h), rng.uniform(0.3, 1.3, h)
    expected = mcb.pack(c, m, hc, hm, variant, "python")
    got = mv.pack_vector(mv.vector_lists(variant, np.column_stack((c, m))), np.column_stack((hc, hm)))
    assert (expected is None) == (got is None)
    if expected is not None:
        assert got is not None and got.tolist() == expected.tolist()


# As in tests/test_mcb.py: VCSCHED_REQUIRE_C=1 (.ci/run) turns a missing C kernel from a skip into failures.
needs_c_kernel = pytest.mark.skipif(
    mcb._mcbc is None and os.environ.get("VCSCHED_REQUIRE_C") != "1",
    reason="the C kernel vcsched.solvers._mcbc is not built (run: .venv/bin/pip install -e . --no-deps)")


@needs_c_kernel
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(sorted(mv.VECTOR_KEYS)), st.integers(1, 4), st.booleans())
def test_the_c_vector_kernel_makes_the_numpy_references_decisions(seed: int, variant: str, d: int,
                                                                   ruled: bool) -> None:
    """Random instances in 1-4 dimensions, with ties (needs on a coarse grid), spread groups with groups already
    on hosts, and now and then an infinite or NaN capacity: the same host for every task, or None from both."""
    from vcsched.rules import HostGroups
    from vcsched.solvers.mcb import KernelRules

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    h = int(rng.integers(max(1, n // 4), n // 2 + 3))  # from too few hosts to enough: both outcomes
    need = np.round(rng.uniform(0.0, 0.6, (n, d)), int(rng.integers(1, 3)))
    cap = rng.uniform(0.2, 1.5, (h, d))
    odd = rng.random((h, d))
    cap[odd < 0.05] = np.inf
    cap[(odd >= 0.05) & (odd < 0.08)] = np.nan
    rules = None
    if ruled:
        groups = rng.integers(-1, max(1, n // 3), n)
        on = rng.integers(0, h, 5)
        rules = KernelRules(groups.astype(np.int64), HostGroups.of(h, on, rng.integers(-1, 4, 5)))
    items = mv.vector_lists(variant, need)
    expected = mv.pack_vector_python(items, cap, rules)
    got = mv.pack_vector_c(items, cap, rules)
    assert (expected is None) == (got is None)
    if expected is not None:
        assert got is not None and got.tolist() == expected.tolist()


@needs_c_kernel
def test_the_c_vector_kernel_refuses_inconsistent_arrays() -> None:
    from vcsched.solvers.mcb import _mcbc

    assert _mcbc is not None
    need = np.ones((3, 2))
    out = np.empty(3, dtype=np.int64)
    cap = np.ones((2, 2))
    with pytest.raises(ValueError, match="inconsistent array lengths"):
        _mcbc.pack_vector(need, 2, np.array([0, 1], dtype=np.int64), np.array([0, 1, 2], dtype=np.int64), cap,
                          1e-12, out)
    with pytest.raises(ValueError, match="out of range or repeated"):
        _mcbc.pack_vector(need, 2, np.array([0, 1, 1], dtype=np.int64), np.array([0, 1, 3], dtype=np.int64), cap,
                          1e-12, out)
    with pytest.raises(ValueError, match="list_ptr"):
        _mcbc.pack_vector(need, 2, np.array([0, 1, 2], dtype=np.int64), np.array([0, 2, 1], dtype=np.int64), cap,
                          1e-12, out)
    with pytest.raises(TypeError, match="float64"):
        _mcbc.pack_vector(need.astype(np.float32), 2, np.array([0, 1, 2], dtype=np.int64),
                          np.array([0, 1, 3], dtype=np.int64), cap, 1e-12, out)


def test_a_task_goes_into_the_list_of_its_largest_dimension_ties_to_the_later_one() -> None:
    need = np.array([[0.5, 0.1, 0.2], [0.1, 0.4, 0.2], [0.1, 0.3, 0.3], [0.2, 0.2, 0.2]])
    lists = mv.vector_lists("mcb8", need).lists
    assert [lst.tolist() for lst in lists] == [[0], [1], [2, 3]]


def test_a_host_looks_first_in_the_list_of_its_most_free_dimension() -> None:
    # Host: cpu 1, disk 1, mem 1.  First task: the first fitting of the lists in dimension order (cpu list).
    # Then free = (0.4, 0.9, 0.9): disk ties memory, the later (memory) list goes first.
    need = np.array([[0.6, 0.1, 0.1], [0.1, 0.5, 0.05], [0.05, 0.05, 0.5]])
    hosts = mv.pack_vector(mv.vector_lists("mcb8", need), np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]))
    assert hosts is not None and hosts.tolist() == [0, 0, 0]
    order = mv.vector_lists("mcb8", need)
    assert [lst.tolist() for lst in order.lists] == [[0], [1], [2]]


def test_a_task_needing_a_resource_a_host_lacks_never_goes_there() -> None:
    inst = Instance((Host("nodisk", 1.0, 1.0), Host("disk", 1.0, 1.0, (("disk", 1.0),))),
                    (Job("io", 0.2, 0.1, 2, (("disk", 0.3),)), Job("cpu", 0.2, 0.1, 2)))
    result = solve(inst, "mcb8")
    assert result.feasible and result.allocation is not None
    hosts = result.allocation.hosts
    assert hosts[0] == hosts[1] == 1  # both io tasks on the host with disk
    check_yields(inst, hosts, result.allocation.yields(inst))


@pytest.mark.parametrize("variant", sorted(mcb.VARIANTS))
def test_every_variant_places_the_vector_within_every_capacity(variant: str) -> None:
    inst = with_disk(generated(3))
    result = solve(inst, variant)
    assert result.feasible and result.allocation is not None
    assert result.detail["backend"] == "vector"
    check_yields(inst, result.allocation.hosts, result.allocation.yields(inst))
    # the probe level is reached: every job at that yield fits the placement
    level = result.detail["probe_yield"]
    assert isinstance(level, float)
    check_yields(inst, result.allocation.hosts, np.full(inst.n_jobs, level))
    assert result.min_yield is not None and result.min_yield >= level - 1e-9


def test_the_level_bound_is_the_lp_bound_with_one_resource_and_unit_rates() -> None:
    from vcsched.solvers.lpbound import lp_bound

    inst = generated(5)
    assert levels.level_bound(inst, np.ones(inst.n_jobs)) == pytest.approx(lp_bound(inst), rel=1e-12)


def test_the_level_bound_stops_where_every_job_is_at_yield_one() -> None:
    inst = Instance((Host("h0", 4.0, 4.0),), (Job("a", 0.5, 0.1), Job("b", 0.5, 0.1)))
    assert levels.level_bound(inst, np.array([1.0, 0.25])) == pytest.approx(4.0)


def test_rates_must_be_positive_and_finite() -> None:
    with pytest.raises(InputError, match="rates"):
        levels.normalised_rates(np.array([1.0, 0.0]))
    with pytest.raises(InputError, match="rates"):
        levels.normalised_rates(np.array([1.0, np.nan]))


def test_the_greedy_balances_the_largest_relative_load() -> None:
    inst = Instance(tuple(Host(f"h{i}", 1.0, 1.0, (("disk", 1.0),)) for i in range(2)),
                    (Job("d", 0.1, 0.1, 1, (("disk", 0.9),)), Job("d2", 0.1, 0.1, 1, (("disk", 0.9),)),
                     Job("c", 0.5, 0.1, 1)))
    result = solve(inst, "gr")
    assert result.allocation is not None
    hosts = result.allocation.hosts
    assert hosts[0] != hosts[1]  # GR on CPU alone would stack both disk-heavy tasks on the emptier-CPU host


# --- placement under a policy --------------------------------------------------------------------


def test_yield_on_a_cpu_only_instance_is_todays_solve_bit_for_bit() -> None:
    inst = generated(7)
    placed = place_policy(inst, "yield", "mcb8")
    base = solve(inst, "mcb8")
    assert placed.result.allocation == base.allocation
    assert placed.result.min_yield == base.min_yield and placed.result.avg_yield == base.avg_yield
    assert placed.result.detail == base.detail


@pytest.mark.parametrize("policy", ["yield", "drf", "asset", "drf-pools", "pf", "hdrf"])
def test_every_policy_places_and_allocates_within_every_capacity(policy: str) -> None:
    inst = with_disk(generated(11), seed=2)
    placed = place_policy(inst, policy)
    assert placed.result.feasible and placed.allocation is not None
    assert placed.method == ("level" if policy in LEVEL_POLICIES else "max-min")
    check_yields(inst, placed.allocation.hosts, placed.allocation.yields)
    assert placed.result.min_yield == pytest.approx(min(placed.allocation.yields))


@pytest.mark.parametrize("policy", ["drf", "asset"])
def test_the_policy_reaches_at_least_the_level_its_placement_was_searched_at(policy: str) -> None:
    inst = with_disk(generated(13), seed=4)
    placed = place_policy(inst, policy)
    assert placed.allocation is not None
    level = placed.result.detail["probe_level"]
    assert isinstance(level, float)
    rates = level_rates(inst, policy)
    assert rates is not None
    floor = levels.level_yields(levels.normalised_rates(rates), level)
    assert np.all(np.asarray(placed.allocation.yields) >= floor - 1e-9)


def test_drf_places_by_its_level_on_a_cpu_only_instance_too() -> None:
    inst = Instance(tuple(Host(f"h{i}") for i in range(2)),
                    (Job("big", 0.5, 0.2, 4, weight=1.0), Job("small", 0.5, 0.2, 1, weight=1.0)))
    placed = place_policy(inst, "drf")
    assert placed.method == "level" and placed.allocation is not None
    assert placed.result.detail["placement"] == "level"
    check_yields(inst, placed.allocation.hosts, placed.allocation.yields)


def test_non_mcb_algorithms_place_for_max_min_and_then_allocate() -> None:
    inst = with_disk(generated(17), seed=1)
    assert placement_method("drf", "gr") == "max-min"
    placed = place_policy(inst, "drf", "gr")
    assert placed.method == "max-min" and placed.allocation is not None
    expected = allocate_policy(inst, solve(inst, "gr").allocation.hosts, "drf")  # type: ignore[union-attr]
    assert placed.allocation.yields == expected.yields


def test_a_bound_only_algorithm_or_an_unknown_policy_is_bad_input() -> None:
    inst = generated(1)
    with pytest.raises(InputError, match="algorithm"):
        place_policy(inst, "drf", "lpbound")
    with pytest.raises(InputError, match="policy"):
        place_policy(inst, "fair-ish")


def test_memory_that_does_not_fit_places_nothing() -> None:
    inst = Instance((Host("h0", 1.0, 0.5, (("disk", 1.0),)),), (Job("a", 0.5, 0.4, 2, (("disk", 0.1),)),))
    placed = place_policy(inst, "drf")
    assert not placed.result.feasible and placed.allocation is None


# --- placement rules under the level placement -------------------------------------------------------------


def ruled(extra: bool, spread: str | None = None, together: str | None = None, tasks: int = 3,
          maintenance: tuple[int, ...] = (), pinned: tuple[int, ...] = ()) -> Instance:
    """Three hosts, a small job ``a`` with the rule, a heavier job ``b``; ``extra``: every host and job has disk."""
    cap = (("disk", 1.0),) if extra else ()
    hosts = tuple(Host(f"h{i}", 1.0, 1.0, cap, maintenance=i in maintenance) for i in range(3))
    need = (("disk", 0.1),) if extra else ()
    jobs = (Job("a", 0.2, 0.1, tasks, need, weight=2.0, spread=spread, together=together),
            Job("b", 0.5, 0.3, 1, need))
    return Instance(hosts, jobs, pinned=pinned)


@pytest.mark.parametrize("extra", [False, True], ids=["cpu", "vector"])
@pytest.mark.parametrize("policy", ["drf", "asset"])
def test_the_level_placement_honours_required_spread_together_maintenance_and_pins(policy: str, extra: bool) -> None:
    spread = place_policy(ruled(extra, spread="required"), policy)
    assert spread.result.detail["placement"] == "level" and spread.allocation is not None
    assert sorted(spread.allocation.hosts[:3]) == [0, 1, 2]
    together = place_policy(ruled(extra, together="required"), policy)
    assert together.allocation is not None and len(set(together.allocation.hosts[:3])) == 1
    cordoned = place_policy(ruled(extra, maintenance=(0, 1)), policy)
    assert cordoned.allocation is not None and set(cordoned.allocation.hosts) == {2}
    pinned = place_policy(ruled(extra, maintenance=(0,), pinned=(0, -1, -1, -1)), policy)
    assert pinned.allocation is not None and pinned.allocation.hosts[0] == 0 and 0 not in pinned.allocation.hosts[1:]


@pytest.mark.parametrize("extra", [False, True], ids=["cpu", "vector"])
@pytest.mark.parametrize("policy", ["drf", "asset"])
def test_the_level_placement_reports_preferred_rules_it_cannot_honour(policy: str, extra: bool) -> None:
    kept = place_policy(ruled(extra, spread="preferred"), policy)
    assert kept.allocation is not None and sorted(kept.allocation.hosts[:3]) == [0, 1, 2]
    assert "unmet_preferred" not in kept.result.detail
    dropped = place_policy(ruled(extra, spread="preferred", tasks=4), policy)
    assert dropped.result.feasible and dropped.result.detail["preferred_dropped"] is True
    assert any("spread" in u for u in dropped.result.detail["unmet_preferred"])  # type: ignore[union-attr]


@pytest.mark.parametrize("policy", ["drf", "asset"])
def test_the_level_placement_refuses_an_impossible_required_rule_naming_it(policy: str) -> None:
    placed = place_policy(ruled(False, spread="required", tasks=4), policy)
    assert not placed.result.feasible
    assert str(placed.result.detail["infeasible"]).startswith("spread: virtual cluster 'a' has 4 VMs")
