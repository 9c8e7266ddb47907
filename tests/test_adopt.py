"""`vcsched adopt` / `release`: running domains brought under management and handed back (docs/introducing.md)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from acting.definitions import DefinitionStore, FileBackend, recorder
from acting.executor import DONE, SKIPPED, PlanRefused, apply_plan
from hypervisor.devices import unmigratable_devices
from hypervisor.domain_xml import domain_xml
from hypervisor.memory import MemoryHypervisor
from tests.builders import MiB, cluster_of, inventory_of, managed, memory_hypervisor
from vcsched.control.adoption import Domain, Refused, plan_adoption, plan_release
from vcsched.control.failover import plan_recovery
from vcsched.errors import InputError
from vcsched.formats.cluster import FenceConfig
from vcsched.inventory import VmMeta, VmState
from vcsched.plans.plan import Plan, plan_from_dict
from vcsched.plans.steps import AdoptStep, ReleaseStep, SetCapStep

LEGACY_XML = ("<domain type='kvm'><name>legacy</name><uuid>5f1c0b7e-0000-4000-8000-000000000001</uuid>"
              "<memory unit='KiB'>524288</memory><vcpu>1</vcpu><os><type>hvm</type><kernel>/k</kernel>"
              "<initrd>/i</initrd></os><devices><serial type='pty'/></devices></domain>")
PASSTHROUGH_XML = LEGACY_XML.replace("<serial type='pty'/>", "<hostdev mode='subsystem' type='pci'/>")


def legacy(host: str = "h1", vcpus: int = 1, active: bool = True) -> VmState:
    return VmState("legacy", host, vcpus, 512 * MiB, active, None, None)


def hv_with(*vms: VmState, n_hosts: int = 3, xml: str = LEGACY_XML) -> MemoryHypervisor:
    hv = memory_hypervisor(inventory_of(vms, n_hosts=n_hosts, memory=4096 * MiB))
    hv.definitions["legacy"] = xml
    return hv


def adopt(hv: MemoryHypervisor, *names: str, vc: str = "old", need: float | None = None,
          min_yield: float | None = None) -> Plan:
    inv = hv.inventory()
    domains = {n: Domain(hv.domain_definition(v.host, n), tuple(unmigratable_devices(hv.domain_definition(v.host, n))))
               for n in names if (v := inv.vm(n)) is not None}
    return plan_adoption(cluster_of(3), inv, list(names), vc, need=need, min_yield=min_yield, domains=domains)


def store(tmp_path: Path) -> DefinitionStore:
    return DefinitionStore(FileBackend(tmp_path / "definitions"), "lab", "file://test")


def test_a_dry_run_says_what_would_be_recorded_and_capped_and_changes_nothing() -> None:
    hv = hv_with(legacy())
    plan = adopt(hv, "legacy", vc="old")
    step, = plan.steps
    assert isinstance(step, AdoptStep) and step.host == "h1"
    d = step.definition
    assert (d.cluster, d.vcpus, d.memory_bytes, d.cpu_need_cores) == ("old", 1, 512 * MiB, 1.0)
    assert d.boot.kind == "domain" and d.boot.xml == LEGACY_XML and d.boot.domain_type == "kvm"
    assert step.cap_cores == pytest.approx(1.0)
    assert hv.vms["legacy"].meta is None and hv.calls == []


def test_adopting_makes_it_managed_capped_and_recorded_and_a_rerun_does_nothing(tmp_path: Path) -> None:
    hv = hv_with(legacy(), managed("web-0", "h1", "web", 1.0, cap=1.0, mem=256 * MiB))
    plan = adopt(hv, "legacy", vc="old", need=0.5)
    records = store(tmp_path)
    report = apply_plan(hv, plan, on_step=recorder(records, print))
    assert report.ok, report.to_dict()
    v = hv.vms["legacy"]
    assert v.meta is not None and v.meta.cluster == "old" and v.meta.cpu_need_cores == 0.5
    assert v.cap_cores is not None and hv.vms["web-0"].cap_cores is not None
    assert v.cap_cores + hv.vms["web-0"].cap_cores <= 1.0 + 1e-9  # h1's one core, shared by yield
    assert any(isinstance(s, SetCapStep) and s.vm == "web-0" for s in plan.steps)
    recorded = records.get("legacy")
    assert recorded is not None and recorded.host == "h1" and recorded.step.boot.xml == LEGACY_XML
    again = apply_plan(hv, plan, on_step=recorder(records, print))
    assert again.ok and {r.outcome for r in again.results} == {SKIPPED}


def test_an_adopted_vm_joins_an_existing_virtual_cluster_with_its_floor_and_rules() -> None:
    old = dataclasses.replace(managed("old-0", "h0", "old", 0.5, cap=0.5),
                              meta=VmMeta("old", 0.5, 128 * MiB, 1, min_yield=0.5, spread="preferred"))
    hv = hv_with(legacy(), old)
    step = next(s for s in adopt(hv, "legacy", vc="old").steps if isinstance(s, AdoptStep))
    assert (step.definition.min_yield, step.definition.spread) == (0.5, "preferred")
    said = "--min-yield: virtual cluster 'old' was admitted with min_yield 0.5"
    with pytest.raises(InputError, match=re.escape(said)):
        adopt(hv, "legacy", vc="old", min_yield=0.9)


def test_an_adoption_that_pushes_a_virtual_cluster_below_its_floor_is_refused() -> None:
    web = dataclasses.replace(managed("web-0", "h1", "web", 1.0, cap=1.0),
                              meta=VmMeta("web", 1.0, 128 * MiB, 1, min_yield=0.9))
    said = "virtual cluster 'web' would get a yield of 0.5000, below the min_yield 0.9"
    with pytest.raises(Refused, match=re.escape(said)):
        adopt(hv_with(legacy(), web), "legacy", need=1.0)


@pytest.mark.parametrize(("case", "error", "message"), [
    ("passthrough", Refused, "legacy: has a host device passed through (<hostdev>): vcsched could not migrate it"),
    ("managed", Refused, "legacy: already managed by vcsched (virtual cluster 'web', on h1)"),
    ("stopped", Refused, "legacy: not running on h1"),
    ("missing", InputError, "DOMAIN: no domain 'ghost' on the hosts of cluster 'lab' (h0, h1, h2); a domain on a "
                            "host outside the cluster file cannot be adopted: add its host first"),
    ("need", InputError, "--need: 2 cores is more than legacy's 1 vCPUs can use"),
])
def test_refusals_name_the_reason_and_change_nothing(case: str, error: type[Exception], message: str) -> None:
    v = legacy(active=case != "stopped")
    if case == "managed":
        v = dataclasses.replace(v, meta=VmMeta("web", 0.5, 512 * MiB, 1))
    hv = hv_with(v, xml=PASSTHROUGH_XML if case == "passthrough" else LEGACY_XML)
    before = dict(hv.vms)
    with pytest.raises(error) as exc:
        adopt(hv, "ghost" if case == "missing" else "legacy", need=2.0 if case == "need" else None)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    assert hv.vms == before and hv.calls == []


def test_unmigratable_devices_are_named_and_disks_and_interfaces_are_not() -> None:
    assert unmigratable_devices(LEGACY_XML) == []
    disk = LEGACY_XML.replace("<serial type='pty'/>", "<disk type='file' device='disk'><source file='/v.img'/>"
                              "<target dev='vda'/></disk><interface type='network'/><filesystem type='mount'/>")
    assert unmigratable_devices(disk) == ["a host directory shared into the guest (<filesystem>: virtiofs or 9p)"]


def test_the_whole_plan_check_refuses_an_adoption_of_a_domain_managed_meanwhile() -> None:
    hv = hv_with(legacy())
    plan = adopt(hv, "legacy")
    hv.vms["legacy"] = dataclasses.replace(hv.vms["legacy"], meta=VmMeta("web", 0.5, 512 * MiB, 1))
    with pytest.raises(PlanRefused, match="already managed by vcsched \\(virtual cluster 'web'\\)"):
        apply_plan(hv, plan, force=True)
    assert hv.vms["legacy"].cap_cores is None


def test_adopt_and_release_steps_round_trip_through_the_plan_file() -> None:
    plan = adopt(hv_with(legacy()), "legacy")
    doc = plan.to_dict()
    assert plan_from_dict(doc).steps == plan.steps
    released = plan_release(cluster_of(3), hv_with(dataclasses.replace(
        legacy(), meta=VmMeta("old", 1.0, 512 * MiB, 1), cap_cores=1.0)).inventory(), ["legacy"])
    assert plan_from_dict(released.to_dict()).steps == (ReleaseStep("legacy", "h1", "old"),)


def test_release_removes_caps_metadata_and_record_and_leaves_it_running(tmp_path: Path) -> None:
    hv = hv_with(legacy())
    records = store(tmp_path)
    apply_plan(hv, adopt(hv, "legacy"), on_step=recorder(records, print))
    assert records.get("legacy") is not None
    plan = plan_release(cluster_of(3), hv.inventory(), ["legacy"])
    report = apply_plan(hv, plan, on_step=recorder(records, print))
    assert report.ok and [r.outcome for r in report.results] == [DONE]
    v = hv.vms["legacy"]
    assert v.active and v.host == "h1" and v.meta is None and v.cap_cores is None
    assert records.get("legacy") is None
    assert apply_plan(hv, plan).results[0].outcome == SKIPPED  # already released: converges
    with pytest.raises(Refused, match="legacy: not managed by vcsched \\(on h1\\): nothing to release"):
        plan_release(cluster_of(3), hv.inventory(), ["legacy"])
    with pytest.raises(InputError, match="VM: no VM 'ghost'"):
        plan_release(cluster_of(3), hv.inventory(), ["ghost"])


def test_an_adopted_vm_is_restarted_from_its_own_xml_after_its_host_fails(tmp_path: Path) -> None:
    hv = hv_with(legacy())
    records = store(tmp_path)
    apply_plan(hv, adopt(hv, "legacy"), on_step=recorder(records, print))
    del hv.vms["legacy"]
    hv.down["h1"] = "host h1: did not answer"
    cluster = dataclasses.replace(cluster_of(3), hosts=tuple(
        dataclasses.replace(h, fence=FenceConfig("/bin/true")) if h.name == "h1" else h for h in cluster_of(3).hosts))
    recovery = plan_recovery(cluster, hv.inventory(), "h1", [d.step for d in records.on("h1")])
    assert recovery.plan is not None and [vm for vm, _ in recovery.restarts] == ["legacy"]
    assert apply_plan(hv, recovery.plan).ok
    v = hv.vms["legacy"]
    assert v.host != "h1" and v.meta is not None and v.meta.cluster == "old" and v.cap_cores is not None
    create = recovery.plan.steps[-1]
    xml = domain_xml(create, None)
    assert "<kernel>/k</kernel>" in xml and "<name>legacy</name>" in xml and "<uuid>" not in xml
    assert "vcsched:vm" in xml and "<quota>" in xml


# ---------------------------------------------------------------------------------------------- the commands


@pytest.fixture
def test_hosts(tmp_path: Path) -> Path:
    """libvirt's test driver: h0 with an unmanaged "stranger", a passed-through "gpu" and a managed "old-0"."""
    from tests.test_libvirt_backend import META, cluster_toml, domain_of, node_xml

    gpu = domain_of("gpu").replace("</os>", "</os><devices><hostdev mode='subsystem' type='usb'><source>"
                                           "<vendor id='0x1234'/><product id='0xbeef'/></source></hostdev></devices>")
    (tmp_path / "h0.xml").write_text(node_xml(2, 1 << 20, domain_of("stranger") + gpu + domain_of("old-0", META)))
    (tmp_path / "h1.xml").write_text(node_xml(2, 1 << 20))
    return cluster_toml(tmp_path, [("h0", f"test://{tmp_path}/h0.xml"), ("h1", f"test://{tmp_path}/h1.xml")])


@pytest.mark.parametrize(("argv", "code", "said"), [
    (["adopt", "ghost", "--vc", "old"], 2, "vcsched: error: DOMAIN: no domain 'ghost' on the hosts of cluster 't'"),
    (["adopt", "gpu", "--vc", "old", "--apply"], 1, "vcsched: refused: gpu: has a host device passed through"),
    (["adopt", "old-0", "--vc", "new"], 1, "vcsched: refused: old-0: already managed by vcsched (virtual cluster"),
    (["adopt", "stranger", "--vc", "old"], 1, "vcsched: refused: stranger: host h0 cannot cap CPU"),
    (["adopt", "stranger", "--vc", "old", "--need", "nan"], 2, "vcsched: error: "),
    (["release", "stranger", "--apply"], 1, "vcsched: refused: stranger: not managed by vcsched (on h0)"),
    (["release", "ghost"], 2, "vcsched: error: VM: no VM 'ghost'"),
])
def test_the_commands_refuse_in_one_line_with_the_contracts_exit_code_and_change_nothing(
        test_hosts: Path, argv: list[str], code: int, said: str, tmp_path: Path) -> None:
    import json

    from tests.test_libvirt_backend import run

    before = (tmp_path / "h0.xml").read_text()
    result = run(*argv, "--cluster", test_hosts, "--coordination", f"file://{tmp_path}/coord")
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said), result.stderr
    assert (tmp_path / "h0.xml").read_text() == before
    if code == 1:
        doc = json.loads(run(*argv, "--json", "--cluster", test_hosts,
                             "--coordination", f"file://{tmp_path}/coord").stdout)
        assert doc["ok"] is False and doc["refused"] == lines[0].removeprefix("vcsched: refused: ")
