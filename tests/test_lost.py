"""Lost VMs (vcsched/control/lost.py): recorded in the definitions store, running nowhere, and why."""

from __future__ import annotations

import dataclasses

from tests.builders import inventory_of, managed
from tests.test_failover import record
from vcsched.control.lost import HOST_ANSWERS, HOST_FENCED, HOST_GONE, Lost, awaiting, lost_vms
from vcsched.inventory import Inventory


def h1_down(inv: Inventory) -> Inventory:
    return dataclasses.replace(inv, hosts=tuple(dataclasses.replace(h, down="did not answer") if h.name == "h1"
                                                else h for h in inv.hosts))


def test_a_vm_running_anywhere_is_not_lost_and_one_whose_host_answers_without_it_is() -> None:
    inv = inventory_of([managed("web-0", "h2", "web", 0.5)], n_hosts=3)  # web-0 moved: recorded on h1 is stale
    records = [(dataclasses.replace(record("web-0"), host="h0"), 10.0), (dataclasses.replace(record("db-1", "db"),
                                                                                              host="h0"), 20.0)]
    assert lost_vms(inv, records) == (Lost("db-1", "db", "h0", HOST_ANSWERS, 20.0),)


def test_on_a_down_host_a_vm_awaits_recovery_until_the_host_is_fenced() -> None:
    inv = h1_down(inventory_of([], n_hosts=3))
    records = [(record("db-1", "db"), 20.0)]
    assert lost_vms(inv, records) == ()
    assert lost_vms(inv, records, fenced={"h1": 30.0}) == (Lost("db-1", "db", "h1", HOST_FENCED, 30.0),)
    assert lost_vms(inv, records, fenced={"h1": 10.0}) == (), "fenced before the VM came to h1: it may run there"


def test_a_vm_recorded_on_a_host_the_cluster_file_dropped_is_lost_and_a_copy_shut_off_is_not() -> None:
    inv = inventory_of([dataclasses.replace(managed("web-0", "h0", "web", 0.5), active=False)], n_hosts=1)
    records = [(record("web-0"), 5.0), (record("db-1", "db"), 6.0)]
    assert lost_vms(inv, records) == (Lost("db-1", "db", "h1", HOST_GONE, 6.0),)


def down(inv: Inventory, *names: str) -> Inventory:
    return dataclasses.replace(inv, hosts=tuple(dataclasses.replace(h, down="did not answer") if h.name in names
                                                else h for h in inv.hosts))


def test_no_vm_is_lost_while_a_host_that_was_not_fenced_does_not_answer() -> None:
    """A migration h0 -> h1 cut after its switch-over, before its step was recorded: the record names h0, which
    answers without web-0, while web-0 runs on h1, which then stopped answering.  Counted lost, it was started a
    second time on h0 (scripts/faultsim --seed 1 --replay 2709).  Once h1 is fenced it holds nothing: lost."""
    inv = down(inventory_of([], n_hosts=3), "h1")
    records = [(dataclasses.replace(record("web-0"), host="h0"), 10.0)]
    assert lost_vms(inv, records) == ()
    assert lost_vms(inv, records, fenced={"h1": 5.0}) == (Lost("web-0", "web", "h0", HOST_ANSWERS, 10.0),)
    assert lost_vms(inv, records, ignore_down_hosts=True) == (Lost("web-0", "web", "h0", HOST_ANSWERS, 10.0),)


def test_a_recovery_restarts_the_vms_only_its_host_may_still_hold() -> None:
    """The VMs that await h1 besides those recorded on it: web-0 (recorded on h0, which answers without it) is
    restarted by h1's recovery, which fences h1 first; not while h2, unfenced, does not answer either (it may hold
    it), and never a VM that runs (scripts/faultsim --seed 1 --replay 8245: nothing recorded on the failed host,
    nothing fenced, web-0 never restarted)."""
    inv = down(inventory_of([managed("db-1", "h2", "db", 0.5)], n_hosts=3), "h1")
    web0, db1, on_h1 = (dataclasses.replace(record("web-0"), host="h0"), record("db-1", "db"), record("app-0"))
    records = [(web0, 10.0), (db1, 10.0), (on_h1, 10.0)]
    assert awaiting(inv, records, {}, "h1") == (web0,)
    assert awaiting(down(inv, "h1", "h2"), records, {}, "h1") == ()
    assert awaiting(down(inv, "h1", "h2"), records, {"h2": 20.0}, "h1") == (web0,)
