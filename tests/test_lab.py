"""The local lab: pure parts everywhere, the real thing (marked ``lab``) where libvirt and TCG work."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import time
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from cli.main import cli
from hypervisor.guest import BOOT_MARKER, guest_xml
from lab import Lab, daemons, default_cluster_file, down, status, up
from lab import cgroups as lab_cgroups
from lab.image import BUSYBOX, build_initramfs, ensure_image, has_pvh_entry
from lab.ports import held_blocks, migration_ports, preferred_block
from lab.state import (
    GuestImage,
    LabHost,
    LabLayout,
    host_uuid,
    lab_id,
    memory_reserved_for,
    partition_dir_name,
    partition_name,
    pid_matches,
    read_pid_file,
    render_cluster_toml,
)
from tests.lab_support import lab_guest, lab_leftovers, new_lab_dir, skip_unless_lab_possible, start_lab_guest
from vcsched.errors import InputError

# --- pure parts: run everywhere -------------------------------------------------------------------


def _hosts(n: int, root: str = "/var/tmp/vcl-x") -> list[LabHost]:
    layout = LabLayout(Path(root))
    return [LabHost(layout.host_name(i), layout.uri(i), layout.partition(i)) for i in range(n)]


def test_cluster_toml_parses_and_lists_every_host_in_order() -> None:
    doc = tomllib.loads(render_cluster_toml("lab", _hosts(3), None))
    assert doc["name"] == "lab"
    assert [h["name"] for h in doc["hosts"]] == ["h0", "h1", "h2"]
    assert all(h["cores"] == 1 and h["memory_reserved"] == "64MiB" for h in doc["hosts"])  # LabHost's default


def test_cluster_toml_carries_uri_and_partition_of_each_host() -> None:
    hosts = _hosts(2)
    doc = tomllib.loads(render_cluster_toml("lab", hosts, None))
    assert [(h["uri"], h["partition"]) for h in doc["hosts"]] == [(h.uri, h.partition) for h in hosts]


def test_cluster_toml_guest_section_names_kernel_initrd_and_tcg() -> None:
    guest = GuestImage(Path("/var/tmp/vcl-x/image/vmlinuz"), Path("/var/tmp/vcl-x/image/initrd.gz"))
    doc = tomllib.loads(render_cluster_toml("lab", _hosts(1), guest))
    assert doc["guest"] == {"kernel": str(guest.kernel), "initrd": str(guest.initrd),
                            "cmdline": guest.cmdline, "domain_type": "qemu"}


def test_cluster_toml_without_guest_has_no_guest_section() -> None:
    assert "guest" not in tomllib.loads(render_cluster_toml("lab", _hosts(1), None))


@given(st.text(min_size=1, max_size=30))
def test_cluster_toml_round_trips_any_cluster_name(name: str) -> None:
    assert tomllib.loads(render_cluster_toml(name, _hosts(1), None))["name"] == name


def test_cluster_toml_refuses_a_cluster_without_hosts() -> None:
    with pytest.raises(InputError, match="at least one host"):
        render_cluster_toml("lab", [], None)


def test_memory_reserved_leaves_each_host_its_share_of_the_machine() -> None:
    assert memory_reserved_for(4096, 2) == "2048MiB"
    assert memory_reserved_for(4097, 2) == "2049MiB"  # never more than the machine in total
    assert memory_reserved_for(4096, 1) == "64MiB"  # a lone host keeps the floor for itself


@given(st.integers(1, 1 << 20), st.integers(1, 8))
def test_lab_hosts_together_never_promise_more_memory_than_the_machine(total: int, n: int) -> None:
    usable = total - int(memory_reserved_for(total, n).removesuffix("MiB"))
    assert n * usable <= total


def test_partition_name_embeds_lab_id_and_host_index() -> None:
    assert partition_name("3fa2c1", 0) == "/vcl3fa2c1h0"
    assert partition_dir_name("/vcl3fa2c1h0") == "vcl3fa2c1h0.partition"


def test_partition_dir_name_rejects_nested_or_relative_partitions() -> None:
    for bad in ("vclh0", "/a/b", "/"):
        with pytest.raises(InputError, match="partition"):
            partition_dir_name(bad)


def test_two_lab_dirs_never_share_a_partition_or_host_uuid() -> None:
    a, b = LabLayout(Path("/var/tmp/vcl-a")), LabLayout(Path("/var/tmp/vcl-b"))
    assert a.id != b.id
    assert {a.partition(0), a.partition(1)}.isdisjoint({b.partition(0), b.partition(1)})
    assert host_uuid(a.id, 0) != host_uuid(b.id, 0) != host_uuid(b.id, 1)


def test_lab_id_is_stable_for_the_same_dir() -> None:
    # A restarted lab must find the partitions of its crashed predecessor.
    assert lab_id(Path("/var/tmp/vcl-a")) == lab_id(Path("/var/tmp/vcl-a"))


def test_socket_paths_that_do_not_fit_a_unix_address_are_refused() -> None:
    with pytest.raises(InputError, match="too long"):
        LabLayout(Path("/var/tmp/" + "d" * 90)).check_paths(2)
    LabLayout(Path("/var/tmp/vcsched-lab")).check_paths(8)


def test_pid_file_missing_or_garbage_reads_as_no_pid(tmp_path: Path) -> None:
    assert read_pid_file(tmp_path / "none.pid") is None
    (tmp_path / "g.pid").write_text("not a pid\n")
    assert read_pid_file(tmp_path / "g.pid") is None
    (tmp_path / "ok.pid").write_text("1234\n")
    assert read_pid_file(tmp_path / "ok.pid") == 1234


def test_pid_matches_only_a_live_process_whose_command_line_has_the_marker(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cmdline").write_bytes(b"libvirtd\0-d\0-p\0/var/tmp/vcl-x/h0/libvirtd.pid\0")
    assert pid_matches(77, "/var/tmp/vcl-x/h0/libvirtd.pid", proc)
    assert not pid_matches(77, "/var/tmp/vcl-y/h0/libvirtd.pid", proc)  # a reused pid
    assert not pid_matches(78, "/var/tmp/vcl-x/h0/libvirtd.pid", proc)  # gone


def test_mounts_parsing_finds_v1_controllers_named_hierarchies_and_v2() -> None:
    text = ("tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
            "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
            "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n"
            "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
    hs = lab_cgroups.parse_mounts(text)
    assert [(str(h.mount), h.controllers, h.v2) for h in hs] == [
        ("/sys/fs/cgroup/cpu", ("cpu",), False),
        ("/sys/fs/cgroup/systemd", ("name=systemd",), False),
        ("/sys/fs/cgroup/unified", (), True),
    ]


_MOUNTINFO = (
    "63 43 254:0 /var/tmp/vcl-a/h0/etc /etc/libvirt rw,relatime - ext4 /dev/vda rw\n"
    "64 43 254:0 /var/tmp/vcl-a/h0/run /run/libvirt rw,relatime - ext4 /dev/vda rw\n"
    "22 1 0:5 / /proc rw - proc proc rw\n"
)


def test_a_mount_table_with_the_hosts_etc_on_etc_libvirt_is_that_hosts_namespace() -> None:
    binds = daemons.parse_mountinfo_binds(_MOUNTINFO)
    assert daemons.holds_host_namespace(binds, LabLayout(Path("/var/tmp/vcl-a")), 0)
    assert not daemons.holds_host_namespace(binds, LabLayout(Path("/var/tmp/vcl-a")), 1)
    assert not daemons.holds_host_namespace(binds, LabLayout(Path("/var/tmp/vcl-b")), 0)


def test_host_namespace_is_recognised_when_var_tmp_is_its_own_filesystem() -> None:
    # The root field is then relative to /var/tmp's filesystem.
    binds = daemons.parse_mountinfo_binds("63 43 8:1 /vcl-a/h0/etc /etc/libvirt rw - ext4 /dev/sdb rw\n")
    assert daemons.holds_host_namespace(binds, LabLayout(Path("/var/tmp/vcl-a")), 0)


def test_the_machines_own_mount_table_is_no_lab_hosts_namespace() -> None:
    binds = daemons.parse_mountinfo_binds(Path("/proc/self/mountinfo").read_text())
    assert not daemons.holds_host_namespace(binds, LabLayout(Path("/var/tmp/vcl-a")), 0)


def _newc_members(data: bytes) -> dict[str, tuple[int, bytes]]:
    """name -> (mode, content) of a newc cpio archive (the initramfs format)."""
    out: dict[str, tuple[int, bytes]] = {}
    pos = 0
    while True:
        hdr = data[pos:pos + 110]
        assert hdr[:6] == b"070701"
        fields = [int(hdr[6 + 8 * i: 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name = data[pos + 110: pos + 110 + namesize - 1].decode()
        pos = (pos + 110 + namesize + 3) & ~3
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, data[pos:pos + size])
        pos = (pos + size + 3) & ~3


def test_initramfs_holds_busybox_and_an_executable_init_that_announces_the_boot() -> None:
    if not BUSYBOX.is_file():
        pytest.skip(f"{BUSYBOX} missing (busybox-static not installed)")
    members = _newc_members(gzip.decompress(build_initramfs()))
    mode, init = members["init"]
    assert mode & 0o111
    assert BOOT_MARKER.encode() in init
    assert members["bin/busybox"][1] == BUSYBOX.read_bytes()


def test_guest_xml_is_a_tcg_kernel_boot_in_the_hosts_partition() -> None:
    image = GuestImage(Path("/img/vmlinuz"), Path("/img/initrd.gz"))
    root = ET.fromstring(guest_xml("g1", image, partition="/vclxh1", console_log=Path("/c/g1.log")))
    assert root.get("type") == "qemu"
    assert root.findtext("resource/partition") == "/vclxh1"
    assert root.findtext("os/kernel") == "/img/vmlinuz"
    assert root.findtext("os/initrd") == "/img/initrd.gz"
    assert root.find("devices/serial/source").get("path") == "/c/g1.log"  # type: ignore[union-attr]


def test_guest_xml_escapes_names() -> None:
    image = GuestImage(Path("/img/vmlinuz"), Path("/img/initrd.gz"))
    assert ET.fromstring(guest_xml("a<&>b", image)).findtext("name") == "a<&>b"


def test_the_running_labs_cluster_file_is_kept_when_it_says_all_the_lab_would_write() -> None:
    """A repair (`lab up` on a running lab) kept nothing an operator added to cluster.toml (QA: `maintenance = true`
    from `vcsched cordon` and power settings vanished): the file is rewritten only when it no longer says what the
    lab would write."""
    from lab import says_all

    lab = {"name": "lab", "hosts": [{"name": "h0", "uri": "u0"}, {"name": "h1", "uri": "u1"}]}
    edited = {"name": "lab", "power_yield": 0.5, "hosts": [{"name": "h0", "uri": "u0", "maintenance": True},
                                                           {"name": "h1", "uri": "u1"}]}
    assert says_all(edited, lab) and says_all(lab, lab)
    assert not says_all(lab, edited)  # the other way round: additions missing
    assert not says_all({**edited, "hosts": edited["hosts"][:1]}, lab)  # a host fewer
    assert not says_all({**edited, "hosts": [{"name": "h0", "uri": "other"}, lab["hosts"][1]]}, lab)  # changed


def test_lab_up_rejects_a_host_count_out_of_range() -> None:
    for n in ("0", "9"):
        r = CliRunner().invoke(cli, ["lab", "up", "--hosts", n])
        assert r.exit_code == 2
        assert "--hosts" in r.output


def test_lab_status_of_an_empty_dir_says_nothing_runs(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("reading the lab's cgroups needs root")
    r = CliRunner().invoke(cli, ["lab", "status", "--dir", str(tmp_path)])
    assert r.exit_code == 0
    assert "no lab running" in r.output


def test_lab_down_of_an_empty_dir_is_harmless(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    r = CliRunner().invoke(cli, ["lab", "down", "--dir", str(tmp_path), "--json"])
    assert r.exit_code == 0
    assert '"daemons":[]' in r.output


def test_lab_up_as_non_root_fails_with_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = CliRunner().invoke(cli, ["lab", "up", "--dir", str(tmp_path)])
    assert r.exit_code == 2
    assert r.output == "vcsched: error: the lab needs root (namespaces, bind mounts, cgroups)\n"


def test_lab_up_without_libvirtd_names_the_missing_program(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda p: None if p == "libvirtd" else real_which(p))
    r = CliRunner().invoke(cli, ["lab", "up", "--dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "libvirtd is not installed" in r.output
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_lab_up_with_a_relative_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="not an absolute path"):
        LabLayout(Path("rel")).check_paths(1)


def test_two_lab_commands_on_one_dir_do_not_interleave(tmp_path: Path) -> None:
    import fcntl

    from lab import LabError
    from lab import down as lab_down

    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(LabError, match="another 'vcsched lab' command"):
            lab_down(tmp_path)
    finally:
        os.close(fd)


# --- the real lab ----------------------------------------------------------------------------------


@pytest.mark.lab
def test_lab_hosts_each_answer_get_info(lab2: Lab) -> None:
    import libvirt

    for h in lab2.hosts:
        conn = libvirt.open(h.connect_uri)
        try:
            assert conn.getInfo()[2] >= 1  # CPUs
            assert conn.getHostname() == f"vcl{lab2.id}{h.name}"
        finally:
            conn.close()


@pytest.mark.lab
def test_lab_cluster_file_lists_the_running_hosts(lab2: Lab) -> None:
    doc = tomllib.loads(lab2.cluster_file.read_text())
    assert [(h["name"], h["uri"], h["partition"]) for h in doc["hosts"]] == [
        (h.name, h.uri, h.partition) for h in lab2.hosts]
    assert Path(doc["guest"]["kernel"]).is_file() and Path(doc["guest"]["initrd"]).is_file()


@pytest.mark.lab
def test_lab_status_json_reports_both_hosts_answering(lab2: Lab) -> None:
    r = CliRunner().invoke(cli, ["lab", "status", "--dir", str(lab2.dir), "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["running"] is True
    assert [(h["name"], h["answers"]) for h in doc["hosts"]] == [("h0", True), ("h1", True)]


def test_default_cluster_file_is_none_when_no_lab_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VCSCHED_LAB_DIR", str(tmp_path))
    (tmp_path / "cluster.toml").write_text(render_cluster_toml("lab", _hosts(1), None))  # stale: no daemons
    assert default_cluster_file() is None


@pytest.mark.lab
def test_default_cluster_file_is_the_running_labs(lab2: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VCSCHED_LAB_DIR", str(lab2.dir))
    assert default_cluster_file() == lab2.cluster_file


@pytest.mark.lab
def test_lab_hosts_split_the_machines_memory(lab2: Lab) -> None:

    doc = tomllib.loads(lab2.cluster_file.read_text())
    # The split is made from what libvirt reported at `up`; compare with that, not with now: the machine's
    # reported memory drifts by hundreds of MiB on a shared machine (7770 -> 7002 MiB within minutes here).
    total = lab2.machine_memory_mib
    assert total > 0
    usable = [total - int(h["memory_reserved"].removesuffix("MiB")) for h in doc["hosts"]]
    assert sum(usable) <= total


@pytest.mark.lab
def test_lab_hosts_are_distinct_libvirt_hosts(lab2: Lab) -> None:
    import libvirt

    uuids = set()
    for h in lab2.hosts:
        conn = libvirt.open(h.connect_uri)
        try:
            uuids.add(ET.fromstring(conn.getCapabilities()).findtext("host/uuid"))
        finally:
            conn.close()
    assert len(uuids) == len(lab2.hosts)


def _cpu_seconds(dom: object, window_s: float) -> float:
    """Host CPU the guest used per second over a window (libvirt's accounting, all threads)."""
    t0 = dom.getCPUStats(True)[0]["cpu_time"]  # type: ignore[attr-defined]
    time.sleep(window_s)
    t1 = dom.getCPUStats(True)[0]["cpu_time"]  # type: ignore[attr-defined]
    return (t1 - t0) / 1e9 / window_s


@pytest.fixture(scope="module")
def loop_guest(lab2: Lab) -> Iterator[Any]:
    """One booted CPU-loop guest on h0 for the measuring tests below (one boot instead of one per test)."""
    with lab_guest(lab2, host=0) as dom:
        yield dom


@pytest.mark.lab
@pytest.mark.exclusive
def test_lab_guest_boots_and_burns_cpu(loop_guest: Any) -> None:
    assert loop_guest.isActive()
    # A busy loop under TCG uses most of a core; 0.3 leaves room for a loaded machine.
    assert _cpu_seconds(loop_guest, 1.0) > 0.3


@pytest.mark.lab
@pytest.mark.exclusive
def test_lab_vcpu_quota_caps_the_guests_cpu(loop_guest: Any) -> None:
    """Caps work on lab hosts (what the plan applier and calibration rely on): 25% of a vCPU."""
    import libvirt

    dom = loop_guest
    flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
    dom.setSchedulerParametersFlags({"vcpu_period": 100000, "vcpu_quota": 25000}, flags)
    try:
        params = dom.schedulerParametersFlags(flags)
        assert (params["vcpu_period"], params["vcpu_quota"]) == (100000, 25000)
        time.sleep(0.3)  # let the running CFS period end
        # The cap bounds it from above whatever else runs; the emulator thread adds ~1%.
        assert 0.0 < _cpu_seconds(dom, 2.0) < 0.4
    finally:
        dom.setSchedulerParametersFlags({"vcpu_quota": -1}, flags)  # uncapped again, as the fixture made it


@pytest.mark.lab
def test_lab_guest_lands_in_its_hosts_partition(lab2: Lab) -> None:
    layout = LabLayout(lab2.dir)

    def in_partition(i: int) -> set[int]:
        procs: set[int] = set()
        for d in lab_cgroups.partition_dirs(layout.partition(i)):
            procs |= lab_cgroups.procs_in(d)
        return procs

    # h0 may run a guest of another test of this session (this module's loop_guest): only what is new counts.
    before = in_partition(0), in_partition(1)
    with lab_guest(lab2, host=1, wait=False):
        assert in_partition(1) - before[1], "no new process in h1's partition"
        assert not in_partition(0) - before[0], "the guest started on h1 has processes in h0's partition"


@pytest.mark.lab
def test_lab_live_migration_moves_a_running_guest_between_hosts(lab2: Lab) -> None:
    """The recipe docs/lab.md gives the adaptation developer: migrate3 over tcp://127.0.0.1, LIVE,
    with the destination host's partition written into VIR_MIGRATE_PARAM_DEST_XML."""
    import libvirt

    src_host, dst_host = lab2.hosts
    with lab_guest(lab2, host=0) as dom:
        dst = libvirt.open(dst_host.connect_uri)
        try:
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE).replace(
                f"<partition>{src_host.partition}</partition>", f"<partition>{dst_host.partition}</partition>")
            moved = dom.migrate3(dst, {libvirt.VIR_MIGRATE_PARAM_URI: "tcp://127.0.0.1",
                                       libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml}, libvirt.VIR_MIGRATE_LIVE)
            assert moved.isActive()
            assert ET.fromstring(moved.XMLDesc(0)).findtext("resource/partition") == dst_host.partition
            assert dom.name() not in [d.name() for d in dom.connect().listAllDomains(0)]
            # Still running its loop after the move.  Executing at all is the point: this test shares the machine
            # with others (scripts/test, pass 1), so how much CPU the loop gets is not.
            assert _cpu_seconds(moved, 1.0) > 0.05
        finally:
            dst.close()


@pytest.mark.lab
@pytest.mark.network
def test_guest_image_is_built_from_the_debian_kernel_package_when_no_cache_has_it(tmp_path: Path) -> None:
    skip_unless_lab_possible()
    image = ensure_image(tmp_path / "image", sources=())  # forces `apt-get download`
    bz = (image.kernel.parent / "vmlinuz").read_bytes()
    assert bz[0x202:0x206] == b"HdrS"  # the x86 boot protocol signature of a bzImage
    # Debian's kernel has a PVH entry: the guests boot its unpacked ELF image (lab/image.py).
    assert image.kernel.name == "vmlinux" and has_pvh_entry(image.kernel.read_bytes())
    assert image.initrd.is_file()
    assert not [p.name for p in image.kernel.parent.iterdir() if p.name.startswith(".")]  # no temporaries left


def lab_dir_hashing_to(block: int) -> Path:
    """A fresh lab directory whose id hashes to ``block``: the port block another lab may already hold."""
    while True:
        d = new_lab_dir()
        if preferred_block(LabLayout(d).id) == block:
            return d
        d.rmdir()


def migration_port_range(lab_dir: Path, host: int) -> tuple[int, int]:
    conf = (LabLayout(lab_dir).host_dir(host) / "etc" / "qemu.conf").read_text()
    values = dict(line.split(" = ") for line in conf.splitlines() if line.startswith("migration_port_m"))
    return int(values["migration_port_min"]), int(values["migration_port_max"])


@pytest.mark.lab
def test_lab_cli_up_then_down_round_trip_holding_migration_ports_no_other_lab_holds(lab2: Lab) -> None:
    """A lab whose id hashes to the port block of a lab that runs receives migrations on other ports (two such
    labs made a migration's connection refused), and gives its block back at ``down``."""
    assert lab2.port_block is not None
    d = lab_dir_hashing_to(lab2.port_block)
    try:
        r = CliRunner().invoke(cli, ["lab", "up", "--hosts", "1", "--dir", str(d), "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert [h["name"] for h in doc["hosts"]] == ["h0"]
        assert tomllib.loads(Path(doc["cluster_file"]).read_text())["hosts"][0]["uri"] == doc["hosts"][0]["uri"]
        assert doc["port_block"] != lab2.port_block
        assert migration_port_range(d, 0) == migration_ports(doc["port_block"], 0) != migration_port_range(lab2.dir, 0)
        assert json.loads((d / "lab.json").read_text())["port_block"] == doc["port_block"]
        assert {c.block for c in held_blocks() if c.dir == str(d)} == {doc["port_block"]}
        r = CliRunner().invoke(cli, ["lab", "down", "--dir", str(d), "--json"])
        assert r.exit_code == 0, r.output
        assert len(json.loads(r.output)["daemons"]) == 3  # libvirtd, virtlogd, virtlockd
        assert [c for c in held_blocks() if c.dir == str(d)] == []
        assert lab_leftovers(d, 1) == []
        assert (d / "image").is_dir()
        assert CliRunner().invoke(cli, ["lab", "down", "--dir", str(d), "--purge"]).exit_code == 0
        assert not d.exists()
    finally:
        down(d)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.lab
def test_lab_down_leaves_nothing_and_up_repairs_a_crash_keeping_guests_or_recreates_on_request() -> None:
    skip_unless_lab_possible()
    d = new_lab_dir()
    try:
        lab = up(1, d)
        layout = LabLayout(d)
        start_lab_guest(lab, host=0, wait=False)
        pids = [int(layout.pid_file(0, n).read_text()) for n in ("libvirtd", "virtlogd")]
        guest_pids: set[int] = set()
        for cg in lab_cgroups.partition_dirs(layout.partition(0)):
            guest_pids |= lab_cgroups.procs_in(cg)
        assert guest_pids
        from cli.maintenance import set_maintenance

        set_maintenance(lab.cluster_file, "h0", True)  # an operator's edits of the cluster file: `cordon h0` ...
        edited = lab.cluster_file.read_text().replace('name = "lab"\n', 'name = "lab"\npower_yield = 0.5\n', 1)
        lab.cluster_file.write_text(edited)  # ... and a setting of their own
        for pid in pids:  # a crash: daemons die, the guest and the partition stay
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        lab = up(1, d)  # on a lab that exists: a repair, which keeps the guest
        assert status(d).running and lab.repaired == ("h0",)
        assert lab.cluster_file.read_text() == edited, "the repair dropped the operator's cordon and setting"
        assert not any(lab_cgroups.pid_gone(p) for p in guest_pids), "the repair lost the guest"
        assert len(status(d).hosts[0].domains) == 1  # the new libvirtd took it over
        lab = up(1, d, recreate=True)  # asked for: a fresh lab, the old guest destroyed
        assert status(d).running and status(d).hosts[0].domains == ()
        assert all(lab_cgroups.pid_gone(p) for p in guest_pids), "the orphaned guest survived --recreate"
        down(d)
        assert lab_leftovers(d, 1) == []
        assert all(lab_cgroups.pid_gone(p) for p in pids)
        assert not (d / "cluster.toml").exists()
        assert (d / "image" / "vmlinuz").is_file()  # the image cache is kept
        assert down(d).daemons == ()  # idempotent
    finally:
        down(d)
        shutil.rmtree(d, ignore_errors=True)
