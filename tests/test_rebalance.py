"""When `vcsched run` migrates (vcsched.control.rebalance): a lasting, large enough gain; never a VM cooling down."""

from __future__ import annotations

import pytest

from tests.builders import MiB, inventory_of, managed
from vcsched.control.rebalance import NOTHING, REBALANCE, RECAP, RebalanceOptions, Rebalancer, cooling
from vcsched.errors import InputError
from vcsched.inventory import VmMeta, VmState
from vcsched.plans.steps import MigrateStep

NOW = 1_700_000_000.0


def crowded() -> list[VmState]:
    """h0 holds two VMs needing a core each, h1 one idle VM: moving one off h0 lifts the minimum yield to ~0.9."""
    return [managed("a-0", "h0", "a", 1.0, 0.5), managed("b-0", "h0", "b", 1.0, 0.5),
            managed("c-0", "h1", "c", 0.1, 0.1)]


def test_a_gainful_move_is_applied_only_once_proposed_settle_intervals_in_a_row() -> None:
    r = Rebalancer(RebalanceOptions(256 * MiB, threshold=0.05, settle=2))
    inv = inventory_of(crowded())
    first = r.decide(inv, {}, NOW)
    assert first.kind in (RECAP, NOTHING) and first.streak == 1 and first.gain == pytest.approx(0.4091, abs=1e-3)
    second = r.decide(inv, {}, NOW + 10)
    assert second.kind == REBALANCE and second.plan is not None
    assert [s.vm for s in second.plan.steps if isinstance(s, MigrateStep)] in (["a-0"], ["b-0"])


def test_a_gain_below_the_threshold_only_re_caps() -> None:
    r = Rebalancer(RebalanceOptions(256 * MiB, threshold=0.5, settle=1))
    d = r.decide(inventory_of(crowded()), {}, NOW)
    assert d.kind != REBALANCE and "below the threshold" in d.reason


def test_budget_zero_never_migrates() -> None:
    r = Rebalancer(RebalanceOptions(0, settle=1))
    d = r.decide(inventory_of(crowded()), {}, NOW)
    assert d.kind != REBALANCE and d.plan is not None
    assert not any(isinstance(s, MigrateStep) for s in d.plan.steps)


def test_the_plan_never_moves_more_than_the_budget_per_interval() -> None:
    vms = [managed(f"v{i}", "h0", f"v{i}", 1.0, 0.25, mem=128 * MiB) for i in range(4)]
    r = Rebalancer(RebalanceOptions(128 * MiB, settle=1))
    d = r.decide(inventory_of(vms, n_hosts=4), {}, NOW)
    assert d.kind == REBALANCE and d.plan is not None
    assert d.plan.extra["migrated_bytes"] <= 128 * MiB
    assert sum(s.bytes for s in d.plan.steps if isinstance(s, MigrateStep)) <= 128 * MiB


def moved(vm: VmState, when: float) -> VmState:
    assert vm.meta is not None
    return VmState(vm.name, vm.host, vm.vcpus, vm.memory_bytes, vm.active,
                   VmMeta(vm.meta.cluster, vm.meta.cpu_need_cores, vm.meta.memory_bytes, vm.meta.vcpus,
                          migrated_at=when), vm.cap_cores)


def test_a_vm_that_migrated_within_the_cooldown_is_pinned() -> None:
    a, b, c = crowded()
    inv = inventory_of([moved(a, NOW - 60), moved(b, NOW - 30), c])
    assert cooling(inv, NOW, 600) == ("a-0", "b-0")
    assert cooling(inv, NOW, 45) == ("b-0",)
    r = Rebalancer(RebalanceOptions(256 * MiB, settle=1, cooldown=600))
    d = r.decide(inv, {}, NOW)
    assert d.pinned == ("a-0", "b-0")
    assert d.plan is not None and not any(isinstance(s, MigrateStep) for s in d.plan.steps)
    assert d.reason.endswith("(in their cool-down or vetoed, not moved: a-0, b-0)"), d.reason  # told why


def test_once_the_cooldown_is_over_the_vm_may_move_again() -> None:
    a, b, c = crowded()
    inv = inventory_of([moved(a, NOW - 700), moved(b, NOW - 700), c])
    r = Rebalancer(RebalanceOptions(256 * MiB, settle=1, cooldown=600))
    assert r.decide(inv, {}, NOW).kind == REBALANCE


def test_load_that_swings_between_hosts_never_settles_so_nothing_migrates() -> None:
    """Each interval the busy pair is on the other host: the proposed moves alternate, the streak never reaches 2."""
    vms = [managed("x", "h0", "x", 1.0, 0.5), managed("y", "h0", "y", 1.0, 0.5),
           managed("w", "h1", "w", 1.0, 0.5), managed("v", "h1", "v", 1.0, 0.5)]
    inv = inventory_of(vms)
    left_busy = {"x": 1.0, "y": 1.0, "w": 0.1, "v": 0.1}
    right_busy = {"x": 0.1, "y": 0.1, "w": 1.0, "v": 1.0}
    r = Rebalancer(RebalanceOptions(128 * MiB, threshold=0.05, settle=2))  # room for one move per interval
    proposals = set()
    for i in range(20):
        d = r.decide(inv, left_busy if i % 2 == 0 else right_busy, NOW + 10 * i)
        assert d.kind != REBALANCE, d.reason
        proposals.add(d.moves)
    assert len(proposals) == 2  # it did propose, every time the other way


def test_options_out_of_range_are_bad_input() -> None:
    with pytest.raises(InputError, match="--threshold"):
        RebalanceOptions(0, threshold=1.5)
    with pytest.raises(InputError, match="--budget-per-interval"):
        RebalanceOptions(-1)
    with pytest.raises(InputError, match="--settle"):
        RebalanceOptions(0, settle=0)
