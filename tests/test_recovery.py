"""acting/recovery.py, the one sequence of a failed host's recovery and of the restart of lost VMs, on the in-memory
hypervisor with a fake lock: what is planned, checked, fenced, marked and created, in which order, and what is
returned for the caller to say; and that every caller (the CLI, the controller, the fault simulation) runs it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from acting import recovery as recovery_module
from acting.definitions import DefinitionStore, StoreError
from acting.executor import DONE, PlanRefused
from acting.fence import FenceResult
from acting.recovery import NotFailed, RecoveryRun, plan_host_recovery, recover_host, restart_lost
from acting.unit_of_work import Reporting, UnitOfWork
from hypervisor.memory import MemoryHypervisor
from tests.builders import cluster_of, inventory_of, managed, memory_hypervisor
from tests.test_unit_of_work import Lock
from vcsched.formats.cluster import Cluster, ClusterHost, FenceConfig
from vcsched.plans.claims import PlanMismatch
from vcsched.plans.steps import Boot, CreateStep

ROOT = Path(__file__).resolve().parent.parent
B0 = CreateStep("b-0", "h1", "b", 1, 128 << 20, 0.3, 0.3, Boot("kernel", "/k", "/i", "quiet"))
A0 = CreateStep("a-0", "h0", "a", 1, 128 << 20, 0.3, 0.3, Boot("kernel", "/k", "/i", "quiet"))


def failed_h1(tmp_path: Path) -> tuple[MemoryHypervisor, Cluster, DefinitionStore]:
    """h1 failed holding b-0 (recorded in the store, as a-0 on h0 is); h0 and h2 survive, every host has an agent."""
    hv = memory_hypervisor(inventory_of([managed("a-0", "h0", "a", 0.3, 0.3)], n_hosts=3))
    hv.down["h1"] = "host h1: did not answer"
    c = cluster_of(3)
    c = dataclasses.replace(c, hosts=tuple(dataclasses.replace(h, fence=FenceConfig("/bin/true")) for h in c.hosts))
    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    store.put(A0)
    store.put(B0)
    return hv, c, store


class Fence:
    """A fence agent as a function: the hosts it was asked to fence, and whether it reports them off."""

    def __init__(self, works: bool = True, order: list[str] | None = None) -> None:
        self.works = works
        self.calls: list[str] = []
        self.order = order if order is not None else []

    def __call__(self, host: ClusterHost) -> FenceResult:
        self.calls.append(host.name)
        self.order.append("fence")
        return FenceResult(host.name, "fake", self.works, "off" if self.works else "still on", 0.01)


def test_a_recovery_is_planned_then_fenced_and_marked_then_its_vms_created_and_recorded(tmp_path: Path) -> None:
    hv, c, store = failed_h1(tmp_path)
    order: list[str] = []
    fence = Fence(order=order)

    def planned(run: RecoveryRun) -> None:
        order.append("planned")
        assert run.recovery.restarts and not fence.calls  # said before anything changes

    with UnitOfWork(hv, Lock(), store=store) as uow:
        run = recover_host(uow, c, store, uow.inventory(), "h1", fence=fence, planned=planned,
                           on_step=lambda r: order.append(f"{r.step.op} {r.outcome}"))
    assert order[:2] == ["planned", "fence"] and f"create {DONE}" in order
    assert run.fence is not None and run.fence.fenced and run.refused is None
    assert run.report is not None and run.report.ok and hv.vms["b-0"].active
    assert [r.vm for r in run.records] == ["b-0"]
    assert "h1" in store.fenced()  # its VMs not restarted would now count as lost
    recorded = store.get("b-0")
    assert recorded is not None and recorded.host == hv.vms["b-0"].host != "h1"


def test_a_recovery_plan_refused_whole_fences_nothing_and_is_returned(tmp_path: Path) -> None:
    hv, c, store = failed_h1(tmp_path)
    fence = Fence()
    with UnitOfWork(hv, Lock(), store=store) as uow:
        inventory = uow.inventory()
        hv.vms["a-0"] = dataclasses.replace(hv.vms["a-0"], cap_cores=0.5)  # the cluster changed after the read
        run = recover_host(uow, c, store, inventory, "h1", fence=fence)
    assert isinstance(run.refused, PlanRefused | PlanMismatch) and "nothing changed" in str(run.refused)
    assert not fence.calls and run.fence is None and run.report is None
    assert "b-0" not in hv.vms and "h1" not in store.fenced()


def test_a_fence_that_fails_creates_nothing_and_marks_nothing(tmp_path: Path) -> None:
    hv, c, store = failed_h1(tmp_path)
    with UnitOfWork(hv, Lock(), store=store) as uow:
        run = recover_host(uow, c, store, uow.inventory(), "h1", fence=Fence(works=False))
    assert run.fence is not None and not run.fence.fenced and run.report is None and run.refused is None
    assert "b-0" not in hv.vms and "h1" not in store.fenced()


def test_a_host_fenced_earlier_in_the_same_failure_is_neither_fenced_nor_marked_again(tmp_path: Path) -> None:
    """The controller fences once per failure (acting/failure.py) and says so with ``already_fenced``."""
    hv, c, store = failed_h1(tmp_path)
    fence = Fence()
    with UnitOfWork(hv, Lock(), store=store) as uow:
        run = recover_host(uow, c, store, uow.inventory(), "h1", fence=fence, already_fenced=True)
    assert not fence.calls and run.fence is None
    assert run.report is not None and run.report.ok and hv.vms["b-0"].active
    assert "h1" not in store.fenced()


@pytest.mark.parametrize("own", [False, True])
def test_a_fence_mark_that_cannot_be_written_is_said_and_the_recovery_goes_on(tmp_path: Path, own: bool) -> None:
    """Said as a note of the unit of work (the CLI's notice), or through the caller's ``unmarked`` (the controller's
    error event); the host is off either way, so its VMs are created."""
    hv, c, store = failed_h1(tmp_path)

    def unwritable(host: str, at: float | None = None) -> None:
        raise StoreError("the coordination service does not answer")

    store.mark_fenced = unwritable  # type: ignore[method-assign]
    notes: list[str] = []
    said: list[StoreError] = []
    with UnitOfWork(hv, Lock(), store=store, reporting=Reporting(note=notes.append)) as uow:
        run = recover_host(uow, c, store, uow.inventory(), "h1", fence=Fence(),
                           unmarked=said.append if own else None)
    assert run.report is not None and run.report.ok and hv.vms["b-0"].active
    if own:
        assert len(said) == 1 and not any("lost" in n for n in notes)
    else:
        assert not said and any("its stranded VMs will not be listed as lost" in n for n in notes), notes


def test_a_dry_run_fences_nothing_and_says_whether_apply_would_refuse(tmp_path: Path) -> None:
    hv, c, store = failed_h1(tmp_path)
    fence = Fence()
    with UnitOfWork(hv, None) as uow:
        run = recover_host(uow, c, store, uow.inventory(), "h1", fence=fence)
    assert run.recovery.plan is not None and run.refused is None and run.report is None
    hv.boot_files = True  # the dry run checks the creates as --apply would: the boot files (/k, /i) are absent
    with UnitOfWork(hv, None) as uow, pytest.raises(Exception, match="/k"):
        recover_host(uow, c, store, uow.inventory(), "h1", fence=fence)
    assert not fence.calls and "b-0" not in hv.vms and "h1" not in store.fenced()


def test_a_host_that_answers_or_sleeps_is_not_recovered(tmp_path: Path) -> None:
    hv, c, store = failed_h1(tmp_path)
    inventory = hv.inventory()
    answering = dataclasses.replace(inventory, hosts=tuple(dataclasses.replace(h, down=None) for h in inventory.hosts))
    with pytest.raises(NotFailed, match="answers") as answers:
        plan_host_recovery(c, store, answering, "h1", waited_on=False)
    asleep = dataclasses.replace(inventory, hosts=tuple(dataclasses.replace(h, asleep=h.name == "h1")
                                                        for h in inventory.hosts))
    with pytest.raises(NotFailed, match="asleep") as sleeps:
        plan_host_recovery(c, store, asleep, "h1", waited_on=False)
    assert not answers.value.asleep and sleeps.value.asleep


def test_a_restart_of_named_vms_restarts_the_lost_and_says_why_not_the_others(tmp_path: Path) -> None:
    hv, c, store = failed_h1(tmp_path)
    store.mark_fenced("h1")  # fenced, nothing restarted: b-0 is lost
    planned: list[object] = []
    with UnitOfWork(hv, Lock(), store=store) as uow:
        run = restart_lost(uow, c, store, uow.inventory(), [A0, B0], below_floor_ok=True, planned=planned.append)
    assert planned and run.not_lost == (("a-0", "it is on h0 (not lost)"),)
    assert run.not_restarted == run.not_lost and [r.vm for r in run.records] == ["b-0"]
    assert run.report is not None and run.report.ok and hv.vms["b-0"].active


def test_a_restart_of_every_lost_vm_as_a_dry_run_changes_nothing(tmp_path: Path) -> None:
    hv, c, store = failed_h1(tmp_path)
    store.mark_fenced("h1")
    with UnitOfWork(hv, None) as uow:
        run = restart_lost(uow, c, store, uow.inventory())
    assert [r.vm for r in run.records] == ["b-0"] and run.restart.plan is not None
    assert run.refused is None and run.report is None and "b-0" not in hv.vms


def test_the_core_plans_recoveries_and_restarts_in_acting_recovery_only() -> None:
    """One place calls :func:`vcsched.control.failover.plan_recovery` and ``plan_restart`` outside the core and the
    tests: acting/recovery.py, which every caller goes through (so a new argument of theirs is one change)."""
    callers = []
    for package in ("acting", "cli", "faultsim", "hypervisor", "lab", "calibration"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", getattr(node.func, "attr", None))
                    if name in ("plan_recovery", "plan_restart"):
                        callers.append((str(path.relative_to(ROOT)), name))
    assert sorted(callers) == [("acting/recovery.py", "plan_recovery"), ("acting/recovery.py", "plan_restart")]


@pytest.mark.parametrize("index, function", [(5, "recover_host"), (13, "restart_lost"), (21, "recover_host")])
def test_the_fault_simulation_runs_the_product_recovery_itself(monkeypatch: pytest.MonkeyPatch, index: int,
                                                               function: str) -> None:
    """A recover, a restart and a controller schedule of scripts/faultsim (docs/faultsim.md) call acting/recovery.py,
    not a re-enactment of it."""
    import acting.controller
    from faultsim.simulation import replay, workload_of

    calls: list[str] = []
    real = getattr(recovery_module, function)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(function)
        return real(*args, **kwargs)

    monkeypatch.setattr(recovery_module, function, counted)
    monkeypatch.setattr(acting.controller, function, counted)
    assert workload_of(index) in ("recover", "restart", "controller")
    out = replay(1, index)
    assert calls and not out.violations


def test_a_vm_of_a_fenced_host_waits_while_another_unfenced_host_is_down_and_the_reason_names_that_host(
        tmp_path: Path) -> None:
    """h1 fenced, b-0 not restarted; h2 down and not fenced may run b-0 (a migration cut after its switch-over):
    not lost, and the reason names h2, not h1 (which was fenced).  A recovery of h1 then makes b-0 wait too."""
    hv, c, store = failed_h1(tmp_path)
    hv.down["h2"] = "host h2: did not answer"
    store.mark_fenced("h1")
    with UnitOfWork(hv, Lock(), store=store) as uow:
        run = restart_lost(uow, c, store, uow.inventory(), [B0], below_floor_ok=True)
        assert run.report is None and [vm for vm, _ in run.not_lost] == ["b-0"]
        assert "host(s) h2 do not answer" in run.not_lost[0][1] and "recover h2" in run.not_lost[0][1]
        recovery = plan_host_recovery(c, store, uow.inventory(), "h1", waited_on=False).recovery
    assert recovery.restarts == () and [vm for vm, _ in recovery.waiting] == ["b-0"] and not recovery.stranded
    assert recovery.plan is not None  # h1 is fenced all the same (a caps-only plan)
