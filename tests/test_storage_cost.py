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
from vcsched.adaptation.problem import AdaptProblem, migrations, move_cost
from vcsched.adaptation.solve import solve_adapt
from vcsched.control.live import adapt_inventory
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.model import Host, Instance, Job

MiB = 1 << 20


def two_on_h0(disk: int) -> tuple:
    """Two VMs needing 0.6 cores on h0 (1 core each host), 128 MiB memory and ``disk`` bytes of disks each."""
    vms = [replace(managed(f"v{i}", "h0", f"c{i}", 0.6, 0.5), disk_bytes=disk) for i in range(2)]
    return inventory_of(vms, n_hosts=2)


def storage(c: Cluster, *names: str | None) -> Cluster:
    return replace(c, hosts=tuple(replace(h, storage=n) for h, n in zip(c.hosts, names, strict=True)))


def test_moves_between_storages_cost_memory_plus_disks_and_shared_storage_memory_only() -> None:
    inst = Instance((Host("a", 1, 1), Host("b", 1, 1), Host("c", 1, 1)), (Job("j", 0.5, 0.1, tasks=2),))
    p = AdaptProblem(inst, np.array([0, 0]), np.array([100, 100]), 1000, np.array([40, 0]), np.array([0, 0, 1]))
    assert p.copies_disks
    assert p.move_bytes(0, 1) == 100 and p.move_bytes(0, 2) == 140 and p.move_bytes(1, 2) == 100
    assert move_cost(p, np.array([2, 1])) == 240
    assert [m.bytes for m in migrations(p, np.array([2, 1]))] == [140, 100]
    old = AdaptProblem(inst, np.array([0, 0]), np.array([100, 100]), 1000)
    assert not old.copies_disks and move_cost(old, np.array([2, 1])) == 200
    with pytest.raises(InputError, match="go together"):
        AdaptProblem(inst, np.array([0, 0]), np.array([100, 100]), 1, np.array([1, 1]))


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
        p = AdaptProblem(inst, cur, np.full(n_t, 100), int(rng.integers(0, 600)), rng.integers(0, 300, n_t),
                         rng.integers(0, 2, n_h))
        for algorithm in ("heuristic", "milp"):
            r = solve_adapt(p, algorithm)
            if r.result.allocation is not None:
                assert move_cost(p, r.result.allocation.hosts) <= p.budget
                assert r.migrated_bytes == move_cost(p, r.result.allocation.hosts)

