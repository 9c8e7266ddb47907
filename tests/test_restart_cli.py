"""Lost VMs in ``vcsched status`` and ``vcsched restart VM...`` on libvirt's test driver (h1 down, h0 and h2 up),
and the restart plan applied on the in-memory hypervisor (the test driver cannot cap; the whole path runs on the
lab in tests/test_recover_lab.py)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from acting.definitions import DefinitionStore
from acting.executor import apply_plan
from cli.main import cli
from tests.builders import cluster_of, managed
from tests.test_failover import db1, down_h1, record, short_of_cpu
from tests.test_recover_cli import agent, cluster, recorded, state  # noqa: F401  (fixture)
from vcsched.control.failover import plan_restart
from vcsched.control.lost import HOST_FENCED


def invoke(*args: object) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_status_lists_a_vm_of_a_fenced_host_as_lost_and_not_before(tmp_path: Path, state: Path) -> None:  # noqa: F811
    recorded(state, "web-0")
    c = cluster(tmp_path, agent(tmp_path, 2))
    doc = json.loads(invoke("status", "--cluster", c, "--json", "--sample", 0).stdout)  # type: ignore[attr-defined]
    assert doc["lost"] == [] and doc["lost_unknown"] is None, "h1 may still run web-0: it awaits recovery"
    DefinitionStore.for_url(f"file://{state}/coordination", "t").mark_fenced("h1", at=2e9)
    doc = json.loads(invoke("status", "--cluster", c, "--json", "--sample", 0).stdout)  # type: ignore[attr-defined]
    assert doc["lost"] == [{"vm": "web-0", "cluster": "web", "host": "h1", "why": HOST_FENCED, "since": 2e9}]
    text = invoke("status", "--cluster", c, "--sample", 0).stdout  # type: ignore[attr-defined]
    assert "lost: web-0 (web) runs nowhere: recorded on h1, host fenced" in text.replace("\n", " ")


def test_status_counts_a_virtual_clusters_lost_vms_beside_its_running_ones(tmp_path: Path, state: Path) -> None:  # noqa: F811
    from cli.app import console
    from cli.status import render_virtual_clusters

    doc = {"policy": "yield", "virtual_clusters": [{"name": "batch", "vms": 1, "weight": 1.0, "tenant": None,
                                                    "yield": 1.0, "dominant_share": 0.1, "dominant_pool": "cpu",
                                                    "min_yield": None, "lost": 1, "below_floor": False}]}
    with console.capture() as cap:
        render_virtual_clusters(doc)
    assert "1 (+1 lost)" in cap.get()


def test_restart_dry_run_plans_a_lost_vm_on_a_host_that_answers(tmp_path: Path, state: Path) -> None:  # noqa: F811
    recorded(state, "web-0")
    DefinitionStore.for_url(f"file://{state}/coordination", "t").mark_fenced("h1", at=2e9)
    r = invoke("restart", "web-0", "--cluster", cluster(tmp_path, agent(tmp_path, 2)), "--json")
    # The test driver cannot cap CPU, so --apply would refuse the plan before its first step: the dry run exits 1
    # as --apply would (issue 40: dry runs predict), after planning, with the plan in its document.
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    doc = json.loads(r.stdout)  # type: ignore[attr-defined]
    assert doc["ok"] is False and "--apply would refuse" in doc["refused"] and "cannot cap CPU" in doc["refused"]
    (where,) = doc["restart"]["restarts"]
    assert where["vm"] == "web-0" and where["host"] in ("h0", "h2") and "apply" not in doc
    assert [s["op"] for s in doc["plan"]["steps"]] == ["create"] and doc["plan"]["restart"] == ["web-0"]


def test_restart_refuses_a_vm_whose_host_may_still_run_it_and_names_recover(tmp_path: Path, state: Path) -> None:  # noqa: F811
    recorded(state, "web-0")
    r = invoke("restart", "web-0", "--cluster", cluster(tmp_path, agent(tmp_path, 2)), "--apply")
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    assert "its host h1 does not answer and was not fenced" in r.stdout  # type: ignore[attr-defined]
    assert "vcsched recover h1" in r.stdout  # type: ignore[attr-defined]


def test_restart_of_a_name_never_recorded_is_bad_input(tmp_path: Path, state: Path) -> None:  # noqa: F811
    recorded(state, "web-0")
    r = invoke("restart", "nope", "--cluster", cluster(tmp_path, agent(tmp_path, 2)))
    assert r.exit_code == 2 and "VM 'nope': not recorded in the definitions store" in r.stderr  # type: ignore[attr-defined]


def test_a_running_vm_is_not_restarted() -> None:
    hv = down_h1([managed("web-0", "h0", "web", 0.5, cap=0.5)])
    from vcsched.control.lost import lost_vms

    assert lost_vms(hv.inventory(), [(record("web-0"), 1.0)], {"h1": 2.0}) == ()


def test_the_restart_plan_applies_and_runs_the_vm_once_below_its_floor_if_it_must() -> None:
    hv = short_of_cpu()
    restart = plan_restart(cluster_of(3), hv.inventory(), [db1()])
    assert [vm for vm, _ in restart.restarts] == ["db-1"] and not restart.refused and restart.plan is not None
    assert [vm for vm, _, _ in restart.below_floor if vm == "db-1"] == ["db-1"]
    report = apply_plan(hv, restart.plan)
    assert report.ok, report.to_dict()
    assert [v.host for v in hv.inventory().vms if v.name == "db-1"] == ["h0"]


def test_with_on_failure_strand_the_controllers_restart_keeps_the_floor_and_the_operators_does_not() -> None:
    import dataclasses

    hv = short_of_cpu()
    strand = dataclasses.replace(cluster_of(3), on_failure="strand")
    restart = plan_restart(strand, hv.inventory(), [db1()])
    assert restart.plan is None and [vm for vm, _ in restart.refused] == ["db-1"]
    asked = plan_restart(strand, hv.inventory(), [db1()], below_floor_ok=True)
    assert [vm for vm, _ in asked.restarts] == ["db-1"] and asked.plan is not None


def test_a_restart_plan_reads_back_whole_and_only_a_recover_plan_may_say_below_floor() -> None:
    import pytest

    from vcsched.errors import InputError
    from vcsched.plans.plan import plan_from_dict

    hv = short_of_cpu()
    restart = plan_restart(cluster_of(3), hv.inventory(), [db1()])
    assert restart.plan is not None
    doc = restart.plan.to_dict()
    assert plan_from_dict(doc).extra == restart.plan.extra and "db-1" in doc["below_floor"]
    with pytest.raises(InputError, match=r"plan\.below_floor: only a recover plan has it"):
        plan_from_dict({**{k: v for k, v in doc.items() if k != "restart"}, "kind": "place"})


def test_lab_up_names_the_guests_a_repaired_host_was_recorded_with_that_no_longer_run(
        tmp_path: Path, state: Path) -> None:  # noqa: F811
    """Issue 37: after a fence killed h1's guests, `lab up` said "guests kept"; it names the dead ones now."""
    from types import SimpleNamespace

    from cli.lab import found_dead

    recorded(state, "batch-0", "db-1", "web-0")  # all recorded on h1
    lab = SimpleNamespace(repaired=("h1",), cluster_file=cluster(tmp_path, agent(tmp_path, 2)))
    st = SimpleNamespace(hosts=(SimpleNamespace(name="h0", domains=("web-0",)), SimpleNamespace(name="h1",
                                                                                                 domains=())))
    assert found_dead(lab, st) == ({"h1": ["batch-0", "db-1"]}, None)  # type: ignore[arg-type]
    assert found_dead(SimpleNamespace(repaired=(), cluster_file=lab.cluster_file), st) == ({}, None)  # type: ignore[arg-type]


def test_recover_says_which_vm_runs_below_its_floor_and_the_plan_marks_it(tmp_path: Path, state: Path) -> None:  # noqa: F811
    """Three VMs of h1 needing a whole host each with floor 0.9, two survivors: the third restarts below its
    floor (on_failure = "restart", the default), said in text and in --json; the plan lists it."""
    from hypervisor.testhosts import CORES
    from vcsched.plans.steps import Boot, CreateStep

    store = DefinitionStore.for_url(f"file://{state}/coordination", "t")
    for i in range(3):
        store.put(CreateStep(f"db-{i}", "h1", "db", CORES, 128 << 20, float(CORES), float(CORES),
                             Boot("kernel", "/k", "/i", "quiet"), 0.9, priority=-i))
    c = cluster(tmp_path, agent(tmp_path, 2))
    r = invoke("recover", "h1", "--cluster", c, "--json")
    # The test driver cannot cap CPU: the dry run says --apply would refuse (exit 1), after planning.
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    doc = json.loads(r.stdout)  # type: ignore[attr-defined]
    assert "--apply would refuse" in doc["refused"]
    below = {b["vm"] for b in doc["recovery"]["below_floor"]}
    assert below and doc["plan"]["below_floor"] == sorted(below) and not doc["recovery"]["stranded"]
    text = invoke("recover", "h1", "--cluster", c).stdout  # type: ignore[attr-defined]
    assert "below its floor" in text and "min_yield 0.9" in text


def test_restart_refuses_a_vm_that_runs(tmp_path: Path, state: Path) -> None:  # noqa: F811
    recorded(state, "vm0")  # the test driver's h0 runs vm0 (hypervisor/testhosts.py)
    r = invoke("restart", "vm0", "--cluster", cluster(tmp_path, agent(tmp_path, 2)), "--json")
    assert r.exit_code == 1, r.output  # type: ignore[attr-defined]
    doc = json.loads(r.stdout)  # type: ignore[attr-defined]
    assert not doc["ok"] and doc["restart"]["refused"] == [{"vm": "vm0", "reason": "it is on h0 (not lost)"}]
    assert doc["plan"] is None
