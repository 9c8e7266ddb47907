"""GR, SG, GB, SGB (paper section 3.3): host choice, order, backtracking and its bound."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_instance
from vcsched.model import Host, Instance, Job, SolveOptions
from vcsched.solvers.greedy import backtracking, greedy, task_order
from vcsched.solvers.registry import solve
from vcsched.validate import check_allocation


def test_gr_puts_each_task_on_the_least_loaded_host() -> None:
    # 0.9 -> h0 (tie, lowest index); 0.5 -> h1; 0.3 -> h1 (0.5 < 0.9); 0.2 -> h1 (0.8 < 0.9)
    inst = make_instance([(0.9, 0.1), (0.5, 0.1), (0.3, 0.1), (0.2, 0.1)])
    hosts = greedy(inst, task_order(inst, sort_by_memory=False))
    assert hosts is not None
    assert hosts.tolist() == [0, 1, 1, 1]


def test_gr_breaks_ties_by_lowest_host_index() -> None:
    inst = make_instance([(0.5, 0.1), (0.5, 0.1), (0.5, 0.1)], n_hosts=3)
    hosts = greedy(inst, task_order(inst, sort_by_memory=False))
    assert hosts is not None
    assert hosts.tolist() == [0, 1, 2]


def test_gr_skips_hosts_where_memory_does_not_fit() -> None:
    inst = make_instance([(0.1, 0.9), (0.9, 0.5), (0.1, 0.5)])
    hosts = greedy(inst, task_order(inst, sort_by_memory=False))
    # task 1 goes to h1 (h0 lacks memory); task 2 fits only on h1 as well
    assert hosts is not None
    assert hosts.tolist() == [0, 1, 1]


def test_gr_balances_load_relative_to_host_capacity() -> None:
    # h1 is twice as fast: after 0.6 on h1 its relative load 0.3 is below h0's 0.5
    inst = Instance(
        hosts=(Host("slow", cpu=1.0), Host("fast", cpu=2.0)),
        jobs=(Job("a", 0.5, 0.1), Job("b", 0.6, 0.1), Job("c", 0.4, 0.1)),
    )
    hosts = greedy(inst, task_order(inst, sort_by_memory=False))
    assert hosts is not None
    assert hosts.tolist() == [0, 1, 1]


def test_gr_places_the_tasks_of_a_parallel_job_individually() -> None:
    inst = make_instance([(0.6, 0.2, 2), (0.3, 0.2)])
    hosts = greedy(inst, task_order(inst, sort_by_memory=False))
    assert hosts is not None
    assert hosts.tolist() == [0, 1, 0]


def test_gr_fails_when_a_task_fits_nowhere() -> None:
    inst = make_instance([(0.5, 0.6), (0.5, 0.6), (0.5, 0.6)])
    assert solve(inst, "gr").feasible is False


def test_sg_orders_tasks_by_memory_descending_and_stable() -> None:
    inst = make_instance([(0.1, 0.2), (0.1, 0.7), (0.1, 0.2), (0.1, 0.5)])
    assert task_order(inst, sort_by_memory=True) == [1, 3, 0, 2]


def test_sg_succeeds_where_gr_fails_by_placing_big_memory_first() -> None:
    # GR: 0.6 -> h0, 0.2 -> h1, 0.4 -> h1 (lighter), then 0.5 fits nowhere.
    # SG: 0.6 -> h0, 0.5 -> h1, 0.4 -> h0 (lighter), 0.2 -> h1.
    inst = make_instance([(0.5, 0.6), (0.1, 0.2), (0.2, 0.4), (0.9, 0.5)])
    assert solve(inst, "gr").feasible is False
    assert solve(inst, "sg").feasible is True


def test_gb_finds_a_placement_where_gr_fails() -> None:
    # Memory 0.5, 0.3, 0.2, 0.5, 0.5 on two unit hosts: only {0.5, 0.5} + {0.3, 0.2, 0.5} fits.
    # GR: 0.5 -> h0, 0.3 -> h1, 0.2 -> h0 (lighter CPU), 0.5 -> h1, and the last 0.5 fits nowhere.
    inst = make_instance([(0.1, 0.5), (0.9, 0.3), (0.1, 0.2), (0.5, 0.5), (0.5, 0.5)])
    assert solve(inst, "gr").feasible is False
    result = solve(inst, "gb")
    assert result.feasible is True
    assert result.allocation is not None
    check_allocation(inst, result.allocation, min_yield=result.min_yield, avg_yield=result.avg_yield)


def test_gb_returns_grs_placement_when_gr_succeeds() -> None:
    inst = make_instance([(0.9, 0.1), (0.5, 0.1), (0.3, 0.1), (0.2, 0.3)], n_hosts=3)
    order = task_order(inst, sort_by_memory=False)
    hosts, attempts, _ = backtracking(inst, order, 500_000)
    assert hosts is not None
    expected = greedy(inst, order)
    assert expected is not None
    assert hosts.tolist() == expected.tolist()
    assert attempts == inst.n_tasks


def test_gb_stops_at_max_attempts() -> None:
    # Eleven tasks of memory 0.34 on five hosts (two per host): infeasible.  Distinct
    # CPU needs keep hosts distinguishable, so the search space is far beyond 50 attempts.
    inst = make_instance([(0.05 * (i + 1), 0.34) for i in range(11)], n_hosts=5)
    result = solve(inst, "gb", SolveOptions(max_attempts=50))
    assert result.feasible is False
    assert result.detail["attempts"] == 50
    assert result.detail["stopped"] == "attempt bound reached"


def test_gb_proves_infeasibility_when_the_search_is_exhausted() -> None:
    inst = make_instance([(0.5, 0.6)] * 3)
    result = solve(inst, "sgb")
    assert result.feasible is False
    assert result.detail["stopped"] == "no memory-feasible placement exists"


def test_gb_skips_identical_empty_hosts_after_the_first() -> None:
    # Three tasks of 0.6 on three identical hosts fit, but 4 tasks on three do not.
    # Without pruning each failed level would retry all empty hosts; with it the
    # exhaustive search stays tiny.
    inst = make_instance([(0.5, 0.6)] * 4, n_hosts=3)
    hosts, attempts, exhausted = backtracking(inst, task_order(inst, sort_by_memory=False), 500_000)
    assert hosts is None
    assert exhausted
    assert attempts == 3  # one host per distinct state at each of the three levels


def test_sgb_result_is_a_valid_allocation() -> None:
    inst = make_instance([(0.3, 0.3), (0.8, 0.45), (0.5, 0.25), (0.2, 0.55), (0.6, 0.4)], n_hosts=2)
    result = solve(inst, "sgb")
    assert result.feasible
    assert result.allocation is not None
    check_allocation(inst, result.allocation, min_yield=result.min_yield, avg_yield=result.avg_yield)


@pytest.mark.parametrize("name", ["gr", "sg", "gb", "sgb"])
def test_greedy_family_handles_an_instance_without_jobs(name: str) -> None:
    inst = make_instance([], n_hosts=2)
    result = solve(inst, name)
    assert result.feasible
    assert result.allocation is not None
    assert np.asarray(result.allocation.hosts).size == 0
