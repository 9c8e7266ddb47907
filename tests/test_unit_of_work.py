"""The unit of work (acting/unit_of_work.py) on the in-memory hypervisor with a fake lock: the order of the acting
sequence — lock, lease, settle, read, validate whole, irreversible action, apply, record — and what a dry run
does not do."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from acting.definitions import DefinitionStore
from acting.executor import DONE, PlanRefused
from acting.lock import LockLost
from acting.unit_of_work import DryRun, Reporting, UnitOfWork
from hypervisor.memory import MemoryHypervisor
from tests.builders import cluster_of, inventory_of, managed, memory_hypervisor
from vcsched.control.failover import plan_recovery
from vcsched.control.observe import cap_plan
from vcsched.formats.cluster import FenceConfig
from vcsched.plans.steps import Boot, CreateStep, SetCapStep


class Lock:
    """A cluster lock that says what was asked of it, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lost = False

    def acquire(self, wait: float = 0.0) -> None:
        self.calls.append("acquire")

    def guard(self) -> None:
        self.calls.append("guard")
        if self.lost:
            raise LockLost("the lease expired")

    def held(self) -> bool:
        return not self.lost

    def release(self) -> None:
        self.calls.append("release")


def hypervisor() -> MemoryHypervisor:
    return memory_hypervisor(inventory_of([managed("a-0", "h0", "a", 0.5, 0.5), managed("b-0", "h1", "b", 0.5, 0.5)]))


def test_entering_takes_the_lock_sets_the_lease_and_settles_in_doubt_vms_first() -> None:
    hv, lock = hypervisor(), Lock()
    settled: list[object] = []
    with UnitOfWork(hv, lock, reporting=Reporting(settled=settled.append)) as uow:
        assert lock.calls[0] == "acquire" and hv.lease is not None and hv.lease()
        assert hv.repairs == 1 and len(settled) == 1
        assert not uow.dry_run
    assert lock.calls[-1] == "release" and hv.lease is None


def test_settle_false_leaves_in_doubt_vms_to_the_caller() -> None:
    hv = hypervisor()
    with UnitOfWork(hv, Lock(), settle=False):
        assert hv.repairs == 0


def test_the_lock_is_released_and_the_lease_cleared_when_the_block_raises() -> None:
    hv, lock = hypervisor(), Lock()
    with pytest.raises(RuntimeError), UnitOfWork(hv, lock):
        raise RuntimeError("boom")
    assert lock.calls[-1] == "release" and hv.lease is None


def test_a_dry_run_takes_no_lock_settles_nothing_and_refuses_to_apply() -> None:
    hv = hypervisor()
    with UnitOfWork(hv, None) as uow:
        inventory = uow.inventory()
        plan = cap_plan(inventory, {"a-0": 0.25})
        assert uow.validate(plan) is True  # a dry run validates: it only reads
        with pytest.raises(DryRun):
            uow.apply(plan)
    assert hv.repairs == 0 and hv.vms["a-0"].cap_cores == 0.5


def test_a_dry_run_validates_on_the_inventory_it_planned_on_and_only_a_dry_run_may() -> None:
    """The dry runs of place, adapt, drain and apply check their plan on the inventory they read (no lock: a second
    read of every host would only cost time); a unit of work that acts always reads afresh, under its lock."""
    from unittest import mock

    hv = hypervisor()
    with UnitOfWork(hv, None) as uow:
        inventory = uow.inventory()
        plan = cap_plan(inventory, {"a-0": 0.25})
        with mock.patch.object(hv, "inventory", wraps=hv.inventory) as read:
            assert uow.validate(plan, inventory=inventory) is True
        assert read.call_count == 0
        too_much = dataclasses.replace(plan, steps=(SetCapStep("a-0", "h0", 3.0),))
        with pytest.raises(PlanRefused, match=r"plan\.steps\[0\]\.cap_cores: 3 cores is more than the VM's 1"):
            uow.validate(too_much, inventory=inventory)
    with UnitOfWork(hv, Lock()) as uow, pytest.raises(DryRun, match="acting reads under the lock"):
        uow.validate(plan, inventory=inventory)


def test_a_plan_is_applied_under_the_guard_and_each_step_reported() -> None:
    hv, lock = hypervisor(), Lock()
    seen: list[str] = []
    with UnitOfWork(hv, lock, reporting=Reporting(step=lambda r: seen.append(r.step.vm))) as uow:
        report = uow.apply(cap_plan(uow.inventory(), {"a-0": 0.25}))
    assert report is not None and report.ok and hv.vms["a-0"].cap_cores == 0.25
    assert seen == ["a-0"] and "guard" in lock.calls


def test_the_callers_own_condition_is_checked_before_every_step() -> None:
    hv = hypervisor()

    def stopping() -> None:
        raise LockLost("no longer the leader")

    with UnitOfWork(hv, Lock(), before_step=stopping) as uow:
        report = uow.apply(cap_plan(uow.inventory(), {"a-0": 0.25}))
    assert report is not None and not report.ok and report.stopped == "no longer the leader"
    assert hv.vms["a-0"].cap_cores == 0.5


def test_a_plan_refused_whole_runs_no_irreversible_action() -> None:
    """Pacemaker's ordering: fencing (irreversible) only once the plan that must follow it is known to hold."""
    hv = hypervisor()
    plan = cap_plan(hv.inventory(), {"a-0": 0.25})
    over = dataclasses.replace(plan, steps=(dataclasses.replace(plan.steps[0], cap_cores=4.0),))  # 1-core hosts
    fenced: list[bool] = []
    with UnitOfWork(hv, Lock()) as uow, pytest.raises(PlanRefused):
        uow.apply(over, irreversible=lambda: fenced.append(True) or True)
    assert not fenced and hv.vms["a-0"].cap_cores == 0.5


def test_an_irreversible_action_that_fails_applies_nothing() -> None:
    hv = hypervisor()
    with UnitOfWork(hv, Lock()) as uow:
        report = uow.apply(cap_plan(uow.inventory(), {"a-0": 0.25}), irreversible=lambda: False)
    assert report is None and hv.vms["a-0"].cap_cores == 0.5


def recovery_case(boot_files: bool) -> tuple[MemoryHypervisor, object]:
    """h1 failed holding b-0 (recorded); h0 and h2 survive.  ``boot_files``: the in-memory hosts are this
    machine, so the recorded VM's boot files (/k, /i: absent) are checked before it is created."""
    hv = memory_hypervisor(inventory_of([managed("a-0", "h0", "a", 0.3, 0.3)], n_hosts=3))
    hv.down["h1"] = "host h1: did not answer"
    hv.boot_files = boot_files
    c = cluster_of(3)
    c = dataclasses.replace(c, hosts=tuple(dataclasses.replace(h, fence=FenceConfig("/bin/true")) for h in c.hosts))
    record = CreateStep("b-0", "h1", "b", 1, 128 << 20, 0.3, 0.3, Boot("kernel", "/k", "/i", "quiet"))
    return hv, plan_recovery(c, hv.inventory(), "h1", [record])


def test_recovery_fences_only_after_its_plan_validates_whole() -> None:
    """Issue 37, measurement 1: the host was fenced, then its recovery plan refused; its VMs were dead and
    nothing restarted them."""
    hv, recovery = recovery_case(boot_files=True)
    assert recovery.plan is not None  # type: ignore[attr-defined]
    fenced: list[str] = []
    with UnitOfWork(hv, Lock()) as uow, pytest.raises(Exception, match="/k"):
        uow.apply(recovery.plan, irreversible=lambda: fenced.append("h1") or True)  # type: ignore[attr-defined]
    assert not fenced and "b-0" not in hv.vms


def test_recovery_whose_plan_holds_fences_then_creates_and_records_where(tmp_path: Path) -> None:
    hv, recovery = recovery_case(boot_files=False)
    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    order: list[str] = []
    with UnitOfWork(hv, Lock(), store=store,
                    reporting=Reporting(step=lambda r: order.append(f"{r.step.op} {r.outcome}"))) as uow:
        report = uow.apply(recovery.plan, irreversible=lambda: order.append("fence") or True)  # type: ignore[attr-defined]
    assert report is not None and report.ok and hv.vms["b-0"].active
    assert order[0] == "fence" and f"create {DONE}" in order
    recorded = store.get("b-0")
    assert recorded is not None and recorded.host == hv.vms["b-0"].host != "h1"


def test_a_plan_checked_before_its_irreversible_action_is_not_read_and_checked_again() -> None:
    """Each whole read costs a host that does not answer (the failed host of a recovery) its ``host_timeout``:
    checking before fencing must not add a read to what applying alone costs."""
    hv, recovery = recovery_case(boot_files=False)
    reads = []
    real = hv.inventory
    hv.inventory = lambda hosts=None: reads.append(hosts) or real(hosts)  # type: ignore[method-assign]
    with UnitOfWork(hv, Lock(), settle=False) as uow:
        report = uow.apply(recovery.plan, irreversible=lambda: True)  # type: ignore[attr-defined]
    assert report is not None and report.ok
    assert reads.count(None) == 1, reads  # the whole read under the check; each step then reads its own hosts


def test_in_doubt_vms_a_refused_repair_leaves_are_said_once_with_why() -> None:
    """The adapter reports a repair it refused (a host did not answer) as not applied (hypervisor/settlement.py):
    the unit of work still says which in-doubt VMs it left and why (tests/test_repair_lab.py saw nothing said)."""
    from vcsched.inventory import InDoubt
    from vcsched.plans.repair import RepairPlan, RepairReport

    class Refusing(MemoryHypervisor):
        def repair(self, guard, *, apply=True, fenced=frozenset()):  # type: ignore[no-untyped-def]
            doubt = InDoubt("a-0", "u-a", ("h1",), ("paused",), arriving_from=("h0",))
            return RepairReport(RepairPlan((doubt,), refused="host h0 did not answer"), applied=False)

    hv = hypervisor()
    refusing = Refusing.__new__(Refusing)
    refusing.__dict__.update(hv.__dict__)
    notes: list[str] = []
    with UnitOfWork(refusing, Lock(), reporting=Reporting(note=notes.append)):
        pass
    assert len(notes) == 1 and "not settled" in notes[0] and "h0" in notes[0]


def test_a_fence_mark_lives_until_its_host_answers_under_the_lock(tmp_path: Path) -> None:
    """A mark says its host holds no VM (vcsched/control/lost.py).  Left after the host answered again, a VM moved
    there since counted as lost once the host stopped answering again, and was started a second time (scripts/
    faultsim --seed 90210 --replay 6229).  Cleared by the read a plan is decided on, and by the whole-plan check
    before any step (a saved plan applied without a planning read); a dry run, which places nothing, keeps it."""
    hv = hypervisor()
    hv.down["h0"] = "fenced: off"
    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    store.mark_fenced("h0")
    store.mark_fenced("h1")
    with UnitOfWork(hv, None, store=store) as uow:
        uow.inventory()
    assert set(store.fenced()) == {"h0", "h1"}
    with UnitOfWork(hv, Lock(), store=store) as uow:
        uow.inventory()
    assert set(store.fenced()) == {"h0"}, "h0 does not answer: still off"
    store.mark_fenced("h1")
    plan = cap_plan(hv.inventory(), {"b-0": 0.25})  # read outside any unit of work: a saved plan
    with UnitOfWork(hv, Lock(), store=store) as uow:
        report = uow.apply(plan)
    assert report is not None and report.ok and set(store.fenced()) == {"h0"}


def test_a_resume_by_the_settlement_on_entry_is_recorded_where_the_vm_now_runs(tmp_path: Path) -> None:
    """A migration h0 -> h1 switched over and its process died before recording it: the record names h0, the VM
    is a paused arrival on h1.  The settlement on entry resumes it there, and records h1 — left naming h0, a
    recovery of h0 took it for one of its own VMs (scripts/faultsim --seed 1 --replay 8245 --sigterm)."""
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from tests.test_settlement import domain, hosts, node

    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "t")
    store.put(CreateStep("v", "h0", "vc", 1, 128 << 20, 0.5, 0.5, Boot("kernel", "/k", "/i", "")))
    c = hosts(tmp_path, h0=node(), h1=node(domain("v", arriving_from="h0")))
    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        with UnitOfWork(hv, Lock(), store=store) as uow:
            assert uow.repaired is not None and [(a.action, a.host, o) for a, o, _ in uow.repaired.outcomes] == [
                ("resume", "h1", "done")]
    recorded = store.get("v")
    assert recorded is not None and recorded.host == "h1"
