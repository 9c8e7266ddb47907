"""Adaptation under a migration byte budget (section 6.1): the problem, its parsing and the heuristic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_instance
from vcsched.adaptation.heuristic import align_to_current, mcb8_from_scratch
from vcsched.adaptation.problem import GIB, AdaptProblem, move_cost, problem_from_dict
from vcsched.adaptation.problem import parse_budget as parse_bytes
from vcsched.adaptation.solve import solve_adapt
from vcsched.errors import InputError
from vcsched.formats.units import UNLIMITED
from vcsched.model import Host, Instance, Job
from vcsched.validate import check_allocation
from vcsched.yields import allocate, placement_min_yield


def problem(jobs: list[tuple[float, float]], current: list[int], n_hosts: int = 2, budget: int = 0,
            task_bytes: int = GIB) -> AdaptProblem:
    inst = make_instance(list(jobs), n_hosts=n_hosts)
    return AdaptProblem(inst, np.array(current, dtype=np.int64),
                        np.full(inst.n_tasks, task_bytes, dtype=np.int64), budget)


# Two heavy jobs share h0, a light one runs on h1: one migration rebalances.
LOPSIDED = [(0.8, 0.3), (0.8, 0.3), (0.2, 0.2)]


@pytest.mark.parametrize(("text", "expected"), [
    (0, 0), (1073741824, GIB), ("2GiB", 2 * GIB), ("512MiB", 512 << 20), ("1.5GiB", 3 * GIB // 2),
    ("1GB", 10**9), ("64k", 65536), (" 7 ", 7), ("unlimited", UNLIMITED),
])
def test_byte_sizes_parse_with_binary_and_decimal_suffixes(text: object, expected: int) -> None:
    assert parse_bytes("budget", text) == expected


@pytest.mark.parametrize("text", ["-1", -1, "2XB", "GiB", "", True, 1.5, "1e9"])
def test_malformed_byte_sizes_are_rejected_naming_the_field(text: object) -> None:
    with pytest.raises(InputError, match="budget"):
        parse_bytes("budget", text)


def test_current_and_memory_bytes_are_parsed_per_task() -> None:
    raw = {"hosts": [{"name": "h0"}, {"name": "h1"}], "host_memory_bytes": "4GiB",
           "jobs": [{"name": "a", "cpu_need": 0.5, "memory": 0.25, "tasks": 2, "current": [1, None]},
                    {"name": "b", "cpu_need": 0.5, "memory": 0.5, "memory_bytes": "1GiB"}]}
    p = problem_from_dict(raw, 5)
    assert p.current.tolist() == [1, -1, -1]
    assert p.task_bytes.tolist() == [GIB, GIB, GIB]
    assert p.budget == 5


def test_memory_bytes_default_to_one_gib_per_reference_host() -> None:
    raw = {"hosts": [{"name": "h0"}], "jobs": [{"name": "a", "cpu_need": 0.5, "memory": 0.5}]}
    assert problem_from_dict(raw, 0).task_bytes.tolist() == [GIB // 2]


@pytest.mark.parametrize(("current", "message"), [
    ([0], r"jobs\[0\]\.current: expected a list of 2"),
    ([0, 2], r"jobs\[0\]\.current\[1\]: 2 is not a host index"),
    ("0", r"jobs\[0\]\.current"),
    ([0, True], r"jobs\[0\]\.current\[1\]"),
])
def test_bad_current_hosts_are_rejected_naming_the_task(current: object, message: str) -> None:
    raw = {"hosts": [{"name": "h0"}, {"name": "h1"}],
           "jobs": [{"name": "a", "cpu_need": 0.5, "memory": 0.25, "tasks": 2, "current": current}]}
    with pytest.raises(InputError, match=message):
        problem_from_dict(raw, 0)


def test_unknown_job_fields_are_still_rejected() -> None:
    raw = {"hosts": [{"name": "h0"}], "jobs": [{"name": "a", "cpu_need": 0.5, "memory": 0.5, "where": 0}]}
    with pytest.raises(InputError, match=r"jobs\[0\]: unknown field 'where'"):
        problem_from_dict(raw, 0)


def test_budget_zero_only_recaps_the_current_placement() -> None:
    p = problem(LOPSIDED, [0, 0, 1], budget=0)
    out = solve_adapt(p)
    assert out.result.allocation is not None
    assert list(out.result.allocation.hosts) == [0, 0, 1]
    assert out.migrations == () and out.migrated_bytes == 0
    assert out.result.min_yield == pytest.approx(placement_min_yield(p.instance, p.current))
    assert out.result.allocation == allocate(p.instance, p.current)


def test_budget_zero_still_places_new_arrivals() -> None:
    p = problem([*LOPSIDED, (0.5, 0.2)], [0, 0, 1, -1], budget=0)
    out = solve_adapt(p)
    assert out.result.allocation is not None
    assert list(out.result.allocation.hosts) == [0, 0, 1, 1]  # the only host that does not lower the yield
    assert out.migrated_bytes == 0


def test_one_migration_within_budget_rebalances() -> None:
    p = problem(LOPSIDED, [0, 0, 1], budget=GIB)
    out = solve_adapt(p)
    assert out.result.min_yield == pytest.approx(1.0)
    assert out.migrated_bytes == GIB
    assert len(out.migrations) == 1 and out.migrations[0].source == 0 and out.migrations[0].target == 1


def test_budget_below_one_task_allows_no_move() -> None:
    p = problem(LOPSIDED, [0, 0, 1], budget=GIB - 1)
    out = solve_adapt(p)
    assert out.migrated_bytes == 0
    assert out.result.min_yield == pytest.approx(1 / 1.6)


def test_moves_that_do_not_raise_the_minimum_yield_are_not_made() -> None:
    # h0 and h1 each carry 1.0 + 0.5 of need; h2 has memory for one 0.5 job
    # only.  Moving one there relieves h0 or h1, never both: the minimum
    # yield stays 2/3, so no bytes should be spent.
    inst = Instance((Host("h0"), Host("h1"), Host("h2", memory=0.15)),
                    (Job("a", 1.0, 0.5), Job("b", 1.0, 0.5), Job("c", 0.5, 0.1), Job("d", 0.5, 0.1)))
    p = AdaptProblem(inst, np.array([0, 1, 0, 1]), np.full(4, GIB), 10 * GIB)
    out = solve_adapt(p)
    assert out.result.min_yield == pytest.approx(2 / 3)
    assert out.migrated_bytes == 0


def test_memory_overfull_hosts_force_migrations_or_fail_within_the_budget() -> None:
    inst = Instance((Host("h0", memory=0.5), Host("h1")), (Job("a", 0.3, 0.4), Job("b", 0.3, 0.4)))
    p = AdaptProblem(inst, np.array([0, 0]), np.array([GIB, 2 * GIB]), 0)
    assert not solve_adapt(p).result.feasible
    out = solve_adapt(p.with_budget(GIB))
    assert out.result.feasible and out.migrated_bytes == GIB
    assert [m.job for m in out.migrations] == ["a"]


def test_unlimited_budget_reaches_mcb8_from_scratch() -> None:
    rng = np.random.default_rng(3)
    jobs = [(float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.05, 0.25))) for _ in range(20)]
    p = problem(jobs, [0] * 10 + [1] * 10, n_hosts=6, budget=UNLIMITED)
    scratch = mcb8_from_scratch(p.instance)
    assert scratch is not None
    out = solve_adapt(p)
    assert out.result.min_yield is not None
    assert out.result.min_yield >= placement_min_yield(p.instance, scratch) - 1e-9


def test_aligned_scratch_placement_keeps_the_yield_and_moves_fewer_bytes() -> None:
    p = problem([(0.5, 0.1)] * 4, [1, 1, 0, 0], budget=0)
    target = np.array([0, 0, 1, 1])  # the same placement with the hosts swapped
    aligned = align_to_current(p, target)
    assert aligned.tolist() == [1, 1, 0, 0]
    assert move_cost(p, aligned) == 0


def test_parallel_job_tasks_stay_on_hosts_the_job_keeps() -> None:
    inst = Instance((Host("h0"), Host("h1", cpu=2.0)), (Job("p", 0.5, 0.1, tasks=3),))
    p = AdaptProblem(inst, np.array([1, 0, -1]), np.full(3, GIB), 0)
    aligned = align_to_current(p, np.array([0, 1, 1]))
    assert sorted(aligned.tolist()) == [0, 1, 1]
    assert aligned[0] == 1 and aligned[1] == 0


scenario = st.integers(2, 5).flatmap(lambda n_hosts: st.tuples(
    st.just(n_hosts),
    st.lists(st.tuples(st.floats(0.05, 1.0), st.floats(0.02, 0.3), st.integers(1, 3),
                       st.integers(-1, n_hosts - 1), st.integers(1, 8)), min_size=1, max_size=10),
    st.integers(0, 40),
))


@settings(max_examples=80, deadline=None)
@given(case=scenario)
def test_heuristic_never_exceeds_the_budget_and_is_valid(case: tuple[int, list, int]) -> None:  # type: ignore[type-arg]
    n_hosts, jobs, budget_units = case
    inst = Instance(tuple(Host(f"h{i}") for i in range(n_hosts)),
                    tuple(Job(f"j{i}", a, m, k) for i, (a, m, k, _, _) in enumerate(jobs)))
    current = np.array([c for (_, _, k, c, _) in jobs for _ in range(k)], dtype=np.int64)
    task_bytes = np.array([b << 28 for (_, _, k, _, b) in jobs for _ in range(k)], dtype=np.int64)
    p = AdaptProblem(inst, current, task_bytes, budget_units << 28)
    out = solve_adapt(p)
    if not out.result.feasible:
        return
    assert out.result.allocation is not None
    hosts = np.asarray(out.result.allocation.hosts)
    assert out.migrated_bytes == move_cost(p, hosts) <= p.budget
    assert sum(m.bytes for m in out.migrations) == out.migrated_bytes
    check_allocation(inst, out.result.allocation)


@settings(max_examples=40, deadline=None)
@given(case=scenario)
def test_more_budget_never_lowers_the_minimum_yield_found_from_a_fitting_placement(
        case: tuple[int, list, int]) -> None:  # type: ignore[type-arg]
    n_hosts, jobs, _ = case
    inst = Instance(tuple(Host(f"h{i}") for i in range(n_hosts)),
                    tuple(Job(f"j{i}", a, m, k) for i, (a, m, k, _, _) in enumerate(jobs)))
    current = np.array([c for (_, _, k, c, _) in jobs for _ in range(k)], dtype=np.int64)
    p = AdaptProblem(inst, current, np.full(inst.n_tasks, GIB, dtype=np.int64), 0)
    zero, free = solve_adapt(p), solve_adapt(p.with_budget(UNLIMITED))
    if zero.result.feasible:
        assert free.result.feasible
        assert free.result.min_yield is not None and zero.result.min_yield is not None
        assert free.result.min_yield >= zero.result.min_yield - 1e-9


def test_unknown_algorithm_is_an_input_error() -> None:
    with pytest.raises(InputError, match="algorithm: unknown adaptation algorithm 'mcb8'"):
        solve_adapt(problem(LOPSIDED, [0, 0, 1]), "mcb8")


def test_heuristic_best_reaches_the_anytime_placement_with_an_unlimited_budget() -> None:
    """``heuristic-best`` re-places with ``best`` (never below MCB8), so it is never below plain ``heuristic``'s
    from-scratch candidate either, and it stays within memory and budget (solve_adapt asserts both)."""
    from vcsched.model import SolveOptions
    from vcsched.solvers.registry import get

    rng = np.random.default_rng(5)
    jobs = [(float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.05, 0.25))) for _ in range(24)]
    p = problem(jobs, [0] * 12 + [1] * 12, n_hosts=6, budget=UNLIMITED)
    plain, with_best = solve_adapt(p), solve_adapt(p, "heuristic-best")
    scratch = get("best").placer(p.instance, SolveOptions()).hosts
    assert scratch is not None and with_best.result.min_yield is not None and plain.result.min_yield is not None
    assert with_best.result.min_yield >= placement_min_yield(p.instance, scratch) - 1e-9
    assert with_best.result.min_yield >= placement_min_yield(p.instance, mcb8_from_scratch(p.instance)) - 1e-9
    assert with_best.result.algorithm == "heuristic-best"
