"""Plan safety on real libvirt: rounded caps after adapt, VMs arriving capped, a host down and repaired, and two
operators placing at once — never a host over its cores or memory.

The shared ``lab2`` serves the cap tests; the tests that kill daemons or race
two commands get a 3-host lab of their own (``lab3``), so nothing they break
reaches the other lab tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
from lab import Lab, up
from lab.daemons import daemon_pid
from lab.state import LabLayout
from tests.lab_support import (
    LAB_TRANSPORT,
    destroy_everywhere,
    running_lab,
    skip_unless_lab_possible,
)
from vcsched.formats.cluster import Cluster, cluster_from_dict

pytestmark = pytest.mark.lab
ROOT = Path(__file__).resolve().parents[1]


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def cluster_of(lab: Lab) -> Cluster:
    return cluster_from_dict(tomllib.loads(lab.cluster_file.read_text()))


def request_file(d: Path, name: str, vms: int, cores: float) -> Path:
    p = d / f"{name}.toml"
    p.write_text(f'name = "{name}"\nvms = {vms}\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = {cores}\n')
    return p


def over_committed(lab: Lab) -> list[str]:
    """Every host whose running VMs' caps (an uncapped VM: its vCPUs) or memory exceed it, read from libvirt."""
    with LibvirtHypervisor(cluster_of(lab)) as hv:
        inv = hv.inventory()
    problems = []
    for h in inv.hosts:
        on = [v for v in inv.vms if v.host == h.name and v.active]
        caps = sum(v.cap_or_vcpus for v in on if v.managed)
        mem = sum(v.memory_bytes for v in on)
        if caps > h.cores + 1e-9:
            problems.append(f"{h.name}: caps {caps:.5f} > {h.cores} cores")
        if mem > h.usable_memory:
            problems.append(f"{h.name}: memory {mem} > {h.usable_memory}")
    return problems


# ---------------------------------------------------------------------------------------- on lab2


def test_admission_after_adapt_places_onto_a_full_host(lab2: Lab, tmp_path: Path) -> None:
    """The sequence that was refused as bad input: after an adapt left caps such as 0.6087 and 0.3913 on full
    1-core hosts, a small request landing on one of them got "no order of the remaining steps ..." (exit 2)."""
    tag = uuid.uuid4().hex[:4]
    a, b, c = f"a{tag}", f"b{tag}", f"c{tag}"
    vms = [f"{a}-0", f"{a}-1", f"{b}-0", f"{b}-1", f"{c}-0"]
    try:
        for name, n, cores in ((a, 2, 0.7), (b, 2, 0.45)):
            req = request_file(tmp_path, name, n, cores)
            r = run("place", req, "--cluster", lab2.cluster_file, "--apply", "--json")
            assert r.exit_code == 0, r.output
        r = run("adapt", "--cluster", lab2.cluster_file, "--budget", "0", "--set-need", f"{b}-0=0.2", "--apply")
        assert r.exit_code == 0, r.output
        r = run("place", request_file(tmp_path, c, 1, 0.2), "--cluster", lab2.cluster_file, "--apply", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["applied"]["ok"]
        assert over_committed(lab2) == []
    finally:
        for vm in vms:
            destroy_everywhere(lab2, vm)


def test_a_migrated_vm_arrives_with_its_destination_cap(lab2: Lab) -> None:
    from tests.lab_support import lab_guest
    from vcsched.formats.cluster import ClusterHost  # noqa: F401  (the cluster file describes both hosts)
    from vcsched.inventory import VmMeta

    cluster = cluster_of(lab2)
    with lab_guest(lab2, host=0) as dom, LibvirtHypervisor(cluster) as hv:
        import libvirt

        from hypervisor.domain_xml import metadata_xml
        from vcsched.inventory import METADATA_NS, METADATA_PREFIX

        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                        metadata_xml(VmMeta("arrive", 0.9, 128 << 20, 1), bare=True), METADATA_PREFIX, METADATA_NS,
                        libvirt.VIR_DOMAIN_AFFECT_LIVE)
        hv.set_cap("h0", dom.name(), 0.9)
        hv.migrate_vm(dom.name(), "h0", "h1", 0.2)
        assert hv.read_cap("h1", dom.name()) == pytest.approx(0.2, abs=1e-9)  # no set_cap after the move


def test_an_inventory_read_by_another_process_during_a_migration_never_removes_a_copy(lab2: Lab) -> None:
    """Another vcsched (an operator's `status`, the controller's sampler) reads the inventory every 0.1 s while
    a VM migrates back and forth three times.  Its snapshot can show the source running and the arriving copy
    paused, which is what a stale copy left by a failed migration also looks like; before the copies were
    re-read right before removal, such a reader destroyed the arrival after the source had gone (3 of 3 VMs
    lost here), so the VM must still run, once, after every move."""
    import threading

    from tests.lab_support import lab_guest
    from vcsched.inventory import VmMeta

    cluster = cluster_of(lab2)
    stop = threading.Event()
    errors: list[str] = []

    def reader() -> None:
        with LibvirtHypervisor(cluster) as other:
            while not stop.wait(0.1):
                try:
                    other.inventory()
                except Exception as exc:  # a read racing the migration may fail; it must never remove anything
                    errors.append(str(exc))

    with lab_guest(lab2, host=0) as dom, LibvirtHypervisor(cluster) as hv:
        import libvirt

        from hypervisor.domain_xml import metadata_xml
        from vcsched.inventory import METADATA_NS, METADATA_PREFIX

        name = dom.name()
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata_xml(VmMeta("race", 0.3, 128 << 20, 1), bare=True),
                        METADATA_PREFIX, METADATA_NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        try:
            for src, dst in (("h0", "h1"), ("h1", "h0"), ("h0", "h1")):
                hv.migrate_vm(name, src, dst, 0.3)
                copies = [(v.host, v.active) for v in hv.inventory().vms if v.name == name]
                assert copies == [(dst, True)], (src, dst, copies)
        finally:
            stop.set()
            thread.join()


# ---------------------------------------------------------------------------------------- own 3-host lab


@pytest.fixture(scope="module")
def lab3() -> Iterator[Lab]:
    skip_unless_lab_possible()
    with running_lab(3, LAB_TRANSPORT) as lab:
        yield lab


def test_a_host_down_is_reported_planned_around_and_repaired_keeping_its_guests(lab3: Lab, tmp_path: Path) -> None:
    from tests.lab_support import start_lab_guest

    guest = start_lab_guest(lab3, host=2).name()  # booted: a guest libvirtd had finished starting
    layout = LabLayout(lab3.dir)
    pid = daemon_pid(layout, 2, "libvirtd")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    try:
        start = time.monotonic()
        r = run("status", "--cluster", lab3.cluster_file, "--sample", "0", "--json")
        assert r.exit_code == 0, r.output
        hosts = {h["name"]: h for h in json.loads(r.stdout)["hosts"]}
        assert hosts["h2"]["down"] and hosts["h0"]["down"] is None and time.monotonic() - start < 30
        r = run("place", request_file(tmp_path, "dn", 3, 0.2), "--cluster", lab3.cluster_file, "--json")
        assert r.exit_code == 0, r.output
        assert {p["host"] for p in json.loads(r.stdout)["plan"]["predicted"]["per_vm"].values()} <= {"h0", "h1"}
    finally:
        repaired = up(3, lab3.dir, transport=LAB_TRANSPORT)  # `lab up` on the running lab: repair, not recreate
    assert repaired.repaired == ("h2",)
    import libvirt

    conn = libvirt.open(lab3.hosts[2].connect_uri)
    try:
        assert conn.lookupByName(guest).isActive()  # the guest outlived its libvirtd and was taken over
    finally:
        conn.close()
    destroy_everywhere(lab3, guest)


#: Runs ``vcsched ARGS`` with a barrier right before the cluster lock is taken: each process touches a file in
#: DIR and waits until N files are there, so two commands reach the lock within milliseconds of each other and
#: every trial is a real race (without it, interpreter start-up alone spread them by up to a second, and 20 trials
#: were needed to hope for a few close calls).  ``nolock`` makes the lock a no-op: the control run.
RACE = r"""
import os, sys, time
from pathlib import Path
from acting import lock

barrier, n, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
real = lock.ClusterLock.acquire

def at_the_barrier(self, wait=0.0):
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.iterdir())) < n and time.monotonic() < deadline:
        time.sleep(0.002)
    if mode != "nolock":
        real(self, wait)

lock.ClusterLock.acquire = at_the_barrier
if mode == "nolock":
    lock.ClusterLock.release = lambda self: None
    lock.ClusterLock.guard = lambda self: None
sys.argv = ["vcsched", *sys.argv[4:]]
from cli.main import main
main()
"""


def place_at_once(lab: Lab, tmp_path: Path, env: dict[str, str], names: list[str],
                  mode: str = "lock") -> list[tuple[int, str, str]]:
    """``place --apply`` of one 0.6-core VM per name, all released together at the lock; (rc, out, err) each."""
    barrier = tmp_path / f"barrier-{uuid.uuid4().hex[:6]}"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(barrier), str(len(names)), mode, "place",
                               str(request_file(tmp_path, n, 1, 0.6)), "--cluster", str(lab.cluster_file),
                               "--apply", "--wait", "120"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in names]
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def test_without_the_lock_two_operators_placing_at_once_collide(lab3: Lab, tmp_path: Path) -> None:
    """The control: with the lock made a no-op, the same race makes both place onto the same empty host, so at
    least one command fails its step or a host is over-committed.  It shows that the trials below are races
    the lock has to win, not runs that never overlapped."""
    names = [f"nl{uuid.uuid4().hex[:4]}" for _ in range(2)]
    env = {**os.environ, "VCSCHED_COORDINATION": f"file://{tmp_path / 'locks'}"}
    try:
        outs = place_at_once(lab3, tmp_path, env, names, mode="nolock")
        problems = over_committed(lab3)
        failed = [rc for rc, _out, _err in outs if rc != 0]
        assert failed or problems, outs
    finally:
        for n in names:
            destroy_everywhere(lab3, f"{n}-0")


@pytest.mark.parametrize("backend", ["file", "etcd"])
def test_two_operators_placing_at_once_never_over_commit_a_host(lab3: Lab, tmp_path: Path, backend: str,
                                                                request: pytest.FixtureRequest) -> None:
    """Three trials of two `place --apply` released together at the lock: each request alone would take a whole
    1-core host at 0.6 cores, so without the lock both land on the same empty host (the control above).  Each
    command is its own process, so each has its own member id (user@host:pid)."""
    url = request.getfixturevalue("etcd").url if backend == "etcd" else f"file://{tmp_path / 'locks'}"
    env = {**os.environ, "VCSCHED_COORDINATION": url}
    for trial in range(3):
        names = [f"r{trial}x{uuid.uuid4().hex[:4]}" for _ in range(2)]
        try:
            outs = place_at_once(lab3, tmp_path, env, names)
            for rc, out, err in outs:
                assert rc == 0, (trial, out, err)
            problems = over_committed(lab3)
            assert problems == [], (trial, problems)
        finally:
            for n in names:
                destroy_everywhere(lab3, f"{n}-0")
