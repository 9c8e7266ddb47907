"""Plans: JSON round trip with validation, and step orders that never overrun a host's cores."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcsched.errors import InputError
from vcsched.plans.ordering import cap_overruns, order_steps
from vcsched.plans.plan import Plan, VmPrediction, plan_from_dict
from vcsched.plans.steps import Boot, CreateStep, SetCapStep, Step

SNAP = "ab" * 32


def sample_plan() -> Plan:
    boot = Boot("kernel", kernel="/k", initrd="/i", cmdline="quiet", domain_type="qemu")
    steps = (SetCapStep("old-0", "h0", 0.5),
             CreateStep("web-0", "h0", "web", 1, 128 << 20, 0.5, 0.5, boot),
             CreateStep("web-1", "h1", "web", 1, 128 << 20, 0.5, 0.5, Boot("template", path="/t.xml")))
    per_vm = {"web-0": VmPrediction("h0", "web", 0.5, 0.5, 1.0), "web-1": VmPrediction("h1", "web", 0.5, 0.5, 1.0),
              "old-0": VmPrediction("h0", "old", 1.0, 0.5, 0.5)}
    return Plan("place", "lab", SNAP, 0.5, 0.833, per_vm, steps, extra={"request": "web"})


def test_a_plan_survives_a_json_round_trip() -> None:
    plan = sample_plan()
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan


def test_the_json_carries_the_contract_fields() -> None:
    d = sample_plan().to_dict()
    assert d["version"] == 1 and d["kind"] == "place" and d["snapshot"] == SNAP
    assert d["steps"][0] == {"op": "set-cap", "vm": "old-0", "host": "h0", "cap_cores": 0.5}
    assert set(d["predicted"]) == {"min_yield", "avg_yield", "per_vm"}


def test_created_vms_are_the_create_steps() -> None:
    assert sample_plan().created_vms() == {"web-0", "web-1"}


def mutate(path: list[Any], value: Any) -> dict[str, Any]:
    d = sample_plan().to_dict()
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return d


@pytest.mark.parametrize("path,value,message", [
    (["version"], 2, r"plan.version: 2 is not supported"),
    (["kind"], "shuffle", r"plan.kind: 'shuffle'"),
    (["snapshot"], "xyz", r"plan.snapshot: 'xyz' is not a sha256"),
    (["steps", 0, "op"], "explode", r"plan.steps\[0\].op: 'explode' is not a known step"),
    (["steps", 0, "cap_cores"], -1, r"plan.steps\[0\].cap_cores: -1 must be above 0"),
    (["steps", 1, "cap_cores"], 2, r"plan.steps\[1\].cap_cores: 2 cores is more than the VM's 1 vCPUs"),
    (["steps", 1, "boot", "kind"], "pxe", r"plan.steps\[1\].boot.kind"),
])
def test_a_tampered_plan_is_refused_naming_the_field(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        plan_from_dict(mutate(path, value))


def test_lowering_steps_go_before_raising_ones() -> None:
    # h0 (1 core): a at 0.8 must drop to 0.3 before b (new) can get 0.7.
    steps: list[Step] = [CreateStep("b", "h0", "c", 1, 1, 0.7, 0.7, Boot("template", path="/t")),
                         SetCapStep("a", "h0", 0.3)]
    caps = {"h0": {"a": 0.8}}
    ordered = order_steps(steps, caps, {"h0": 1.0})
    assert [s.vm for s in ordered] == ["a", "b"]
    assert cap_overruns(steps, caps, {"h0": 1.0}) != []
    assert cap_overruns(ordered, caps, {"h0": 1.0}) == []


@st.composite
def cap_changes(draw: st.DrawFn) -> tuple[dict[str, dict[str, float]], list[SetCapStep], dict[str, float]]:
    """Current and target caps on a few hosts, both within capacity, with VMs leaving and arriving."""
    n_hosts = draw(st.integers(1, 3))
    cores = {f"h{i}": float(draw(st.integers(1, 4))) for i in range(n_hosts)}
    now: dict[str, dict[str, float]] = {}
    steps: list[SetCapStep] = []
    for h, c in cores.items():
        n = draw(st.integers(0, 5))
        before = draw(st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n))
        after = draw(st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n))
        sb, sa = sum(before), sum(after)
        now[h] = {f"{h}v{i}": b * c / max(sb, c) for i, b in enumerate(before)}
        steps += [SetCapStep(f"{h}v{i}", h, a * c / max(sa, c)) for i, a in enumerate(after)]
    return now, draw(st.permutations(steps)), cores


@settings(max_examples=150, deadline=None)
@given(cap_changes())
def test_ordered_steps_never_overrun_a_host_at_any_prefix(case: Any) -> None:
    now, steps, cores = case
    ordered = order_steps(steps, now, cores)
    assert sorted(s.vm for s in ordered) == sorted(s.vm for s in steps)
    assert cap_overruns(ordered, now, cores) == []


def test_the_snapshot_ignores_the_host_of_a_vm_the_plan_moves() -> None:
    from dataclasses import replace

    from tests.builders import inventory_of, managed
    from vcsched.control.inventory import snapshot_hash

    before = inventory_of([managed("a-0", "h0", "a", 0.5), managed("b-0", "h1", "b", 0.5)])
    moved = replace(before, vms=(replace(before.vms[0], host="h1"), before.vms[1]))
    assert snapshot_hash(before) != snapshot_hash(moved)
    assert snapshot_hash(before, moving=frozenset({"a-0"})) == snapshot_hash(moved, moving=frozenset({"a-0"}))


@dataclass(frozen=True)
class Hop(SetCapStep):
    """A step kind that moves its VM (as the adaptation's ``migrate`` will)."""

    op: ClassVar[str] = "hop"
    moves: ClassVar[bool] = True


def test_only_step_kinds_that_move_count_as_moved() -> None:
    plan = sample_plan()
    plan = Plan(plan.kind, plan.cluster, plan.snapshot, 1, 1, {}, (*plan.steps, Hop("old-0", "h1", 0.5)))
    assert plan.moved_vms() == {"old-0"}
    assert sample_plan().moved_vms() == frozenset()
