"""The room left once every floor and the target yield hold (vcsched.adaptation.spare): spread evens the hosts,
consolidate empties them, both within the budget, never lowering a yield or breaking the failures room."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tests.builders import GiB, cluster_of
from vcsched.adaptation.problem import problem_from_dict
from vcsched.adaptation.solve import solve_adapt
from vcsched.adaptation.spare import SPREAD_MIN_GAIN, Spare, spare_score, spend_spare
from vcsched.control.admission import floors_missed
from vcsched.control.failover import failover_refusal
from vcsched.control.live import LiveAdaptation, adapt_inventory
from vcsched.control.rebalance import REBALANCE, RebalanceOptions, Rebalancer
from vcsched.errors import InputError
from vcsched.formats.power import power_from_dict
from vcsched.inventory import HostState, Inventory, VmMeta, VmState
from vcsched.plans.steps import MigrateStep

#: Where each VM runs: h0 holds five, h1 two, h2 one, h3 none.  Every VM needs half a core of a 4-core host and
#: 2 GiB of 16: every yield is 1.0 already, so the minimum yield has nothing to buy.
UNEVEN = (0, 0, 0, 0, 0, 1, 1, 2)


def uneven(floor: float | None = 1.0, layout: tuple[int, ...] = UNEVEN) -> Inventory:
    vms = tuple(VmState(f"v{i}", f"h{h}", 1, 2 * GiB, True, VmMeta(f"vc{i}", 0.5, 2 * GiB, 1, min_yield=floor), 0.5)
                for i, h in enumerate(layout))
    return Inventory("lab", tuple(HostState(f"h{i}", 4, 16 * GiB) for i in range(4)), vms)


def moved(inv: Inventory, live: LiveAdaptation) -> Inventory:
    assert live.plan is not None
    where = {name: p.host for name, p in live.plan.per_vm.items()}
    return dataclasses.replace(inv, vms=tuple(dataclasses.replace(v, host=where.get(v.name, v.host))
                                              for v in inv.vms))


def free_memory_stddev(inv: Inventory) -> float:
    free = [1 - sum(v.memory_bytes for v in inv.vms if v.host == h.name) / h.memory_bytes for h in inv.hosts]
    return float(np.std(free))


def empty_hosts(inv: Inventory) -> int:
    return sum(1 for h in inv.hosts if not any(v.host == h.name for v in inv.vms))


def migrated(live: LiveAdaptation) -> int:
    assert live.plan is not None
    return sum(s.bytes for s in live.plan.steps if isinstance(s, MigrateStep))


def check_kept(inv: Inventory, live: LiveAdaptation) -> None:
    """Every VM still at yield 1.0 and at its floor."""
    assert live.plan is not None and live.plan.min_yield == pytest.approx(1.0)
    assert all(p.yield_ == pytest.approx(1.0) for p in live.plan.per_vm.values())
    assert not live.floors_missed
    assert not floors_missed(inv.vms, {n: p.yield_ for n, p in live.plan.per_vm.items()})


def test_without_spare_adapt_leaves_the_uneven_cluster_as_it_is() -> None:
    live = adapt_inventory("lab", uneven(), 64 * GiB)
    assert migrated(live) == 0 and "spare" not in live.adapted.detail


def test_spread_lowers_the_free_memory_stddev_within_the_budget() -> None:
    inv = uneven()
    live = adapt_inventory("lab", inv, 6 * GiB, spare="spread")
    after = moved(inv, live)
    assert free_memory_stddev(after) < free_memory_stddev(inv) / 2  # 0.23 -> 0.05 here
    assert 0 < migrated(live) <= 6 * GiB
    assert empty_hosts(after) == 0
    check_kept(inv, live)
    report = live.adapted.detail["spare"]
    assert report["now"]["free_memory_stddev"] == pytest.approx(free_memory_stddev(inv), abs=1e-6)
    assert report["after"]["free_memory_stddev"] == pytest.approx(free_memory_stddev(after), abs=1e-6)
    assert report["after"]["score"] < report["now"]["score"] - SPREAD_MIN_GAIN / 4


def test_spread_stays_within_a_budget_of_one_vm() -> None:
    inv = uneven()
    live = adapt_inventory("lab", inv, 2 * GiB, spare="spread")
    assert migrated(live) == 2 * GiB
    assert free_memory_stddev(moved(inv, live)) < free_memory_stddev(inv)


def test_consolidate_empties_a_host_within_the_budget() -> None:
    inv = uneven()
    live = adapt_inventory("lab", inv, 2 * GiB, spare="consolidate")
    after = moved(inv, live)
    assert empty_hosts(after) == 2 and migrated(live) == 2 * GiB  # h2's one VM joins the others
    check_kept(inv, live)
    wide = adapt_inventory("lab", inv, 64 * GiB, spare="consolidate")
    assert empty_hosts(moved(inv, wide)) == 3 and migrated(wide) == 6 * GiB  # h1 and h2 onto h0 (8 x 2 GiB)
    check_kept(inv, wide)


def test_consolidate_keeps_the_failures_tolerated_room() -> None:
    """Emptying a host leaves its whole capacity as room, so on equal hosts the failures room holds (the
    totals do not change); the check is asked all the same, on every step."""
    inv = uneven()
    cluster = dataclasses.replace(cluster_of(4), failures_tolerated=2)
    live = adapt_inventory("lab", inv, 64 * GiB, cluster=cluster, spare="consolidate")
    after = moved(inv, live)
    assert empty_hosts(after) >= 2 and failover_refusal(cluster, after) is None
    check_kept(inv, live)


def test_a_cluster_already_short_of_the_failures_room_is_left_alone() -> None:
    """h0's five VMs (10 GiB) could not all restart on h1 (6 GiB free) if h0 failed: nothing is spent."""
    inv = dataclasses.replace(uneven(layout=(0, 0, 0, 0, 0, 1, 1, 1)),
                              hosts=(HostState("h0", 4, 12 * GiB), HostState("h1", 4, 12 * GiB)))
    cluster = dataclasses.replace(cluster_of(2), failures_tolerated=1)
    assert failover_refusal(cluster, inv) is not None
    live = adapt_inventory("lab", inv, 64 * GiB, cluster=cluster, spare="spread")
    assert "already breaks" in live.adapted.detail["spare"]["skipped"] and migrated(live) == 0
    assert migrated(adapt_inventory("lab", inv, 64 * GiB, spare="spread")) > 0  # without the room: it spreads


def test_spread_moves_on_a_large_cluster_too() -> None:
    """200 hosts, half with 3 VMs, half with 1.  A move's share of a standard deviation over n hosts shrinks as
    1 / n: the minimum gain does too."""
    layout = tuple(h for h in range(200) for _ in range(3 if h < 100 else 1))
    vms = tuple(VmState(f"v{i}", f"h{h}", 1, 2 * GiB, True, VmMeta(f"vc{i}", 0.5, 2 * GiB, 1), 0.5)
                for i, h in enumerate(layout))
    inv = Inventory("lab", tuple(HostState(f"h{i}", 4, 16 * GiB) for i in range(200)), vms)
    live = adapt_inventory("lab", inv, 32 * GiB, spare="spread")
    # Each move lowers the score by about 0.001 here (a fixed minimum of 0.005 made none).
    assert migrated(live) == 32 * GiB  # 16 of the 100 crowded hosts give one VM each
    assert free_memory_stddev(moved(inv, live)) < free_memory_stddev(inv)


def test_a_step_the_callers_check_refuses_is_undone() -> None:
    """The check of the whole placement (the live layer's failures room): here no host may hold 6 VMs."""
    doc = {"hosts": [{"name": f"h{i}"} for i in range(4)], "host_memory_bytes": "16GiB",
           "jobs": [{"name": f"j{k}", "cpu_need": 0.125, "memory": 0.125, "current": [c]}
                    for k, c in enumerate(UNEVEN)]}
    p = problem_from_dict(doc, 64 * GiB)
    first = solve_adapt(p)

    def at_most_five(hosts: np.ndarray) -> str | None:
        return "a host holds 6 VMs" if np.bincount(hosts).max() > 5 else None

    free = spend_spare(p, first, Spare("consolidate"))
    assert free.result.allocation is not None and np.bincount(free.result.allocation.hosts).max() == 8
    kept = spend_spare(p, first, Spare("consolidate", accept=at_most_five))
    assert kept.result.allocation is not None
    hosts = np.asarray(kept.result.allocation.hosts)
    assert np.bincount(hosts).max() <= 5 and kept.detail["spare"]["refused"] == ["a host holds 6 VMs"] * len(
        kept.detail["spare"]["refused"])
    assert kept.detail["spare"]["after"]["hosts_empty"] == 2  # h2 emptied into h1; h1 (3 VMs) fits nowhere


def test_nothing_is_spent_while_a_vm_is_below_the_target_yield() -> None:
    inv = uneven(floor=None)
    two_cores = dataclasses.replace(inv, hosts=tuple(dataclasses.replace(h, cores=2) for h in inv.hosts))
    live = adapt_inventory("lab", two_cores, 0, spare="spread")  # h0: 2.5 cores needed of 2, and no budget
    assert "below the target yield 1" in live.adapted.detail["spare"]["skipped"]


def test_a_floor_missed_stops_the_spare_room() -> None:
    inv = uneven(floor=1.0)
    hosts = tuple(dataclasses.replace(h, cores=2) for h in inv.hosts)  # h0: 2.5 cores needed of 2
    live = adapt_inventory("lab", dataclasses.replace(inv, hosts=hosts), 0, spare="consolidate")
    assert live.adapted.detail["spare"]["moves"] == 0 and "skipped" in live.adapted.detail["spare"]


def test_the_core_never_lowers_a_yield_below_one() -> None:
    """Below yield 1 (a target of 0.5 met): every job keeps at least the yield the min-yield answer gave it."""
    doc = {"hosts": [{"name": f"h{i}"} for i in range(3)], "host_memory_bytes": "8GiB",
           "jobs": [{"name": f"j{k}", "cpu_need": need, "memory": 0.125, "current": [c]}
                    for k, (need, c) in enumerate([(0.6, 0), (0.6, 0), (0.3, 1), (0.2, 1), (0.1, 2)])]}
    p = problem_from_dict(doc, 64 * GiB)
    first = solve_adapt(p.with_budget(0))
    p = p.with_budget(64 * GiB)
    assert first.result.allocation is not None
    y0 = first.result.allocation.yields(p.instance)
    for mode in ("spread", "consolidate"):
        got = spend_spare(p, first, Spare(mode, 0.5))
        assert got.result.allocation is not None
        assert (got.result.allocation.yields(p.instance) >= y0 - 1e-6).all()
        assert got.migrated_bytes <= p.budget


def test_spare_score_is_hbal_s_pair_of_standard_deviations() -> None:
    doc = {"hosts": [{"name": "h0"}, {"name": "h1"}], "host_memory_bytes": "8GiB",
           "jobs": [{"name": "a", "cpu_need": 0.5, "memory": 0.5, "current": [0]}]}
    p = problem_from_dict(doc, 0)
    s = spare_score(p, np.array([0]))
    # free memory 0.5 and 1.0, free CPU 0.5 and 1.0: each a stddev of 0.25
    assert (s.free_memory_stddev, s.free_cpu_stddev, s.spread, s.hosts_empty) == (0.25, 0.25, 0.5, 1)
    with pytest.raises(InputError, match="spare: 'pack' is not one of"):
        Spare("pack")


def test_spare_applies_when_the_file_sets_it_or_power_saving_is_on() -> None:
    assert power_from_dict({}, 2).spare_goal is None
    assert power_from_dict({"spare": "spread"}, 2).spare_goal == "spread"
    assert power_from_dict({"power_saving": "recommend"}, 2).spare_goal == "consolidate"


def test_the_controller_rebalances_for_spread_after_settle_intervals() -> None:
    r = Rebalancer(RebalanceOptions(6 * GiB, settle=2, spare="spread"))
    inv = uneven()
    first = r.decide(inv, {}, 1_700_000_000.0)
    assert first.kind != REBALANCE and first.streak == 1 and "spare spread" in first.reason
    second = r.decide(inv, {}, 1_700_000_010.0)
    assert second.kind == REBALANCE and second.plan is not None and second.moves
    assert second.plan.extra["migrated_bytes"] <= 6 * GiB
    plain = Rebalancer(RebalanceOptions(6 * GiB, settle=1))
    assert plain.decide(inv, {}, 1_700_000_000.0).kind != REBALANCE


CLUSTER_TOML = """name = "lab"
spare = "{spare}"
[guest]
kernel = "/k"
initrd = "/i"
{hosts}
"""


def adapt_cli(tmp_path: Path, spare: str, *args: str) -> Any:
    """`vcsched adapt --json` on the uneven cluster served by the simulated libvirt (``sim://``: its hosts cap CPU,
    so the dry run's whole-plan check accepts what --apply would do)."""
    from tests.builders import test_driver_node

    hosts = ""
    first = 0
    for h in range(4):
        vms = [(f"v{i}", VmMeta(f"vc{i}", 0.5, 512 << 20, 1, min_yield=1.0)) for i, at in enumerate(UNEVEN) if at == h]
        node = tmp_path / f"h{h}.xml"
        node.write_text(test_driver_node(vms, 4, first))
        first += len(vms)
        hosts += f'[[hosts]]\nname = "h{h}"\nuri = "sim://{node}"\n'
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(CLUSTER_TOML.format(spare=spare, hosts=hosts))
    from cli.main import cli

    return CliRunner().invoke(cli, ["adapt", "--cluster", str(cluster), "--budget", "8GiB", "--json", *args])


def test_adapt_json_carries_the_score_before_and_after(tmp_path: Path) -> None:
    r = adapt_cli(tmp_path, "spread")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    spare = out["spare"]
    assert spare["mode"] == "spread" and spare["moves"] > 0
    assert spare["after"]["free_memory_stddev"] < spare["now"]["free_memory_stddev"]
    assert out["migrated_bytes"] <= 8 * GiB
    assert all("spare room" in r["reason"] for r in out["reasons"] if r["op"] == "migrate")
    r = adapt_cli(tmp_path, "spread", "--spare", "consolidate")
    out = json.loads(r.stdout)
    assert out["spare"]["mode"] == "consolidate" and out["spare"]["after"]["hosts_empty"] >= 2


def test_the_dry_run_prints_the_score_before_and_after(tmp_path: Path) -> None:
    adapt_cli(tmp_path, "spread")
    from cli.main import cli

    r = CliRunner().invoke(cli, ["adapt", "--cluster", str(tmp_path / "cluster.toml"), "--budget", "8GiB"])
    assert r.exit_code == 0, r.output
    assert "spare room (spread): score 0.2631 -> 0.0000" in r.output and "dry run" in r.output
    r = CliRunner().invoke(cli, ["adapt", "--cluster", str(tmp_path / "cluster.toml"), "--budget", "8GiB",
                                 "--spare", "none", "--json"])
    assert json.loads(r.stdout)["spare"] is None and json.loads(r.stdout)["migrated_bytes"] == 0


def test_the_controller_consolidates_within_its_budget_per_interval() -> None:
    r = Rebalancer(RebalanceOptions(2 * GiB, settle=1, spare="consolidate"))
    d = r.decide(uneven(), {}, 1_700_000_000.0)
    assert d.kind == REBALANCE and d.plan is not None and "spare consolidate: 1 more host(s) empty" in d.reason
    assert d.moves == (("v7", "h0"),) or d.moves == (("v7", "h1"),)
    assert d.plan.extra["migrated_bytes"] == 2 * GiB
