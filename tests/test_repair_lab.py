"""Issue 31's hazards 1 and 2 on real libvirt: reads never act, and an arrival is never resumed while its source
may still run it.

A VM left *in doubt* by an interrupted migration is made directly with libvirt, the way libvirt leaves it: the
same domain (same UUID) running on h0 and a copy on h1 created paused (``VIR_DOMAIN_START_PAUSED``) with
vcsched's ``arriving_from`` mark — what a destination holds after libvirt's Finish with the PAUSED flag.  The
copies need not boot: a paused copy never runs, and the running one is judged by libvirt's state.

1. Two running copies: h0's libvirtd stops (SIGSTOP) and `place --apply` creates a VM on h1.  The old per-step
   re-check read only h1, found an arrival "whose source is gone" and resumed it while h0 still ran the VM.
2. Reading commands changed hosts without the lock: a `place` dry run and `observe` destroyed the paused copy,
   and `observe` resumed an orphaned arrival.  Only `repair --apply` may, and does.

These tests use the session's 2-host lab (``lab2``); the SIGSTOP is undone in a ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.domain_xml import metadata_xml, stamp_migrated_at
from hypervisor.guest import guest_xml
from lab import Lab
from lab.daemons import daemon_pid
from lab.state import LabLayout
from tests.lab_support import destroy_everywhere
from vcsched.inventory import METADATA_NS, METADATA_PREFIX, VmMeta

pytestmark = pytest.mark.lab

HOST_TIMEOUT = 2  # seconds: how long a stopped libvirtd is waited for by each read


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def copy_xml(lab: Lab, host: int, name: str, vm_uuid: str, *, arriving_from: str | None) -> str:
    """The lab guest's XML for ``host`` with ``vm_uuid``, vcsched's metadata (cap 0.2) and, for an arrival, the
    ``arriving_from`` mark; its serial console goes nowhere (two copies must not share a file)."""
    root = ET.fromstring(guest_xml(name, lab.guest, partition=lab.hosts[host].partition))
    ET.SubElement(root, "uuid").text = vm_uuid
    md = ET.SubElement(root, "metadata")
    md.append(ET.fromstring(metadata_xml(VmMeta("doubt", 0.2, 128 << 20, 1))))
    tune = ET.SubElement(root, "cputune")
    ET.SubElement(tune, "period").text = "100000"
    ET.SubElement(tune, "quota").text = "20000"
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    xml = ET.tostring(root, encoding="unicode")
    return stamp_migrated_at(xml, time.time(), arriving_from=arriving_from) if arriving_from else xml


def start(lab: Lab, host: int, xml: str, *, paused: bool) -> None:
    import libvirt

    conn = libvirt.open(lab.hosts[host].connect_uri)
    try:
        conn.createXML(xml, libvirt.VIR_DOMAIN_START_PAUSED if paused else 0)
    finally:
        conn.close()


def state_of(lab: Lab, host: int, name: str) -> str:
    """``running``, ``paused`` or ``gone``: read from that host's libvirtd directly (never through vcsched)."""
    import libvirt

    conn = libvirt.open(lab.hosts[host].connect_uri)
    try:
        dom = next((d for d in conn.listAllDomains(0) if d.name() == name), None)
        if dom is None or not dom.isActive():
            return "gone"
        return "paused" if dom.state(0)[0] == libvirt.VIR_DOMAIN_PAUSED else "running"
    finally:
        conn.close()


@contextmanager
def in_doubt(lab: Lab, *, twin: bool = True, orphan: bool = False) -> Iterator[dict[str, str]]:
    """``twin``: VM running on h0 with a paused arrival copy on h1; ``orphan``: a lone paused arrival on h1 from
    h0 (h0 has no copy: vcsched stopped between migrating and resuming).  Names by role; destroyed afterwards."""
    tag = uuid.uuid4().hex[:6]
    names = {}
    try:
        if twin:
            names["twin"] = name = f"twin-{tag}"
            vm_uuid = str(uuid.uuid4())
            start(lab, 0, copy_xml(lab, 0, name, vm_uuid, arriving_from=None), paused=False)
            start(lab, 1, copy_xml(lab, 1, name, vm_uuid, arriving_from="h0"), paused=True)
        if orphan:
            names["orphan"] = name = f"orphan-{tag}"
            start(lab, 1, copy_xml(lab, 1, name, str(uuid.uuid4()), arriving_from="h0"), paused=True)
        yield names
    finally:
        for name in names.values():
            destroy_everywhere(lab, name)


def short_timeout_cluster(lab: Lab, tmp_path: Path) -> Path:
    p = tmp_path / "cluster.toml"
    p.write_text(f"host_timeout = {HOST_TIMEOUT}\n" + lab.cluster_file.read_text())
    return p


def test_an_arrival_is_not_resumed_while_its_source_is_unread(lab2: Lab, tmp_path: Path) -> None:
    """Hazard 1: h0 (the source, still running the VM) stops answering; `place --apply` creating a VM on h1 must
    not resume h1's paused arrival: libvirt must never show the VM running on both hosts."""
    cluster = short_timeout_cluster(lab2, tmp_path)
    request = tmp_path / "small.toml"
    request.write_text('name = "small"\nvms = 1\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.1\n')
    pid = daemon_pid(LabLayout(lab2.dir), 0, "libvirtd")
    assert pid is not None
    with in_doubt(lab2) as names:
        vm = names["twin"]
        os.kill(pid, signal.SIGSTOP)
        try:
            r = run("place", request, "--cluster", cluster, "--apply", "--json")
            during = state_of(lab2, 1, vm)
        finally:
            os.kill(pid, signal.SIGCONT)
            destroy_everywhere(lab2, "small-0")
        assert (state_of(lab2, 0, vm), during) == ("running", "paused"), r.output
        assert "not settled" in r.stderr and "h0" in r.stderr  # said why nothing was settled


def test_a_place_dry_run_and_observe_report_in_doubt_vms_and_change_nothing(lab2: Lab, tmp_path: Path) -> None:
    """Hazard 2: with a paused twin and an orphaned arrival, `place` (dry run) and `observe` destroyed the
    twin and resumed the arrival, without the lock.  Now they say what repair would do and change nothing;
    `repair` alone changes nothing either, `repair --apply` settles both."""
    request = tmp_path / "web.toml"
    request.write_text('name = "web"\nvms = 1\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.1\n')
    with in_doubt(lab2, orphan=True) as names:
        twin, orphan = names["twin"], names["orphan"]
        expected = {(0, twin): "running", (1, twin): "paused", (1, orphan): "paused"}

        def states() -> dict[tuple[int, str], str]:
            return {(h, vm): state_of(lab2, h, vm) for h, vm in expected}

        r = run("place", request, "--cluster", lab2.cluster_file)
        assert r.exit_code in (0, 1), r.output
        assert states() == expected, r.output
        assert f"{twin} is in doubt" in r.stderr and "would destroy the paused copy" in r.stderr
        r = run("observe", "--cluster", lab2.cluster_file, "--window", "1s", "--sample", "0.5", "--json")
        assert states() == expected, r.output
        assert f"{orphan} is in doubt" in r.stderr and "would resume the paused arrival" in r.stderr
        r = run("repair", "--cluster", lab2.cluster_file, "--json")
        assert r.exit_code == 0 and states() == expected, r.output
        assert {(a["action"], a["vm"], a["host"]) for a in json.loads(r.stdout)["actions"]} == \
            {("destroy", twin, "h1"), ("resume", orphan, "h1")}
        r = run("repair", "--cluster", lab2.cluster_file, "--apply")
        assert r.exit_code == 0, r.output
        assert states() == {(0, twin): "running", (1, twin): "gone", (1, orphan): "running"}
