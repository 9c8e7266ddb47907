"""A plan's claims are checked against the live cluster before its first step (vcsched/plans/claims.py).

On the in-memory hypervisor: each kind of claim a plan file makes — bytes
per migration, their sum and budget, caps on the quota grid, wave numbers,
predictions — edited by hand is refused whole (exit 1, naming the step, the
claimed and the real value) with no host changed; and a property test edits
any number of a valid place or adapt plan at random.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from acting.executor import PlanRefused, apply_plan
from hypervisor.memory import MemoryHypervisor
from tests.builders import GiB, MiB, cluster_of, managed, request
from tests.plan_edits import claims_hold, edited, get, new_values, number_paths, same_bytes
from vcsched.control.admission import admit
from vcsched.control.live import adapt_inventory
from vcsched.errors import InputError, VcschedError
from vcsched.inventory import HostState, VmState
from vcsched.plans.claims import PlanMismatch, claim_problems
from vcsched.plans.plan import Plan, plan_from_dict
from vcsched.plans.steps import MigrateStep


def crowded() -> MemoryHypervisor:
    """Three hosts: h0 (2 cores) crowded by four VMs, one of them with 64 MiB of disk; h1 (1 core) with one; h2
    (2 cores) empty, on other storage: the best adaptation moves two VMs to h2, one of them with its disk."""
    hosts = [HostState("h0", 2, 4 * GiB, storage="rack1"), HostState("h1", 1, 4 * GiB, storage="rack1"),
             HostState("h2", 2, 2 * GiB, storage="rack2")]
    vms = [managed("a-0", "h0", "a", 1.0, 0.5, mem=512 * MiB), managed("a-1", "h0", "a", 1.0, 0.5, mem=512 * MiB),
           replace(managed("b-0", "h0", "b", 0.8, 0.5, mem=256 * MiB), disk_bytes=64 * MiB),
           managed("d-0", "h0", "d", 0.8, 0.5, mem=128 * MiB), managed("c-0", "h1", "c", 0.9, 0.9)]
    return MemoryHypervisor("lab", hosts, vms)


def adapt_plan(hv: MemoryHypervisor, budget: int = 2 * GiB) -> Plan:
    live = adapt_inventory("lab", hv.inventory(), budget)
    assert live.plan is not None
    return live.plan


def place_plan(hv: MemoryHypervisor) -> Plan:
    d = admit(cluster_of(3), hv.inventory(), request("web", vms=2, need=0.5))
    assert d.plan is not None
    return d.plan


def state(hv: MemoryHypervisor) -> dict[str, VmState]:
    return dict(hv.vms)


def refused_unchanged(hv: MemoryHypervisor, doc: dict[str, Any], match: str) -> PlanMismatch:
    before = state(hv)
    with pytest.raises(PlanMismatch, match=match) as caught:
        apply_plan(hv, plan_from_dict(doc))
    assert state(hv) == before and hv.calls == []
    assert caught.value.exit_code == 1
    return caught.value


# ---------------------------------------------------------------------------------------------- the claims


def test_plans_vcsched_computes_claim_exactly_what_the_cluster_shows() -> None:
    hv = crowded()
    for plan in (adapt_plan(hv), place_plan(hv)):
        assert claim_problems(plan_from_dict(json.loads(json.dumps(plan.to_dict()))), hv.inventory()) == []


def test_bytes_edited_under_a_tiny_budget_are_refused_naming_the_step_the_claim_and_the_real_bytes() -> None:
    # Finding 1 of issue 32: two 128 MiB migrations claimed as 1 byte each under a budget of 2 were applied.
    hv = crowded()
    doc = adapt_plan(hv).to_dict()
    moves = [i for i, s in enumerate(doc["steps"]) if s["op"] == "migrate"]
    assert len(moves) >= 2
    for i in moves:
        doc["steps"][i]["bytes"] = 1
    doc["migrated_bytes"], doc["budget"] = len(moves), len(moves)
    first = doc["steps"][moves[0]]
    err = refused_unchanged(hv, doc, rf"plan\.steps\[{moves[0]}\]\.bytes: migrate {first['vm']} "
                                     rf"{first['from']}->{first['to']} claims 1 bytes, it moves \d+")
    assert "above the plan's budget" in str(err)


def test_a_move_between_storage_groups_costs_memory_and_disks_and_claiming_memory_only_is_refused() -> None:
    hv = crowded()
    plan = adapt_plan(hv)
    b0 = hv.vms["b-0"]
    moves = [s for s in plan.steps if isinstance(s, MigrateStep) and s.vm == "b-0"]
    if not moves or all(hv.hosts[m.source].storage == hv.hosts[m.target].storage for m in moves):
        pytest.skip("the adaptation did not move b-0 across storage groups")  # pragma: no cover
    assert moves[0].bytes == b0.memory_bytes + b0.disk_bytes
    doc = plan.to_dict()
    i = plan.steps.index(moves[0])
    doc["steps"][i]["bytes"] = b0.memory_bytes
    doc["migrated_bytes"] -= b0.disk_bytes
    refused_unchanged(hv, doc, rf"plan\.steps\[{i}\]\.bytes: .* it moves {b0.memory_bytes + b0.disk_bytes} "
                               r"\(its memory \d+ \+ its disks \d+ \(other storage\)\)")


def test_a_cap_off_the_quota_grid_is_refused_naming_what_the_host_would_hold() -> None:
    hv = crowded()
    doc = place_plan(hv).to_dict()
    i = next(i for i, s in enumerate(doc["steps"]) if s["op"] == "set-cap")
    doc["steps"][i]["cap_cores"] += 1e-7
    before = state(hv)
    with pytest.raises(PlanRefused, match=rf"plan\.steps\[{i}\]\.cap_cores: .* cores is off the quota grid: a "
                                          r"1-vCPU VM's caps are multiples of 1e-05 cores .* it would hold") as caught:
        apply_plan(hv, plan_from_dict(doc))
    assert state(hv) == before and hv.calls == [] and caught.value.exit_code == 1


def test_a_cap_moved_to_another_grid_point_contradicts_the_prediction() -> None:
    hv = crowded()
    doc = place_plan(hv).to_dict()
    i = next(i for i, s in enumerate(doc["steps"]) if s["op"] == "set-cap")
    vm = doc["steps"][i]["vm"]
    doc["steps"][i]["cap_cores"] = round(doc["steps"][i]["cap_cores"] - 0.01, 2)
    refused_unchanged(hv, doc, rf"plan\.predicted\.per_vm\.{vm}\.cap_cores: claims .*, the plan leaves {vm} at")


@pytest.mark.parametrize("field,match", [
    ("yield", r"\.yield: claims .* is a yield of"),
    ("cpu_need_cores", r"\.cpu_need_cores: claims .* need once the plan is applied is"),
])
def test_an_edited_prediction_is_refused(field: str, match: str) -> None:
    hv = crowded()
    doc = place_plan(hv).to_dict()
    vm = sorted(doc["predicted"]["per_vm"])[0]
    doc["predicted"]["per_vm"][vm][field] *= 0.9
    refused_unchanged(hv, doc, match)


def test_an_edited_minimum_or_average_yield_is_refused() -> None:
    hv = crowded()
    for key in ("min_yield", "avg_yield"):
        doc = place_plan(hv).to_dict()
        doc["predicted"][key] += 0.01
        refused_unchanged(hv, doc, rf"plan\.predicted\.{key}: claims")


def test_waves_out_of_order_are_refused() -> None:
    hv = crowded()
    doc = adapt_plan(hv).to_dict()
    i = next(i for i, s in enumerate(doc["steps"]) if s["op"] == "migrate")
    doc["steps"][i]["wave"] = 2
    refused_unchanged(hv, doc, rf"plan\.steps\[{i}\]\.wave: 2, .* waves are numbered 1, 2")


def test_a_floor_above_the_created_vms_predicted_yield_is_refused() -> None:
    hv = crowded()
    d = admit(cluster_of(3), hv.inventory(), request("big", vms=2, need=1.0, vcpus=2))
    assert d.plan is not None
    doc = d.plan.to_dict()
    i = next(i for i, s in enumerate(doc["steps"]) if s["op"] == "create")
    vm = doc["steps"][i]["vm"]
    predicted = doc["predicted"]["per_vm"][vm]["yield"]
    assert predicted < 0.99
    doc["steps"][i]["min_yield"] = predicted + 0.01
    refused_unchanged(hv, doc, rf"plan\.steps\[{i}\]\.min_yield: .* predicts {vm} a yield of .*, below it")


def test_the_controllers_plans_on_measured_needs_say_so_and_pass() -> None:
    hv = crowded()
    live = adapt_inventory("lab", hv.inventory(), 0, needs={"a-0": 0.2}, record_needs=False)
    assert live.plan is not None and live.plan.extra["needs"] == "measured"
    assert claim_problems(live.plan, hv.inventory()) == []
    doc = live.plan.to_dict()
    assert plan_from_dict(doc).extra["needs"] == "measured"
    doc["needs"] = "guessed"
    with pytest.raises(InputError, match=r"plan\.needs: 'guessed' is not 'measured'"):
        plan_from_dict(doc)


# ---------------------------------------------------------------------------------------------- any edit


def _fresh(kind: str) -> tuple[MemoryHypervisor, dict[str, Any]]:
    hv = crowded()
    plan = adapt_plan(hv) if kind == "adapt" else place_plan(hv)
    return hv, json.loads(json.dumps(plan.to_dict()))


PLANS = {kind: _fresh(kind)[1] for kind in ("adapt", "place")}


def test_a_fresh_cluster_gets_the_same_plan_again() -> None:
    # What lets every edit below start from PLANS (a copy) on a new crowded() instead of planning again.
    assert {kind: _fresh(kind)[1] for kind in PLANS} == PLANS


@st.composite
def edits(draw: st.DrawFn) -> tuple[str, tuple[str | int, ...], Any]:
    kind = draw(st.sampled_from(sorted(PLANS)))
    path = draw(st.sampled_from(sorted(number_paths(PLANS[kind]), key=str)))
    return kind, path, draw(new_values(get(PLANS[kind], path)))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits())
def test_any_edit_of_a_plans_numbers_is_refused_whole_or_applied_exactly_as_it_claims(
        edit: tuple[str, tuple[str | int, ...], Any]) -> None:
    kind, path, value = edit
    hv, doc = crowded(), json.loads(json.dumps(PLANS[kind]))  # the plan _fresh(kind) makes, without planning again
    changed = edited(doc, path, value)
    if same_bytes(changed, doc):
        return  # the edit wrote what was there: the same plan
    before_vms, before = state(hv), hv.inventory()
    try:
        report = apply_plan(hv, plan_from_dict(changed))
    except VcschedError as exc:  # bad input (exit 2), a changed cluster (exit 2) or a false claim (exit 1)
        assert state(hv) == before_vms and hv.calls == [], f"refused {path} = {value!r} after acting"
        event(f"refused: {type(exc).__name__}")
        return
    event("applied as claimed")
    assert report.ok, f"{path} = {value!r}: accepted, then stopped: {report.to_dict()}"
    wrong = claims_hold(changed, before, hv.inventory())
    assert wrong == [], f"{path} = {value!r}: applied, but not as claimed: {wrong}"
