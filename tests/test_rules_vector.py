"""Placement rules (docs/rules.md) and the resource vector (docs/policies.md) together.

Maintenance, pins and a host without a fluid resource a task needs close a
(task, host) pair through one mask (:func:`vcsched.rules.allowed_matrix`,
:func:`vcsched.adaptation.problem.task_allowed`).  These tests put the two
side by side: every placing algorithm and both adaptation methods must honour
both at once, and say "infeasible" (never place at yield 0) when only their
combination rules a task out.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vcsched.adaptation.drain import NO_ROOM, drain
from vcsched.adaptation.problem import AdaptProblem, task_allowed
from vcsched.adaptation.solve import solve_adapt
from vcsched.errors import InputError
from vcsched.model import REQUIRED, Host, Instance, Job, SolveOptions
from vcsched.rules import allowed_matrix, check_rules, rule_problems
from vcsched.solvers.registry import algorithms, solve
from vcsched.validate import allocation_problems
from vcsched.yields import fits

PLACERS = sorted(name for name, a in algorithms().items() if not a.bound_only)
OPTIONS = SolveOptions(seed=1, time_limit=20.0, max_attempts=50_000)
DISK = (("disk", 1.0),)


def _io_and_cpu(h0: Host, h1: Host, pinned: tuple[int, ...] = ()) -> Instance:
    """One task needing disk, one needing none; only h0 has disk."""
    jobs = (Job("io", 0.5, 0.3, 1, (("disk", 0.2),)), Job("cpu", 0.5, 0.3, 1))
    return dataclasses.replace(Instance((h0, h1), jobs), pinned=pinned)


def test_the_one_mask_closes_maintenance_pins_and_missing_resources() -> None:
    inst = dataclasses.replace(Instance(
        (Host("h0", capacity=DISK), Host("h1", maintenance=True, capacity=DISK), Host("h2")),
        (Job("io", 0.2, 0.1, 2, (("disk", 0.1),)), Job("cpu", 0.2, 0.1, 2))), pinned=(-1, 2, 1, -1))
    assert allowed_matrix(inst).tolist() == [
        [True, False, False],   # io: h1 in maintenance, h2 without disk
        [False, False, False],  # io pinned to h2, which has no disk: nowhere
        [False, True, False],   # cpu pinned to h1: there alone, maintenance or not
        [True, False, True],    # cpu: anywhere not in maintenance
    ]


@pytest.mark.parametrize("algorithm", PLACERS)
def test_the_only_host_with_disk_in_maintenance_is_infeasible(algorithm: str) -> None:
    inst = _io_and_cpu(Host("h0", maintenance=True, capacity=DISK), Host("h1"))
    r = solve(inst, algorithm, OPTIONS)
    assert not r.feasible and "rules" in r.detail


@pytest.mark.parametrize("algorithm", PLACERS)
def test_a_task_pinned_to_a_host_without_its_resource_is_infeasible(algorithm: str) -> None:
    inst = _io_and_cpu(Host("h0", capacity=DISK), Host("h1"), pinned=(1, -1))
    assert not solve(inst, algorithm, OPTIONS).feasible


def random_ruled_vector(rng: np.random.Generator) -> Instance:
    """2-4 hosts, some without disk or in maintenance; jobs needing disk (or not), some spread, a few pins."""
    nh = int(rng.integers(2, 5))
    hosts = tuple(Host(f"h{i}", maintenance=bool(rng.random() < 0.2),
                       capacity=(("disk", float(rng.uniform(0.3, 1.0))),) if i == 0 or rng.random() < 0.6 else ())
                  for i in range(nh))
    jobs = tuple(Job(f"j{j}", float(rng.uniform(0.05, 0.9)), float(rng.uniform(0.05, 0.3)), int(rng.integers(1, 4)),
                     needs=(("disk", float(rng.uniform(0.05, 0.4))),) if rng.random() < 0.5 else (),
                     spread=REQUIRED if rng.random() < 0.3 else None)
                 for j in range(int(rng.integers(1, 5))))
    inst = Instance(hosts, jobs)
    return dataclasses.replace(inst, pinned=tuple(int(rng.integers(0, nh)) if rng.random() < 0.1 else -1
                                                  for _ in range(inst.n_tasks)))


@pytest.mark.parametrize("algorithm", PLACERS)
def test_every_algorithm_honours_rules_and_resources_at_once(algorithm: str) -> None:
    rng = np.random.default_rng(11)
    feasible = 0
    for _ in range(25):
        inst = random_ruled_vector(rng)
        try:
            check_rules(inst)
        except InputError:
            continue
        r = solve(inst, algorithm, OPTIONS)
        if not r.feasible:
            continue
        assert r.allocation is not None
        hosts = np.asarray(r.allocation.hosts)
        assert allocation_problems(inst, r.allocation) == [], algorithm
        assert rule_problems(inst, hosts) == [], algorithm
        assert fits(inst, hosts), algorithm  # no task where a resource it needs has capacity 0
        feasible += 1
    assert feasible >= 8


def _three_hosts() -> tuple[Instance, np.ndarray, np.ndarray]:
    """h0 and h1 have disk, h2 has none and is empty; the disk VM runs on h0, a CPU VM on h1."""
    hosts = (Host("h0", capacity=DISK), Host("h1", capacity=DISK), Host("h2"))
    jobs = (Job("io", 0.6, 0.3, 1, (("disk", 0.3),)), Job("busy", 0.9, 0.3, 1))
    inst = Instance(hosts, jobs)
    return inst, np.array([0, 1]), np.array([1 << 30, 1 << 30])


@pytest.mark.parametrize("algorithm", ["heuristic", "heuristic-best", "milp"])
def test_a_drain_sends_a_vm_only_where_its_resources_are(algorithm: str) -> None:
    # h2 is the emptiest, but has no disk: the io VM must go to h1 even though that lowers the yield.
    inst, current, task_bytes = _three_hosts()
    result = drain(AdaptProblem(inst, current, task_bytes, 1 << 31), 0, algorithm)
    assert result.complete
    hosts = result.adapted.result.allocation.hosts  # type: ignore[union-attr]
    assert hosts[0] == 1


@pytest.mark.parametrize("algorithm", ["heuristic", "heuristic-best", "milp"])
def test_a_drain_with_no_other_host_with_the_resource_stays_for_no_room(algorithm: str) -> None:
    hosts = (Host("h0", capacity=DISK), Host("h1"), Host("h2"))
    inst = Instance(hosts, (Job("io", 0.6, 0.3, 1, (("disk", 0.3),)),))
    result = drain(AdaptProblem(inst, np.array([0]), np.array([1 << 30]), 1 << 31), 0, algorithm)
    assert not result.complete
    assert [s.reason for s in result.stays] == [NO_ROOM]


@pytest.mark.parametrize("algorithm", ["heuristic", "heuristic-best", "milp"])
def test_a_vm_on_a_cordoned_host_without_its_resource_is_moved_off(algorithm: str) -> None:
    # It may stay on a host in maintenance it runs on, but not where it could only run at yield 0.
    hosts = (Host("h0", maintenance=True), Host("h1", capacity=DISK))
    inst = Instance(hosts, (Job("io", 0.5, 0.3, 1, (("disk", 0.3),)), Job("cpu", 0.5, 0.3, 1)))
    problem = AdaptProblem(inst, np.array([0, 0]), np.array([1 << 30, 1 << 30]), 1 << 30)
    assert task_allowed(problem, np.array([0, 1]), np.array([0, 1])).tolist() == [[False, True], [True, True]]
    res = solve_adapt(problem, algorithm).result
    assert res.feasible and res.allocation is not None
    assert res.allocation.hosts == (1, 0)  # io moves to the disk host (the budget is one VM); cpu stays
