"""Room for host failures (vcsched/control/failover.py): would a host's VMs fit on the survivors (N+1)?

Memory is rigid; CPU is needed only at each virtual cluster's floor (its admitted min_yield, or the cluster's).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from acting.executor import apply_plan
from cli.main import cli
from hypervisor.memory import MemoryHypervisor
from hypervisor.testhosts import write_scale_cluster
from tests.builders import MiB, cluster_of, inventory_of, managed, memory_hypervisor, request
from vcsched.control.admission import admit
from vcsched.control.failover import (
    NO_MEMORY,
    NO_ROOM,
    failover_refusal,
    headroom,
    host_failover,
    keep_failover_room,
    plan_recovery,
)
from vcsched.formats.cluster import Cluster, FenceConfig
from vcsched.inventory import VmState
from vcsched.plans.steps import Boot, CreateStep


def floored(v: VmState, floor: float) -> VmState:
    assert v.meta is not None
    return dataclasses.replace(v, meta=dataclasses.replace(v.meta, min_yield=floor))


def test_a_hosts_vms_fit_on_the_others_when_their_memory_does() -> None:
    inv = inventory_of([managed("a", "h0", "a", 1.0, mem=400 * MiB), managed("b", "h1", "b", 1.0, mem=400 * MiB)],
                       n_hosts=3)
    f = host_failover(cluster_of(3), inv, "h0")
    assert f.fits and f.placed == (("a", "h2"),)  # h2 is empty: MCB puts it where the room is
    assert f.min_yield is not None and f.min_yield > 0


def test_memory_is_rigid() -> None:
    inv = inventory_of([managed("a", "h0", "a", 0.1, mem=700 * MiB), managed("b", "h1", "b", 0.1, mem=700 * MiB)])
    f = host_failover(cluster_of(2), inv, "h0")
    assert not f.fits and f.stranded == (("a", NO_ROOM),) and f.min_yield is not None


def test_without_floors_cpu_does_not_count_but_a_floor_does() -> None:
    vms = [managed("a", "h0", "a", 1.0), managed("b", "h1", "b", 1.0)]
    assert host_failover(cluster_of(2), inventory_of(vms), "h0").fits  # two full-core VMs on one core: yield 0.5
    strict = [floored(v, 0.6) for v in vms]  # 0.6 + 0.6 cores on one core: no
    assert not host_failover(cluster_of(2), inventory_of(strict), "h0").fits
    assert not host_failover(cluster_of(2, min_yield=0.6), inventory_of(vms), "h0").fits


def test_the_min_yield_after_the_loss_is_reported() -> None:
    inv = inventory_of([managed("a", "h0", "a", 1.0), managed("b", "h1", "b", 1.0)])
    f = host_failover(cluster_of(2), inv, "h0")
    assert f.min_yield is not None and abs(f.min_yield - 0.5) < 1e-6


def test_spread_vms_do_not_join_their_siblings_on_a_survivor() -> None:
    vms = [dataclasses.replace(v, meta=dataclasses.replace(v.meta, spread="required"))  # type: ignore[arg-type]
           for v in (managed("w-0", "h0", "w", 0.1), managed("w-1", "h1", "w", 0.1))]
    f = host_failover(cluster_of(3), inventory_of(vms, n_hosts=3), "h0")
    assert f.fits and f.placed == (("w-0", "h2"),)
    assert not host_failover(cluster_of(2), inventory_of(vms, n_hosts=2), "h0").fits


def test_hosts_in_maintenance_take_nothing() -> None:
    c = cluster_of(3)
    c = dataclasses.replace(c, hosts=(c.hosts[0], c.hosts[1], dataclasses.replace(c.hosts[2], maintenance=True)))
    inv = inventory_of([managed("a", "h0", "a", 0.1, mem=700 * MiB), managed("b", "h1", "b", 0.1, mem=700 * MiB)],
                       n_hosts=3)
    assert not host_failover(c, inv, "h0").fits


def test_the_least_important_vms_are_stranded_first() -> None:
    big = [managed(n, "h0", n, 0.1, mem=400 * MiB) for n in ("a", "b")]
    prio = [dataclasses.replace(v, meta=dataclasses.replace(v.meta, priority=p))  # type: ignore[arg-type]
            for v, p in zip(big, (1, 5), strict=True)]
    inv = inventory_of([*prio, managed("c", "h1", "c", 0.1, mem=500 * MiB)])
    f = host_failover(cluster_of(2), inv, "h0")
    assert f.placed == (("b", "h1"),) and f.stranded == (("a", NO_ROOM),)


def test_headroom_has_one_answer_per_host_that_answers() -> None:
    inv = inventory_of([managed("a", "h0", "a", 0.5, mem=700 * MiB)], n_hosts=2)
    rows = {f.host: f for f in headroom(cluster_of(2), inv)}
    assert set(rows) == {"h0", "h1"} and rows["h0"].fits and rows["h1"].fits and rows["h1"].vms == ()


def test_failures_tolerated_refuses_naming_the_host_whose_loss_could_not_be_absorbed() -> None:
    c = dataclasses.replace(cluster_of(3), failures_tolerated=1)
    inv = inventory_of([managed(f"x{i}", f"h{i}", f"x{i}", 0.1, mem=500 * MiB) for i in range(2)], n_hosts=3)
    assert failover_refusal(c, inv) is None  # h0's or h1's 500 MiB fits on h2
    decision = admit(c, inv, request("big", vms=1, mem=600 * MiB))
    assert decision.admitted and decision.plan is not None  # only h2 has 600 MiB free
    refused = keep_failover_room(c, inv, decision)
    assert not refused.admitted and refused.plan is None
    assert refused.reason == ("failover: if host h2 failed, 1 of its 1 VMs (big-0; 600 MiB) would find no room "
                              "on the survivors (memory, and CPU at the virtual clusters' floors) "
                              "(failures_tolerated = 1)")
    unasked = keep_failover_room(cluster_of(3), inv, decision)
    assert unasked is decision


# --- the CLI on libvirt's test driver ------------------------------------------------------------


def full_cluster(tmp_path: Path, tolerated: int) -> tuple[Path, Path]:
    """3 simulated hosts (``sim://``: they cap CPU) of 32 GiB with 40 VMs of 512 MiB each (12 GiB free each), and
    a request of one 6 GiB VM: after it, no host's VMs fit on the other two (20 GiB into 6 + 12 GiB)."""
    sc = write_scale_cluster(tmp_path, 3, 40, scheme="sim")
    text = sc.cluster_file.read_text().replace('name = "scale"', f'name = "scale"\nfailures_tolerated = {tolerated}')
    sc.cluster_file.write_text(text)
    req = tmp_path / "big.toml"
    req.write_text('name = "big"\nvms = 1\nvcpus = 1\nmemory = "6GiB"\ncpu_cores = 0.5\n')
    return sc.cluster_file, req


def test_place_refuses_what_would_leave_no_failover_room_naming_the_host(tmp_path: Path) -> None:
    cluster, req = full_cluster(tmp_path, 1)
    r = CliRunner().invoke(cli, ["place", str(req), "--cluster", str(cluster), "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert not doc["admitted"] and doc["reason"].startswith("failover: if host h0 failed, ")
    assert "failures_tolerated = 1" in doc["reason"]
    text = CliRunner().invoke(cli, ["place", str(req), "--cluster", str(cluster)])
    assert text.exit_code == 1 and "failover: if host h0 failed" in text.output


def test_without_failures_tolerated_the_same_request_is_admitted(tmp_path: Path) -> None:
    cluster, req = full_cluster(tmp_path, 0)
    r = CliRunner().invoke(cli, ["place", str(req), "--cluster", str(cluster), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["admitted"]


def test_status_shows_each_hosts_headroom_in_text_and_json(tmp_path: Path) -> None:
    sc = write_scale_cluster(tmp_path, 3, 40)
    r = CliRunner().invoke(cli, ["status", "--cluster", str(sc.cluster_file), "--sample", "0", "--json"])
    assert r.exit_code == 0, r.output
    rows = {f["host"]: f for f in json.loads(r.stdout)["headroom"]}
    assert set(rows) == {"h0", "h1", "h2"}
    assert all(f["fits"] and len(f["vms"]) == 40 for f in rows.values())  # 20 GiB into 12 + 12 GiB
    assert 0 < rows["h0"]["min_yield_after"] <= 1
    text = CliRunner().invoke(cli, ["status", "--cluster", str(sc.cluster_file), "--sample", "0"])
    assert text.exit_code == 0 and "failover headroom" in text.stdout and "min yield after" in text.stdout


# --- recovery of a failed host ----------------------------------------------------------------------


def fenced(cluster: Cluster, *hosts: str) -> Cluster:
    return dataclasses.replace(cluster, hosts=tuple(
        dataclasses.replace(h, fence=FenceConfig("/bin/true")) if h.name in hosts else h for h in cluster.hosts))


def record(vm: str, cluster: str = "web", mem: int = 128 * MiB, need: float = 0.5, priority: int = 0,
           boot: Boot | None = None, floor: float | None = None) -> CreateStep:
    return CreateStep(vm, "h1", cluster, 1, mem, need, need, boot or Boot("kernel", "/k", "/i", "quiet"), floor,
                      priority=priority)


def down_h1(vms: list[VmState], n_hosts: int = 3) -> MemoryHypervisor:
    hv = memory_hypervisor(inventory_of(vms, n_hosts=n_hosts))
    hv.down["h1"] = "host h1: did not answer within 15 s (host_timeout)"
    return hv


def test_a_fenced_hosts_vms_are_created_on_the_survivors_and_the_plan_applies() -> None:
    hv = down_h1([managed("old-0", "h0", "old", 1.0, cap=1.0)])
    rec = plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", [record("web-0"), record("web-1")])
    assert rec.fence and not rec.stranded and rec.plan is not None
    assert {vm for vm, _ in rec.restarts} == {"web-0", "web-1"} and all(h != "h1" for _, h in rec.restarts)
    report = apply_plan(hv, rec.plan)
    assert report.ok, report.to_dict()
    assert {v.name: v.host for v in hv.inventory().vms} == {"old-0": "h0", **dict(rec.restarts)}


def test_without_a_fence_agent_nothing_is_restarted_and_every_vm_is_stranded_saying_why() -> None:
    hv = down_h1([])
    rec = plan_recovery(cluster_of(3), hv.inventory(), "h1", [record("web-0")])
    assert rec.plan is None and not rec.fence
    (vm, why), = rec.stranded
    assert vm == "web-0" and "host h1 has no fence agent" in why


def test_most_important_first_and_the_rest_stranded_for_lack_of_room() -> None:
    hv = down_h1([managed("big", "h0", "big", 0.1, mem=900 * MiB)], n_hosts=2)
    recs = [record("low", "a", mem=100 * MiB, priority=0), record("high", "b", mem=100 * MiB, priority=9)]
    rec = plan_recovery(fenced(cluster_of(2), "h1"), hv.inventory(), "h1", recs)
    assert rec.restarts == (("high", "h0"),) and rec.stranded == (("low", NO_MEMORY),)
    strand = dataclasses.replace(fenced(cluster_of(2), "h1"), on_failure="strand")
    assert plan_recovery(strand, hv.inventory(), "h1", recs).stranded == (("low", NO_ROOM),)


def test_a_vm_with_a_disk_on_unshared_storage_is_stranded() -> None:
    hv = down_h1([])
    image = record("db-0", boot=Boot("image", path="/img/db.qcow2"))
    rec = plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", [image, record("web-0")])
    assert [vm for vm, _ in rec.restarts] == ["web-0"]
    (vm, why), = rec.stranded
    assert vm == "db-0" and why.startswith("local disk: it boots from a image on h1's storage")


def test_vms_already_running_elsewhere_are_not_created_again() -> None:
    hv = down_h1([managed("web-0", "h2", "web", 0.5, cap=0.5)])
    rec = plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", [record("web-0"), record("web-1")])
    assert rec.running == (("web-0", "h2"),) and [vm for vm, _ in rec.restarts] == ["web-1"]


def test_status_leaves_headroom_out_above_100_hosts_unless_asked(tmp_path: Path) -> None:
    sc = write_scale_cluster(tmp_path, 101, 1)
    r = CliRunner().invoke(cli, ["status", "--cluster", str(sc.cluster_file), "--sample", "0", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["headroom"] is None and "more than 100" in doc["headroom_skipped"]
    asked = CliRunner().invoke(cli, ["status", "--cluster", str(sc.cluster_file), "--sample", "0", "--json",
                                     "--headroom"])
    assert len(json.loads(asked.stdout)["headroom"]) == 101


def test_a_refusal_says_when_the_cluster_lacked_failover_room_already() -> None:
    c = dataclasses.replace(cluster_of(2), failures_tolerated=1)
    inv = inventory_of([managed("x", "h0", "x", 0.1, mem=700 * MiB), managed("y", "h1", "y", 0.1, mem=700 * MiB)])
    decision = admit(c, inv, request("tiny", vms=1, mem=64 * MiB))
    refused = keep_failover_room(c, inv, decision)
    assert refused.reason is not None and refused.reason.endswith("already before this request (make room first)")


def test_priority_round_trips_through_libvirt_metadata_and_is_left_out_when_0() -> None:
    from hypervisor.domain_xml import metadata_xml, parse_metadata
    from vcsched.inventory import VmMeta

    meta = VmMeta("web", 0.5, 128 * MiB, 1, priority=7)
    assert parse_metadata(metadata_xml(meta)) == meta
    assert "priority" not in metadata_xml(dataclasses.replace(meta, priority=0))


def measurement_1() -> MemoryHypervisor:
    """Issue 37's measurement 1 in data: h1 (batch-0, db-1) is down; db (spread, min_yield 0.5) keeps db-0 on h2,
    so db-1 can only go to h0, where web-0 and web-1 need a core each."""
    db0 = floored(dataclasses.replace(managed("db-0", "h2", "db", 0.6, cap=0.6)), 0.5)
    assert db0.meta is not None
    db0 = dataclasses.replace(db0, meta=dataclasses.replace(db0.meta, spread="required"))
    return down_h1([managed("web-0", "h0", "web", 1.0, cap=0.5), managed("web-1", "h0", "web", 1.0, cap=0.5),
                    managed("batch-0", "h2", "batch", 0.4, cap=0.4), db0])


def db1(priority: int = 0) -> CreateStep:
    return dataclasses.replace(record("db-1", "db", need=0.6, floor=0.5, priority=priority), spread="required")


def test_recovery_caps_meet_the_floors_the_failover_was_searched_at() -> None:
    """Measurement 1: the placement fits at the floors, so the caps must give db-1 its 0.5 (not 1/2.6 = 0.385),
    and the whole-plan check (apply's) accepts the plan."""
    hv = measurement_1()
    rec = plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", [db1()])
    assert rec.restarts == (("db-1", "h0"),) and not rec.stranded and rec.plan is not None
    per_vm = rec.plan.per_vm
    assert per_vm["db-1"].yield_ >= 0.5 - 1e-6, per_vm["db-1"]
    assert per_vm["web-0"].yield_ == pytest.approx((1.0 - 0.3) / 2.0, abs=0.02)  # floors first, then the rest
    report = apply_plan(hv, rec.plan)
    assert report.ok, report.to_dict()


def short_of_cpu() -> MemoryHypervisor:
    """Measurement 1 with web-1 needing more: db-1's floor (0.5 of 0.6 cores) no longer fits beside web-0 and
    web-1 at their floor 0.5 each on h0 (0.5 + 0.5 + 0.3 > 1 core), and spread keeps db-1 off h2."""
    hv = measurement_1()
    for name in ("web-0", "web-1"):
        v = hv.inventory().vm(name)
        assert v is not None and v.meta is not None
        hv.vms[name] = dataclasses.replace(v, meta=dataclasses.replace(v.meta, min_yield=0.5))
    return hv


def test_on_failure_restart_runs_a_vm_below_its_floor_and_the_plan_says_so_and_applies() -> None:
    hv = short_of_cpu()
    rec = plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", [db1(), record("batch-1", "batch")])
    assert not rec.stranded and rec.plan is not None
    assert {vm for vm, _ in rec.restarts} == {"db-1", "batch-1"} and dict(rec.restarts)["db-1"] == "h0"
    # h0 holds floors of 0.5 x (1 + 1 + 0.6) = 1.3 cores on 1: each floor is met to 1 / 1.3, together
    below = {vm: (got, floor) for vm, got, floor in rec.below_floor}
    # db-0 too: a virtual cluster's VMs of one need and size share one yield (docs/model.md)
    assert set(below) == {"db-0", "db-1", "web-0", "web-1"} and rec.plan.extra["below_floor"] == sorted(below)
    assert below["db-1"][0] == pytest.approx(0.5 / 1.3, abs=0.01) and below["db-1"][1] == 0.5
    report = apply_plan(hv, rec.plan)
    assert report.ok, report.to_dict()
    assert {v.name for v in hv.inventory().vms if v.active} >= {"db-1", "batch-1"}


def test_on_failure_strand_keeps_the_floor_and_strands_the_vm_saying_why() -> None:
    hv = short_of_cpu()
    cluster = dataclasses.replace(fenced(cluster_of(3), "h1"), on_failure="strand")
    rec = plan_recovery(cluster, hv.inventory(), "h1", [db1(), record("batch-1", "batch")])
    assert rec.stranded == (("db-1", NO_ROOM),) and rec.restarts == (("batch-1", "h2"),) and not rec.below_floor


def test_only_a_recovery_plan_may_run_a_vm_below_its_floor() -> None:
    from vcsched.plans.claims import claim_problems

    hv = short_of_cpu()
    rec = plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", [db1()])
    assert rec.plan is not None and claim_problems(rec.plan, hv.inventory()) == []
    unmarked = dataclasses.replace(rec.plan, extra={"recover": "h1"})
    assert any("min_yield: 0.5, but the plan predicts db-1" in p for p in claim_problems(unmarked, hv.inventory()))
    as_place = dataclasses.replace(rec.plan, kind="place")
    assert any("min_yield: 0.5" in p for p in claim_problems(as_place, hv.inventory()))


def test_memory_short_restarts_the_higher_priority_vm() -> None:
    hv = down_h1([managed("big", "h0", "big", 0.1, mem=800 * MiB)], n_hosts=2)
    recs = [record("a-low", "a", mem=150 * MiB, priority=-5), record("z-high", "z", mem=150 * MiB, priority=7)]
    rec = plan_recovery(fenced(cluster_of(2), "h1"), hv.inventory(), "h1", recs)
    assert rec.restarts == (("z-high", "h0"),) and [vm for vm, _ in rec.stranded] == ["a-low"]


def test_a_host_an_in_doubt_vm_waits_for_is_fenced_with_nothing_to_restart() -> None:
    """scripts/faultsim --seed 90210 --replay 3285: nothing recorded on failed h1, but a VM in doubt (a source
    paused by a migration to h1 that was cut) waits for h1; not fenced, h1 kept it paused for ever.  With
    ``waited_on`` the recovery's plan restarts nothing and exists, so the host is fenced once it validates."""
    hv = down_h1([managed("old-0", "h0", "old", 1.0, cap=1.0)])
    assert plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", []).plan is None
    rec = plan_recovery(fenced(cluster_of(3), "h1"), hv.inventory(), "h1", [], waited_on=True)
    assert rec.fence and rec.restarts == () and rec.plan is not None
    assert not rec.plan.created_vms() and apply_plan(hv, rec.plan).ok
    assert plan_recovery(cluster_of(3), hv.inventory(), "h1", [], waited_on=True).plan is None  # no agent: never


def test_with_another_host_down_and_not_fenced_nothing_is_restarted_but_the_host_is_fenced_all_the_same() -> None:
    """A VM recorded on h1 may run on h2, down but not fenced (a migration cut after its switch-over, its step not
    recorded): restarting it would run it twice (scripts/faultsim --seed 1 --replay 8245 --sigterm).  h1 is fenced
    all the same, so that once h2 is recovered too they are lost and restarted; with h2 fenced, they restart."""
    hv = down_h1([managed("old-0", "h0", "old", 0.5, cap=0.5)], n_hosts=4)
    hv.down["h2"] = "host h2: did not answer within 15 s (host_timeout)"
    cluster = fenced(fenced(cluster_of(4), "h1"), "h2")
    rec = plan_recovery(cluster, hv.inventory(), "h1", [record("web-0")])
    assert rec.fence and rec.restarts == () and rec.plan is not None  # fenced: the plan re-sets the caps only
    assert [vm for vm, _ in rec.waiting] == ["web-0"] and "h2" in rec.waiting[0][1] and not rec.stranded
    assert not any(s.op == "create" for s in rec.plan.steps)
    rec = plan_recovery(cluster, hv.inventory(), "h1", [record("web-0")], fenced={"h2": 1.0})
    assert [vm for vm, _ in rec.restarts] == ["web-0"] and not rec.stranded and not rec.waiting


def test_with_every_other_host_down_a_recovery_plans_nothing_and_does_not_crash() -> None:
    """scripts/faultsim --seed 20261127 --replay 2981: every host down, the recovery's caps plan had no host to
    read the reference size from (ValueError: max() arg is an empty sequence)."""
    hv = down_h1([], n_hosts=2)
    hv.down["h0"] = "host h0: did not answer within 15 s (host_timeout)"
    rec = plan_recovery(fenced(fenced(cluster_of(2), "h1"), "h0"), hv.inventory(), "h1", [record("web-0")])
    assert rec.plan is None and rec.restarts == () and [vm for vm, _ in rec.waiting] == ["web-0"]
