"""Placement rules end to end on a real 3-host lab (docs/rules.md): spread, pinned, cordon, drain.

A spread virtual cluster of 2 VMs lands on two different hosts; a pinned VM
on a third or the same; ``vcsched cordon`` keeps new VMs off a host;
``vcsched drain --apply`` empties a host holding a spread VM by live
migration, to the one host that keeps the rule, and the pinned VM never
moves; draining the pinned VM's host with a budget is bad input (exit 2).
Checked through libvirt.  Its own lab directory under /var/tmp, taken down
at the end (over TLS with ``VCSCHED_LAB_TRANSPORT=tls``, as scripts/test's
second pass runs it); skipped with the reason where a TCG guest cannot boot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from lab import Lab
from tests.lab_support import LAB_TRANSPORT, running_lab, skip_unless_lab_possible

pytestmark = pytest.mark.lab


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def lab3() -> Iterator[Lab]:
    skip_unless_lab_possible()
    with running_lab(3, LAB_TRANSPORT) as lab:
        yield lab


def where(lab: Lab) -> dict[str, str]:
    """Running domain -> host, over every lab host."""
    import libvirt

    out: dict[str, str] = {}
    for h in lab.hosts:
        conn = libvirt.open(h.connect_uri)
        try:
            out.update({d.name(): h.name for d in conn.listAllDomains(0) if d.isActive()})
        finally:
            conn.close()
    return out


def request(tmp: Path, name: str, vms: int, extra: str) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(f'name = "{name}"\nvms = {vms}\nvcpus = 1\nmemory = "96MiB"\ncpu_cores = 0.2\n{extra}\n')
    return p


def test_spread_pinned_cordon_and_drain(lab3: Lab, tmp_path: Path) -> None:
    cf = lab3.cluster_file
    placed = run("place", request(tmp_path, "sp", 2, "spread = true"), "--cluster", cf, "--apply", "--json")
    assert placed.exit_code == 0, placed.output
    placed = run("place", request(tmp_path, "pn", 1, "pinned = true"), "--cluster", cf, "--apply", "--json")
    assert placed.exit_code == 0, placed.output
    now = where(lab3)
    assert now["sp-0"] != now["sp-1"]  # spread: two hosts
    pinned_host = now["pn-0"]

    # Cordon a host: a new spread cluster of 2 VMs goes to the two others.
    cordoned = next(h.name for h in lab3.hosts if h.name != pinned_host)
    c = run("cordon", cordoned, "--cluster", cf, "--json")
    assert c.exit_code == 0 and json.loads(c.stdout)["changed"] is True, c.output
    assert "maintenance = true" in cf.read_text()
    placed = run("place", request(tmp_path, "nw", 2, "spread = true"), "--cluster", cf, "--apply", "--json")
    assert placed.exit_code == 0, placed.output
    now = where(lab3)
    assert cordoned not in (now["nw-0"], now["nw-1"]) and now["nw-0"] != now["nw-1"]
    assert run("uncordon", cordoned, "--cluster", cf).exit_code == 0
    assert "maintenance" not in cf.read_text()

    # A pinned VM's host cannot be drained with a budget: bad input, nothing changed.
    bad = run("drain", pinned_host, "--cluster", cf, "--budget", "1GiB")
    assert bad.exit_code == 2 and "pn-0" in bad.output and "pinned" in bad.output
    assert where(lab3) == now

    # Drain a host that holds an sp VM and not the pinned one: it leaves by live migration, keeping spread.
    target = next((now[v] for v in ("sp-0", "sp-1") if now[v] != pinned_host), None)
    # Two spread VMs on three hosts: at most one of them shares the pinned VM's host.
    assert target is not None, f"both spread VMs are on the pinned VM's host: {now}"
    before = {v: h for v, h in now.items() if h == target}
    dry = run("drain", target, "--cluster", cf, "--budget", "unlimited", "--json")
    assert dry.exit_code == 0, dry.output
    doc = json.loads(dry.stdout)
    assert doc["complete"] and doc["migrated_bytes"] >= 96 << 20
    done = run("drain", target, "--cluster", cf, "--budget", "unlimited", "--apply", "--json")
    assert done.exit_code == 0, done.output
    after = where(lab3)
    assert all(after[v] != target for v in before)  # emptied
    assert after["sp-0"] != after["sp-1"]  # spread kept
    assert after["pn-0"] == pinned_host  # the pinned VM never moved
    assert "maintenance = true" in cf.read_text()  # drain --apply cordoned it
    assert run("uncordon", target, "--cluster", cf).exit_code == 0

    status = run("status", "--cluster", cf, "--json")
    assert status.exit_code == 0, status.output
