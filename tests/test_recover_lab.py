"""Power loss on a real lab host, then ``vcsched recover HOST --apply``: its VMs run again, once, on the survivors.

The lab's fence agent (lab/fence_agent.py) is the one ``lab up`` names in the cluster file, so the
ClusterLabs interface is used end to end: the host is "powered off" (SIGKILL of its libvirtd, virtlogd and QEMU
processes) before the recovery, and recover's own fencing finds it off.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

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
