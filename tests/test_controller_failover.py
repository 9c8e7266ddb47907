"""`vcsched run` and failed hosts (acting/failure.py), on the in-memory hypervisor with a fake clock.

A host down for ``failure_timeout`` is failed, fenced through its agent, and its recorded VMs are created on the
survivors; without an agent or when fencing fails nothing is created.  The fence agent is a function here (the
agent interface itself is tested in tests/test_fence.py, and the whole path on the lab in
tests/test_recover_lab.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from acting.definitions import DefinitionStore
from acting.failure import Failover
from acting.fence import FenceResult
from tests.builders import cluster_of, managed
from tests.fake_load import FakeLocks, busy
from tests.test_controller import Run, loaded
from vcsched.formats.cluster import Cluster, ClusterHost, FenceConfig
from vcsched.plans.steps import Boot, CreateStep

FAILURE_TIMEOUT = 30.0  # three intervals of tests/test_controller.py's 10 s


def cluster(fence: bool = True) -> Cluster:
    c = cluster_of(3)
    hosts = tuple(dataclasses.replace(h, fence=FenceConfig("/bin/true")) if fence else h for h in c.hosts)
    return dataclasses.replace(c, hosts=hosts, failure_timeout=FAILURE_TIMEOUT, host_timeout=5.0)


class Fences:
    """A fence agent as a function: what it was asked, and whether it reports the host off."""

    def __init__(self, works: bool = True) -> None:
        self.works = works
        self.calls: list[str] = []

    def __call__(self, host: ClusterHost) -> FenceResult:
        self.calls.append(host.name)
        return FenceResult(host.name, "fake", self.works, "off" if self.works else "still on", 0.01)


def setup(tmp_path: Path, fences: Fences, fence: bool = True) -> tuple[Run, Any]:
    hv, clock = loaded([managed("a-0", "h0", "a", 0.3, 0.3), managed("b-0", "h1", "b", 0.3, 0.3),
                        managed("c-0", "h2", "c", 0.3, 0.3)],
                       {"a-0": busy(0.3), "b-0": busy(0.3), "c-0": busy(0.3)}, n_hosts=3)
    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    store.put(CreateStep("b-0", "h1", "b", 1, 128 << 20, 0.3, 0.3, Boot("kernel", "/k", "/i", "quiet")))
    run = Run(hv, clock, FakeLocks(), probe_seconds=0.0)
    run.controller.failover = Failover(cluster(fence), store, fences)
    return run, hv


def power_loss(hv: Any, host: str) -> None:
    hv.down[host] = f"host {host}: did not answer within 5 s (host_timeout)"
    for name in [v.name for v in hv.vms.values() if v.host == host]:
        del hv.vms[name]  # gone with the power


def test_a_host_down_for_failure_timeout_is_fenced_and_its_vms_run_on_the_survivors(tmp_path: Path) -> None:
    fences = Fences()
    run, hv = setup(tmp_path, fences)
    run.cycles(3)
    power_loss(hv, "h1")
    run.cycles(6)
    failed, fenced, restarted = run.events("host_failed"), run.events("host_fenced"), run.events("vm_restarted")
    assert len(failed) == 1 and failed[0]["host"] == "h1" and failed[0]["down_seconds"] >= FAILURE_TIMEOUT
    assert fences.calls == ["h1"] and fenced[0]["fenced"]
    assert [(r["vm"], r["failed_host"]) for r in restarted] == [("b-0", "h1")]
    assert hv.vms["b-0"].host in ("h0", "h2") and hv.vms["b-0"].active
    assert run.at(failed[0]) <= run.at(fenced[0]) <= run.at(restarted[0])
    assert {hv.vms["a-0"].host, hv.vms["c-0"].host} == {"h0", "h2"}, "the others did not move"
    stored = run.controller.failover.store.get("b-0")  # type: ignore[union-attr]
    assert stored is not None and stored.host == hv.vms["b-0"].host, "the record moved with the VM"
    m = run.controller.metrics
    assert m.failures["hosts_failed"] == 1 and m.failures["vms_restarted"] == 1 and m.restart_seconds[1] == 1


def test_one_missed_reading_is_not_a_failure(tmp_path: Path) -> None:
    fences = Fences()
    run, hv = setup(tmp_path, fences)
    run.cycles(2)
    hv.down["h1"] = "host h1: did not answer within 5 s (host_timeout)"
    run.cycles(2)
    del hv.down["h1"]
    run.cycles(3)
    assert not run.events("host_failed") and not fences.calls and hv.vms["b-0"].host == "h1"


def test_without_a_fence_agent_nothing_is_restarted_and_its_vms_are_stranded_once(tmp_path: Path) -> None:
    fences = Fences()
    run, hv = setup(tmp_path, fences, fence=False)
    run.cycles(2)
    power_loss(hv, "h1")
    run.cycles(8)
    stranded = run.events("vm_stranded")
    assert [(s["vm"], s["host"]) for s in stranded] == [("b-0", "h1")] and "no fence agent" in stranded[0]["reason"]
    assert not fences.calls and "b-0" not in hv.vms and not run.events("vm_restarted")


def test_a_fence_that_fails_restarts_nothing_and_is_tried_again(tmp_path: Path) -> None:
    fences = Fences(works=False)
    run, hv = setup(tmp_path, fences)
    run.cycles(2)
    power_loss(hv, "h1")
    run.cycles(7)
    assert len(fences.calls) >= 2 and all(not f["fenced"] for f in run.events("host_fenced"))
    assert "b-0" not in hv.vms and not run.events("vm_restarted")
    fences.works = True
    run.cycles(1)
    assert [r["vm"] for r in run.events("vm_restarted")] == ["b-0"]


def test_a_stop_during_the_restart_still_says_which_vm_ran_again(tmp_path: Path) -> None:
    """SIGTERM while the recovery plan runs: the plan stops after its running step, and the VM that step created
    is still reported (``vm_restarted``, the restart metric) -- a stop must not hide what was done."""
    fences = Fences()
    run, hv = setup(tmp_path, fences)
    run.cycles(3)
    power_loss(hv, "h1")
    create = hv.create_vm

    def create_then_stop(step: Any) -> None:
        create(step)
        run.controller.stop.set()  # SIGTERM arrives while the step runs

    hv.create_vm = create_then_stop
    for _ in range(6):
        if run.controller.stop.is_set():
            break
        run.cycles(1)
    assert run.controller.stop.is_set() and hv.vms["b-0"].active
    assert [(r["vm"], r["failed_host"]) for r in run.events("vm_restarted")] == [("b-0", "h1")]
    assert run.controller.metrics.failures["vms_restarted"] == 1


def test_a_recovery_plan_refused_whole_fences_nothing(tmp_path: Path) -> None:
    """The recovery plan is validated whole before the host is fenced (acting/unit_of_work.py; issue 37,
    measurement 1): here the recorded VM's boot files (/k, /i) are absent on the hosts (the in-memory hosts are
    this machine), so the whole-plan check refuses its create, and the failed host is not fenced."""
    fences = Fences()
    run, hv = setup(tmp_path, fences)
    hv.boot_files = True
    run.cycles(2)
    power_loss(hv, "h1")
    run.cycles(6)
    assert run.events("host_failed") and not fences.calls and not run.events("host_fenced")
    assert "b-0" not in hv.vms and any("/k" in e.get("error", "") for e in run.events("error"))


def test_a_vm_whose_floor_the_survivors_cannot_meet_restarts_below_it_with_an_event(tmp_path: Path) -> None:
    """on_failure = "restart" (the default): b-0's floor (0.5 of 0.6 cores) does not fit beside a-0's and c-0's
    (0.9 of 0.9 cores each, on one-core hosts), yet it runs again, and `vm_below_floor` says so."""
    def floored(name: str, host: str, need: float, floor: float) -> Any:
        v = managed(name, host, name[0], need, need)
        assert v.meta is not None
        return dataclasses.replace(v, meta=dataclasses.replace(v.meta, min_yield=floor))

    hv, clock = loaded([floored("a-0", "h0", 0.9, 0.9), floored("b-0", "h1", 0.6, 0.5),
                        floored("c-0", "h2", 0.9, 0.9)],
                       {"a-0": busy(0.9), "b-0": busy(0.6), "c-0": busy(0.9)}, n_hosts=3)
    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    store.put(CreateStep("b-0", "h1", "b", 1, 128 << 20, 0.6, 0.6, Boot("kernel", "/k", "/i", "quiet"), 0.5))
    run = Run(hv, clock, FakeLocks(), probe_seconds=0.0)
    run.controller.failover = Failover(cluster(), store, Fences())
    run.cycles(3)
    power_loss(hv, "h1")
    run.cycles(6)
    assert [r["vm"] for r in run.events("vm_restarted")] == ["b-0"] and hv.vms["b-0"].active
    (below,) = run.events("vm_below_floor")
    assert below["vm"] == "b-0" and below["min_yield"] == 0.5 and below["yield"] < 0.5
    assert below["host"] == hv.vms["b-0"].host and not run.events("vm_stranded")


def lost_b0(tmp_path: Path, **options: Any) -> tuple[Run, Any, DefinitionStore]:
    """b-0 is recorded on h1, which answers without it (killed outside vcsched, or fenced and back): lost."""
    hv, clock = loaded([managed("a-0", "h0", "a", 0.3, 0.3), managed("c-0", "h2", "c", 0.3, 0.3)],
                       {"a-0": busy(0.3), "b-0": busy(0.3), "c-0": busy(0.3)}, n_hosts=3)
    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    store.put(CreateStep("b-0", "h1", "b", 1, 128 << 20, 0.3, 0.3, Boot("kernel", "/k", "/i", "quiet")))
    run = Run(hv, clock, FakeLocks(), probe_seconds=0.0, **options)
    run.controller.failover = Failover(cluster(), store, Fences())
    return run, hv, store


def test_the_controller_restarts_a_lost_vm_once_and_says_so(tmp_path: Path) -> None:
    run, hv, _ = lost_b0(tmp_path)
    run.cycles(4)
    (lost,) = run.events("vm_lost")
    assert lost["vm"] == "b-0" and lost["host"] == "h1" and lost["why"] == "host answers without it"
    assert [(r["vm"], r["lost"]) for r in run.events("vm_restarted")] == [("b-0", True)]
    assert [v.name for v in hv.vms.values()].count("b-0") == 1 and hv.vms["b-0"].active
    assert run.controller.metrics.lost == 0, "lost before the restart, none after"


def test_in_recommend_mode_the_controller_proposes_the_restart_and_changes_nothing(tmp_path: Path) -> None:
    from acting.recommendations import RecommendationStore
    from vcsched.control import recommend as rc

    run, hv, _ = lost_b0(tmp_path, recommend=True)
    book = RecommendationStore(f"file://{tmp_path}", "lab")
    run.controller.recommendations = book
    run.cycles(3)
    assert "b-0" not in hv.vms and not run.events("vm_restarted") and run.controller.metrics.lost == 1
    (rec,) = [r for r in rc.open_ones(book.read(), run.clock.time()) if r.kind == "restart"]
    assert [s["vm"] for s in rec.to_dict()["steps"] if s["op"] == "create"] == ["b-0"]
    assert rec.reason == "1 lost VM(s) run nowhere: b-0"


def test_with_on_failure_strand_a_lost_vm_whose_floor_cannot_be_met_stays_lost_said_once(tmp_path: Path) -> None:
    def full(name: str, host: str) -> Any:  # needs 0.9 of its host's one core, and keeps it (floor 0.9)
        v = managed(name, host, name[0], 0.9, 0.9)
        return dataclasses.replace(v, meta=dataclasses.replace(v.meta, min_yield=0.9))

    hv, clock = loaded([full("a-0", "h0"), full("d-0", "h1"), full("c-0", "h2")],
                       {"a-0": busy(0.9), "d-0": busy(0.9), "c-0": busy(0.9)}, n_hosts=3)
    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    store.put(CreateStep("b-0", "h1", "b", 1, 128 << 20, 0.5, 0.5, Boot("kernel", "/k", "/i", "quiet"), 0.5))
    run = Run(hv, clock, FakeLocks(), probe_seconds=0.0)
    run.controller.failover = Failover(dataclasses.replace(cluster(), on_failure="strand"), store, Fences())
    run.cycles(5)
    assert "b-0" not in hv.vms and not run.events("vm_restarted") and run.controller.metrics.lost == 1
    (stranded,) = run.events("vm_stranded")
    assert stranded["vm"] == "b-0" and stranded["host"] == "h1" and "floors" in stranded["reason"]
    assert len(run.events("vm_lost")) == 1


def test_a_host_vcsched_put_to_sleep_is_never_declared_failed_nor_fenced(tmp_path: Path) -> None:
    from vcsched.control.power import PowerState, slept

    fences = Fences()
    run, hv = setup(tmp_path, fences)
    run.cycles(2)
    run.controller.power = lambda: slept(PowerState(), hv.hosts["h1"], 0.0)  # the power record: h1 asleep
    power_loss(hv, "h1")
    run.cycles(8)
    assert not run.events("host_failed") and not fences.calls
    assert not run.events("host-down")  # asleep, not down
    # (This fixture's h1 "slept" with VMs on it, which sleep_host never does: its records name h1, and a host
    # asleep holds no VM, so they are lost and restarted like those of a host that answers without them.)


def test_with_two_hosts_failed_each_is_fenced_and_every_vm_runs_once_after_both(tmp_path: Path) -> None:
    """h1 and h2 lose power together.  While one is down and not fenced, the other's VMs may run there (a
    migration cut after its switch-over, not recorded): the first recovery fences its host and says its VMs wait
    (``vm_waiting``, not stranded: no metric); the second fences the other host and restarts both hosts' VMs."""
    fences = Fences()
    run, hv = setup(tmp_path, fences)
    run.controller.failover.store.put(  # type: ignore[union-attr]
        CreateStep("c-0", "h2", "c", 1, 128 << 20, 0.3, 0.3, Boot("kernel", "/k", "/i", "quiet")))
    run.cycles(3)
    power_loss(hv, "h1")
    power_loss(hv, "h2")
    run.cycles(8)
    waiting = run.events("vm_waiting")
    assert waiting and all("do not answer and were not fenced" in w["reason"] for w in waiting), waiting
    assert sorted(fences.calls) == ["h1", "h2"] and not run.events("vm_stranded")
    assert sorted(r["vm"] for r in run.events("vm_restarted")) == ["b-0", "c-0"]
    assert hv.vms["b-0"].host == hv.vms["c-0"].host == "h0" and hv.vms["b-0"].active and hv.vms["c-0"].active
    assert run.controller.metrics.failures.get("vms_stranded", 0) == 0
