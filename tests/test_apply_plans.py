"""`vcsched apply` reads every plan vcsched writes: each writer run for real, its plan applied.

The writers: ``place -o``, ``adapt -o``, ``drain -o`` (files), and the plans
embedded in ``place --json``, ``adapt --json``, ``drain --json`` and
``observe --record --json`` (``run`` logs the same documents as ``adapt``'s, in
its ``plan`` events).  The hosts are libvirt's test driver
(hypervisor/testhosts.py): no daemon, so the whole path up to the hosts runs —
the plan is read, its snapshot matched and replayed on the live hosts — but
the test driver cannot set CPU caps, so a plan with caps is then refused *for
that host* (exit 2 naming it), never for its format.  Applying on real hosts,
drain included: tests/test_journal_lab.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.testhosts import write_scale_cluster
from vcsched.plans.plan import plan_from_dict

pytest.importorskip("libvirt", reason="libvirt-python is not installed")

#: What the test driver says when a plan needs a CPU cap: a refusal by the host, after the plan was read.
HOST_CANNOT_CAP = re.compile(r"host h\d cannot cap CPU: the libvirt test driver")


@pytest.fixture(scope="module")
def written_on(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """Two test-driver hosts (two managed VMs each, capped at 0.25 for a need of 0.5: adapt re-caps them) and
    the plans every writer wrote on them.  Nothing changes them: a test-driver host is a file each connection
    reads afresh, and every plan applied here is refused by the host or sets needs already recorded."""
    d = tmp_path_factory.mktemp("apply-plans")
    scale = write_scale_cluster(d / "hosts", 2, 2)
    for node in (d / "hosts").glob("h*.xml"):
        node.write_text(node.read_text().replace("<quota>50000</quota>", "<quota>25000</quota>"))
    return scale.cluster_file, written(scale.cluster_file, d)


@pytest.fixture
def hosts(written_on: tuple[Path, dict[str, dict[str, Any]]]) -> Path:
    return written_on[0]


@pytest.fixture
def plans(written_on: tuple[Path, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return json.loads(json.dumps(written_on[1]))  # a copy each test may edit


def vcsched(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def written(cluster: Path, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Every plan document the writers produce on ``cluster``, by writer."""
    c = ["--cluster", cluster]
    request = cluster.parent / "request.toml"
    plans: dict[str, dict[str, Any]] = {}
    for name, args in {"place -o": ["place", request, *c], "adapt -o": ["adapt", "--budget", "1GiB", *c],
                       "drain -o": ["drain", "h1", "--budget", "4GiB", *c]}.items():
        out = tmp_path / f"{name.split()[0]}.json"
        r = vcsched(*args, "-o", out)
        # Every plan here caps CPU: the dry run exits as --apply would, refused by the test driver; saved all the same.
        assert r.exit_code == 1 and HOST_CANNOT_CAP.search(r.stderr), (name, r.output)
        plans[name] = json.loads(out.read_text())
    for name, args in {"place --json": ["place", request, *c], "adapt --json": ["adapt", "--budget", "1GiB", *c],
                       "drain --json": ["drain", "h1", "--budget", "4GiB", *c]}.items():
        r = vcsched(*args, "--json")
        assert r.exit_code == 1 and HOST_CANNOT_CAP.search(json.loads(r.stdout)["refused"]), (name, r.output)
        plans[name] = json.loads(r.stdout)["plan"]
    r = vcsched("observe", "--window", "1s", "--sample", "0.5s", "--record", "--json", *c)
    assert r.exit_code == 0, r.output
    plans["observe --record --json"] = json.loads(r.stdout)["record"]
    return plans


def test_every_plan_vcsched_writes_is_read_back_whole(plans: dict[str, dict[str, Any]]) -> None:
    assert plans["drain -o"]["drain"] == "h1" and plans["drain -o"]["stays"] == []
    assert "migrate" in {s["op"] for s in plans["drain -o"]["steps"]}
    assert "create" in {s["op"] for s in plans["place -o"]["steps"]}
    assert {s["op"] for s in plans["adapt -o"]["steps"]} == {"set-cap"}
    for name, doc in plans.items():
        assert plan_from_dict(doc).to_dict() == doc, name


@pytest.mark.parametrize("writer", ["place -o", "adapt -o", "drain -o", "observe --record --json"])
def test_apply_takes_each_written_plan_to_the_hosts(hosts: Path, plans: dict[str, dict[str, Any]], tmp_path: Path,
                                                   writer: str) -> None:
    doc = plans[writer]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    r = vcsched("apply", path, "--cluster", hosts, "--json")
    if any(s["op"] in ("create", "set-cap", "migrate") for s in doc["steps"]):
        # Read, matched and replayed on the live hosts; refused (exit 1) only by the host that cannot cap.
        assert r.exit_code == 1 and HOST_CANNOT_CAP.search(r.stderr), r.output
        assert "plan:" not in r.stderr and "unknown field" not in r.stderr
    else:
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["ok"] is True


def test_a_refused_drain_plan_leaves_the_cluster_file_alone(hosts: Path, plans: dict[str, dict[str, Any]],
                                                            tmp_path: Path) -> None:
    before = hosts.read_text()
    (tmp_path / "drain.json").write_text(json.dumps(plans["drain -o"]))
    r = vcsched("apply", tmp_path / "drain.json", "--cluster", hosts)
    assert r.exit_code == 1 and HOST_CANNOT_CAP.search(r.stderr), r.output
    assert hosts.read_text() == before  # refused before its first step: h1 not put in maintenance


def test_a_partial_drain_plan_is_not_applied(hosts: Path, plans: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """As `drain --apply`: a plan that leaves VMs on the host is refused (exit 1), nothing changed."""
    doc = plans["drain -o"]
    doc["stays"] = [["vm3", "budget", "the budget is spent"]]
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(doc))
    before = hosts.read_text()
    r = vcsched("apply", path, "--cluster", hosts, "--json")
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["refused"] == "h1 cannot be emptied within these rules and budget"
    assert hosts.read_text() == before


@pytest.mark.parametrize(("edit", "message"), [
    ({"drain": 3}, "plan.drain: expected a non-empty string, got 3"),
    ({"stays": "none"}, "plan.stays: expected a list, got 'none'"),
    ({"stays": [["vm3", "budget"]]}, "plan.stays[0]: expected [vm, reason, detail] strings"),
    ({"drain": None}, "plan.drain: expected a non-empty string, got None"),
])
def test_a_malformed_drain_field_is_one_line_naming_it(hosts: Path, plans: dict[str, dict[str, Any]], tmp_path: Path,
                                                        edit: dict[str, Any], message: str) -> None:
    doc = {**plans["drain -o"], **edit}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    r = vcsched("apply", path, "--cluster", hosts)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


# ---------------------------------------------------------------------------------------------- on real hosts


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.lab_support import own_lab

    with own_lab(2, cores=1) as lab:
        yield lab


@pytest.mark.lab
def test_place_then_drain_plans_written_then_applied_on_real_hosts(lab: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's report: `drain -o` then `apply` was "plan: unknown field 'drain'" (exit 2).  Here a VM is
    placed by `place -o` + `apply`, then its host drained by `drain -o` + `apply`: it runs on the other host,
    and the drained one is in maintenance in the cluster file."""
    import libvirt

    from tests.lab_support import destroy_everywhere

    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    cluster = tmp_path / "cluster.toml"  # a copy: the drain cordons a host in it
    cluster.write_text(lab.cluster_file.read_text())
    request = tmp_path / "dr.toml"
    request.write_text('name = "dr"\nvms = 1\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.1\n')
    try:
        r = vcsched("place", request, "--cluster", cluster, "-o", tmp_path / "place.json")
        assert r.exit_code == 0, r.output
        r = vcsched("apply", tmp_path / "place.json", "--cluster", cluster, "--json")
        assert r.exit_code == 0, r.output

        def host_of(vm: str) -> list[str]:
            found = []
            for h in lab.hosts:
                conn = libvirt.open(h.connect_uri)
                try:
                    found += [h.name for d in conn.listAllDomains(0) if d.name() == vm and d.isActive()]
                finally:
                    conn.close()
            return found

        (start,) = host_of("dr-0")
        r = vcsched("drain", start, "--budget", "1GiB", "--cluster", cluster, "-o", tmp_path / "drain.json")
        assert r.exit_code == 0, r.output
        assert json.loads((tmp_path / "drain.json").read_text())["drain"] == start
        r = vcsched("apply", tmp_path / "drain.json", "--cluster", cluster, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["ok"] is True
        assert host_of("dr-0") == [h.name for h in lab.hosts if h.name != start]
        import tomllib

        hosts = {h["name"]: h for h in tomllib.loads(cluster.read_text())["hosts"]}
        assert hosts[start].get("maintenance") is True and not any(
            h.get("maintenance") for name, h in hosts.items() if name != start)
    finally:
        destroy_everywhere(lab, "dr-0")
