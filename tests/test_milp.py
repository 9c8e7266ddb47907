"""The exact MILP (sections 2.5 and 5): known optima, infeasibility, the model builder's contract."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.sparse import csr_array

from tests.conftest import make_instance
from vcsched.model import Host, Instance, Job, SolveOptions
from vcsched.solvers.milp import (
    build_model,
    identical_host_groups,
    placement_from,
    solve_model,
)
from vcsched.solvers.registry import solve
from vcsched.validate import check_allocation
from vcsched.yields import fits_in_memory, placement_min_yield


def brute_force_optimum(instance: Instance) -> float | None:
    """Best min yield over every memory-feasible placement (tiny instances only)."""
    best: float | None = None
    for combo in itertools.product(range(instance.n_hosts), repeat=instance.n_tasks):
        hosts = np.array(combo, dtype=np.int64)
        if fits_in_memory(instance, hosts):
            y = placement_min_yield(instance, hosts)
            best = y if best is None else max(best, y)
    return best


def test_milp_pairs_big_and_small_tasks_for_yield_one() -> None:
    inst = make_instance([(0.6, 0.1), (0.6, 0.1), (0.4, 0.1), (0.4, 0.1)])
    result = solve(inst, "milp")
    assert result.feasible and result.optimal
    assert result.min_yield == pytest.approx(1.0)


def test_highs_model_pairs_big_and_small_tasks() -> None:
    inst = make_instance([(0.6, 0.1), (0.6, 0.1), (0.4, 0.1), (0.4, 0.1)])
    model = build_model(inst)
    sol = solve_model(model, None)
    assert sol.optimal and sol.x is not None
    assert sol.objective == pytest.approx(1.0)
    hosts = placement_from(model, sol.x)
    assert hosts[0] != hosts[1] and hosts[2] != hosts[3]


def test_an_incumbent_at_the_lp_bound_is_optimal_without_highs() -> None:
    inst = make_instance([(0.6, 0.1), (0.6, 0.1), (0.4, 0.1), (0.4, 0.1)])
    result = solve(inst, "milp")
    assert result.optimal
    assert "LP bound" in str(result.detail["proof"])


def test_milp_beats_greedy_where_greedy_is_suboptimal() -> None:
    # GR: 0.3 -> h0, 0.3 -> h1, 0.4 -> h0 (0.7), 1.0 -> h1 (1.3): Y = 1/1.3.
    # Optimum: {0.3, 0.3, 0.4} and {1.0}: Y = 1.
    inst = make_instance([(0.3, 0.1), (0.3, 0.1), (0.4, 0.1), (1.0, 0.1)])
    greedy = solve(inst, "gr")
    exact = solve(inst, "milp")
    assert greedy.min_yield == pytest.approx(1 / 1.3)
    assert exact.optimal
    assert exact.min_yield == pytest.approx(1.0)


def test_milp_proves_memory_infeasibility() -> None:
    inst = make_instance([(0.5, 0.6), (0.5, 0.6), (0.5, 0.6)])
    result = solve(inst, "milp")
    assert result.feasible is False
    assert result.optimal is True
    assert "infeasible" in result.detail


def test_milp_places_the_tasks_of_a_parallel_job_on_distinct_hosts_when_memory_forces_it() -> None:
    # A 2-task job of memory 0.6 per task cannot share a host; a 0.3-CPU job joins one of them.
    inst = make_instance([(0.8, 0.6, 2), (0.3, 0.3)])
    result = solve(inst, "milp")
    assert result.feasible and result.optimal and result.allocation is not None
    hosts = result.allocation.hosts
    assert hosts[0] != hosts[1]
    assert result.min_yield == pytest.approx(1 / 1.1)
    check_allocation(inst, result.allocation, min_yield=result.min_yield, avg_yield=result.avg_yield)


def test_milp_matches_brute_force_on_a_heterogeneous_instance() -> None:
    inst = Instance(
        hosts=(Host("a", cpu=1.0, memory=1.0), Host("b", cpu=2.0, memory=0.5), Host("c", cpu=0.5, memory=1.0)),
        jobs=(Job("p", 0.9, 0.4), Job("q", 0.7, 0.3, tasks=2), Job("r", 0.2, 0.5), Job("s", 1.0, 0.2)),
    )
    result = solve(inst, "milp")
    assert result.optimal
    assert result.min_yield == pytest.approx(brute_force_optimum(inst), abs=1e-7)


@pytest.mark.parametrize("seed", range(5))
def test_milp_matches_brute_force_on_random_small_instances(seed: int) -> None:
    rng = np.random.default_rng(seed)
    jobs = [(float(rng.uniform(0.05, 1.0)), float(rng.uniform(0.05, 0.6)), int(rng.integers(1, 3))) for _ in range(4)]
    inst = make_instance(jobs, n_hosts=3)
    expected = brute_force_optimum(inst)
    result = solve(inst, "milp")
    assert result.optimal
    if expected is None:
        assert not result.feasible
    else:
        assert result.min_yield == pytest.approx(expected, abs=1e-7)


def test_symmetry_breaking_does_not_change_the_optimum() -> None:
    inst = make_instance([(0.7, 0.3), (0.5, 0.2), (0.9, 0.4), (0.2, 0.3), (0.6, 0.5), (0.4, 0.1)], n_hosts=3)
    with_rows = solve_model(build_model(inst, symmetry_breaking=True), None)
    without = solve_model(build_model(inst, symmetry_breaking=False), None)
    assert with_rows.optimal and without.optimal
    assert with_rows.objective == pytest.approx(without.objective, abs=1e-7)


def test_identical_hosts_are_grouped_by_capacity() -> None:
    inst = Instance(
        hosts=(Host("a"), Host("b", cpu=2.0), Host("c"), Host("d", cpu=2.0), Host("e", memory=0.5)),
        jobs=(),
    )
    assert identical_host_groups(inst) == [[0, 2], [1, 3]]


def test_time_limit_returns_the_heuristic_incumbent_as_not_optimal() -> None:
    # A zero time limit stops HiGHS before it finds anything of its own.
    inst = make_instance([(0.3 + 0.05 * i, 0.1 + 0.02 * i) for i in range(12)], n_hosts=4)
    result = solve(inst, "milp", SolveOptions(time_limit=0.0))
    assert result.optimal is False
    assert result.feasible and result.allocation is not None
    assert "returning the" in str(result.detail["stopped"])
    check_allocation(inst, result.allocation, min_yield=result.min_yield, avg_yield=result.avg_yield)


def test_milp_result_is_at_least_as_good_as_its_incumbent() -> None:
    inst = make_instance([(0.3 + 0.05 * i, 0.1 + 0.02 * i) for i in range(10)], n_hosts=4)
    result = solve(inst, "milp")
    incumbent = result.detail["incumbent"]
    assert isinstance(incumbent, dict)
    assert result.optimal
    assert result.min_yield is not None
    assert result.min_yield >= incumbent["min_yield"] - 1e-9


def test_model_accepts_extra_rows_that_tighten_it() -> None:
    # Forbid task 0 on host 0 with one extra row: e[0, 0] <= 0.
    inst = make_instance([(0.6, 0.1), (0.6, 0.1), (0.4, 0.1), (0.4, 0.1)])
    model = build_model(inst, symmetry_breaking=False)
    row = np.zeros((1, model.n_vars))
    row[0, model.e_index(0, 0)] = 1.0
    tightened = model.with_rows(csr_array(row), np.array([-np.inf]), np.array([0.0]))
    sol = solve_model(tightened, None)
    assert sol.optimal and sol.x is not None
    assert placement_from(tightened, sol.x)[0] == 1
    assert sol.objective == pytest.approx(1.0)


def test_model_rejects_extra_rows_of_the_wrong_width() -> None:
    model = build_model(make_instance([(0.5, 0.5)]))
    with pytest.raises(ValueError, match="columns"):
        model.with_rows(csr_array(np.zeros((1, 3))), np.zeros(1), np.zeros(1))


def test_model_variable_layout_matches_its_index_helpers() -> None:
    inst = make_instance([(0.5, 0.2, 2), (0.3, 0.1)], n_hosts=2)
    model = build_model(inst)
    assert model.e_index(2, 1) == 5
    assert model.x_index(0, 0) == 6
    assert model.a_index(1) == 13
    assert model.y_index == 14 == model.n_vars - 1
    assert model.c[model.y_index] < 0.0  # maximize Y
    assert model.integrality[:6].tolist() == [1] * 6
    assert not model.integrality[6:].any()
    assert not model.relaxed().integrality.any()


