"""The lab over TLS, like separate machines: every host on its own loopback address with certificates.

Proven here on real libvirtd + QEMU (skipped with the reason where the lab
cannot run):

* a VM moved by ``adapt --apply`` arrives on its destination through the
  destination's ``address`` (each host's QEMU accepts migrations only on its
  own address, ``migration_address``), resumed after its source copy is gone;
* a host drains over TLS and its VMs come back when the host they went to
  drains in turn (maintenance both ways);
* a wrong ``address`` fails the step and the VM keeps running on its source
  (exit 1), with no copy left anywhere else;
* a client certificate from another CA is refused: every host is shown down
  with libvirt's reason, no traceback;
* a hung host (SIGSTOP of its libvirtd) is down within ``host_timeout`` + 1 s,
  ``place`` plans onto the others, and it is back at the next command;
* a destination that hangs once the migration job has started: the step
  fails, at no moment do two copies run, and the re-run converges.
* hosts with local storage: a VM with a disk moves with its disk
  (VIR_MIGRATE_NON_SHARED_DISK; libvirt creates the destination image in the
  host's ``default`` pool), the plan's bytes are memory + disk, the disk's
  hash is the same after the move, and a budget that fits the memory but not
  memory + disk moves nothing.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.libvirt_backend import LibvirtHypervisor
from lab import Lab
from lab.certs import make_foreign_client
from lab.daemons import daemon_pid
from lab.state import LabLayout
from tests.lab_support import destroy_everywhere, running_lab, skip_unless_lab_possible
from tests.skip_policy import skip_or_fail
from vcsched.formats.cluster import Cluster, cluster_from_dict
from vcsched.plans.steps import Boot, CreateStep

pytestmark = pytest.mark.lab
MIB = 1 << 20
VCSCHED = str(Path(sys.executable).parent / "vcsched")


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def tls3() -> Iterator[Lab]:
    """A 3-host TLS lab (local storage) in /var/tmp/vcl-tls-*, for this module."""
    skip_unless_lab_possible()
    with running_lab(3, "tls") as lab:
        yield lab


def cluster_of(path: Path) -> Cluster:
    return cluster_from_dict(tomllib.loads(path.read_text()))


def variant(lab: Lab, tmp: Path, name: str, top: str = "", addresses: dict[str, str] | None = None,
            pki: Path | None = None) -> Path:
    """The lab's cluster file with extra top-level fields, other host addresses or another pki directory."""
    text = lab.cluster_file.read_text()
    lines = text.splitlines()
    out = []
    host = None
    for line in lines:
        if line.startswith("pki = ") and pki is not None:
            line = f'pki = "{pki}"'
        out.append(line)
        if line.startswith("name = ") and host is None and top:
            out.append(top)
            host = ""
        if line.startswith('name = "h'):
            host = line.split('"')[1]
        if line.startswith("uri = ") and addresses and host in addresses:
            out.append(f'address = "{addresses[host]}"')
    p = tmp / f"{name}.toml"
    p.write_text("\n".join(out) + "\n")
    return p


def boot_of(c: Cluster) -> Boot:
    g = c.guest
    assert g is not None
    return Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=g.cmdline, domain_type=g.domain_type)


@pytest.fixture
def two_on_h0(tls3: Lab) -> Iterator[tuple[str, str]]:
    """Two VMs needing 0.6 cores each on h0 (1 core), capped at 0.5: adapt wants to move one."""
    c = cluster_of(tls3.cluster_file)
    tag = uuid.uuid4().hex[:6]
    names = (f"tl{tag}-0", f"tl{tag}-1")
    try:
        with LibvirtHypervisor(c) as hv:
            for n in names:
                hv.create_vm(CreateStep(n, "h0", f"tl{tag}", 1, 128 * MIB, 0.6, 0.5, boot_of(c)))
        yield names
    finally:
        for n in names:
            destroy_everywhere(tls3, n)


def copies(lab: Lab, name: str) -> list[tuple[str, str]]:
    """(host, state) of every domain called ``name``, read through the hosts' unix sockets (management path)."""
    import libvirt

    layout = LabLayout(lab.dir)
    out = []
    for i, h in enumerate(lab.hosts):
        conn = libvirt.open(layout.uri(i))
        try:
            for d in conn.listAllDomains(0):
                if d.name() == name:
                    try:
                        st = d.state(0)[0]
                    except libvirt.libvirtError:  # vanished while we looked: not a copy
                        continue
                    out.append((h.name, {libvirt.VIR_DOMAIN_RUNNING: "running",
                                         libvirt.VIR_DOMAIN_PAUSED: "paused"}.get(st, f"state {st}")))
        finally:
            conn.close()
    return out


def test_hosts_listen_for_tls_on_their_own_loopback_address_only_and_keys_are_private(tls3: Lab) -> None:
    import psutil

    layout = LabLayout(tls3.dir)
    for i, h in enumerate(tls3.hosts):
        assert h.uri == f"qemu+tls://{layout.address(i)}/system"
        pid = daemon_pid(layout, i, "libvirtd")
        assert pid is not None
        listening = [c.laddr for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"]
        assert listening and all(a.ip == layout.address(i) and a.port == 16514 for a in listening), listening
        qemu_conf = (layout.host_dir(i) / "etc" / "qemu.conf").read_text()
        assert f'migration_address = "{layout.address(i)}"' in qemu_conf
    keys = [layout.pki_dir / "clientkey.pem", layout.pki_dir / "ca.key"]
    keys += [layout.host_dir(i) / "etc" / "pki" / "serverkey.pem" for i in range(3)]
    assert all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)
    doc = tomllib.loads(tls3.cluster_file.read_text())
    assert doc["pki"] == str(layout.pki_dir) and doc["migration_tls"] is True


def test_a_move_arrives_through_the_destinations_address_and_runs_there(tls3: Lab,
                                                                          two_on_h0: tuple[str, str]) -> None:
    done = run("adapt", "--cluster", tls3.cluster_file, "--budget", "128MiB", "--apply", "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["apply"]["ok"], doc["apply"]
    move = next(s for s in doc["plan"]["steps"] if s["op"] == "migrate")
    assert copies(tls3, move["vm"]) == [(move["to"], "running")]  # resumed there, gone from h0
    stay = next(n for n in two_on_h0 if n != move["vm"])
    assert copies(tls3, stay) == [("h0", "running")]


def test_a_host_drains_over_tls_and_its_vms_come_back_when_the_other_host_drains(
        tls3: Lab, two_on_h0: tuple[str, str], tmp_path: Path) -> None:
    """Maintenance over TLS, both ways: with h2 cordoned, draining h0 sends both VMs to h1 through h1's address,
    and once h0 is back in service, draining h1 sends them back to h0 through h0's address."""
    cf = tmp_path / "cluster.toml"
    cf.write_text(tls3.cluster_file.read_text())  # cordons are written into the file: a copy of this test's own
    assert run("cordon", "h2", "--cluster", cf).exit_code == 0
    for source, target in (("h0", "h1"), ("h1", "h0")):
        r = run("drain", source, "--cluster", cf, "--budget", "unlimited", "--parallel", "2", "--apply", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["complete"]
        for n in two_on_h0:
            assert copies(tls3, n) == [(target, "running")], (source, n)
        assert run("uncordon", source, "--cluster", cf).exit_code == 0


def test_a_wrong_address_fails_the_step_and_the_vm_keeps_running_on_its_source(
        tls3: Lab, two_on_h0: tuple[str, str], tmp_path: Path) -> None:
    layout = LabLayout(tls3.dir)
    swapped = variant(tls3, tmp_path, "swapped", addresses={"h1": layout.address(2), "h2": layout.address(1)})
    r = run("adapt", "--cluster", swapped, "--budget", "128MiB", "--apply", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert not doc["apply"]["ok"]
    said = json.dumps(doc["apply"])
    assert "keeps running on h0" in said, said
    for n in two_on_h0:
        assert copies(tls3, n) == [("h0", "running")]


def test_a_client_certificate_from_another_ca_is_refused_and_hosts_show_down_with_libvirts_reason(
        tls3: Lab, tmp_path: Path) -> None:
    foreign = make_foreign_client(tmp_path / "foreign", LabLayout(tls3.dir).pki_dir / "cacert.pem")
    p = variant(tls3, tmp_path, "foreign", top="host_timeout = 10", pki=foreign)
    r = run("status", "--cluster", p, "--sample", "0", "--json")
    assert r.exit_code == 1, r.output  # every host down
    hosts = json.loads(r.stdout)["hosts"]
    assert all(h["down"] for h in hosts)
    reasons = [h["down"] for h in hosts]
    assert all("TLS" in why or "certificate" in why for why in reasons), reasons
    assert "Traceback" not in r.output


def test_a_hung_host_is_down_within_host_timeout_and_place_plans_onto_the_others(tls3: Lab, tmp_path: Path) -> None:
    layout = LabLayout(tls3.dir)
    p = variant(tls3, tmp_path, "quick", top="host_timeout = 3")
    request = tmp_path / "hung.toml"
    request.write_text('name = "hung"\nvms = 2\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.2\n')
    pid = daemon_pid(layout, 2, "libvirtd")
    assert pid is not None

    def status() -> tuple[subprocess.CompletedProcess[str], float]:
        t0 = time.monotonic()
        proc = subprocess.run([VCSCHED, "status", "--cluster", str(p), "--sample", "0", "--json"],
                              capture_output=True, text=True, timeout=60, check=False)
        return proc, time.monotonic() - t0

    # The same command with every host answering, just before: what starting Python and reading the hosts cost
    # on this machine now (it is loaded by other tests), so the bound below is on what the hung host adds.
    _, usual = status()
    os.kill(pid, signal.SIGSTOP)
    try:
        proc, took = status()
        assert proc.returncode == 0, proc.stderr
        hosts = {h["name"]: h for h in json.loads(proc.stdout)["hosts"]}
        assert "did not answer within 3 s" in hosts["h2"]["down"]
        assert hosts["h0"]["down"] is None and hosts["h1"]["down"] is None
        assert took <= usual + 3 + 1, f"status took {took:.2f} s with host_timeout 3 ({usual:.2f} s with none hung)"
        r = run("place", request, "--cluster", p, "--json")
        assert r.exit_code == 0, r.output
        assert {v["host"] for v in json.loads(r.stdout)["plan"]["predicted"]["per_vm"].values()} <= {"h0", "h1"}
    finally:
        os.kill(pid, signal.SIGCONT)
    r = run("status", "--cluster", p, "--sample", "0", "--json")
    assert r.exit_code == 0 and all(h["down"] is None for h in json.loads(r.stdout)["hosts"]), r.output


#: Seconds the copies must stay unchanged after a hung destination is continued before the watch ends.
QUIET = 3.0


def late_enough(dom: Any, phase: str) -> bool:
    """Whether the source's migration job has reached ``phase``: "started", or "late" (as much memory sent as is
    left to send: a guest's untouched pages are zero and never sent, so "half of its RAM" may never come)."""
    import libvirt

    stats = dom.jobStats(0)
    if stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE) == libvirt.VIR_DOMAIN_JOB_NONE:
        return False
    if phase == "started":
        return True
    done, left = stats.get("memory_processed", 0), stats.get("memory_remaining", 0)
    return bool(done) and done >= left


@pytest.mark.parametrize("phase", ["started", "late"])
def test_a_destination_that_hangs_mid_migration_never_leaves_two_running_copies(tls3: Lab, tmp_path: Path,
                                                                                phase: str) -> None:
    import libvirt

    from hypervisor.base import HypervisorError
    from tests.lab_support import start_lab_guest

    layout = LabLayout(tls3.dir)
    p = variant(tls3, tmp_path, "quick", top="host_timeout = 3")
    c = cluster_of(p)
    name = start_lab_guest(tls3, host=0, name=f"dbt{uuid.uuid4().hex[:6]}").name()
    src = libvirt.open(layout.uri(0))
    try:
        dom = src.lookupByName(name)
        meta = ('<vcsched:vm xmlns:vcsched="https://vcsched.dev/xmlns/vm/1" cluster="dbt" cpu_need_cores="0.5" '
                f'memory_bytes="{128 * MIB}" vcpus="1"/>')
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, meta.replace(
            ' xmlns:vcsched="https://vcsched.dev/xmlns/vm/1"', "").replace("vcsched:vm", "vm"), "vcsched",
            "https://vcsched.dev/xmlns/vm/1", libvirt.VIR_DOMAIN_AFFECT_LIVE)
        # Slow the move down (libvirt keeps the speed for the domain's next migration), so that each phase lasts
        # long enough to be caught by the polls below.
        dom.migrateSetMaxSpeed(16, 0)  # MiB/s: about 60 MB to send, some 4 s
        pid = daemon_pid(layout, 1, "libvirtd")
        assert pid is not None
        failure: list[BaseException] = []

        def migrate() -> None:
            try:
                with LibvirtHypervisor(c) as hv:
                    hv.migrate_vm(name, "h0", "h1", 0.5)
            except BaseException as exc:
                failure.append(exc)

        t = threading.Thread(target=migrate)
        t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not late_enough(dom, phase) and t.is_alive():
            time.sleep(0.01)
        if not t.is_alive():
            skip_or_fail(f"the migration finished before it reached phase {phase!r}: nothing to interrupt")
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            t.join(60)
            assert not t.is_alive()
            assert failure and isinstance(failure[0], HypervisorError), failure
            report = str(failure[0])
            assert "cannot migrate" in report and "h0" in report
            assert dom.state(0)[0] == libvirt.VIR_DOMAIN_RUNNING  # the source copy runs
        finally:
            os.kill(pid, signal.SIGCONT)
        # The destination catches up: it must never run its copy too.  Only the source's Finish could resume that
        # copy, and what the destination had queued is handled as soon as it runs again: watched until the copies
        # have not changed for QUIET s (the destination has answered and settled), at most 10 s.
        seen = []
        until, settled = time.monotonic() + 10, time.monotonic() + QUIET
        while time.monotonic() < min(until, settled):
            now = copies(tls3, name)
            if seen and now != seen[-1]:
                settled = time.monotonic() + QUIET
            seen.append(now)
            assert sum(st == "running" for _h, st in now) <= 1, now
            time.sleep(0.2)
        with LibvirtHypervisor(c) as hv:  # repair settles what is left (reads do not) and the move converges
            for _rerun in range(3):
                hv.repair(lambda: None)  # what `vcsched repair --apply` does under the lock
                inv = hv.inventory()
                if not inv.in_doubt:
                    break
                time.sleep(2)
            assert not inv.in_doubt, (inv.in_doubt, hv.notices)
            assert copies(tls3, name) == [("h0", "running")], (seen[-1], hv.notices)
            dom.migrateSetMaxSpeed(1024, 0)  # the slow-down was for catching a phase: the re-run need not crawl
            hv.migrate_vm(name, "h0", "h1", 0.5)
        assert copies(tls3, name) == [("h1", "running")]
        print(f"phase {phase}: stopped the destination at {stopped_at:.1f}; step said: {report}; copies after "
              f"SIGCONT: {seen[0]} ... {seen[-1]}; settled: {hv.notices}")
    finally:
        src.close()
        destroy_everywhere(tls3, name)


# ------------------------------------------------------------------ local storage: disks move with the VM


def start_with_disk(lab: Lab, host: int, name: str, vc: str, disk_mib: int) -> tuple[Path, str]:
    """A managed VM (needs 0.6 cores, capped 0.5) on ``host`` with a raw disk of random bytes in the host's
    images pool; returns the disk's path inside the namespace and its sha256."""
    import hashlib
    import xml.etree.ElementTree as ET

    import libvirt

    from hypervisor.domain_xml import domain_xml

    layout = LabLayout(lab.dir)
    images = (layout.shared_dir if lab.shared_storage else layout.host_dir(host) / "lib" / "images")
    image = images / f"{name}.img"
    image.write_bytes(os.urandom(disk_mib * MIB))
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    c = cluster_of(lab.cluster_file)
    h = c.hosts[host]
    root = ET.fromstring(domain_xml(CreateStep(name, h.name, vc, 1, 128 * MIB, 0.6, 0.5, boot_of(c)), h.partition))
    devices = root.find("devices")
    assert devices is not None
    devices.insert(0, ET.fromstring(
        f"<disk type='file' device='disk'><driver name='qemu' type='raw'/>"
        f"<source file='/var/lib/libvirt/images/{name}.img'/><target dev='vda' bus='virtio'/></disk>"))
    conn = libvirt.open(layout.uri(host))
    try:
        conn.storagePoolLookupByName("default").refresh(0)
        conn.createXML(ET.tostring(root, encoding="unicode"), 0)
    finally:
        conn.close()
    return image, digest


def sha256_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_vm_with_a_disk_moves_between_local_storages_with_its_disk_and_the_budget_counts_it(
        tls3: Lab, tmp_path: Path) -> None:
    layout = LabLayout(tls3.dir)
    tag = uuid.uuid4().hex[:6]
    names = (f"dk{tag}-0", f"dk{tag}-1")
    disk_mib = 16
    try:
        digests = {n: start_with_disk(tls3, 0, n, f"dk{tag}", disk_mib)[1] for n in names}
        st = run("status", "--cluster", tls3.cluster_file, "--sample", "0", "--json")
        assert st.exit_code == 0, st.output
        with LibvirtHypervisor(cluster_of(tls3.cluster_file)) as hv:
            disk_bytes = {v.name: v.disk_bytes for v in hv.inventory().vms if v.name in names}
        assert all(b >= disk_mib * MIB for b in disk_bytes.values()), disk_bytes
        one_move = 128 * MIB + max(disk_bytes.values())
        # The memory fits the budget, memory + disk does not: no move.
        refused = run("adapt", "--cluster", tls3.cluster_file, "--budget", str(128 * MIB + disk_mib * MIB // 2),
                      "--json")
        assert refused.exit_code in (0, 1), refused.output
        doc = json.loads(refused.stdout)
        assert not [s for s in (doc.get("plan") or {}).get("steps", []) if s["op"] == "migrate"], doc
        done = run("adapt", "--cluster", tls3.cluster_file, "--budget", str(one_move), "--apply", "--json")
        assert done.exit_code == 0, done.output
        doc = json.loads(done.stdout)
        move = next(s for s in doc["plan"]["steps"] if s["op"] == "migrate")
        assert move["bytes"] == 128 * MIB + disk_bytes[move["vm"]]  # memory + the disk, in the plan
        assert copies(tls3, move["vm"]) == [(move["to"], "running")]
        target = layout.host_dir(int(move["to"][1:])) / "lib" / "images" / f"{move['vm']}.img"
        assert sha256_of(target) == digests[move["vm"]]  # the disk arrived byte for byte
    finally:
        for n in names:
            destroy_everywhere(tls3, n)
