"""Counts and names as an operator reads them (issue 40): "1 wave", not "1 waves"; "0.83 s", not "0.833333 s";
never vcsched's internal name for the VMs a question is asked with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.headroom import said_plainly
from cli.main import cli
from cli.observe import sample_interval
from hypervisor.testhosts import write_scale_cluster
from vcsched.formats.words import plural


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_a_count_of_one_is_singular() -> None:
    assert plural(1, "wave") == "1 wave" and plural(2, "wave") == "2 waves" and plural(0, "relay") == "0 relays"
    assert plural(1, "more VM", "more VMs") == "1 more VM" and plural(3, "more VM", "more VMs") == "3 more VMs"


def test_one_wave_of_migrations_is_said_in_the_singular(tmp_path: Path) -> None:
    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2, scheme="sim")  # hosts that cap CPU
    r = run("drain", "h0", "--budget", "unlimited", "--parallel", "2", "--cluster", hosts.cluster_file)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "(1 wave, 0 relays)" in r.stdout and "1 waves" not in r.stdout
    assert "plan (2 steps, in this order)" in r.stdout


def test_the_default_sample_interval_is_a_round_number() -> None:
    assert sample_interval(10) == 0.83 and f"{sample_interval(10):g}" == "0.83"
    assert sample_interval(30) == 2.5 and sample_interval(1) == 0.5 and sample_interval(600) == 5.0


def test_headrooms_refusal_does_not_name_the_question_by_its_internal_names() -> None:
    limit = ("failover: if host h0 failed, 3 of its 16 VMs (headroom-9, vm0, vm1; 1.5 GiB) would find no room; "
             "the minimum yield would be 0.9412, below request 'headroom' min_yield 1")
    said = said_plainly(limit, "headroom")
    assert "headroom" not in said
    assert "(new VM 9, vm0, vm1; 1.5 GiB)" in said and "below the new VMs' min_yield 1" in said
    assert said_plainly("vm headroom-10x stays", "headroom") == "vm headroom-10x stays"  # a whole name only


def test_headroom_keeps_room_for_one_host_failure_in_the_singular(tmp_path: Path) -> None:
    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2)
    r = run("headroom", "--vm", "vcpus=1,memory=512MiB,cpu_cores=0.5", "--min-yield", "1", "--failures", "1",
            "--cluster", hosts.cluster_file)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "failure(s)" not in r.stdout and "keeping room for 1 host failure," in r.stdout
    assert "headroom-" not in r.stdout


def test_headroom_says_one_more_vm_in_the_singular(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vcsched.control.headroom as headroom

    def one(_cluster: Any, _inv: Any, shape: Any, **_: Any) -> headroom.Headroom:
        return headroom.Headroom(shape, 1, 0, 0.5, "the lowest current yield", {"h0": 1}, 0.5, 0.5,
                                 "memory: 2 VMs do not fit", None)

    monkeypatch.setattr(headroom, "headroom_for", one)
    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2)
    r = run("headroom", "--vm", "vcpus=1,memory=512MiB,cpu_cores=0.5", "--cluster", hosts.cluster_file)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert r.stdout.startswith("1 more VM of 1 vCPU"), r.stdout
