"""``vcsched recover HOST`` on libvirt's test driver: the dry-run plan, and every refusal before anything changes.

The whole path — fence, then create — runs on the lab in tests/test_recover_lab.py (the test driver can not cap).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from acting.definitions import DefinitionStore
from cli.main import cli
from hypervisor.testhosts import node_xml
from vcsched.plans.steps import Boot, CreateStep


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VCSCHED_COORDINATION", raising=False)
    return tmp_path / "state"


def agent(tmp_path: Path, status_exit: int) -> Path:
    """A fake fence agent: off succeeds, status exits ``status_exit`` (2: off, 0: on); each action is logged."""
    path = tmp_path / "fence_fake"
    path.write_text(f"#!/bin/sh\nin=$(cat)\necho \"$in\" | grep action= >> {tmp_path}/called\n"
                    f"case \"$in\" in *action=status*) exit {status_exit};; esac\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def cluster(tmp_path: Path, fence: Path | None, h1_alive: bool = False, scheme: str = "test") -> Path:
    """h0 and h2 answer (test-driver files; ``scheme="sim"``: the same files served by the simulated libvirt,
    whose hosts cap CPU); h1 is a file that does not exist: down."""
    for h in ("h0", "h2") + (("h1",) if h1_alive else ()):
        (tmp_path / f"{h}.xml").write_text(node_xml({"h0": 0, "h1": 1, "h2": 2}[h], 1))
    lines = ['name = "t"', "host_timeout = 5"]
    for h in ("h0", "h1", "h2"):
        lines += ["[[hosts]]", f'name = "{h}"', f'uri = "{scheme}://{tmp_path}/{h}.xml"']
        if h == "h1":  # names the cluster lock while h1 is down (hypervisor/identity.py)
            lines.append('uuid = "6d1b8a52-3f0e-4c59-9a52-8c0f1e0b7a11"')
        if h == "h1" and fence is not None:
            lines.append(f'fence = {{agent = "{fence}", plug = "h1"}}')
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def recorded(state: Path, *vms: str) -> None:
    store = DefinitionStore.for_url(f"file://{state}/coordination", "t")
    for i, vm in enumerate(vms):
        store.put(CreateStep(vm, "h1", "web", 1, 128 << 20, 0.5, 0.5, Boot("kernel", "/k", "/i", "quiet"),
                             priority=i))


def run(*args: object) -> object:
    return CliRunner().invoke(cli, ["recover", *map(str, args)])


def test_a_dry_run_prints_fence_then_creates_most_important_first(tmp_path: Path, state: Path) -> None:
    recorded(state, "web-0", "web-1")
    c = cluster(tmp_path, agent(tmp_path, 2))
    r = run("h1", "--cluster", c, "--json")
    # The test driver cannot cap CPU, so --apply would refuse the plan before fencing: the dry run says so too
    # (exit 1), after showing the plan.
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    doc = json.loads(r.stdout)  # type: ignore[attr-defined]
    assert "--apply would refuse" in doc["refused"]
    assert [x["vm"] for x in doc["recovery"]["restarts"]] == ["web-1", "web-0"]
    assert {s["op"] for s in doc["plan"]["steps"]} == {"create"} and "fence" not in doc
    assert not (tmp_path / "called").exists(), "a dry run does not fence"
    text = run("h1", "--cluster", c)
    assert "1. fence h1" in text.stdout and "2. create web-1 on" in text.stdout  # type: ignore[attr-defined]


def test_without_a_fence_agent_every_vm_is_stranded_and_the_exit_is_1(tmp_path: Path, state: Path) -> None:
    recorded(state, "web-0")
    r = run("h1", "--cluster", cluster(tmp_path, None), "--json")
    assert r.exit_code == 1  # type: ignore[attr-defined]
    (s,) = json.loads(r.stdout)["recovery"]["stranded"]  # type: ignore[attr-defined]
    assert s["vm"] == "web-0" and "has no fence agent" in s["reason"]


def test_a_host_that_answers_is_not_recovered(tmp_path: Path, state: Path) -> None:
    recorded(state, "web-0")
    r = run("h1", "--cluster", cluster(tmp_path, agent(tmp_path, 2), h1_alive=True), "--apply")
    assert r.exit_code == 1 and "host h1 answers: it has not failed" in r.stdout  # type: ignore[attr-defined]
    assert not (tmp_path / "called").exists()


def test_a_recovery_plan_the_live_cluster_refuses_fences_nothing(tmp_path: Path, state: Path) -> None:
    """The plan is validated whole before the host is fenced (issue 37, measurement 1: it was fenced, then its
    plan refused, and its VMs were dead with nothing restarted).  The test driver cannot cap CPU, so the whole-plan
    check refuses the creates' caps: the fence agent must not be called.  Fencing that fails restarts nothing:
    tests/test_unit_of_work.py."""
    recorded(state, "web-0")
    r = run("h1", "--cluster", cluster(tmp_path, agent(tmp_path, 2)), "--apply", "--json")
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    doc = json.loads(r.stdout)  # type: ignore[attr-defined]
    assert "cannot cap CPU" in doc["refused"] and "nothing fenced" in doc["refused"], doc["refused"]
    assert "fence" not in doc and "apply" not in doc
    assert not (tmp_path / "called").exists(), "the host was fenced before its recovery plan was validated"


def test_a_dry_run_exits_as_apply_would_when_the_live_cluster_refuses_the_plan(tmp_path: Path, state: Path) -> None:
    """The dry run checks the recovery plan whole as --apply does before fencing, so both exit 1 (issue 40: dry
    runs predict); it fences nothing either."""
    recorded(state, "web-0")
    r = run("h1", "--cluster", cluster(tmp_path, agent(tmp_path, 2)), "--json")
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    doc = json.loads(r.stdout)  # type: ignore[attr-defined]
    assert "--apply would refuse" in doc["refused"] and "cannot cap CPU" in doc["refused"], doc["refused"]
    assert not (tmp_path / "called").exists()


def test_an_unknown_host_is_bad_input(tmp_path: Path) -> None:
    r = run("h9", "--cluster", cluster(tmp_path, None))
    assert r.exit_code == 2 and "host 'h9': not in cluster" in r.stderr  # type: ignore[attr-defined]


def test_with_another_host_down_and_not_fenced_its_vms_wait_and_the_exit_is_1(tmp_path: Path, state: Path) -> None:
    """h2 does not answer either and was not fenced: a VM recorded on h1 may run there (a migration cut after its
    switch-over, not recorded), so nothing is created; h1 is fenced all the same (its plan re-sets caps only)."""
    recorded(state, "web-0", "web-1")
    c = cluster(tmp_path, agent(tmp_path, 2), scheme="sim")
    (tmp_path / "h2.xml").unlink()
    r = run("h1", "--cluster", c, "--json")
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    doc = json.loads(r.stdout)  # type: ignore[attr-defined]
    assert [x["vm"] for x in doc["recovery"]["waiting"]] == ["web-1", "web-0"] and not doc["recovery"]["stranded"]
    assert "h2" in doc["recovery"]["waiting"][0]["reason"] and not doc["recovery"]["restarts"]
    assert doc["plan"] is not None and "create" not in {s["op"] for s in doc["plan"]["steps"]}
    text = run("h1", "--cluster", c)
    assert "1. fence h1" in text.stdout and "waits: web-1" in text.stdout  # type: ignore[attr-defined]
    assert "not restarted yet" in text.output  # type: ignore[attr-defined]
