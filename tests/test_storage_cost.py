"""What a move costs when hosts do not share storage: memory plus the VM's disks (per VM, source, target).

Shared storage (or no cluster file, or VMs without disks) keeps the paper's
cost, memory only; the heuristic, the MILP and the plan's ordering all count
the disks when the destination's storage differs, so a budget that fits the
memory but not memory + disks refuses the move.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.builders import cluster_of, inventory_of, managed
from vcsched.adaptation.drain import BUDGET, drain
from vcsched.adaptation.problem import AdaptProblem, migrations, move_cost
from vcsched.adaptation.solve import solve_adapt
from vcsched.control.live import adapt_inventory
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.model import REQUIRED, Host, Instance, Job

MiB = 1 << 20


def two_on_h0(disk: int) -> tuple:
    """Two VMs needing 0.6 cores on h0 (1 core each host), 128 MiB memory and ``disk`` bytes of disks each."""
    vms = [replace(managed(f"v{i}", "h0", f"c{i}", 0.6, 0.5), disk_bytes=disk) for i in range(2)]
    return inventory_of(vms, n_hosts=2)


def storage(c: Cluster, *names: str | None) -> Cluster:
    return replace(c, hosts=tuple(replace(h, storage=n) for h, n in zip(c.hosts, names, strict=True)))


def test_moves_between_storages_cost_memory_plus_disks_and_shared_storage_memory_only() -> None:
    inst = Instance((Host("a", 1, 1), Host("b", 1, 1), Host("c", 1, 1)), (Job("j", 0.5, 0.1, tasks=2),))
    p = AdaptProblem(inst, np.array([0, 0]), np.array([100, 100]), 1000, disk_bytes=np.array([40, 0]),
                     host_storage=np.array([0, 0, 1]))
    assert p.copies_disks
    assert p.move_bytes(0, 1) == 100 and p.move_bytes(0, 2) == 140 and p.move_bytes(1, 2) == 100
    assert move_cost(p, np.array([2, 1])) == 240
    assert [m.bytes for m in migrations(p, np.array([2, 1]))] == [140, 100]
    old = AdaptProblem(inst, np.array([0, 0]), np.array([100, 100]), 1000)
    assert not old.copies_disks and move_cost(old, np.array([2, 1])) == 200
    with pytest.raises(InputError, match="go together"):
        AdaptProblem(inst, np.array([0, 0]), np.array([100, 100]), 1, disk_bytes=np.array([1, 1]))


@pytest.mark.parametrize("algorithm", ["heuristic", "milp"])
def test_the_budget_refuses_a_move_whose_memory_fits_but_memory_plus_disk_does_not(algorithm: str) -> None:
    inv = two_on_h0(disk=64 * MiB)
    local = storage(cluster_of(2), None, None)  # each host its own storage: the default
    refused = adapt_inventory("lab", inv, 128 * MiB, algorithm=algorithm, cluster=local)
    assert refused.plan is None or not any(s.moves for s in refused.plan.steps)
    moved = adapt_inventory("lab", inv, 192 * MiB, algorithm=algorithm, cluster=local)
    assert moved.plan is not None
    moves = [s for s in moved.plan.steps if s.moves]
    assert len(moves) == 1 and moves[0].to_dict()["bytes"] == 192 * MiB
    assert moved.plan.extra["migrated_bytes"] == 192 * MiB
    shared = adapt_inventory("lab", inv, 128 * MiB, algorithm=algorithm, cluster=storage(cluster_of(2), "s", "s"))
    assert shared.plan is not None
    assert [s.to_dict()["bytes"] for s in shared.plan.steps if s.moves] == [128 * MiB]


def test_without_the_cluster_file_or_disks_a_move_costs_memory_as_before() -> None:
    inv = two_on_h0(disk=64 * MiB)
    live = adapt_inventory("lab", inv, 128 * MiB)
    assert live.plan is not None and [s.to_dict()["bytes"] for s in live.plan.steps if s.moves] == [128 * MiB]
    no_disks = adapt_inventory("lab", two_on_h0(disk=0), 128 * MiB, cluster=cluster_of(2))
    assert no_disks.plan is not None and [s.to_dict()["bytes"] for s in no_disks.plan.steps if s.moves] == [128 * MiB]


def test_solve_adapt_never_overspends_with_destination_dependent_costs() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        n_h, n_t = 4, 6
        inst = Instance(tuple(Host(f"h{i}", 1, 1) for i in range(n_h)),
                        tuple(Job(f"j{t}", float(rng.uniform(0.2, 0.6)), 0.2) for t in range(n_t)))
        cur = rng.integers(0, n_h, n_t)
        p = AdaptProblem(inst, cur, np.full(n_t, 100), int(rng.integers(0, 600)),
                         disk_bytes=rng.integers(0, 300, n_t), host_storage=rng.integers(0, 2, n_h))
        for algorithm in ("heuristic", "milp"):
            r = solve_adapt(p, algorithm)
            if r.result.allocation is not None:
                assert move_cost(p, r.result.allocation.hosts) <= p.budget
                assert r.migrated_bytes == move_cost(p, r.result.allocation.hosts)



# ------------------------------------------------------------------ drain and the rules pay for disks too


def disk_problem(jobs: tuple[Job, ...], current: list[int], budget: int, disks: list[int],
                 storage: list[int]) -> AdaptProblem:
    inst = Instance(tuple(Host(f"h{i}", 1, 1) for i in range(len(storage))), jobs)
    return AdaptProblem(inst, np.array(current), np.full(inst.n_tasks, 100), budget,
                        disk_bytes=np.array(disks), host_storage=np.array(storage))


@pytest.mark.parametrize("algorithm", ["heuristic", "milp"])
def test_a_drain_pays_for_the_disks_unless_a_host_shares_the_storage(algorithm: str) -> None:
    jobs = (Job("a", 0.3, 0.3),)
    local = disk_problem(jobs, [0], 120, [40], [0, 1, 2])  # memory (100) fits, memory + disk (140) does not
    r = drain(local, 0, algorithm)
    assert not r.complete and [(s.reason, "needs 140 B to move" in s.detail) for s in r.stays] == [(BUDGET, True)]
    done = drain(local.with_budget(140), 0, algorithm)
    assert done.complete and done.adapted.migrated_bytes == 140
    # h2 shares h0's storage: leaving there costs the memory only, and the drain takes it.
    shared = drain(disk_problem(jobs, [0], 120, [40], [0, 1, 0]), 0, algorithm)
    assert shared.complete and shared.adapted.result.allocation is not None
    assert int(shared.adapted.result.allocation.hosts[0]) == 2 and shared.adapted.migrated_bytes == 100


@pytest.mark.parametrize("algorithm", ["heuristic", "milp"])
def test_a_together_virtual_cluster_moved_as_one_pays_every_vms_disks(algorithm: str) -> None:
    # Two VMs that must stay together on h0 (too loaded), h1 with other storage: moving both costs 2 x (100 + 40).
    jobs = (Job("t", 0.4, 0.2, tasks=2, together=REQUIRED), Job("b", 0.5, 0.2))
    p = disk_problem(jobs, [0, 0, 0], 279, [40, 40, 0], [0, 1])
    r = solve_adapt(p, algorithm)
    assert r.result.allocation is None or list(r.result.allocation.hosts[:2]) == [0, 0]  # 280 > 279: no move
    moved = solve_adapt(p.with_budget(280), algorithm)
    assert moved.result.allocation is not None and moved.migrated_bytes <= 280
    assert move_cost(p, moved.result.allocation.hosts) == moved.migrated_bytes


def test_the_controller_counts_the_disks_when_given_the_cluster_file() -> None:
    from vcsched.control.rebalance import REBALANCE, RebalanceOptions, Rebalancer

    inv = two_on_h0(disk=64 * MiB)
    needs = {v.name: 0.6 for v in inv.vms}

    def moves(storage: Cluster | None) -> list[int]:
        live = Rebalancer(RebalanceOptions(128 * MiB, storage=storage)).plan_for(REBALANCE, inv, needs)
        return [s.to_dict()["bytes"] for s in live.plan.steps if s.moves] if live.plan is not None else []

    assert moves(None) == [128 * MiB]  # without the file: memory only, as before
    assert moves(storage(cluster_of(2), None, None)) == []  # local storage: memory + disk exceeds the budget
    assert moves(storage(cluster_of(2), "s", "s")) == [128 * MiB]
