"""Departed virtual clusters in ``vcsched adapt``: remove steps, the room they free, and applying them safely."""

from __future__ import annotations

from dataclasses import replace

import pytest

from acting.executor import DONE, FAILED, NOT_RUN, SKIPPED, apply_plan, check_snapshot
from hypervisor.memory import MemoryHypervisor
from tests.builders import vm
from vcsched.adaptation.problem import GIB
from vcsched.control.live import adapt_inventory
from vcsched.errors import InputError
from vcsched.inventory import HostState, VmState
from vcsched.plans.ordering import cap_overruns
from vcsched.plans.plan import plan_from_dict
from vcsched.plans.steps import MigrateStep, RemoveStep, SetCapStep


def crowded() -> MemoryHypervisor:
    """Two 1-core hosts, each full of memory (4 GiB of 1 GiB VMs); everyone gets less CPU than it needs.

    h0: web-0, web-1 (0.8 cores each), batch-0 (0.8) and an unmanaged VM (measured idle: reserves no CPU);
    h1: batch-1..3 (0.8) and db-0 (0.2).
    """
    hosts = [HostState("h0", 1, 4 * GIB), HostState("h1", 1, 4 * GIB)]
    unmanaged = VmState("other", "h0", 1, GIB, True, None, None, measured_reserve=0.0)  # measured idle
    return MemoryHypervisor("lab", hosts, [
        vm("web-0", "h0", 0.8, 0.3, "web"), vm("web-1", "h0", 0.8, 0.3, "web"),
        vm("batch-0", "h0", 0.8, 0.3, "batch"), unmanaged,
        *(vm(f"batch-{i}", "h1", 0.8, 0.25, "batch") for i in (1, 2, 3)), vm("db-0", "h1", 0.2, 0.05, "db")])


def test_departing_removes_its_vms_first_and_the_rest_grow() -> None:
    hv = crowded()
    before = adapt_inventory("lab", hv.inventory(), GIB)
    live = adapt_inventory("lab", hv.inventory(), GIB, depart=["batch"])
    assert live.plan is not None and before.plan is not None
    removals = [s for s in live.plan.steps if isinstance(s, RemoveStep)]
    assert [(s.vm, s.host) for s in removals] == [("batch-0", "h0"), ("batch-1", "h1"), ("batch-2", "h1"),
                                                  ("batch-3", "h1")]
    assert list(live.plan.steps[:4]) == removals  # removing only frees room: it goes first
    assert set(live.plan.per_vm) == {"web-0", "web-1", "db-0"}
    assert live.plan.min_yield > before.plan.min_yield + 0.1
    assert live.plan.removed_vms() == {"batch-0", "batch-1", "batch-2", "batch-3"}


def test_the_freed_memory_is_usable_by_migrations_in_the_same_plan() -> None:
    """Both hosts are full: web-1 can only move to h1 once batch left it, and then web gets all it needs."""
    hv = crowded()
    assert adapt_inventory("lab", hv.inventory(), GIB).plan is not None
    live = adapt_inventory("lab", hv.inventory(), GIB, depart=["batch"])
    assert live.plan is not None
    moves = [s for s in live.plan.steps if isinstance(s, MigrateStep)]
    assert [(m.source, m.target) for m in moves] == [("h0", "h1")] and moves[0].vm.startswith("web-")
    assert live.plan.min_yield == pytest.approx(1.0)
    report = apply_plan(hv, live.plan)
    assert report.ok, report.to_dict()
    inv = hv.inventory()
    assert not any(v.name.startswith("batch-") for v in inv.vms)
    assert inv.vm("other") is not None  # unmanaged: untouched
    for h in inv.hosts:
        assert sum(v.memory_bytes for v in inv.vms if v.host == h.name) <= h.memory_bytes
    for name in ("web-0", "web-1", "db-0"):
        v = inv.vm(name)
        assert v is not None and v.active and v.cap_cores == pytest.approx(live.plan.per_vm[name].cap_cores)
    assert live.plan.per_vm["web-0"].cap_cores == pytest.approx(0.8)


def test_without_the_departure_the_full_hosts_allow_no_migration() -> None:
    live = adapt_inventory("lab", crowded().inventory(), 10 * GIB)
    assert live.plan is not None
    assert live.plan.min_yield < 0.5


def test_caps_never_overrun_a_host_along_the_plan() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), GIB, depart=["batch"])
    assert live.plan is not None
    inv = hv.inventory()
    caps_now: dict[str, dict[str, float]] = {}
    for v in inv.managed():  # unmanaged domains are outside the model's CPU (as in admission)
        caps_now.setdefault(v.host, {})[v.name] = v.cap_cores if v.cap_cores is not None else float(v.vcpus)
    assert cap_overruns(live.plan.steps, caps_now, {h.name: float(h.cores) for h in inv.hosts}) == []


def test_a_rerun_skips_the_removals_and_the_half_applied_plan_still_matches() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), GIB, depart=["batch"])
    assert live.plan is not None
    hv.fail[("set-cap", "web-0")] = "host h0: cannot cap 'web-0': connection reset"
    first = apply_plan(hv, live.plan)
    assert not first.ok
    assert [r.outcome for r in first.results[:4]] == [DONE] * 4
    assert FAILED in [r.outcome for r in first.results] and hv.find_vm("web-0") is not None
    assert check_snapshot(hv, live.plan)  # the removed VMs are left out of the comparison
    second = apply_plan(hv, live.plan)
    assert second.ok and [r.outcome for r in second.results[:4]] == [SKIPPED] * 4
    assert all(r.outcome == SKIPPED for r in apply_plan(hv, live.plan).results)


def test_a_failed_removal_stops_the_plan_and_nothing_else_changes() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), GIB, depart=["batch"])
    assert live.plan is not None
    hv.fail[("remove", "batch-0")] = "host h0: cannot remove 'batch-0': timed out"
    report = apply_plan(hv, live.plan)
    assert report.results[0].outcome == FAILED and "timed out" in report.results[0].detail
    assert all(r.outcome == NOT_RUN for r in report.results[1:])
    assert set(hv.vms) == set(crowded().vms)
    assert apply_plan(hv, live.plan).ok


def test_a_reused_name_in_another_virtual_cluster_refuses_the_whole_plan_before_any_step() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), 0, depart=["batch"])
    assert live.plan is not None
    v = hv.vms["batch-0"]
    assert v.meta is not None
    hv.vms["batch-0"] = replace(v, meta=replace(v.meta, cluster="batch2"))  # recreated meanwhile by someone else
    with pytest.raises(InputError, match="'batch2'"):
        apply_plan(hv, live.plan, force=True)
    assert "batch-0" in hv.vms and hv.calls == []


def test_a_name_reused_while_the_plan_runs_stops_it_at_that_step() -> None:
    """The change happens after the whole-plan check: the step's own pre-condition catches it."""
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), 0, depart=["batch"])
    assert live.plan is not None

    def someone_else() -> None:
        v = hv.vms["batch-1"]
        assert v.meta is not None
        hv.vms["batch-1"] = replace(v, meta=replace(v.meta, cluster="batch2"))

    hv.before[("remove", "batch-0")] = someone_else
    report = apply_plan(hv, live.plan, force=True)
    assert [r.outcome for r in report.results[:2]] == [DONE, FAILED]
    assert "'batch2'" in report.results[1].detail
    assert "batch-1" in hv.vms and "batch-0" not in hv.vms


def test_an_unmanaged_domain_with_the_name_is_not_removed() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), 0, depart=["batch"])
    assert live.plan is not None
    hv.vms["batch-0"] = replace(hv.vms["batch-0"], meta=None)
    with pytest.raises(InputError, match="unmanaged"):
        apply_plan(hv, live.plan, force=True)
    assert "batch-0" in hv.vms and hv.calls == []


def test_every_cluster_departing_leaves_only_removals() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), 0, depart=["web", "batch", "db"])
    assert live.plan is not None
    assert all(isinstance(s, RemoveStep) for s in live.plan.steps) and len(live.plan.steps) == 7
    assert apply_plan(hv, live.plan).ok
    assert set(hv.vms) == {"other"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"depart": ["nosuch"]}, "--depart: 'nosuch' is not a virtual cluster of cluster 'lab'"),
    ({"depart": ["batch"], "needs": {"batch-0": 0.5}}, "--set-need: 'batch-0' belongs to a departing"),
])
def test_bad_departures_are_input_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        adapt_inventory("lab", crowded().inventory(), GIB, **kwargs)  # type: ignore[arg-type]


def test_remove_steps_round_trip_and_are_validated() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), GIB, depart=["batch"])
    assert live.plan is not None
    again = plan_from_dict(live.plan.to_dict())
    assert again.steps == live.plan.steps and again.snapshot == live.plan.snapshot
    doc = live.plan.to_dict()
    del doc["steps"][0]["cluster"]
    with pytest.raises(InputError, match=r"plan.steps\[0\]"):
        plan_from_dict(doc)


def test_departure_with_migrations_keeps_the_budget() -> None:
    hv = crowded()
    for budget in (0, GIB, 2 * GIB, 10 * GIB):
        live = adapt_inventory("lab", hv.inventory(), budget, depart=["db"])
        assert live.plan is not None
        moved = sum(s.bytes for s in live.plan.steps if isinstance(s, MigrateStep))
        assert moved <= budget
        assert not any(isinstance(s, SetCapStep) and s.vm == "db-0" for s in live.plan.steps)
