"""The definitions store (acting/definitions.py): every create, move, re-need and removal is recorded where a
dead host cannot take it along, so that its VMs can be created again elsewhere."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from acting.definitions import DefinitionStore, StoreError, recorder
from acting.executor import DONE, FAILED, StepResult, apply_plan
from tests.builders import cluster_of, inventory_of, managed, memory_hypervisor, request
from tests.etcd_support import Etcd, etcd  # noqa: F401  (fixture)
from vcsched.control.admission import admit
from vcsched.errors import InputError
from vcsched.plans.steps import Boot, CreateStep, MigrateStep, RemoveStep, SetNeedStep


def create(vm: str = "web-0", host: str = "h0", priority: int = 0) -> CreateStep:
    return CreateStep(vm, host, "web", 1, 128 << 20, 0.5, 0.5, Boot("kernel", "/k", "/i", "quiet"), 0.3,
                      spread="required", priority=priority)


def file_store(tmp_path: Path) -> DefinitionStore:
    return DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")


def test_a_record_holds_the_create_step_and_reads_back_equal(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    store.put(create(priority=7))
    got = store.get("web-0")
    assert got is not None and got.step == create(priority=7) and got.host == "h0"
    path = tmp_path / "coordination" / "definitions" / "lab" / "web-0.json"
    assert json.loads(path.read_text())["create"]["priority"] == 7
    assert not list(path.parent.glob(".*.tmp")), "written through a temporary file, renamed"


def test_migrations_move_the_record_and_removals_delete_it(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    store.record([create("web-0", "h0"), create("web-1", "h0")])
    store.record([MigrateStep("web-0", "h0", "h1", 1 << 20, 0.5), SetNeedStep("web-1", "h0", 0.8)])
    assert [d.vm for d in store.on("h0")] == ["web-1"] and [d.vm for d in store.on("h1")] == ["web-0"]
    web1 = store.get("web-1")
    assert web1 is not None and web1.step.cpu_need_cores == 0.8
    store.record([RemoveStep("web-1", "h0", "web")])
    assert set(store.all()) == {"web-0"}


def test_clusters_do_not_see_each_others_records(tmp_path: Path) -> None:
    file_store(tmp_path).put(create())
    assert DefinitionStore.for_url(f"file://{tmp_path}/coordination", "other").all() == {}


def test_a_record_that_is_not_one_is_bad_data_naming_it(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    store.put(create())
    (tmp_path / "coordination" / "definitions" / "lab" / "web-0.json").write_text("{}")
    with pytest.raises(InputError, match="definition of web-0: not a vcsched definition record"):
        store.get("web-0")


def test_an_unwritable_store_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "coordination").write_text("a file, not a directory")
    with pytest.raises(StoreError, match=r"definitions store file://.*: cannot record VM web-0"):
        file_store(tmp_path).put(create())


def test_applying_a_plan_records_what_took_effect_and_only_that(tmp_path: Path) -> None:
    hv = memory_hypervisor(inventory_of([managed("old-0", "h0", "old", 0.5, cap=0.5)]))
    plan = admit(cluster_of(), hv.inventory(), request(vms=2, need=0.25)).plan
    assert plan is not None
    creates = [s for s in plan.steps if isinstance(s, CreateStep)]
    hv.fail[("create", creates[-1].vm)] = "libvirt said no"
    store = file_store(tmp_path)
    warned: list[str] = []
    report = apply_plan(hv, plan, on_step=recorder(store, warned.append))
    outcome = {r.step.vm: r.outcome for r in report.results if isinstance(r.step, CreateStep)}
    assert outcome[creates[0].vm] == DONE and outcome[creates[-1].vm] == FAILED
    assert set(store.all()) == {creates[0].vm} and not warned


def test_a_store_that_cannot_be_written_is_said_and_the_plan_stands(tmp_path: Path) -> None:
    (tmp_path / "coordination").write_text("not a directory")
    warned: list[str] = []
    step = create()
    recorder(file_store(tmp_path), warned.append)(StepResult(step, DONE))
    assert len(warned) == 1 and "could not be restarted elsewhere if its host failed" in warned[0]


def test_etcd_holds_the_records_too(etcd: Etcd) -> None:  # noqa: F811
    store = DefinitionStore.for_url(etcd.url, "lab")
    store.record([create("web-0"), dataclasses.replace(create("web-1"), host="h1")])
    assert {d.vm: d.host for d in store.all().values()} == {"web-0": "h0", "web-1": "h1"}
    store.delete("web-0")
    assert store.get("web-0") is None and [d.vm for d in store.on("h1")] == ["web-1"]


def test_fenced_hosts_are_recorded_beside_the_records_and_never_read_as_one(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    store.put(create("web-0", "h1"))
    store.mark_fenced("h1", at=1000.0)
    assert store.fenced() == {"h1": 1000.0} and list(store.all()) == ["web-0"]
    assert DefinitionStore.for_url(f"file://{tmp_path}/coordination", "other").fenced() == {}
    store.clear_fenced("h1")
    assert store.fenced() == {}
