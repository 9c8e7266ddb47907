"""The libvirt backend against libvirt's test driver (``test:///path/host.xml``), and the CLI's bad-input paths.

The test driver gives real libvirt connections without a daemon: inventory,
metadata and domain creation work; caps do not (docs/lab.md), and the backend
must say so naming the host instead of pretending.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from acting.executor import apply_plan
from cli.main import cli
from hypervisor.base import HypervisorError
from hypervisor.domain_xml import domain_xml, metadata_xml, parse_metadata
from hypervisor.libvirt_backend import LibvirtHypervisor
from vcsched.caps import quota_for
from vcsched.control.admission import admit
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster, ClusterHost, GuestDefaults
from vcsched.formats.request import Request
from vcsched.inventory import METADATA_NS, VmMeta
from vcsched.plans.steps import Boot, CreateStep

MiB = 1 << 20
META = VmMeta("old", 0.5, 128 * MiB, 1)


def node_xml(cores: int, mem_kib: int, domains: str = "") -> str:
    return (f"<node><cpu><mhz>2000</mhz><model>t</model><active>{cores}</active><nodes>1</nodes>"
            f"<sockets>1</sockets><cores>{cores}</cores><threads>1</threads></cpu>"
            f"<memory>{mem_kib}</memory>{domains}</node>")


def domain_of(name: str, meta: VmMeta | None = None, mem_kib: int = 131072) -> str:
    md = f"<metadata>{metadata_xml(meta)}</metadata>" if meta else ""
    return (f"<domain type='test'><name>{name}</name><memory>{mem_kib}</memory><vcpu>1</vcpu>"
            f"<os><type>hvm</type></os>{md}</domain>")


@pytest.fixture
def two_hosts(tmp_path: Path) -> Cluster:
    """h0: 2 cores, 1 GiB, an unmanaged and a managed domain; h1: 1 core, 512 MiB, empty."""
    (tmp_path / "h0.xml").write_text(node_xml(2, 1 << 20, domain_of("stranger") + domain_of("old-0", META)))
    (tmp_path / "h1.xml").write_text(node_xml(1, 1 << 19))
    return Cluster("t", (ClusterHost("h0", f"test://{tmp_path}/h0.xml", memory_reserved=64 * MiB),
                         ClusterHost("h1", f"test://{tmp_path}/h1.xml", cores=1)),
                   0.0, GuestDefaults("/k", "/i"))


def test_inventory_reads_hosts_from_libvirt_and_the_cluster_file(two_hosts: Cluster) -> None:
    with LibvirtHypervisor(two_hosts) as hv:
        inv = hv.inventory()
    h0, h1 = inv.hosts
    assert (h0.cores, h0.memory_bytes, h0.usable_memory) == (2, 1 << 30, (1 << 30) - 64 * MiB)
    assert (h1.cores, h1.memory_bytes) == (1, 512 * MiB)
    assert inv.reference_cores == 2


def test_inventory_lists_managed_and_unmanaged_domains(two_hosts: Cluster) -> None:
    with LibvirtHypervisor(two_hosts) as hv:
        inv = hv.inventory()
    stranger, old = inv.vm("stranger"), inv.vm("old-0")
    assert stranger is not None and not stranger.managed and stranger.host == "h0"
    assert old is not None and old.meta == META and old.memory_bytes == 128 * MiB


def test_metadata_round_trips_through_libvirt(tmp_path: Path) -> None:
    meta = VmMeta("we\"b", 0.3333333333333333, 123456789, 3)
    (tmp_path / "h.xml").write_text(node_xml(4, 1 << 20, domain_of("x", meta)))
    with LibvirtHypervisor(Cluster("t", (ClusterHost("h", f"test://{tmp_path}/h.xml"),))) as hv:
        vm = hv.find_vm("x")
    assert vm is not None and vm.meta == meta


def test_a_recorded_floor_round_trips_and_is_optional() -> None:
    with_floor = VmMeta("gold", 0.5, 64 * MiB, 1, 0.75)
    assert parse_metadata(metadata_xml(with_floor)) == with_floor
    assert 'min_yield="0.75"' in metadata_xml(with_floor, bare=True)
    assert "min_yield" not in metadata_xml(VmMeta("plain", 0.5, 64 * MiB, 1))


def test_broken_metadata_makes_a_domain_unmanaged() -> None:
    assert parse_metadata('<vm cluster="x" cpu_need_cores="lots"/>') is None


def test_the_test_driver_refuses_caps_naming_the_host(two_hosts: Cluster) -> None:
    with LibvirtHypervisor(two_hosts) as hv, pytest.raises(HypervisorError, match=r"^host h0: the libvirt test "
                                                                                    r"driver .* cannot set CPU caps"):
        hv.set_cap("h0", "old-0", 0.5)


def test_creating_a_capped_vm_on_the_test_driver_fails_before_creating(two_hosts: Cluster) -> None:
    step = CreateStep("web-0", "h1", "web", 1, 128 * MiB, 0.5, 0.5, Boot("kernel", kernel="/k", initrd="/i"))
    with LibvirtHypervisor(two_hosts) as hv:
        with pytest.raises(HypervisorError, match=r"^host h1: .*cannot set CPU caps"):
            hv.create_vm(step)
        assert hv.find_vm("web-0") is None


def test_a_plan_capping_on_the_test_driver_is_refused_before_its_first_step(two_hosts: Cluster) -> None:
    with LibvirtHypervisor(two_hosts) as hv:
        inv = hv.inventory()
        d = admit(two_hosts, inv, Request("web", 1, 1, 64 * MiB, cpu_cores=0.5))
        assert d.plan is not None
        with pytest.raises(InputError, match=r"plan\.steps\[0\]\.cap_cores: host h\d cannot cap CPU: the libvirt test "
                                             r"driver .* cannot set CPU caps"):
            apply_plan(hv, d.plan)
        assert {v.name for v in hv.inventory().vms} == {v.name for v in inv.vms}


def test_an_unreachable_host_is_down_naming_why_and_the_others_are_read(tmp_path: Path) -> None:
    c = Cluster("t", (ClusterHost("far", f"qemu+unix:///system?socket={tmp_path}/nope"),
                      ClusterHost("near", "test:///default")))
    with LibvirtHypervisor(c) as hv:
        inv = hv.inventory()
    far, near = inv.hosts
    assert far.down is not None and far.down.startswith("host far: cannot connect to qemu")
    assert near.down is None and any(v.host == "near" for v in inv.vms)
    assert all(v.host != "far" for v in inv.vms)


def test_quota_is_per_vcpu_thread() -> None:
    assert quota_for(0.5, 1) == 50_000
    assert quota_for(1.5, 2) == 75_000


def test_domain_xml_carries_metadata_cap_and_partition() -> None:
    step = CreateStep("web-0", "h1", "web", 2, 128 * MiB, 1.0, 0.8, Boot("kernel", kernel="/k", initrd="/i",
                                                                           cmdline="quiet"))
    xml = domain_xml(step, "/vcl1h1")
    assert "<quota>40000</quota>" in xml and "<period>100000</period>" in xml
    assert "<partition>/vcl1h1</partition>" in xml and "<kernel>/k</kernel>" in xml
    assert 'xmlns:vcsched="https://vcsched.dev/xmlns/vm/1"' in xml and 'cluster="web"' in xml


def test_a_template_gets_vcsched_name_size_metadata_and_cap(tmp_path: Path) -> None:
    t = tmp_path / "t.xml"
    t.write_text("<domain type='qemu'><name>tpl</name><uuid>1234</uuid><memory>1</memory><vcpu>8</vcpu>"
                 "<os><type>hvm</type></os><devices/></domain>")
    step = CreateStep("web-1", "h0", "web", 1, 64 * MiB, 0.5, 0.25, Boot("template", path=str(t)))
    xml = domain_xml(step, None)
    assert "<name>web-1</name>" in xml and "<uuid>" not in xml and "<vcpu>1</vcpu>" in xml
    assert f'<memory unit="b">{64 * MiB}</memory>' in xml and "<quota>25000</quota>" in xml
    el = ET.fromstring(xml).find(f"metadata/{{{METADATA_NS}}}vm")
    assert el is not None and parse_metadata(ET.tostring(el, encoding="unicode")) == VmMeta("web", 0.5, 64 * MiB, 1)


# ------------------------------------------------------------------ CLI: bad input -> one line, exit 2


def cluster_toml(tmp_path: Path, hosts: list[tuple[str, str]]) -> Path:
    lines = ['name = "t"', "", "[guest]", 'kernel = "/k"', 'initrd = "/i"']
    for name, uri in hosts:
        lines += ["", "[[hosts]]", f'name = "{name}"', f'uri = "{uri}"']
    p = tmp_path / "cluster.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture
def lab_cluster(tmp_path: Path) -> Path:
    (tmp_path / "h0.xml").write_text(node_xml(1, 1 << 20, domain_of("stranger")))
    (tmp_path / "h1.xml").write_text(node_xml(1, 1 << 20))
    return cluster_toml(tmp_path, [("h0", f"test://{tmp_path}/h0.xml"), ("h1", f"test://{tmp_path}/h1.xml")])


def write_request(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "req.toml"
    p.write_text(text)
    return p


WEB = 'name = "web"\nvms = 2\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.5\n'


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result: Any, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error: "), result.stderr
    return str(lines[0])


def test_place_dry_run_prints_a_plan_and_changes_nothing(tmp_path: Path, lab_cluster: Path) -> None:
    out = tmp_path / "plan.json"
    result = run("place", write_request(tmp_path, WEB), "--cluster", lab_cluster, "--output", out, "--json")
    # Admitted and planned; the test driver cannot cap CPU, so --apply would refuse, and the dry run exits 1 too.
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["admitted"] and [s["op"] for s in doc["plan"]["steps"]] == ["create", "create"]
    assert doc["ok"] is False and "cannot set CPU caps" in doc["refused"]
    assert json.loads(out.read_text()) == doc["plan"]


def test_malformed_toml_is_one_line_exit_2(tmp_path: Path, lab_cluster: Path) -> None:
    line = one_line_error(run("place", write_request(tmp_path, "name = \n"), "--cluster", lab_cluster))
    assert "malformed TOML" in line and "req.toml" in line


def test_unknown_uri_scheme_is_one_line_exit_2(tmp_path: Path) -> None:
    c = cluster_toml(tmp_path, [("h0", "vmware://esx/")])
    line = one_line_error(run("place", write_request(tmp_path, WEB), "--cluster", c))
    assert "hosts[0].uri: 'vmware://esx/' has unknown scheme 'vmware'" in line


def test_status_with_every_host_unreachable_shows_them_down_and_exits_1(tmp_path: Path) -> None:
    c = cluster_toml(tmp_path, [("far", f"qemu+unix:///system?socket={tmp_path}/none")])
    r = run("status", "--cluster", c, "--sample", "0", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["hosts"][0]["down"].startswith("host far: cannot connect to")


def test_status_reports_one_host_down_and_shows_the_others(tmp_path: Path) -> None:
    c = cluster_toml(tmp_path, [("far", f"qemu+unix:///system?socket={tmp_path}/none"), ("near", "test:///default")])
    r = run("status", "--cluster", c, "--sample", "0")
    assert r.exit_code == 0, r.output
    assert "far (down)" in r.stdout and "1 host down (far)" in r.stdout and "near" in r.stdout
    assert "  host far: cannot connect" in r.stdout  # its reason, on a line of its own below the hosts table


def test_vm_larger_than_any_host_is_one_line_exit_2(tmp_path: Path, lab_cluster: Path) -> None:
    req = write_request(tmp_path, WEB.replace('"128MiB"', '"2GiB"'))
    line = one_line_error(run("place", req, "--cluster", lab_cluster))
    assert "memory: 2 GiB per VM is larger than the largest host (1 GiB usable)" in line


def test_duplicate_host_names_are_one_line_exit_2(tmp_path: Path) -> None:
    c = cluster_toml(tmp_path, [("h0", "test:///default"), ("h0", "test:///default")])
    line = one_line_error(run("status", "--cluster", c))
    assert "duplicate host name 'h0'" in line


def test_a_request_named_like_a_host_is_one_line_exit_2(tmp_path: Path, lab_cluster: Path) -> None:
    req = write_request(tmp_path, WEB.replace('name = "web"', 'name = "h1"'))
    line = one_line_error(run("place", req, "--cluster", lab_cluster))
    assert "name: 'h1' is also a host name in cluster 't'" in line


def test_cpu_beyond_vcpus_is_one_line_naming_both_numbers(tmp_path: Path, lab_cluster: Path) -> None:
    req = write_request(tmp_path, WEB.replace("cpu_cores = 0.5", "cpu_cores = 2"))
    line = one_line_error(run("place", req, "--cluster", lab_cluster))
    assert "cpu_cores: 2 cores is more than the 1 vCPUs" in line


def test_place_apply_on_the_test_driver_is_refused_before_any_step_with_exit_1(tmp_path: Path,
                                                                                  lab_cluster: Path) -> None:
    # The plan does not fit hosts that cannot cap CPU: a refusal (exit 1), not bad input.
    result = run("place", write_request(tmp_path, WEB), "--cluster", lab_cluster, "--apply", "--json")
    assert result.exit_code == 1
    assert "cannot set CPU caps" in one_line_error(result, 1)


def test_status_json_lists_unmanaged_domains(lab_cluster: Path) -> None:
    result = run("status", "--cluster", lab_cluster, "--json", "--sample", "0")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(v["name"], v["managed"]) for v in doc["vms"]] == [("stranger", False)]
    assert [h["name"] for h in doc["hosts"]] == ["h0", "h1"]


def test_apply_refuses_a_plan_for_a_changed_cluster(tmp_path: Path, lab_cluster: Path) -> None:
    out = tmp_path / "plan.json"
    assert run("place", write_request(tmp_path, WEB), "--cluster", lab_cluster, "-o", out).exit_code == 1  # no caps
    (tmp_path / "h1.xml").write_text(node_xml(1, 1 << 20, domain_of("newcomer")))
    line = one_line_error(run("apply", out, "--cluster", lab_cluster), 1)  # a stale plan is refused: exit 1
    assert "changed since this plan was computed" in line


@pytest.mark.parametrize("command", ["place", "adapt", "drain"])
def test_a_cluster_changing_while_a_command_plans_and_applies_is_a_refusal_to_run_it_again(
        tmp_path: Path, lab_cluster: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    """Found by the lab chaos test: a host stopping or coming back between `place/adapt/drain --apply`'s planning
    read and its first step refused the command with "changed since this plan was computed (compute a new one
    ..., or apply anyway with --force)" (then exit 2) — advice for a saved plan, which these commands cannot
    follow.  It is a race: exit 1, nothing changed, run it again.  Here a domain appears on h1 meanwhile."""
    import acting.unit_of_work as unit_of_work

    real = unit_of_work.check_whole  # the unit of work's whole-plan check, before the first step

    def meanwhile(hv: LibvirtHypervisor, plan: Any, **kwargs: Any) -> Any:
        hv.conn("h1").createXML(domain_of("newcomer"), 0)
        return real(hv, plan, **kwargs)

    monkeypatch.setattr(unit_of_work, "check_whole", meanwhile)
    args = {"place": ["place", write_request(tmp_path, WEB)], "adapt": ["adapt", "--budget", "0"],
            "drain": ["drain", "h0", "--budget", "unlimited"]}[command]
    line = one_line_error(run(*args, "--cluster", lab_cluster, "--apply"), code=1)
    assert "changed while this command ran" in line and "run it again" in line, line


def test_apply_refuses_a_malformed_plan(tmp_path: Path, lab_cluster: Path) -> None:
    p = tmp_path / "plan.json"
    p.write_text('{"version": 1}')
    line = one_line_error(run("apply", p, "--cluster", lab_cluster))
    assert "plan: missing field" in line


# ------------------------------------------------------------------ cap parameters per driver (fake connection)


class FakeDomain:
    """Records scheduler calls; enough of virDomain for set_cap/read_cap."""

    def __init__(self, name: str, vcpus: int, persistent: bool, params: dict[str, Any]) -> None:
        self._name, self._vcpus, self._persistent, self.params = name, vcpus, persistent, params
        self.calls: list[tuple[dict[str, Any], int]] = []

    def name(self) -> str:
        return self._name

    def info(self) -> list[int]:
        return [1, 131072, 131072, self._vcpus, 0]

    def isPersistent(self) -> bool:
        return self._persistent

    def isActive(self) -> bool:
        return True

    def setSchedulerParametersFlags(self, params: dict[str, Any], flags: int) -> None:
        import libvirt

        both = libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
        if flags & both == both:  # as libvirt's QEMU driver (measured on the lab): one of the two per call
            raise libvirt.libvirtError("Flags 'VIR_DOMAIN_AFFECT_LIVE' and 'VIR_DOMAIN_AFFECT_CONFIG' are "
                                       "mutually exclusive")
        self.calls.append((params, flags))
        self.params.update(params)

    def schedulerParametersFlags(self, flags: int) -> dict[str, Any]:
        return dict(self.params)


class FakeConn:
    def __init__(self, driver: str, dom: FakeDomain) -> None:
        self.driver, self.dom = driver, dom

    def getType(self) -> str:
        return self.driver

    def listAllDomains(self, flags: int) -> list[FakeDomain]:
        return [self.dom]

    def close(self) -> None:
        pass


def fake_backend(driver: str, dom: FakeDomain) -> LibvirtHypervisor:
    return LibvirtHypervisor(Cluster("t", (ClusterHost("h0", "qemu:///system"),)),
                             connect=lambda _uri: FakeConn(driver, dom))


def test_qemu_caps_are_a_per_vcpu_quota_live_and_in_the_persistent_config() -> None:
    import libvirt

    dom = FakeDomain("v", 2, True, {"vcpu_period": 100_000, "vcpu_quota": -1})
    hv = fake_backend("QEMU", dom)
    hv.set_cap("h0", "v", 1.5)
    params = {"vcpu_period": 100_000, "vcpu_quota": 75_000}
    assert dom.calls == [(params, libvirt.VIR_DOMAIN_AFFECT_LIVE), (params, libvirt.VIR_DOMAIN_AFFECT_CONFIG)]
    assert hv.read_cap("h0", "v") == pytest.approx(1.5)


def test_a_transient_domain_is_capped_live_only() -> None:
    import libvirt

    dom = FakeDomain("v", 1, False, {})
    fake_backend("QEMU", dom).set_cap("h0", "v", 0.5)
    assert dom.calls[0][1] == libvirt.VIR_DOMAIN_AFFECT_LIVE


def test_an_unlimited_quota_reads_as_no_cap() -> None:
    dom = FakeDomain("v", 1, False, {"vcpu_period": 100_000, "vcpu_quota": 17592186044415})
    assert fake_backend("QEMU", dom).read_cap("h0", "v") is None


def test_xen_caps_are_percent_of_one_cpu_and_weight_is_left_alone() -> None:
    dom = FakeDomain("v", 2, True, {"weight": 256, "cap": 0})
    hv = fake_backend("Xen", dom)
    hv.set_cap("h0", "v", 1.25)
    assert dom.calls[0][0] == {"cap": 125}
    assert dom.params["weight"] == 256 and hv.read_cap("h0", "v") == pytest.approx(1.25)


def test_a_cap_below_libvirts_minimum_quota_is_refused_naming_the_vm() -> None:
    dom = FakeDomain("v", 4, False, {})
    with pytest.raises(HypervisorError, match=r"^host h0: cap 0\.0200 cores for 'v' is below"):
        fake_backend("QEMU", dom).set_cap("h0", "v", 0.02)
    assert dom.calls == []


# ------------------------------------------------------------------ CLI: refusals and the default cluster


def test_a_refused_request_exits_1_with_the_reason(tmp_path: Path, lab_cluster: Path) -> None:
    req = write_request(tmp_path, WEB.replace("vms = 2", "vms = 4").replace("cpu_cores = 0.5", "cpu_cores = 1\n"
                                                                            "min_yield = 0.9"))
    result = run("place", req, "--cluster", lab_cluster, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert not doc["admitted"] and doc["plan"] is None
    # h0's unmanaged "stranger" (1 uncapped vCPU) reserves its one core: the 4 VMs share h1's core.
    assert doc["reason"] == ("the minimum yield would be 0.2500, below request 'web' min_yield 0.9 "
                             "(unmanaged domains reserve h0 1.00 of 1 cores)")


def test_without_cluster_file_or_running_lab_place_says_how_to_get_one(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VCSCHED_LAB_DIR", str(tmp_path / "nolab"))
    line = one_line_error(run("place", write_request(tmp_path, WEB)))
    assert "--cluster: no cluster file given and no lab is running" in line
