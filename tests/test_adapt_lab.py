"""End to end on the real lab: adapt plans that live-migrate a VM, and that remove a departed cluster.

Two managed VMs needing 0.6 cores each start on h0 (1 core), capped at 0.5
each: minimum yield 0.83.  With a budget of one VM's memory, `vcsched adapt
--apply` must move one of them to h1 and raise both caps to 0.6 (yield 1).
Checked through libvirt afterwards: the VM runs on h1 with its cap, h0 no
longer has it.  Needs the ``lab2`` fixture (skipped with the reason where a
TCG guest cannot boot).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.libvirt_backend import LibvirtHypervisor
from lab import Lab
from tests.lab_support import copies, destroy_everywhere
from vcsched.formats.cluster import cluster_from_dict
from vcsched.plans.steps import Boot, CreateStep

pytestmark = pytest.mark.lab

MIB = 1 << 20
NEED_CORES = 0.6


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def two_on_h0(lab2: Lab) -> Iterator[tuple[str, str]]:
    import tomllib

    cluster = cluster_from_dict(tomllib.loads(lab2.cluster_file.read_text()))
    g = cluster.guest
    assert g is not None
    boot = Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=g.cmdline, domain_type=g.domain_type)
    tag = uuid.uuid4().hex[:6]
    names = (f"ad{tag}-0", f"ad{tag}-1")
    try:
        with LibvirtHypervisor(cluster) as hv:
            for n in names:
                hv.create_vm(CreateStep(n, "h0", f"ad{tag}", 1, 128 * MIB, NEED_CORES, 0.5, boot))
        yield names
    finally:
        for n in names:
            destroy_everywhere(lab2, n)


def where(lab: Lab, name: str) -> list[tuple[str, bool]]:
    return copies(lab, name)


def test_adapt_live_migrates_one_vm_and_raises_the_caps(lab2: Lab, two_on_h0: tuple[str, str]) -> None:
    dry = run("adapt", "--cluster", lab2.cluster_file, "--budget", "128MiB", "--json")
    assert dry.exit_code == 0, dry.output
    plan = json.loads(dry.stdout)["plan"]
    moves = [s for s in plan["steps"] if s["op"] == "migrate"]
    assert len(moves) == 1 and moves[0]["from"] == "h0" and moves[0]["to"] == "h1"
    assert all(where(lab2, n) == [("h0", True)] for n in two_on_h0)  # a dry run changes nothing

    done = run("adapt", "--cluster", lab2.cluster_file, "--budget", "128MiB", "--apply", "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["apply"]["ok"], doc["apply"]
    moved = next(s["vm"] for s in doc["plan"]["steps"] if s["op"] == "migrate")
    assert where(lab2, moved) == [("h1", True)]  # running on h1, gone from h0
    import tomllib

    cluster = cluster_from_dict(tomllib.loads(lab2.cluster_file.read_text()))
    with LibvirtHypervisor(cluster) as hv:
        for n in two_on_h0:
            v = hv.find_vm(n)
            assert v is not None and v.active
            cap = hv.read_cap(v.host, n)
            assert cap == pytest.approx(NEED_CORES, abs=0.005)

    again = run("adapt", "--cluster", lab2.cluster_file, "--budget", "128MiB", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["migrations"] == []  # balanced now: nothing left to move


@pytest.fixture
def leaving_and_staying(lab2: Lab) -> Iterator[tuple[str, str, str]]:
    """On h0 (1 core): ``stay`` needs 0.9 cores, ``leave`` 0.5, both capped at 0.5 (yield 0.56)."""
    import tomllib

    cluster = cluster_from_dict(tomllib.loads(lab2.cluster_file.read_text()))
    g = cluster.guest
    assert g is not None
    boot = Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=g.cmdline, domain_type=g.domain_type)
    tag = uuid.uuid4().hex[:6]
    stay, leave = f"st{tag}-0", f"lv{tag}-0"
    try:
        with LibvirtHypervisor(cluster) as hv:
            hv.create_vm(CreateStep(stay, "h0", f"st{tag}", 1, 128 * MIB, 0.9, 0.5, boot))
            hv.create_vm(CreateStep(leave, "h0", f"lv{tag}", 1, 128 * MIB, 0.5, 0.5, boot))
        yield stay, leave, f"lv{tag}"
    finally:
        for n in (stay, leave):
            destroy_everywhere(lab2, n)


def test_a_departed_cluster_is_removed_and_a_new_need_is_recorded(
        lab2: Lab, leaving_and_staying: tuple[str, str, str]) -> None:
    stay, leave, vc = leaving_and_staying
    dry = run("adapt", "--cluster", lab2.cluster_file, "--budget", "0", "--depart", vc, "--json")
    assert dry.exit_code == 0, dry.output
    steps = json.loads(dry.stdout)["plan"]["steps"]
    assert steps[0] == {"op": "remove", "vm": leave, "host": "h0", "cluster": vc}
    assert where(lab2, leave) == [("h0", True)]  # a dry run changes nothing

    # ... and at the same time stay's need drops to 0.8: recorded in its libvirt metadata by a set-need step.
    done = run("adapt", "--cluster", lab2.cluster_file, "--budget", "0", "--depart", vc, "--set-need", f"{stay}=0.8",
               "--apply", "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["apply"]["ok"]
    assert doc["plan"]["steps"][-1] == {"op": "set-need", "vm": stay, "host": "h0", "cpu_need_cores": 0.8}
    assert where(lab2, leave) == []  # stopped and gone from every host
    assert where(lab2, stay) == [("h0", True)]
    import tomllib

    cluster = cluster_from_dict(tomllib.loads(lab2.cluster_file.read_text()))
    with LibvirtHypervisor(cluster) as hv:
        assert hv.read_cap("h0", stay) == pytest.approx(0.8, abs=0.005)
        v = hv.find_vm(stay)
        assert v is not None and v.meta is not None and v.meta.cpu_need_cores == 0.8

    steady = run("adapt", "--cluster", lab2.cluster_file, "--budget", "0", "--json")
    assert steady.exit_code == 0, steady.output
    assert json.loads(steady.stdout)["plan"]["steps"] == []  # the recorded need holds: nothing to change

    again = run("adapt", "--cluster", lab2.cluster_file, "--budget", "0", "--depart", vc)
    assert again.exit_code == 2 and f"--depart: {vc!r} is not a virtual cluster" in again.output


@pytest.fixture
def four_on_h0(lab2: Lab) -> Iterator[list[str]]:
    """Four VMs needing 0.5 cores on h0 (1 core), capped at 0.25: two must move to h1."""
    import tomllib

    cluster = cluster_from_dict(tomllib.loads(lab2.cluster_file.read_text()))
    g = cluster.guest
    assert g is not None
    boot = Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=g.cmdline, domain_type=g.domain_type)
    tag = uuid.uuid4().hex[:6]
    names = [f"pw{tag}-{i}" for i in range(4)]
    try:
        with LibvirtHypervisor(cluster) as hv:
            for n in names:
                hv.create_vm(CreateStep(n, "h0", f"pw{tag}", 1, 128 * MIB, 0.5, 0.25, boot))
        yield names
    finally:
        for n in names:
            destroy_everywhere(lab2, n)


def test_parallel_two_live_migrates_a_wave_of_two_at_once(lab2: Lab, four_on_h0: list[str]) -> None:
    done = run("adapt", "--cluster", lab2.cluster_file, "--budget", "256MiB", "--parallel", "2", "--apply", "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["apply"]["ok"], doc["apply"]
    moves = [s for s in doc["plan"]["steps"] if s["op"] == "migrate"]
    assert len(moves) == 2 and {m["wave"] for m in moves} == {1} and {m["to"] for m in moves} == {"h1"}
    for m in moves:
        assert where(lab2, m["vm"]) == [("h1", True)]
    hosts = sorted(where(lab2, n)[0][0] for n in four_on_h0)
    assert hosts == ["h0", "h0", "h1", "h1"]
    import tomllib

    cluster = cluster_from_dict(tomllib.loads(lab2.cluster_file.read_text()))
    with LibvirtHypervisor(cluster) as hv:
        for n in four_on_h0:
            v = hv.find_vm(n)
            assert v is not None and v.active and hv.read_cap(v.host, n) == pytest.approx(0.5, abs=0.005)
