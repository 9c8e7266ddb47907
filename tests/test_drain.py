"""Drain planning (vcsched.adaptation.drain), rules in the files and metadata, and `vcsched cordon`'s file edit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from cli.maintenance import set_maintenance
from hypervisor.domain_xml import metadata_xml, parse_metadata
from vcsched.adaptation.drain import BUDGET, NO_ROOM, PINNED, RULE, drain
from vcsched.adaptation.problem import AdaptProblem, adapt_rule_problems
from vcsched.errors import InputError
from vcsched.formats.cluster import cluster_from_dict
from vcsched.formats.request import request_from_dict
from vcsched.inventory import VmMeta
from vcsched.model import REQUIRED, Host, Instance, Job

GIB = 1 << 30


def problem(jobs: tuple[Job, ...], current: list[int], budget: int, n_hosts: int = 3, memory: float = 1.0,
            pinned: tuple[int, ...] = ()) -> AdaptProblem:
    inst = Instance(tuple(Host(f"h{i}", memory=memory) for i in range(n_hosts)), jobs, pinned=pinned)
    return AdaptProblem(inst, np.array(current, dtype=np.int64), np.full(inst.n_tasks, GIB, dtype=np.int64), budget)


@pytest.mark.parametrize("algorithm", ["heuristic", "milp"])
def test_drain_empties_the_host_keeping_spread(algorithm: str) -> None:
    p = problem((Job("sp", 0.3, 0.2, 2, spread=REQUIRED), Job("b", 0.3, 0.2)), [0, 1, 0], 2 * GIB)
    r = drain(p, 0, algorithm)
    assert r.complete and r.adapted.result.allocation is not None
    hosts = np.asarray(r.adapted.result.allocation.hosts)
    assert 0 not in hosts and hosts[0] == 2  # h1 holds sp's other VM: spread sends it to h2
    assert adapt_rule_problems(r.problem, hosts) == []
    assert r.adapted.migrated_bytes == 2 * GIB


@pytest.mark.parametrize("algorithm", ["heuristic", "milp"])
def test_partial_drain_says_why_each_vm_stays(algorithm: str) -> None:
    p = problem((Job("a", 0.2, 0.2, 3), Job("p", 0.2, 0.2)), [0, 0, 0, 0], GIB, pinned=(-1, -1, -1, 0))
    r = drain(p, 0, algorithm)
    reasons = sorted(s.reason for s in r.stays)
    assert reasons == [BUDGET, BUDGET, PINNED]
    assert r.adapted.migrated_bytes == GIB and not r.complete


def test_a_vm_that_stays_is_named_by_its_vm_name_and_the_bytes_in_units() -> None:
    """Issue (QA on the lab): `drain h0 --budget 100MiB` said "task 1 of 'batch' needs 134217728 bytes;
    104857600 of the budget are left" beside VM batch-1."""
    p = problem((Job("a", 0.2, 0.2, 3), Job("p", 0.2, 0.2)), [0, 0, 0, 0], GIB // 2, pinned=(-1, -1, -1, 0))
    r = drain(p, 0, names=["a-7", "a-8", "a-9", "p-0"])
    details = sorted(s.detail for s in r.stays)
    assert details == ["a-7 needs 1 GiB to move; 512 MiB of the budget are left",
                       "a-8 needs 1 GiB to move; 512 MiB of the budget are left",
                       "a-9 needs 1 GiB to move; 512 MiB of the budget are left", "p-0 is pinned to this host"]
    assert drain(p, 0).stays[-1].detail == "task 0 of 'p' is pinned to this host"  # no names: the job's index


def test_rule_and_no_room_reasons() -> None:
    # sp's other VMs fill h1's spread slot; h2 has no memory left: no host keeps the rule with room.
    p = problem((Job("sp", 0.1, 0.3, 2, spread=REQUIRED), Job("big", 0.1, 0.9)), [0, 1, 2], 10 * GIB, memory=1.0)
    assert [s.reason for s in drain(p, 0).stays] == [RULE]
    full = problem((Job("x", 0.1, 0.9, 3),), [0, 1, 2], 10 * GIB)
    assert [s.reason for s in drain(full, 0).stays] == [NO_ROOM]


def test_adapt_repairs_a_spread_violation_within_the_budget() -> None:
    from vcsched.adaptation.solve import solve_adapt

    p = problem((Job("sp", 0.3, 0.2, 2, spread=REQUIRED),), [0, 0], GIB)
    r = solve_adapt(p)
    assert r.result.allocation is not None and len(set(r.result.allocation.hosts)) == 2
    left = solve_adapt(p.with_budget(0))  # no budget: left as it is, and said
    assert left.result.feasible and "spread_left" in left.detail


def test_request_and_cluster_rules() -> None:
    base = {"name": "x", "vms": 2, "vcpus": 1, "memory": "64MiB", "cpu_need": 0.2}
    r = request_from_dict(base | {"spread": "preferred", "pinned": True})
    assert (r.spread, r.together, r.pinned) == ("preferred", None, True)
    assert request_from_dict(base | {"together": True}).together == REQUIRED
    with pytest.raises(InputError, match="cannot be both spread"):
        request_from_dict(base | {"spread": True, "together": True})
    with pytest.raises(InputError, match="spread: 'maybe' is not"):
        request_from_dict(base | {"spread": "maybe"})
    with pytest.raises(InputError, match="pinned: expected true or false"):
        request_from_dict(base | {"pinned": "yes"})
    c = cluster_from_dict({"name": "c", "hosts": [{"name": "h0", "uri": "test:///default", "maintenance": True}]})
    assert c.cordoned == {"h0"}
    with pytest.raises(InputError, match=r"hosts\[0\].maintenance"):
        cluster_from_dict({"name": "c", "hosts": [{"name": "h0", "uri": "test:///default", "maintenance": 1}]})


def test_metadata_round_trip_with_rules() -> None:
    meta = VmMeta("web", 0.5, 64 << 20, 1, spread="required", together=None, pinned=True)
    assert parse_metadata(metadata_xml(meta)) == meta
    plain = VmMeta("web", 0.5, 64 << 20, 1)
    assert "spread" not in metadata_xml(plain) and parse_metadata(metadata_xml(plain)) == plain
    assert parse_metadata(metadata_xml(dataclasses.replace(meta, spread="sometimes"))) is None


def test_cordon_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    text = ('# my cluster\nname = "c"\n\n[[hosts]]\nname = "h0"  # the old one\nuri = "test:///default"\n\n'
            '[[hosts]]\nname = "h1"\nuri = "test:///x"\n')
    f.write_text(text)
    assert set_maintenance(f, "h0", True) is True
    assert set_maintenance(f, "h0", True) is False
    assert "# my cluster" in f.read_text() and "# the old one" in f.read_text()
    assert cluster_from_dict(__import__("tomllib").loads(f.read_text())).cordoned == {"h0"}
    assert set_maintenance(f, "h0", False) is True and f.read_text() == text
    with pytest.raises(InputError, match="'h9': not in cluster"):
        set_maintenance(f, "h9", True)


def test_improvement_moves_stop_at_their_deadline() -> None:
    """The drain bounds the heuristic's improvement moves in time (docs/rules.md): past the deadline none starts."""
    import time

    from vcsched.adaptation.heuristic import improve
    from vcsched.adaptation.problem import GIB
    from vcsched.adaptation.solve import solve_adapt

    inst = Instance((Host("h0"), Host("h1")), (Job("a", 0.8, 0.3), Job("b", 0.8, 0.3), Job("c", 0.2, 0.2)))
    p = AdaptProblem(inst, np.array([0, 0, 1]), np.full(3, GIB, dtype=np.int64), GIB)
    start = np.array([0, 0, 1])
    assert improve(p, start).tolist() != start.tolist()  # one migration rebalances, given time
    assert improve(p, start, deadline=time.perf_counter() - 1.0).tolist() == start.tolist()
    detail = solve_adapt(p, improve_s=0.0).detail
    assert detail.get("improve_stopped") == "improvement moves stopped after 0 s"
    assert "improve_stopped" not in solve_adapt(p).detail


def test_drain_of_live_vms_names_each_one_that_stays_by_its_name() -> None:
    """The same through the live adaptation `vcsched drain` runs: VM names that are not the job's indices."""
    from tests.builders import inventory_of, managed
    from vcsched.control.live import adapt_inventory

    inv = inventory_of([managed("web-5", "h0", "web", 0.25), managed("web-9", "h0", "web", 0.25)])
    live = adapt_inventory("lab", inv, 100 << 20, drain="h0")
    assert sorted(live.stays) == [("web-5", BUDGET, "web-5 needs 128 MiB to move; 100 MiB of the budget are left"),
                                  ("web-9", BUDGET, "web-9 needs 128 MiB to move; 100 MiB of the budget are left")]
