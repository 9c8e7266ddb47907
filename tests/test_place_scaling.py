"""Admission is not quadratic in the request (issue 40): the request's VM names are built a bounded number of
times per `place`, whatever its size.  Built once per VM, they made admitting N VMs cost N^2 (45 % of a
`headroom` at 100 nodes, whose questions are requests of thousands of VMs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.testhosts import write_scale_cluster
from vcsched.formats.request import Request


def names_built(tmp_path: Path, vms: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many times one dry-run `place` of ``vms`` small VMs builds the request's VM names (it is admitted)."""
    scale = write_scale_cluster(tmp_path / f"n{vms}", 3, 2, scheme="sim")
    request = tmp_path / f"n{vms}.toml"
    request.write_text(f'name = "many"\nvms = {vms}\nvcpus = 1\nmemory = "64MiB"\ncpu_cores = 0.01\n')
    calls = []
    original = Request.vm_names

    def counted(self: Request) -> tuple[str, ...]:
        calls.append(self.vms)
        return original(self)

    monkeypatch.setattr(Request, "vm_names", counted)
    r = CliRunner().invoke(cli, ["place", str(request), "--cluster", str(scale.cluster_file), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["admitted"] is True
    return len(calls)


def test_the_request_vm_names_are_built_as_often_for_40_vms_as_for_4(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    few, many = names_built(tmp_path, 4, monkeypatch), names_built(tmp_path, 40, monkeypatch)
    assert few == many <= 4, (few, many)
