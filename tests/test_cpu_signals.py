"""Where the CPU signals come from (hypervisor.cpu_signals, docs/contention.md): libvirt's stats, the vCPU cgroups'
cpu.stat, /proc/pressure/cpu and /proc/stat — parsed, found, and read through the libvirt adapter."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from hypervisor import cpu_signals
from hypervisor.base import CpuCounters
from hypervisor.domain_xml import metadata_xml
from hypervisor.libvirt_backend import LibvirtHypervisor
from hypervisor.simlibvirt import RUNNING, SimDomain, SimWorld
from vcsched.formats.cluster import Cluster, ClusterHost
from vcsched.inventory import VmMeta

MIB = 1 << 20
V1_STAT = "nr_periods 120\nnr_throttled 30\nthrottled_time 1500000000\nnr_bursts 0\nburst_time 0\n"


def test_cpu_stat_of_cgroup_v1_and_v2_gives_periods_throttled_periods_and_ns() -> None:
    assert cpu_signals.parse_cpu_stat(V1_STAT) == cpu_signals.Throttling(120, 30, 1_500_000_000)
    v2 = "usage_usec 10\nnr_periods 4\nnr_throttled 1\nthrottled_usec 2500\n"
    assert cpu_signals.parse_cpu_stat(v2) == cpu_signals.Throttling(4, 1, 2_500_000)
    assert cpu_signals.parse_cpu_stat("usage_usec 10\n") is None  # the v2 cpu controller not enabled there


def test_vcpu_delay_and_wait_are_summed_over_vcpus_and_none_when_any_is_missing() -> None:
    stats = {"vcpu.current": 2, "vcpu.0.delay": 5, "vcpu.1.delay": 7, "vcpu.0.wait": 1}
    assert cpu_signals.vcpu_sums(stats) == (12, None)


def test_pressure_and_steal_are_read_from_the_kernels_files(tmp_path: Path) -> None:
    (tmp_path / "pressure").write_text("some avg10=1.00 avg60=2.00 avg300=3.00 total=105124864\n"
                                       "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (tmp_path / "stat").write_text("cpu  10 0 20 300 4 0 1 17 0 0\ncpu0 5 0 10 150 2 0 1 9 0 0\n")
    assert cpu_signals.host_pressure(tmp_path / "pressure", tmp_path / "stat") == cpu_signals.HostPressure(
        105124864, 17)
    assert cpu_signals.host_pressure(tmp_path / "none", tmp_path / "none") == cpu_signals.HostPressure(None, None)


def test_a_domains_cgroup_is_found_under_its_partition_and_its_vcpus_summed(tmp_path: Path) -> None:
    dom = tmp_path / "cpu" / "host0vms.partition" / "qemu-3-web-0.libvirt-qemu"
    for i, text in enumerate((V1_STAT, "nr_periods 80\nnr_throttled 10\nthrottled_time 500000000\n")):
        (dom / f"vcpu{i}").mkdir(parents=True)
        (dom / f"vcpu{i}" / "cpu.stat").write_text(text)
    (dom / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    xml = "<domain><name>web-0</name><resource><partition>/host0vms</partition></resource></domain>"
    found = cpu_signals.domain_cgroup(cpu_signals.partition_of(xml), 3, "web-0", (tmp_path / "cpu",))
    assert found == dom
    assert cpu_signals.read_throttling(dom) == cpu_signals.Throttling(200, 40, 2_000_000_000)
    assert cpu_signals.domain_cgroup("/host0vms", 4, "web-0", (tmp_path / "cpu",)) is None  # another start: not guessed


def test_only_a_daemon_on_this_machine_has_cgroups_vcsched_can_read() -> None:
    assert cpu_signals.local_uri("qemu:///system")
    assert cpu_signals.local_uri("qemu+unix:///system?socket=/tmp/h0/run/libvirt-sock")
    assert not cpu_signals.local_uri("qemu+ssh://root@h1/system")
    assert not cpu_signals.local_uri("qemu+tls://127.0.0.1:16514/system")
    assert not cpu_signals.local_uri("test:///default")


def test_the_libvirt_adapter_reads_cpu_time_and_vcpu_delay_in_one_call_and_names_throttling_missing() -> None:
    world = SimWorld()
    world.add_host("h0", 4, 4096 * MIB)
    meta = dict(ET.fromstring(metadata_xml(VmMeta("vc", 0.5, 256 * MIB, 2), bare=True)).attrib)
    d = SimDomain("v", world.new_uuid(), 2, 256 * MIB, RUNNING, False, 50000, 100000, meta)
    d.cpu_ns, d.delay_ns = 3_000_000_000, 400_000_000
    world.add_domain("h0", d)
    hv = LibvirtHypervisor(Cluster("sim", (ClusterHost("h0", "sim://h0"),)), connect=lambda uri: world.open(1, uri),
                           workers=1)
    got = hv.cpu_counters("h0", "v")
    assert got == CpuCounters(3_000_000_000, delay_ns=400_000_000)
    assert got.missing() == ("throttled", "wait")
