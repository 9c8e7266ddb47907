"""Migration throttles on the real lab (one shared 2-host lab, tiny unbooted guests, libvirt's job info polled).

* ``max_migrations_per_host = 1``: a drain of h0 holding three VMs, planned as one wave (``--parallel 3``), never
  has more than one migration out of h0 at once — counted from libvirt's ``jobStats`` of h0's domains every
  20 ms, not from vcsched's own report — and at least one is seen;
* a migration slowed to 1 MiB/s (``migration_bandwidth``) is aborted once it has run past
  ``migration_timeout_per_gib`` × its GiB; it keeps running once, on its source, and `status`'s reading lists it
  in flight before the abort.
"""

from __future__ import annotations

import json
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
from tests.lab_support import copies, destroy_everywhere
from vcsched.formats.cluster import Cluster, cluster_from_dict
from vcsched.plans.steps import Boot, CreateStep

pytestmark = pytest.mark.lab

MIB = 1 << 20


def throttled_file(lab: Lab, tmp_path: Path, lines: str) -> Path:
    """A copy of the lab's cluster file with ``lines`` of throttles on top (drain cordons in the copy only)."""
    path = tmp_path / "cluster.toml"
    path.write_text(lines + "\n" + lab.cluster_file.read_text())
    return path


def create_on_h0(cluster: Cluster, names: list[str], need: float) -> None:
    g = cluster.guest
    assert g is not None
    boot = Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=g.cmdline, domain_type=g.domain_type)
    with LibvirtHypervisor(cluster) as hv:
        for n in names:
            hv.create_vm(CreateStep(n, "h0", n.rsplit("-", 1)[0], 1, 128 * MIB, need, need, boot))


@pytest.fixture
def vms(lab2: Lab) -> Iterator[list[str]]:
    """Names for this test's VMs (destroyed wherever they are afterwards)."""
    names: list[str] = []
    yield names
    for n in names:
        destroy_everywhere(lab2, n)


class JobPoller:
    """Counts h0's domains with an outgoing migration job, every 20 ms, on a connection of its own."""

    def __init__(self, uri: str, names: list[str]) -> None:
        import libvirt

        self.conn = libvirt.open(uri)
        self.names = set(names)
        self.most = 0
        self.seen = 0  # polls that saw at least one
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def out_now(self) -> int:
        import libvirt

        n = 0
        for d in self.conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            if d.name() not in self.names:
                continue
            try:
                stats = d.jobStats(0)
            except libvirt.libvirtError:
                continue  # gone meanwhile
            if stats.get("type", 0) != libvirt.VIR_DOMAIN_JOB_NONE and \
                    stats.get("operation") == libvirt.VIR_DOMAIN_JOB_OPERATION_MIGRATION_OUT:
                n += 1
        return n

    def run(self) -> None:
        while not self.stop.wait(0.02):
            n = self.out_now()
            self.most = max(self.most, n)
            self.seen += n > 0

    def __enter__(self) -> JobPoller:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.conn.close()


def test_one_migration_per_host_drains_three_vms_one_at_a_time(lab2: Lab, tmp_path: Path, vms: list[str]) -> None:
    path = throttled_file(lab2, tmp_path, "max_migrations_per_host = 1")
    cluster = cluster_from_dict(tomllib.loads(path.read_text()))
    tag = uuid.uuid4().hex[:6]
    vms += [f"th{tag}-{i}" for i in range(3)]
    create_on_h0(cluster, vms, 0.2)
    dry = CliRunner().invoke(cli, ["drain", "h0", "--cluster", str(path), "--budget", "unlimited", "--parallel", "3",
                                   "--json"])
    assert dry.exit_code == 0, dry.output
    waves = [s["wave"] for s in json.loads(dry.stdout)["plan"]["steps"] if s["op"] == "migrate"]
    assert sorted(waves) == [1, 1, 1]  # planned as one wave: only the throttle keeps them apart
    reasons = [r["reason"] for r in json.loads(dry.stdout)["reasons"] if r["op"] == "migrate"]
    assert len(reasons) == 3 and all("must leave h0, which is being drained" in r for r in reasons)
    with JobPoller(lab2.hosts[0].connect_uri, vms) as poller:
        done = CliRunner().invoke(cli, ["drain", "h0", "--cluster", str(path), "--budget", "unlimited",
                                        "--parallel", "3", "--apply", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["apply"]["ok"]
    assert poller.seen > 0, "no migration job was ever seen: the poll proves nothing"
    assert poller.most == 1, f"{poller.most} migrations out of h0 at once"
    assert all(copies(lab2, n) == [("h1", True)] for n in vms)


def test_a_migration_past_its_timeout_is_aborted_and_the_vm_runs_once_on_its_source(
        lab2: Lab, tmp_path: Path, vms: list[str]) -> None:
    # 128 MiB is 1/8 GiB: 24 s per GiB is a 3 s timeout; at 1 MiB/s the guest's memory takes far longer.
    path = throttled_file(lab2, tmp_path, 'migration_bandwidth = "1MiB"\nmigration_timeout_per_gib = 24')
    cluster = cluster_from_dict(tomllib.loads(path.read_text()))
    vms.append(f"to{uuid.uuid4().hex[:6]}-0")
    create_on_h0(cluster, vms, 0.2)
    seen: list[dict[str, Any]] = []
    trace: list[str] = []
    reads: list[float] = []  # seconds each reading took: an arriving migration must not stall it

    def watch() -> None:  # what `vcsched status` reads, while the migration runs
        with LibvirtHypervisor(cluster) as hv:
            deadline = time.monotonic() + 20
            while not seen and time.monotonic() < deadline:
                t = time.monotonic()
                try:
                    inv = hv.inventory()
                    got = hv.migrations(inv)
                    trace.append(f"{time.monotonic() - start:.2f} {[(v.name, v.host) for v in inv.vms]} {got}")
                    reads.append(time.monotonic() - t)
                    seen.extend(m for m in got if m["vm"] == vms[0] and m["target"] is not None)
                except Exception as exc:
                    trace.append(repr(exc))
                time.sleep(0.1)

    start = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = CliRunner().invoke(cli, ["drain", "h0", "--cluster", str(path), "--budget", "unlimited", "--apply",
                                      "--json"])
    took = time.monotonic() - start
    watcher.join(25)
    assert result.exit_code == 1, result.output
    step = next(s for s in json.loads(result.stdout)["apply"]["steps"] if s["op"] == "migrate")
    assert step["outcome"] == "failed" and "timeout" in step["detail"], step
    assert step["seconds"] >= 3.0 and took < 60, (step["seconds"], took)
    assert copies(lab2, vms[0]) == [("h0", True)]  # running once, on its source; no copy left on h1
    assert seen and seen[0]["source"] == "h0" and seen[0]["target"] == "h1", "\n".join(trace)
    assert max(reads) < 2.0, "\n".join(trace)  # the migration lasted over 3 s
