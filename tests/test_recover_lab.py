"""Power loss on a real lab host, then ``vcsched recover HOST --apply``: its VMs run again, once, on the survivors.

The lab's fence agent (lab/fence_agent.py) is the one ``lab up`` names in the cluster file, so the
ClusterLabs interface is used end to end: the host is "powered off" (SIGKILL of its libvirtd, virtlogd and QEMU
processes) before the recovery, and recover's own fencing finds it off.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import lab as labmod
from acting.definitions import DefinitionStore
from acting.lock import resolve_url
from cli.main import cli
from lab import Lab
from lab.daemons import kill_namespace, namespace_holders
from lab.state import LabLayout
from tests.lab_support import running_lab, skip_unless_lab_possible

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    skip_unless_lab_possible()
    state = tmp_path_factory.mktemp("recover-state")
    old = os.environ.get("VCSCHED_STATE_DIR")
    os.environ["VCSCHED_STATE_DIR"] = str(state)
    try:
        with running_lab(3) as lab:
            yield lab
    finally:
        if old is None:
            os.environ.pop("VCSCHED_STATE_DIR", None)
        else:
            os.environ["VCSCHED_STATE_DIR"] = old


def run(*args: object) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def qemu_hosts(lab: Lab) -> dict[str, list[str]]:
    """For every QEMU process in a lab host's namespace (read from /proc, not from libvirt): VM -> its hosts."""
    layout = LabLayout(lab.dir)
    found: dict[str, list[str]] = {}
    for i, h in enumerate(lab.hosts):
        for pid in namespace_holders(layout, i):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not cmd[0].endswith(b"qemu-system-x86_64"):
                continue
            for arg in cmd:
                if arg.startswith(b"guest="):
                    found.setdefault(arg[len(b"guest="):].split(b",")[0].decode(), []).append(h.name)
    return found


def qemu_copies(lab: Lab, vm: str) -> list[str]:
    """The lab hosts whose namespace runs a QEMU process of ``vm``."""
    return qemu_hosts(lab).get(vm, [])


def test_after_power_loss_recover_runs_the_hosts_vms_once_on_the_survivors(lab3: Lab, tmp_path: Path) -> None:
    name = f"r{uuid.uuid4().hex[:5]}"
    req = tmp_path / "req.toml"
    req.write_text(f'name = "{name}"\nvms = 4\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.3\n')
    placed = run("place", req, "--cluster", lab3.cluster_file, "--apply", "--json")
    assert placed.exit_code == 0, placed.output  # type: ignore[attr-defined]
    hosts = {s["vm"]: s["host"] for s in json.loads(placed.stdout)["plan"]["steps"]}  # type: ignore[attr-defined]
    victim = max(set(hosts.values()), key=lambda h: (list(hosts.values()).count(h), h))
    lost = sorted(vm for vm, h in hosts.items() if h == victim)
    kept = {vm: h for vm, h in hosts.items() if h != victim}
    assert all(qemu_copies(lab3, vm) == [victim] for vm in lost)

    kill_namespace(LabLayout(lab3.dir), int(victim[1:]))  # power loss: libvirtd, virtlogd and QEMU gone at once

    dry = run("recover", victim, "--cluster", lab3.cluster_file, "--json")
    assert dry.exit_code == 0, dry.output  # type: ignore[attr-defined]
    assert sorted(r["vm"] for r in json.loads(dry.stdout)["recovery"]["restarts"]) == lost  # type: ignore[attr-defined]
    t0 = time.monotonic()
    done = run("recover", victim, "--cluster", lab3.cluster_file, "--apply", "--json")
    seconds = time.monotonic() - t0
    assert done.exit_code == 0, done.output  # type: ignore[attr-defined]
    doc = json.loads(done.stdout)  # type: ignore[attr-defined]
    assert doc["fence"]["fenced"] and doc["apply"]["ok"], doc
    print(f"recover --apply of {len(lost)} VMs: {seconds:.2f} s (fencing {doc['fence']['seconds']} s)")

    shown = run("status", "--cluster", lab3.cluster_file, "--sample", 0, "--json")
    status = json.loads(shown.stdout)  # type: ignore[attr-defined]
    where = {v["name"]: v["host"] for v in status["vms"] if v["active"]}
    for vm in lost:
        copies = qemu_copies(lab3, vm)
        assert len(copies) == 1 and copies[0] != victim and where[vm] == copies[0], (vm, copies)
    for vm, h in kept.items():
        assert where[vm] == h and qemu_copies(lab3, vm) == [h], "the others did not move"
    assert kept, "the request spread over at least two hosts (0.3 cores each: at most 3 per 1-core host)"
    again = run("recover", victim, "--cluster", lab3.cluster_file, "--apply", "--json")
    assert again.exit_code == 0, again.output  # type: ignore[attr-defined]
    redo = json.loads(again.stdout)["recovery"]  # type: ignore[attr-defined]
    assert redo["restarts"] == [] and redo["stranded"] == [], "the records moved with the VMs: nothing to redo"


# --- issue 37's measurement 1: floors, on_failure, lost VMs and `vcsched restart` ---------------------------
# Issue 37's measurement 1 on a real 3-host lab: a host's libvirtd stops, ``recover --apply`` fences it and
# runs every VM it had exactly once — one below its floor when the survivors cannot meet it (``on_failure =
# "restart"``), or, with ``on_failure = "strand"``, that VM listed lost until ``vcsched restart VM --apply``.
#
# The layout: ``big`` (one VM needing 0.9 of a core, ``min_yield`` 0.9) on one host, ``db`` (two VMs needing 0.6,
# ``spread``, ``min_yield`` 0.5) on the other two, ``batch`` (two VMs of 0.1, no floor, spread) beside them.  When a
# db host fails, its db VM can only go to big's host (spread), where the floors (0.81 + 0.3 cores) do not fit one
# core; its batch VM restarts anyway.  A recovery that restarts nothing does not fence (the VMs may still run on
# the host), so batch is what makes the strand case fence, as in the issue (batch-0 beside db-1).


def cluster_file(lab: Lab, tmp_path: Path, on_failure: str) -> Path:
    """The lab's cluster file with ``on_failure`` and a short ``host_timeout`` (a stopped libvirtd costs one
    host_timeout per read)."""
    path = tmp_path / "cluster.toml"
    path.write_text(f'on_failure = "{on_failure}"\nhost_timeout = 3\n' + lab.cluster_file.read_text())
    return path


def place(tmp_path: Path, cluster: Path, name: str, body: str) -> dict[str, str]:
    req = tmp_path / f"{name}.toml"
    req.write_text(f'name = "{name}"\nvcpus = 1\nmemory = "128MiB"\n{body}')
    placed = run("place", req, "--cluster", cluster, "--apply", "--json")
    assert placed.exit_code == 0, placed.output  # type: ignore[attr-defined]
    return {s["vm"]: s["host"] for s in json.loads(placed.stdout)["plan"]["steps"]  # type: ignore[attr-defined]
            if s["op"] == "create"}


@pytest.fixture
def layout(lab3: Lab, tmp_path: Path) -> Iterator[tuple[Path, str, str, str]]:
    """big on one host, db's two VMs on the others; yields (cluster file, the db VM whose host fails, that
    host, big's host).  Afterwards the failed host is brought back (`lab up` repairs it) and the VMs placed
    here are destroyed and forgotten, so that the next test starts from an empty lab."""
    labmod.up(3, lab3.dir)  # a test before may have killed a host: repaired (the others keep their guests) ...
    recorded = DefinitionStore.for_url(resolve_url(None, None), "lab").all()
    forget(lab3, [*recorded, *(name for h in labmod.status(lab3.dir).hosts for name in h.domains)])  # ... emptied
    tag = uuid.uuid4().hex[:4]
    plain = cluster_file(lab3, tmp_path, "restart")
    big = place(tmp_path, plain, f"big{tag}", "vms = 1\ncpu_cores = 0.9\nmin_yield = 0.9\n")
    db = place(tmp_path, plain, f"db{tag}", 'vms = 2\ncpu_cores = 0.6\nmin_yield = 0.5\nspread = "required"\n')
    # A VM without a floor beside one of them, so that the failed host has a VM that restarts whatever
    # on_failure says (and is fenced for it); spread: its two VMs on two hosts, one of them a db host.
    batch = place(tmp_path, plain, f"batch{tag}", 'vms = 2\ncpu_cores = 0.1\nspread = "required"\n')
    (big_host,) = big.values()
    assert big_host not in db.values() and len(set(db.values())) == 2, (big, db)
    vm = min(v for v, h in db.items() if h in batch.values())
    try:
        yield plain, vm, db[vm], big_host
    finally:
        pid = int(LabLayout(lab3.dir).pid_file(int(db[vm][1:]), "libvirtd").read_text())
        with contextlib.suppress(ProcessLookupError):  # a test that failed before the fence
            os.kill(pid, signal.SIGCONT)
        labmod.up(3, lab3.dir)  # the fenced host's daemons again (a repair: the others keep their guests)
        forget(lab3, [*big, *db, *batch])


def forget(lab: Lab, vms: list[str]) -> None:
    import libvirt

    layout = LabLayout(lab.dir)
    for i, _ in enumerate(lab.hosts):
        conn = libvirt.open(layout.uri(i))
        try:
            for d in conn.listAllDomains(0):
                if d.name() in vms:
                    d.destroy()
        finally:
            conn.close()
    store = DefinitionStore.for_url(resolve_url(None, None), "lab")
    for vm in vms:
        store.delete(vm)


def stop_libvirtd(lab: Lab, host: str) -> None:
    """kill -STOP the host's libvirtd: it stops answering, its guests run on (a partition, not a power loss)."""
    pid = int(LabLayout(lab.dir).pid_file(int(host[1:]), "libvirtd").read_text())
    os.kill(pid, signal.SIGSTOP)


def test_restart_runs_every_vm_of_the_failed_host_once_one_below_its_floor(
        lab3: Lab, tmp_path: Path, layout: tuple[Path, str, str, str]) -> None:
    cluster, vm, victim, big_host = layout
    stop_libvirtd(lab3, victim)
    dry = run("recover", victim, "--cluster", cluster, "--json")
    assert dry.exit_code == 0, dry.output  # type: ignore[attr-defined]
    planned = json.loads(dry.stdout)  # type: ignore[attr-defined]
    restarts = {r["vm"]: r["host"] for r in planned["recovery"]["restarts"]}
    assert restarts[vm] == big_host and len(restarts) == 2 and not planned["recovery"]["stranded"], planned
    done = run("recover", victim, "--cluster", cluster, "--apply", "--json")
    assert done.exit_code == 0, done.output  # type: ignore[attr-defined]
    doc = json.loads(done.stdout)  # type: ignore[attr-defined]
    assert doc["fence"]["fenced"] and doc["apply"]["ok"], doc
    assert doc["plan"]["steps"] == planned["plan"]["steps"], "the dry run and --apply plan the same thing"
    below = {b["vm"]: b for b in doc["recovery"]["below_floor"]}
    assert vm in below and below[vm]["yield"] < 0.5 and below[vm]["min_yield"] == 0.5, below
    print(f"{vm} restarted on {big_host} at yield {below[vm]['yield']:.3f} (floor 0.5)")
    running = qemu_hosts(lab3)
    assert all(running.get(v) == [h] for v, h in restarts.items()), (running, restarts)  # each once, where planned
    status = json.loads(run("status", "--cluster", cluster, "--sample", 0, "--json").stdout)  # type: ignore[attr-defined]
    assert status["lost"] == []


def test_strand_lists_the_vm_lost_until_restart_runs_it_once(
        lab3: Lab, tmp_path: Path, layout: tuple[Path, str, str, str]) -> None:
    _, vm, victim, big_host = layout
    (tmp_path / "strand").mkdir()
    strand = cluster_file(lab3, tmp_path / "strand", "strand")
    stop_libvirtd(lab3, victim)
    done = run("recover", victim, "--cluster", strand, "--apply", "--json")
    assert done.exit_code == 1, done.output  # type: ignore[attr-defined]
    doc = json.loads(done.stdout)  # type: ignore[attr-defined]
    assert doc["fence"]["fenced"] and [s["vm"] for s in doc["recovery"]["stranded"]] == [vm], doc
    assert "CPU at the virtual clusters' floors" in doc["recovery"]["stranded"][0]["reason"]
    assert vm not in qemu_hosts(lab3)
    status = json.loads(run("status", "--cluster", strand, "--sample", 0, "--json").stdout)  # type: ignore[attr-defined]
    (lost,) = status["lost"]
    assert lost["vm"] == vm and lost["host"] == victim and lost["why"] == "host fenced, not restarted", lost
    again = run("restart", vm, "--cluster", strand, "--apply", "--json")
    assert again.exit_code == 0, again.output  # type: ignore[attr-defined]
    assert json.loads(again.stdout)["apply"]["ok"]  # type: ignore[attr-defined]
    assert qemu_hosts(lab3).get(vm) == [big_host], "runs once"
    status = json.loads(run("status", "--cluster", strand, "--sample", 0, "--json").stdout)  # type: ignore[attr-defined]
    assert status["lost"] == []
