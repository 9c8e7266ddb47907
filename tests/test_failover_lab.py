"""`vcsched run` on a real 3-host lab: a host loses its power, its VMs run again on the survivors, once.

Two virtual clusters of 3 VMs each (spread preferred: one VM of each per host), a ``vcsched run`` daemon
leading (interval 2 s, caps only: ``--budget-per-interval 0``), ``failure_timeout = 6`` and ``host_timeout = 3``
in the cluster file.  Then every process in h1's namespace is SIGKILLed at once (its libvirtd, virtlogd and QEMU:
a power cut).  The daemon must declare h1 failed, fence it through the lab's fence agent, and create its two VMs
on h0 and h2 within ``failure_timeout`` + 15 s; each runs once (its QEMU processes, read from /proc) and none of
the other VMs changed host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.lab import Lab
from hypervisor.lab.daemons import kill_namespace
from hypervisor.lab.state import LabLayout
from tests.lab_support import running_lab, skip_unless_lab_possible
from tests.test_recover_lab import qemu_copies

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[1]
FAILURE_TIMEOUT = 6.0
BOUND = FAILURE_TIMEOUT + 15.0


@pytest.fixture(scope="module")
def lab3() -> Iterator[Lab]:
    skip_unless_lab_possible()
    with running_lab(3) as lab:
        yield lab


def events(log: Path, kind: str | None = None) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    docs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [d for d in docs if kind is None or d["event"] == kind]


def test_a_host_that_loses_its_power_has_its_vms_restarted_once_on_the_survivors(lab3: Lab, tmp_path: Path) -> None:
    text = lab3.cluster_file.read_text()
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(text.replace('name = "lab"\n', f'name = "lab"\nhost_timeout = 3\nfailure_timeout = '
                                                      f'{FAILURE_TIMEOUT:g}\n', 1))
    env = {**os.environ, "VCSCHED_STATE_DIR": str(tmp_path / "state")}
    tag = uuid.uuid4().hex[:4]
    placed: dict[str, str] = {}
    for vc in (f"a{tag}", f"b{tag}"):
        req = tmp_path / f"{vc}.toml"
        req.write_text(f'name = "{vc}"\nvms = 3\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.1\n'
                       'spread = "preferred"\n')
        r = CliRunner(env=env).invoke(cli, ["place", str(req), "--cluster", str(cluster), "--apply", "--json"])
        assert r.exit_code == 0, r.output
        placed |= {s["vm"]: s["host"] for s in json.loads(r.stdout)["plan"]["steps"] if s["op"] == "create"}
    lost = sorted(vm for vm, h in placed.items() if h == "h1")
    assert len(lost) == 2 and sorted(placed.values()).count("h1") == 2, placed
    log = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "--cluster", str(cluster), "--interval", "2",
                             "--budget-per-interval", "0", "--probe-seconds", "0", "--log", str(log)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not events(log, "interval"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        killed_at = time.time()
        kill_namespace(LabLayout(lab3.dir), 1)  # power loss
        while len(events(log, "vm_restarted")) < len(lost) and time.time() < killed_at + BOUND + 10:
            assert proc.poll() is None
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    failed, fenced, restarted = events(log, "host_failed"), events(log, "host_fenced"), events(log, "vm_restarted")
    report = "\n".join(json.dumps(e) for e in events(log) if e["event"] not in ("observe", "interval"))
    assert [e["host"] for e in failed] == ["h1"], report
    assert fenced and fenced[0]["fenced"], report
    assert sorted(e["vm"] for e in restarted) == lost, report
    took = {e["vm"]: e["time"] - killed_at for e in restarted}
    print(f"power loss to running again: {took} (failure_timeout {FAILURE_TIMEOUT:g} s)")
    assert all(t <= BOUND for t in took.values()), (took, report)
    assert failed[0]["time"] <= fenced[0]["time"] <= min(e["time"] for e in restarted)
    for vm in lost:
        copies = qemu_copies(lab3, vm)
        assert len(copies) == 1 and copies[0] != "h1", (vm, copies)
    for vm, h in placed.items():
        if vm not in lost:
            assert qemu_copies(lab3, vm) == [h], "the others did not change host"
