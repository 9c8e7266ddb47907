"""Settling in-doubt VMs (hypervisor/settlement.py) and the executor's hazards, without a lab.

Reading never acts; repair is the one action that destroys a paused twin or resumes an orphaned arrival, only
on a full inventory in which every host answered, re-reading every copy right before each action.  The hosts
are libvirt's test driver (``test:///FILE``: each file an independent host, domains that can be paused) or
fakes handed in through the backend's connection factory.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import libvirt
import pytest

from acting.executor import FAILED, _run_group
from hypervisor.base import HostReadBug, HypervisorError, VmInDoubt
from hypervisor.domain_xml import metadata_xml
from hypervisor.libvirt_backend import LibvirtHypervisor
from vcsched.formats.cluster import Cluster, ClusterHost, cluster_from_dict
from vcsched.inventory import HostState, Inventory, VmMeta, VmState, find_in_doubt, mark_in_doubt
from vcsched.plans.repair import DESTROY, RESUME, plan_repair
from vcsched.plans.steps import SetNeedStep

MiB = 1 << 20
META = VmMeta("vc", 0.5, 128 * MiB, 1)
UUID = "00000000-0000-0000-0000-00000000000a"


def no_lock() -> None:
    """A guard that never refuses (the tests hold no lock: settle itself is under test)."""


# ------------------------------------------------------------------ the rules (pure)


def inventory(*copies: VmState, down: tuple[str, ...] = ()) -> Inventory:
    hosts = tuple(HostState(h, 4, 8 << 30, down="no answer" if h in down else None) for h in ("h0", "h1", "h2"))
    vms = tuple(copies)
    doubts = find_in_doubt(vms)
    return Inventory("t", hosts, mark_in_doubt(vms, doubts), doubts)


def inventory4(*copies: VmState) -> Inventory:
    hosts = tuple(HostState(h, 4, 8 << 30) for h in ("h0", "h1", "h2", "h3"))
    doubts = find_in_doubt(copies)
    return Inventory("t", hosts, mark_in_doubt(copies, doubts), doubts)


def copy(host: str, *, paused: bool = False, meta: VmMeta | None = META, arriving_from: str | None = None) -> VmState:
    return VmState("v", host, 1, 128 * MiB, True, meta, uuid=UUID, paused=paused, arriving_from=arriving_from)


def test_a_paused_twin_of_a_vm_running_elsewhere_is_destroyed() -> None:
    plan = plan_repair(inventory(copy("h0"), copy("h1", paused=True, arriving_from="h0")))
    assert [(a.action, a.host) for a in plan.actions] == [(DESTROY, "h1")] and plan.refused is None


def test_a_paused_copy_recorded_newer_than_the_running_one_is_left_to_the_operator() -> None:
    plan = plan_repair(inventory(copy("h0", meta=gen(1)), copy("h1", paused=True, arriving_from="h0", meta=gen(2))))
    assert plan.actions == () and "newer migration generation" in plan.left[0]


def test_two_running_copies_are_left_to_the_operator() -> None:
    plan = plan_repair(inventory(copy("h0"), copy("h1")))
    assert plan.actions == () and "runs on several hosts" in plan.left[0]


def test_paused_copies_with_none_running_are_left_to_the_operator() -> None:
    plan = plan_repair(inventory(copy("h0", paused=True), copy("h1", paused=True)))
    assert plan.actions == () and "no copy runs" in plan.left[0]


def test_a_paused_arrival_beside_its_paused_source_completes_the_migration() -> None:
    """libvirt's PERFORM3_DONE clean-up (the client gone between Finish and Confirm) leaves both paused, the
    arrival whole: the source is removed first, then the arrival resumed (found by tests/test_faultsim.py)."""
    plan = plan_repair(inventory(copy("h0", paused=True), copy("h1", paused=True, arriving_from="h0")),
                       migration_paused=frozenset({("h0", UUID)}))
    assert [(a.action, a.host) for a in plan.actions] == [(DESTROY, "h0"), (RESUME, "h1")] and plan.left == ()


def test_an_arrival_beside_a_source_someone_paused_is_left_to_the_operator() -> None:
    """The source may have been resumed by libvirt after the attempt failed, run, then been suspended: it may
    hold newer state than the arrival, although both carry the same generation."""
    plan = plan_repair(inventory(copy("h0", paused=True), copy("h1", paused=True, arriving_from="h0")))
    assert plan.actions == () and "not paused by the migration" in plan.left[0]


def gen(n: int, **where: str) -> VmMeta:
    return replace(META, generation=n, **where)


def test_with_no_copy_running_the_newest_generation_is_resumed_and_the_older_copies_destroyed() -> None:
    """scripts/faultsim --seed 424242 --replay 3585 (before generations): a stale arrival on h1 from an earlier
    attempt, then the drain's migration h0 -> h3 killed at Confirm; all three copies paused."""
    inv = inventory4(copy("h0", paused=True, meta=gen(2, migrating_to="h3")),
                     copy("h1", paused=True, arriving_from="h0", meta=gen(1)),
                     copy("h3", paused=True, arriving_from="h0", meta=gen(2)))
    plan = plan_repair(inv, migration_paused=frozenset({("h0", UUID)}))
    assert [(a.action, a.host) for a in plan.actions] == [(DESTROY, "h0"), (DESTROY, "h1"), (RESUME, "h3")]
    assert plan.left == ()


def test_two_arrivals_from_one_gone_source_the_newer_generation_wins() -> None:
    """scripts/faultsim --seed 20261127 --replay 6108: the source h2 confirmed its migration to h0 and is gone;
    h1 still holds the paused arrival of an earlier attempt."""
    plan = plan_repair(inventory(copy("h0", paused=True, arriving_from="h2", meta=gen(2)),
                                 copy("h1", paused=True, arriving_from="h2", meta=gen(1))))
    assert [(a.action, a.host) for a in plan.actions] == [(DESTROY, "h1"), (RESUME, "h0")]


def test_a_source_that_started_a_later_attempt_is_newer_than_its_old_arrival() -> None:
    """The rule before generations would resume the arrival beside its source; the source's higher generation
    says it ran after that arrival's state was taken (then a later attempt paused it and was cut short)."""
    plan = plan_repair(inventory(copy("h0", paused=True, meta=gen(2, migrating_to="h2")),
                                 copy("h1", paused=True, arriving_from="h0", meta=gen(1))),
                       migration_paused=frozenset({("h0", UUID)}))
    assert [(a.action, a.host) for a in plan.actions] == [(DESTROY, "h1"), (RESUME, "h0")]


def test_a_newest_copy_someone_paused_is_never_resumed() -> None:
    plan = plan_repair(inventory(copy("h0", paused=True, meta=gen(2)),
                                 copy("h1", paused=True, arriving_from="h0", meta=gen(1))))
    assert plan.actions == () and "someone paused it" in plan.left[0]


def test_copies_sharing_the_newest_generation_without_being_source_and_arrival_are_left_alone() -> None:
    plan = plan_repair(inventory(copy("h0", paused=True, meta=gen(1)), copy("h1", paused=True, meta=gen(1))),
                       migration_paused=frozenset({("h0", UUID), ("h1", UUID)}))
    assert plan.actions == () and "share the newest generation 1" in plan.left[0]


def test_a_paused_twin_without_vcsched_metadata_is_left_alone() -> None:
    plan = plan_repair(inventory(copy("h0"), copy("h1", paused=True, meta=None)))
    assert plan.actions == () and "no vcsched metadata" in plan.left[0]


def test_a_lone_paused_arrival_is_in_doubt_and_resumed_when_every_host_answered() -> None:
    inv = inventory(copy("h1", paused=True, arriving_from="h0"))
    assert [d.hosts for d in inv.in_doubt] == [("h1",)] and not inv.vms[0].managed  # no plan acts on it
    assert [(a.action, a.host) for a in plan_repair(inv).actions] == [(RESUME, "h1")]


def test_nothing_is_settled_while_a_host_is_down() -> None:
    """The hazard of issue 31: an arrival resumed while its source (down, unread) still ran the VM."""
    for inv in (inventory(copy("h1", paused=True, arriving_from="h0"), down=("h0",)),
                inventory(copy("h0"), copy("h1", paused=True), down=("h2",))):
        plan = plan_repair(inv)
        assert plan.actions == () and plan.refused is not None and "did not answer" in plan.refused


def test_an_arrival_from_a_host_outside_the_cluster_is_left_to_the_operator() -> None:
    plan = plan_repair(inventory(copy("h1", paused=True, arriving_from="elsewhere")))
    assert plan.actions == () and "not a host of this cluster" in plan.left[0]


# ------------------------------------------------------------------ on libvirt's test driver


def domain(name: str, *, arriving_from: str | None = None, uuid: str = UUID) -> str:
    meta = metadata_xml(META)
    if arriving_from is not None:
        meta = meta.replace("/>", f' arriving_from="{arriving_from}"/>')
    return (f"<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>128</memory>"
            f"<vcpu>1</vcpu><os><type>hvm</type></os><metadata>{meta}</metadata></domain>")


def node(domains: str = "") -> str:
    return ("<node><cpu><mhz>2000</mhz><model>t</model><active>4</active><nodes>1</nodes><sockets>1</sockets>"
            f"<cores>4</cores><threads>1</threads></cpu><memory>8388608</memory>{domains}</node>")


def hosts(tmp_path: Path, **files: str | None) -> Cluster:
    """A test-driver host per file; None: a host that does not answer (a socket nobody listens on)."""
    for h, text in files.items():
        if text is not None:
            (tmp_path / f"{h}.xml").write_text(text)
    return cluster_from_dict({"name": "t", "hosts": [
        {"name": h, "uri": f"test://{tmp_path}/{h}.xml"} if files.get(h) is not None else
        {"name": h, "uri": f"qemu+unix:///system?socket={tmp_path}/absent", "uuid": "1" * 32}
        for h in files]})


def states(hv: LibvirtHypervisor) -> list[tuple[str, str]]:
    return [(v.host, "paused" if v.paused else "running") for v in hv.inventory().vms]


def test_reading_never_destroys_nor_resumes(tmp_path: Path) -> None:
    c = hosts(tmp_path, h0=node(domain("v")), h1=node(domain("v", arriving_from="h0")),
              h2=node(domain("w", arriving_from="h0", uuid="00000000-0000-0000-0000-00000000000b")))
    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        hv.conn("h2").lookupByName("w").suspend()
        before = states(hv)
        for _ in range(3):
            assert states(hv) == before
        dry = hv.repair(no_lock, apply=False)
        assert [(a.action, a.vm, a.host) for a in dry.plan.actions] == [(DESTROY, "v", "h1"), (RESUME, "w", "h2")]
        assert states(hv) == before and hv.notices == []


def test_repair_destroys_the_twin_and_resumes_the_orphaned_arrival(tmp_path: Path) -> None:
    c = hosts(tmp_path, h0=node(domain("v")), h1=node(domain("v", arriving_from="h0")),
              h2=node(domain("w", arriving_from="h0", uuid="00000000-0000-0000-0000-00000000000b")))
    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        hv.conn("h2").lookupByName("w").suspend()
        report = hv.repair(no_lock)
        assert [(a.action, a.host, o) for a, o, _ in report.outcomes] == [(DESTROY, "h1", "done"),
                                                                          (RESUME, "h2", "done")]
        inv = hv.inventory()
        assert [(v.name, v.host, v.paused, v.arriving_from) for v in inv.vms] == [("v", "h0", False, None),
                                                                                  ("w", "h2", False, None)]
        assert inv.in_doubt == () and all(v.managed for v in inv.vms)


def test_repair_refuses_with_a_host_down_and_changes_nothing(tmp_path: Path) -> None:
    c = hosts(tmp_path, h0=None, h1=node(domain("v", arriving_from="h0")))
    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        report = hv.repair(no_lock)
        assert report.plan.refused is not None and "h0" in report.plan.refused and report.outcomes == ()
        assert hv.conn("h1").lookupByName("v").state(0)[0] == libvirt.VIR_DOMAIN_PAUSED


def test_a_copy_that_changed_since_the_plan_is_skipped(tmp_path: Path) -> None:
    """Right before the action every copy is read again: the twin resumed meanwhile (someone else's migration
    completing) is not destroyed."""
    c = hosts(tmp_path, h0=node(domain("v")), h1=node(domain("v", arriving_from="h0")))
    with LibvirtHypervisor(c) as hv:
        twin = hv.conn("h1").lookupByName("v")
        twin.suspend()
        report = hv.repair(twin.resume)  # the guard runs right before the action: the twin resumes then
        ((action, outcome, detail),) = report.outcomes
        assert (action.host, outcome) == ("h1", "skipped") and "now running" in detail
        assert twin.state(0)[0] == libvirt.VIR_DOMAIN_RUNNING


def test_repair_stops_when_the_lock_is_lost(tmp_path: Path) -> None:
    c = hosts(tmp_path, h0=node(domain("v")), h1=node(domain("v", arriving_from="h0")))

    def lost() -> None:
        raise HypervisorError("lock lost")

    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        with pytest.raises(HypervisorError, match="lock lost"):
            hv.repair(lost)
        assert len(hv.inventory().vms) == 2


def test_the_lookup_never_returns_the_first_copy_of_a_vm_in_doubt(tmp_path: Path) -> None:
    c = hosts(tmp_path, h0=node(domain("v")), h1=node(domain("v", arriving_from="h0")),
              h2=node(domain("w", arriving_from="h0", uuid="00000000-0000-0000-0000-00000000000b")))
    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        hv.conn("h2").lookupByName("w").suspend()
        with pytest.raises(VmInDoubt, match=r"v is in doubt: copies on h0 \(running\), h1 \(paused"):
            hv.find_vm("v")
        with pytest.raises(VmInDoubt, match=r"h2 \(paused arrival\)"):
            hv.find_vm("w")


def test_a_step_on_a_vm_in_doubt_fails_naming_its_copies_and_does_nothing(tmp_path: Path) -> None:
    c = hosts(tmp_path, h0=node(domain("v")), h1=node(domain("v", arriving_from="h0")))
    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        (result,) = _run_group(hv, [SetNeedStep("v", "h0", 0.75)], 0)
        assert result.outcome == FAILED and "v is in doubt" in result.detail and "vcsched repair" in result.detail
        assert {v.meta.cpu_need_cores for v in hv.inventory().vms if v.meta} == {0.5}


# ------------------------------------------------------------------ fakes through the connection factory


class Dom:
    def __init__(self, xml: str, state: int = libvirt.VIR_DOMAIN_RUNNING) -> None:
        self.xml, self._state = xml, state
        self.aborted = threading.Event()

    def name(self) -> str:
        return "v"

    def UUIDString(self) -> str:
        return UUID

    def XMLDesc(self, _flags: int) -> str:
        return self.xml

    def state(self, _flags: int) -> list[int]:
        return [self._state, 0]

    def info(self) -> list[int]:
        return [self._state, 131072, 131072, 1, 0]

    def isPersistent(self) -> bool:
        return False

    def setMetadata(self, _type: int, metadata: str, _prefix: str, _uri: str, _flags: int) -> int:
        self.recorded = metadata  # the migration attempt (generation, migrating_to) recorded on the source
        return 0

    def migrate3(self, _dst: Any, _params: dict[str, Any], _flags: int) -> None:
        assert self.aborted.wait(5), "the migration was not aborted"
        raise libvirt.libvirtError("operation aborted: migration out job: canceled by client")

    def abortJob(self) -> None:
        self.aborted.set()


def no_domain() -> libvirt.libvirtError:
    err = libvirt.libvirtError("no domain")
    err.err = (libvirt.VIR_ERR_NO_DOMAIN, 0, "no domain", 0, "", None, None, 0, 0)
    return err


class Conn:
    def __init__(self, doms: dict[str, Dom], stats: list[tuple[Dom, dict[str, Any]]] | None = None) -> None:
        self.doms, self.stats = doms, stats or []

    def getType(self) -> str:
        return "QEMU"

    def getInfo(self) -> list[Any]:
        return ["x86_64", 8192, 4, 2000, 1, 1, 4, 1]

    def getCapabilities(self) -> str:
        return "<capabilities><host><uuid>" + "2" * 32 + "</uuid></host></capabilities>"

    def getAllDomainStats(self, _stats: int, _flags: int = 0) -> list[tuple[Dom, dict[str, Any]]]:
        return self.stats

    def lookupByName(self, name: str) -> Dom:
        if name not in self.doms:
            raise no_domain()
        return self.doms[name]

    def lookupByUUIDString(self, _uuid: str) -> Dom:
        if not self.doms:
            raise no_domain()
        return next(iter(self.doms.values()))

    def close(self) -> None:
        pass


def test_a_migration_that_would_outlive_the_lease_is_aborted_and_the_vm_keeps_running_on_its_source() -> None:
    xml = (f"<domain type='kvm'><name>v</name><uuid>{UUID}</uuid><memory unit='MiB'>128</memory><vcpu>1</vcpu>"
           f"<metadata>{metadata_xml(META)}</metadata></domain>")
    src = Dom(xml)
    conns = {"qemu:///h0": Conn({"v": src}), "qemu:///h1": Conn({})}
    c = Cluster("t", (ClusterHost("h0", "qemu:///h0"), ClusterHost("h1", "qemu:///h1")))
    with LibvirtHypervisor(c, connect=conns.__getitem__) as hv:
        # The lease holds when the migration starts (the fences before recording the attempt and before
        # migrate3, hv.fence) ...
        answers = iter([True, True])
        hv.lease = lambda: next(answers, False)  # ... then the lock's renewals fail: it may expire during the copy
        with pytest.raises(HypervisorError, match=r"lease could expire .* aborted it.*it keeps running on h0"):
            hv.migrate_vm("v", "h0", "h1", 0.5)
        assert src.aborted.is_set()
        assert 'generation="1"' in src.recorded and 'migrating_to="h1"' in src.recorded  # recorded before


def test_no_change_starts_once_the_lease_may_run_out() -> None:
    """The guard runs before each step, but a step's calls may outlast the lease (a hung host): every call that
    changes a host is fenced by the lease (found by tests/test_faultsim.py)."""
    xml = (f"<domain type='kvm'><name>v</name><uuid>{UUID}</uuid><memory unit='MiB'>128</memory><vcpu>1</vcpu>"
           f"<metadata>{metadata_xml(META)}</metadata></domain>")
    src = Dom(xml)
    c = Cluster("t", (ClusterHost("h0", "qemu:///h0"), ClusterHost("h1", "qemu:///h1")))
    with LibvirtHypervisor(c, connect={"qemu:///h0": Conn({"v": src}), "qemu:///h1": Conn({})}.__getitem__) as hv:
        hv.lease = lambda: False
        with pytest.raises(HypervisorError, match=r"host h0: not done \(migrate 'v' to h1\): the cluster lock's "
                                                  "lease may run out"):
            hv.migrate_vm("v", "h0", "h1", 0.5)
        assert not src.aborted.is_set()  # never started


def test_a_parse_error_while_reading_a_host_is_a_bug_not_a_down_host() -> None:
    broken = Dom("<domain><name>v</domain>")  # vcsched's reading fails on this answer
    conn = Conn({"v": broken}, [(broken, {"state.state": libvirt.VIR_DOMAIN_RUNNING})])
    c = Cluster("t", (ClusterHost("h0", "qemu:///h0"),))
    with LibvirtHypervisor(c, connect=lambda _uri: conn) as hv, \
            pytest.raises(HostReadBug, match=r"host h0: vcsched could not read .* bug in vcsched") as caught:
        hv.inventory()
    assert caught.value.exit_code == 70


def test_the_cli_reports_a_parse_bug_with_exit_70_not_a_down_host(tmp_path: Path, monkeypatch: Any) -> None:
    """`vcsched status` on a host whose answer vcsched's own code cannot read: exit 70, asking for a report."""
    from click.testing import CliRunner

    import hypervisor.live_state
    from cli.main import cli

    c = tmp_path / "cluster.toml"
    (tmp_path / "h0.xml").write_text(node(domain("v")))
    c.write_text(f'name = "t"\n[[hosts]]\nname = "h0"\nuri = "test://{tmp_path}/h0.xml"\n')

    def broken(*_args: Any, **_kwargs: Any) -> VmState:
        raise KeyError("cluster")  # a bug in vcsched's reading of the domain's XML

    monkeypatch.setattr(hypervisor.live_state, "vm_from_element", broken)
    r = CliRunner().invoke(cli, ["status", "--cluster", str(c), "--sample", "0"])
    assert r.exit_code == 70, r.output
    assert "bug in vcsched" in r.stderr and "report" in r.stderr and "down" not in r.stdout


# ------------------------------------------------------------------ `vcsched repair`


def paused(domain_xml: str) -> str:
    """A test-driver domain that starts paused (``<test:runstate>3</test:runstate>``)."""
    return (domain_xml.replace("<domain type='test'>",
                               "<domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>")
            .replace("</domain>", "<test:runstate>3</test:runstate></domain>"))


def cluster_file(tmp_path: Path, **files: str | None) -> Path:
    hosts(tmp_path, **files)
    p = tmp_path / "cluster.toml"
    p.write_text('name = "t"\n' + "".join(
        f'[[hosts]]\nname = "{h}"\nuri = "test://{tmp_path}/{h}.xml"\n' if text is not None else
        f'[[hosts]]\nname = "{h}"\nuri = "qemu+unix:///system?socket={tmp_path}/absent"\nuuid = "{"1" * 32}"\n'
        for h, text in files.items()))
    return p


def repair_cli(*args: Any) -> Any:
    from click.testing import CliRunner

    from cli.main import cli

    return CliRunner().invoke(cli, ["repair", *map(str, args)])


def test_repair_is_a_dry_run_by_default_and_says_what_it_would_do(tmp_path: Path) -> None:
    c = cluster_file(tmp_path, h0=node(domain("v")), h1=node(paused(domain("v", arriving_from="h0"))))
    r = repair_cli("--cluster", c)
    assert r.exit_code == 0, r.output
    assert "dry run: nothing changed" in r.stdout and "would destroy the paused copy of v on h1" in r.stdout


def test_repair_apply_acts_and_reports_each_action(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    c = cluster_file(tmp_path, h0=node(domain("v")), h1=node(paused(domain("v", arriving_from="h0"))))
    r = repair_cli("--cluster", c, "--apply", "--json")
    assert r.exit_code == 0, r.output
    import json

    assert [(a["action"], a["host"], a["outcome"]) for a in json.loads(r.stdout)["actions"]] == \
        [("destroy", "h1", "done")]


def test_repair_refuses_with_a_host_down_exit_1(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    c = cluster_file(tmp_path, h0=None, h1=node(paused(domain("v", arriving_from="h0"))))
    r = repair_cli("--cluster", c, "--apply")
    assert r.exit_code == 1, r.output
    assert "repair refused" in r.stdout and "h0" in r.stdout


def test_repair_leaves_two_running_copies_to_the_operator_exit_1(tmp_path: Path) -> None:
    c = cluster_file(tmp_path, h0=node(domain("v")), h1=node(domain("v")))
    r = repair_cli("--cluster", c)
    assert r.exit_code == 1, r.output
    assert "left to the operator: v: on h0 (running), h1 (running)" in r.stdout


def test_nothing_in_doubt_is_nothing_to_do(tmp_path: Path) -> None:
    r = repair_cli("--cluster", cluster_file(tmp_path, h0=node(domain("v"))))
    assert r.exit_code == 0 and "nothing in doubt" in r.stdout, r.output


def test_a_host_down_that_may_hold_no_copy_does_not_keep_a_vm_paused() -> None:
    """scripts/faultsim --seed 90210 --replay 2069: the resume of a migration's arrival failed (h0's copy gone) and
    h2, unrelated, did not answer at the end: repair refused for every VM, the arrival stayed paused everywhere,
    running nowhere.  Only the hosts its copies' marks name may hold another copy (vcsched.plans.repair.may_hold)."""
    arrival = copy("h1", paused=True, arriving_from="h0", meta=gen(1))
    plan = plan_repair(inventory(arrival, down=("h2",)))
    assert [(a.action, a.host) for a in plan.actions] == [(RESUME, "h1")] and plan.refused is None
    assert plan.waiting == ()


def test_a_vm_waits_while_a_host_its_marks_name_does_not_answer_and_the_others_are_settled() -> None:
    """A source paused by a migration cut before Finish (its mark names h1): resumed while h2 is down, not while h1
    is; a copy without a generation (from before them) waits for every host."""
    source = copy("h0", paused=True, meta=gen(1, migrating_to="h1"))
    assert [(a.action, a.host) for a in plan_repair(inventory(source, down=("h2",)),
                                                    interrupted=frozenset({UUID})).actions] == [(RESUME, "h0")]
    waits = plan_repair(inventory(source, down=("h1",)), interrupted=frozenset({UUID}))
    assert waits.actions == () and "h1 did not answer and may hold a copy" in waits.waiting[0]
    assert waits.refused is not None and "h1" in waits.refused
    legacy = plan_repair(inventory(copy("h1", paused=True, arriving_from="h0"), down=("h2",)))
    assert legacy.actions == () and "h2 did not answer" in legacy.waiting[0] and "without a migration generation" \
        in legacy.waiting[0]


def test_repair_resumes_an_arrival_whose_source_answers_while_an_unrelated_host_is_down(tmp_path: Path) -> None:
    """On libvirt's test driver: the arrival (generation 1, from h0) is resumed with h2 down; the re-check before
    the resume reads the source and every other host that answered, not the one that did not."""
    arrival = metadata_xml(replace(META, generation=1)).replace("/>", ' arriving_from="h0"/>')
    dom = (f"<domain type='test'><name>v</name><uuid>{UUID}</uuid><memory unit='MiB'>128</memory><vcpu>1</vcpu>"
           f"<os><type>hvm</type></os><metadata>{arrival}</metadata></domain>")
    c = hosts(tmp_path, h0=node(), h1=node(dom), h2=None)
    with LibvirtHypervisor(c) as hv:
        hv.conn("h1").lookupByName("v").suspend()
        report = hv.repair(no_lock)
        assert [(a.action, a.host, o) for a, o, _ in report.outcomes] == [(RESUME, "h1", "done")], report.lines()
        assert states(hv) == [("h1", "running")]


def test_an_arrival_whose_source_host_was_fenced_is_resumed_only_if_libvirt_reported_it_complete() -> None:
    """A fenced host holds no copy, so nothing waits for it; but the source libvirt resumes after a failed Finish
    may have run past its arrival, and the fence took what would tell: such an arrival is destroyed (the VM is
    restarted from its record).  One marked ``completed`` (migrate3 returned) holds the newest state."""
    arrival = copy("h1", paused=True, arriving_from="h0", meta=gen(1))
    plan = plan_repair(inventory(arrival, down=("h0",)), fenced=frozenset({"h0"}))
    assert [(a.action, a.host) for a in plan.actions] == [(DESTROY, "h1")] and "was fenced" in plan.actions[0].why
    done = copy("h1", paused=True, arriving_from="h0", meta=replace(gen(1), completed=True))
    plan = plan_repair(inventory(done, down=("h0",)), fenced=frozenset({"h0"}))
    assert [(a.action, a.host, a.unread) for a in plan.actions] == [(RESUME, "h1", ("h0",))], plan
    plan = plan_repair(inventory(done, down=("h0",)))  # only down: its source is not known gone
    assert plan.actions == () and plan.blocked == ("h0",)


def test_the_completed_mark_is_kept_beside_the_arrival_mark_and_dropped_on_arrival() -> None:
    from hypervisor.domain_xml import parse_metadata, stamp_migrated_at

    marked = metadata_xml(replace(META, generation=1, completed=True), bare=True, arriving_from="h0")
    assert 'arriving_from="h0"' in marked and parse_metadata(marked) == replace(META, generation=1, completed=True)
    dom = f"<domain><metadata>{metadata_xml(replace(META, completed=True))}</metadata></domain>"
    assert "completed" not in stamp_migrated_at(dom, 1.0, arriving_from="h0", generation=2)


def test_a_host_a_running_vms_mark_names_that_does_not_answer_may_hold_a_leftover_copy() -> None:
    """Nothing is in doubt on the hosts that answer, but the mark of vc's running copy names h1, which does not
    answer: a paused copy may be left there (seed 424242 schedule 3669); fenced, it holds none."""
    running = copy("h0", meta=gen(1, migrating_to="h1"))
    assert plan_repair(inventory(running, down=("h1",))).leftovers == ("h1",)
    assert plan_repair(inventory(running, down=("h1",)), fenced=frozenset({"h1"})).leftovers == ()
    assert plan_repair(inventory(running, down=("h2",))).leftovers == ()
