"""Every placing algorithm on the resource vector: CPU plus disk and net needs (docs/policies.md §8).

Seeded random instances where hosts differ in disk and net (some have none),
and jobs need them: every placement returned is checked by the one validator
on every (host, resource); the exact MILP's optimum bounds every heuristic;
and an instance that fits on CPU and memory but not on disk is reported
infeasible by every algorithm, never placed at yield 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from vcsched.adaptation.problem import AdaptProblem
from vcsched.adaptation.solve import solve_adapt
from vcsched.model import Host, Instance, Job, SolveOptions
from vcsched.solvers.anytime import best_placement
from vcsched.solvers.greedy import backtracking, task_order
from vcsched.solvers.lpbound import lp_bound
from vcsched.solvers.registry import algorithms, solve
from vcsched.validate import allocation_problems, yield_problems
from vcsched.yields import placement_min_yield

PLACERS = sorted(name for name, a in algorithms().items() if not a.bound_only)
HEURISTICS = [a for a in PLACERS if a != "milp"]
OPTIONS = SolveOptions(seed=1, time_limit=20.0, max_attempts=50_000)


def vector_instance(seed: int, hosts: int = 3, tasks: int = 7) -> Instance:
    """Hosts with random disk/net capacities (a quarter of them without disk), jobs needing CPU, disk and net."""
    rng = np.random.default_rng(seed)
    hs = []
    for h in range(hosts):
        cap = {"net": float(rng.uniform(0.3, 1.0))}
        if h == 0 or rng.random() > 0.25:  # host 0 always has disk, so no need is for a resource no host has
            cap["disk"] = float(rng.uniform(0.2, 1.0))
        hs.append(Host(f"h{h}", float(rng.uniform(0.5, 1.0)), 1.0, tuple(cap.items())))
    js, left, j = [], tasks, 0
    while left:
        k = int(min(left, rng.integers(1, 3)))
        needs = (("disk", float(rng.uniform(0.0, 0.8)) if rng.random() < 0.7 else 0.0),
                 ("net", float(rng.uniform(0.05, 0.6))))
        js.append(Job(f"j{j}", float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.05, 0.5)), k, needs))
        left -= k
        j += 1
    return Instance(tuple(hs), tuple(js))


def disk_infeasible() -> Instance:
    """Fits on CPU and memory (one task per host), but both tasks need disk and only h0 has any."""
    hosts = (Host("h0", 1.0, 1.0, (("disk", 1.0),)), Host("h1", 1.0, 1.0))
    jobs = (Job("a", 0.5, 0.6, 1, (("disk", 0.2),)), Job("b", 0.5, 0.6, 1, (("disk", 0.2),)))
    return Instance(hosts, jobs)


def _check(inst: Instance, algo: str, result: object) -> None:
    from vcsched.model import SolveResult

    assert isinstance(result, SolveResult)
    if not result.feasible:
        return
    alloc = result.allocation
    assert alloc is not None
    assert allocation_problems(inst, alloc, min_yield=result.min_yield, avg_yield=result.avg_yield) == [], algo
    assert yield_problems(inst, alloc.hosts, alloc.yields(inst)) == [], algo
    assert result.min_yield is not None and result.min_yield > 0, algo  # never on a host without a needed resource


@pytest.mark.parametrize("seed", range(12))
def test_every_placement_is_valid_on_every_resource(seed: int) -> None:
    inst = vector_instance(seed)
    assert inst.resources == ("cpu", "disk", "net")
    for algo in PLACERS:
        _check(inst, algo, solve(inst, algo, OPTIONS))


@pytest.mark.parametrize("seed", range(12))
def test_the_milp_optimum_bounds_every_heuristic_and_the_lp_bound_bounds_it(seed: int) -> None:
    inst = vector_instance(100 + seed, hosts=3, tasks=6)
    exact = solve(inst, "milp", SolveOptions(seed=1))
    heur = {a: solve(inst, a, OPTIONS) for a in HEURISTICS}
    if not exact.feasible:
        assert exact.optimal  # HiGHS's proof: then no heuristic may have placed
        assert not any(r.feasible for r in heur.values())
        return
    assert exact.optimal and exact.min_yield is not None
    for algo, r in heur.items():
        if r.feasible:
            assert r.min_yield is not None and r.min_yield <= exact.min_yield + 1e-6, algo
    bound = lp_bound(inst)
    assert bound is not None and exact.min_yield <= bound + 1e-9


def test_the_milp_sees_disk_a_cpu_only_milp_would_overload() -> None:
    """Two disk-heavy tasks: CPU alone would pair them on the big host; the vector MILP splits them."""
    hosts = (Host("big", 1.0, 1.0, (("disk", 0.5),)), Host("small", 0.5, 1.0, (("disk", 0.5),)))
    jobs = (Job("a", 0.3, 0.1, 1, (("disk", 0.5),)), Job("b", 0.3, 0.1, 1, (("disk", 0.5),)))
    inst = Instance(hosts, jobs)
    exact = solve(inst, "milp")
    assert exact.min_yield == pytest.approx(1.0)
    assert exact.allocation is not None and sorted(exact.allocation.hosts) == [0, 1]


def test_fits_on_cpu_but_not_on_disk_is_infeasible_for_every_algorithm() -> None:
    inst = disk_infeasible()
    cpu_only = Instance(tuple(Host(h.name, h.cpu, h.memory) for h in inst.hosts),
                        tuple(Job(j.name, j.cpu_need, j.memory, j.tasks) for j in inst.jobs))
    assert solve(cpu_only, "milp").feasible
    for algo in PLACERS:
        r = solve(inst, algo, OPTIONS)
        assert not r.feasible, f"{algo} placed a task where it needs disk and there is none"
    exact = solve(inst, "milp")
    assert exact.optimal and "every resource" in str(exact.detail["infeasible"])  # HiGHS proved it
    best = solve(inst, "best", SolveOptions(time_limit=2.0))
    assert best.optimal and "every resource" in str(best.detail["stopped"])
    _, _, exhausted = backtracking(inst, task_order(inst, sort_by_memory=True), 1000)
    assert exhausted  # SGB proved it too


def test_a_host_without_disk_is_used_by_tasks_that_need_none() -> None:
    hosts = (Host("h0", 1.0, 1.0, (("disk", 1.0),)), Host("h1", 1.0, 1.0))
    jobs = (Job("io", 0.5, 0.6, 1, (("disk", 0.5),)), Job("cpu", 0.5, 0.6, 1))
    inst = Instance(hosts, jobs)
    # MCB fills hosts in index order from sorted lists, so an ascending variant puts "cpu" on h0 first and
    # then has nowhere for "io": a packing heuristic's miss, not a broken constraint.  The others must find it.
    for algo in [a for a in PLACERS if not a.startswith("mcb") or a == "mcb8"]:
        r = solve(inst, algo, OPTIONS)
        assert r.feasible and r.allocation is not None, algo
        assert r.allocation.hosts == (0, 1), algo


@pytest.mark.parametrize("seed", range(8))
def test_best_never_below_mcb8_on_the_vector(seed: int) -> None:
    inst = vector_instance(200 + seed, hosts=6, tasks=24)
    placed = best_placement(inst, budget_s=60.0, seed=seed, max_kicks=40)
    mcb8 = solve(inst, "mcb8")
    if mcb8.feasible:
        assert placed.hosts is not None and mcb8.min_yield is not None
        assert placement_min_yield(inst, placed.hosts) >= mcb8.min_yield - 1e-12
    if placed.hosts is not None:
        _check(inst, "best", solve(inst, "best", SolveOptions(time_limit=0.2)))


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("algo", ["heuristic", "milp"])
def test_the_adaptation_is_valid_on_every_resource(seed: int, algo: str) -> None:
    # Draw instances from the seed's sequence until SG places one: an instance with no placement has nothing to
    # adapt from, and skipping it would leave that seed untested.
    for attempt in range(50):
        inst = vector_instance(300 + seed + 1000 * attempt, hosts=3, tasks=6)
        start = solve(inst, "sg")
        if start.allocation is not None:
            break
    assert start.allocation is not None, f"seed {seed}: 50 instances without a placement"
    current = np.roll(np.array(start.allocation.hosts, dtype=np.int64), 1)  # somewhere else than SG's choice
    current[-1] = -1  # a new arrival
    task_bytes = np.round(inst.task_mem * (1 << 30)).astype(np.int64)
    for budget in (0, int(task_bytes.sum() // 3), int(task_bytes.sum())):
        problem = AdaptProblem(inst, current, task_bytes, budget)
        res = solve_adapt(problem, algo, SolveOptions(time_limit=20.0))  # validated inside on every resource
        _check(inst, f"adapt {algo}", res.result)
        assert res.migrated_bytes <= budget


def test_the_adaptation_milp_bounds_the_heuristic_on_the_vector() -> None:
    for seed in range(10):
        inst = vector_instance(400 + seed, hosts=3, tasks=6)
        task_bytes = np.round(inst.task_mem * (1 << 30)).astype(np.int64)
        problem = AdaptProblem(inst, np.full(inst.n_tasks, -1, dtype=np.int64), task_bytes, 0)
        h, m = solve_adapt(problem, "heuristic").result, solve_adapt(problem, "milp").result
        assert h.feasible <= m.feasible
        if h.feasible and m.optimal:
            assert h.min_yield <= m.min_yield + 1e-6  # type: ignore[operator]


def test_adaptation_with_no_disk_where_a_new_task_fits_is_infeasible() -> None:
    inst = disk_infeasible()
    problem = AdaptProblem(inst, np.array([0, -1]), np.array([1, 1]), 10)
    for algo in ("heuristic", "milp"):
        assert not solve_adapt(problem, algo).result.feasible, algo
