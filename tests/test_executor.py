"""Applying plans (against the in-memory hypervisor): idempotent, stops on failure, re-runs converge."""

from __future__ import annotations

import pytest

from acting.executor import DONE, FAILED, NOT_RUN, SKIPPED, SnapshotMismatch, apply_plan
from hypervisor.memory import MemoryHypervisor
from tests.builders import MiB, cluster_of, inventory_of, managed, memory_hypervisor, request
from vcsched.control.admission import admit
from vcsched.errors import InputError
from vcsched.inventory import VmState
from vcsched.plans.plan import Plan
from vcsched.plans.steps import SetCapStep


def placed(hv: MemoryHypervisor, vms: int = 2, need: float = 1.0) -> Plan:
    d = admit(cluster_of(), hv.inventory(), request(vms=vms, need=need))
    assert d.plan is not None
    return d.plan


@pytest.fixture
def crowded() -> MemoryHypervisor:
    """Two 1-core hosts, each with one VM capped at a whole core: a new request forces cap changes."""
    return memory_hypervisor(inventory_of([managed("old-0", "h0", "old", 1.0, cap=1.0),
                                 managed("old-1", "h1", "old", 1.0, cap=1.0)]))


def test_applying_a_plan_creates_the_vms_and_sets_every_cap(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    report = apply_plan(crowded, plan)
    assert report.ok and all(r.outcome == DONE for r in report.results)
    for name, p in plan.per_vm.items():
        vm = crowded.find_vm(name)
        assert vm is not None and vm.host == p.host and vm.cap_cores == pytest.approx(p.cap_cores)


def test_created_vms_carry_their_virtual_cluster_metadata(crowded: MemoryHypervisor) -> None:
    apply_plan(crowded, placed(crowded))
    vm = crowded.find_vm("web-0")
    assert vm is not None and vm.meta is not None
    assert (vm.meta.cluster, vm.meta.cpu_need_cores, vm.meta.memory_bytes) == ("web", 1.0, 128 * MiB)


def test_reapplying_a_plan_changes_nothing(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    apply_plan(crowded, plan)
    calls = len(crowded.calls)
    report = apply_plan(crowded, plan)
    assert report.ok and all(r.outcome == SKIPPED for r in report.results)
    assert len(crowded.calls) == calls


def test_a_failure_stops_the_plan_and_reports_done_and_not_done(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    victim = plan.steps[2].vm  # two set-caps first, then the creates
    crowded.fail[("create", victim)] = f"host h0: boom creating {victim}"
    report = apply_plan(crowded, plan)
    assert not report.ok
    assert [r.outcome for r in report.results] == [DONE, DONE, FAILED, NOT_RUN]
    assert report.results[2].detail == f"host h0: boom creating {victim}"
    assert crowded.find_vm(plan.steps[3].vm) is None  # nothing after the failure ran
    # every step that ran reports how long it took; the ones that did not, nothing
    assert [r.seconds is not None and r.seconds >= 0 for r in report.results] == [True, True, True, False]
    assert [s["seconds"] is None for s in report.to_dict()["steps"]] == [False, False, False, True]


def test_a_failure_leaves_every_vm_running(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    crowded.fail[("create", plan.steps[3].vm)] = "boom"
    apply_plan(crowded, plan)
    assert all(v.active for v in crowded.inventory().vms)
    assert {v.name for v in crowded.inventory().vms} == {"old-0", "old-1", plan.steps[2].vm}


def test_rerunning_after_a_failure_converges(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    failing = plan.steps[3]
    crowded.fail[("create", failing.vm)] = "boom"
    first = apply_plan(crowded, plan)
    # The cap lowered on the failed VM's host was put back (its room stayed empty): the re-run lowers it again.
    assert [r.step.host for r in first.restored] == [failing.host]
    report = apply_plan(crowded, plan)
    assert report.ok
    assert [r.outcome for r in report.results] == [DONE if r.step.host == failing.host and r.step.op == "set-cap"
                                                   else SKIPPED if i < 3 else DONE
                                                   for i, r in enumerate(report.results)]


def test_a_plan_for_a_changed_cluster_is_refused(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    crowded.vms["intruder"] = VmState("intruder", "h1", 1, 64 * MiB, True)
    with pytest.raises(SnapshotMismatch, match="changed since this plan was computed"):
        apply_plan(crowded, plan)
    assert crowded.calls == []


def test_force_applies_a_plan_for_a_changed_cluster(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    crowded.vms["intruder"] = VmState("intruder", "h1", 1, 64 * MiB, True)
    report = apply_plan(crowded, plan, force=True)
    assert report.ok and not report.snapshot_matched


def test_changed_caps_alone_do_not_invalidate_a_plan(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    crowded.set_cap("h0", "old-0", 0.25)
    assert apply_plan(crowded, plan).ok
    vm = crowded.find_vm("old-0")
    assert vm is not None and vm.cap_cores == pytest.approx(plan.per_vm["old-0"].cap_cores)


def test_unmanaged_domains_are_never_touched() -> None:
    hv = memory_hypervisor(inventory_of([VmState("stranger", "h0", 1, 64 * MiB, True)]))
    apply_plan(hv, placed(hv, need=0.5))
    assert hv.find_vm("stranger") == VmState("stranger", "h0", 1, 64 * MiB, True)
    assert all(vm != "stranger" for _, vm in hv.calls)


def test_a_plan_aimed_at_an_unmanaged_domain_is_refused_without_acting() -> None:
    hv = memory_hypervisor(inventory_of([VmState("stranger", "h0", 1, 64 * MiB, True)]))
    plan = placed(hv, need=0.5)
    bad = Plan(plan.kind, plan.cluster, plan.snapshot, 1, 1, {}, (SetCapStep("stranger", "h0", 0.1),))
    with pytest.raises(InputError, match="'stranger' on host h0 is not managed by vcsched"):
        apply_plan(hv, bad)
    assert hv.calls == []


def test_a_vm_found_on_another_host_refuses_the_plan_before_any_step(crowded: MemoryHypervisor) -> None:
    plan = placed(crowded)
    step = plan.steps[2]
    other = "h1" if step.host == "h0" else "h0"
    crowded.vms[step.vm] = managed(step.vm, other, "web", 1.0, cap=0.5)
    with pytest.raises(InputError, match=f"'{step.vm}' already exists on host {other}"):
        apply_plan(crowded, plan, force=True)
    assert crowded.calls == []


def test_a_vm_created_elsewhere_while_the_plan_runs_fails_that_step(crowded: MemoryHypervisor) -> None:
    """A second operator acts after the whole-plan check: the step's runner still refuses to act."""
    plan = placed(crowded)
    first, step = plan.steps[0], plan.steps[2]
    other = "h1" if step.host == "h0" else "h0"

    def someone_else() -> None:
        crowded.vms[step.vm] = managed(step.vm, other, "web", 1.0, cap=0.5)

    crowded.before[(first.op, first.vm)] = someone_else
    report = apply_plan(crowded, plan, force=True)
    failed = next(r for r in report.results if r.outcome == FAILED)
    assert failed.step.vm == step.vm and f"already exists on host {other}" in failed.detail


MIGRATE_PLAN_SCRIPT = r"""
import sys
from acting.executor import apply_plan
from hypervisor.memory import MemoryHypervisor
from vcsched.inventory import HostState, VmMeta, VmState, snapshot_hash
from vcsched.plans.plan import plan_from_dict

hosts = (HostState("h0", 1, 1 << 30), HostState("h1", 1, 1 << 30))
vm = VmState("a-0", "h0", 1, 128 << 20, True, VmMeta("a", 0.5, 128 << 20, 1), 0.5)
hv = MemoryHypervisor("lab", hosts, [vm])
doc = {"version": 1, "kind": "adapt", "cluster": "lab",
       "snapshot": snapshot_hash(hv.inventory(), moving=frozenset({"a-0"})),
       "predicted": {"min_yield": 1.0, "avg_yield": 1.0,
                     "per_vm": {"a-0": {"host": "h1", "cluster": "a", "cpu_need_cores": 0.5,
                                        "cap_cores": 0.5, "yield": 1.0}}},
       "steps": [{"op": "migrate", "vm": "a-0", "from": "h0", "to": "h1", "bytes": 134217728,
                  "cap_cores": 0.5}],
       "budget": 134217728, "migrated_bytes": 134217728}
report = apply_plan(hv, plan_from_dict(doc))
assert report.ok, report.to_dict()
assert hv.find_vm("a-0").host == "h1"
assert not any(m.startswith(("cli", "vcsched.control.live", "vcsched.adaptation")) for m in sys.modules), \
    sorted(m for m in sys.modules if m.startswith(("cli", "vcsched")))
print("ok")
"""


def test_a_migrate_plan_loads_and_applies_with_only_the_plan_module_and_the_executor_imported() -> None:
    """No import-order accident: plan steps and runners are literal tables, not side-effect registrations."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", MIGRATE_PLAN_SCRIPT], cwd=root, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
