"""Plans: JSON round trip with validation, and step orders that never overrun a host's cores."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcsched.errors import InputError
from vcsched.plans.ordering import PlanError, cap_overruns, order_steps
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
    from vcsched.inventory import snapshot_hash

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


# ---------------------------------------------------------------- the incremental ordering against the quadratic one

def _reference_order(steps: list[Step], caps_now: Any, host_cores: Any, io_now: Any, io_capacity: Any) -> Any:
    """The greedy as first written: every candidate evaluated on a copy of the whole state, every round."""
    from vcsched.plans import ordering as o

    pending, state, limits = list(steps), o._state(caps_now, io_now), o._limits(host_cores, io_capacity)
    out = []

    def effect(step: Step) -> tuple[bool, bool]:
        trial = {r: {h: dict(v) for h, v in hosts.items()} for r, hosts in state.items()}
        o._apply_changes(trial, step)
        low = ok = True
        for r, hosts in limits.items():
            for h, cap in hosts.items():
                before, after, tol = o._total(state, r, h), o._total(trial, r, h), o._tolerance(r)
                if after > before + tol:
                    low = False
                    ok = ok and not after > cap + tol
        return low, ok

    while pending:
        effects = [effect(s) for s in pending]
        pick = next((i for i, (low, _) in enumerate(effects) if low), None)
        if pick is None:
            pick = next((i for i, (_, ok) in enumerate(effects) if ok), None)
        if pick is None:
            return None
        out.append(pending.pop(pick))
        o._apply_changes(state, out[-1])
    return tuple(out)


def _reference_overruns(steps: Any, caps_now: Any, host_cores: Any, io_now: Any, io_capacity: Any) -> list[str]:
    from vcsched.plans import ordering as o

    state, limits, problems = o._state(caps_now, io_now), o._limits(host_cores, io_capacity), []
    for i, step in enumerate(steps):
        before = {(r, h): o._total(state, r, h) for r, hosts in limits.items() for h in hosts}
        o._apply_changes(state, step)
        for (r, h), was in before.items():
            after, cap, tol = o._total(state, r, h), limits[r][h], o._tolerance(r)
            if after > was + tol and after > cap + tol:
                unit = "cores" if r == o.CPU else f"B/s of {r}"
                problems.append(f"step {i} ({step.op} {step.vm}): host {h} caps {after:.4f} > {cap:g} {unit}")
    return problems


@st.composite
def mixed_plans(draw: st.DrawFn) -> tuple[Any, ...]:
    """Caps (CPU and disk) on up to 4 hosts and a shuffled mix of set-cap, create, remove and migrate steps."""
    from vcsched.plans.steps import MigrateStep, RemoveStep

    hosts = [f"h{i}" for i in range(draw(st.integers(1, 4)))]
    cores = {h: float(draw(st.integers(1, 3))) for h in hosts}
    disk_cap = {h: draw(st.sampled_from([None, 100.0, 300.0])) for h in hosts}
    caps: dict[str, dict[str, float]] = {h: {} for h in hosts}
    disk: dict[str, dict[str, float]] = {h: {} for h in hosts}
    where = {}
    for k in range(draw(st.integers(0, 8))):
        h = draw(st.sampled_from(hosts))
        caps[h][f"v{k}"] = draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
        if draw(st.booleans()):
            disk[h][f"v{k}"] = float(draw(st.sampled_from([50, 100, 200])))
        where[f"v{k}"] = h
    steps: list[Step] = []
    for vm, h in where.items():
        kind = draw(st.sampled_from(["keep", "cap", "remove", "move"]))
        cap = draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
        if kind == "cap":
            steps.append(SetCapStep(vm, h, cap, draw(st.sampled_from([None, 50, 150])), None, None))
        elif kind == "remove":
            steps.append(RemoveStep(vm, h, "c"))
        elif kind == "move":
            steps.append(MigrateStep(vm, h, draw(st.sampled_from(hosts)), 1, cap))
    for k in range(draw(st.integers(0, 4))):
        steps.append(CreateStep(f"n{k}", draw(st.sampled_from(hosts)), "c", 1, 1,
                                0.5, draw(st.sampled_from([0.25, 0.5, 1.0])), Boot("template", path="/t"),
                                disk_bytes_sec=draw(st.sampled_from([None, 100]))))
        if draw(st.booleans()):  # a later step on the new VM, wherever: it then reads the host the VM lands on
            steps.append(SetCapStep(f"n{k}", draw(st.sampled_from(hosts)), 0.25))
    return caps, draw(st.permutations(steps)), cores, {"disk": disk}, {"disk": disk_cap}


@settings(max_examples=300, deadline=None)
@given(mixed_plans())
def test_the_incremental_ordering_picks_what_the_quadratic_greedy_picked(case: Any) -> None:
    caps, steps, cores, io_now, io_capacity = case
    want = _reference_order(steps, caps, cores, io_now, io_capacity)
    if want is None:
        with pytest.raises(PlanError):
            order_steps(steps, caps, cores, io_now=io_now, io_capacity=io_capacity)
    else:
        assert order_steps(steps, caps, cores, io_now=io_now, io_capacity=io_capacity) == want
    assert cap_overruns(steps, caps, cores, io_now=io_now, io_capacity=io_capacity) == \
        _reference_overruns(steps, caps, cores, io_now, io_capacity)


def test_ordering_ten_thousand_recaps_on_a_thousand_hosts_is_not_quadratic() -> None:
    """4x the steps must cost well under 16x the CPU (the old quadratic greedy: 10,000 rounds of 10,000
    whole-cluster copies).  A ratio of CPU times, not a wall-clock bound, so a loaded machine cannot fail it."""
    import time

    def cpu_seconds(n_hosts: int) -> float:
        cores = {f"h{h}": 8.0 for h in range(n_hosts)}
        now = {h: {f"{h}v{k}": 0.5 for k in range(10)} for h in cores}
        steps = [SetCapStep(f"{h}v{k}", h, 0.75 if k % 2 else 0.25) for h in cores for k in range(10)]
        t0 = time.process_time()
        ordered = order_steps(steps, now, cores)
        took = time.process_time() - t0
        assert sorted(s.vm for s in ordered) == sorted(s.vm for s in steps)
        return took

    small, large = min(cpu_seconds(250) for _ in range(2)), cpu_seconds(1000)
    assert large < 8 * small, (small, large)


def test_a_step_is_re_evaluated_when_an_earlier_step_puts_its_vm_somewhere_else() -> None:
    # n0 is created on hA with 100 B/s of disk; the later set-cap on hB then carries that disk cap to hB, whose
    # 50 B/s it overruns.  Judged before the create, the set-cap looked harmless.
    make = CreateStep("n0", "hA", "c", 1, 1, 0.5, 0.25, Boot("template", path="/t"), disk_bytes_sec=100)
    steps: list[Step] = [make, SetCapStep("n0", "hB", 0.25)]
    kw: Any = {"io_now": {"disk": {}}, "io_capacity": {"disk": {"hA": None, "hB": 50.0}}}
    assert _reference_order(steps, {}, {"hA": 1.0, "hB": 1.0}, kw["io_now"], kw["io_capacity"]) is None
    with pytest.raises(PlanError):
        order_steps(steps, {}, {"hA": 1.0, "hB": 1.0}, **kw)
