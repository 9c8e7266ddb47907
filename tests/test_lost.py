"""Lost VMs (vcsched/control/lost.py): recorded in the definitions store, running nowhere, and why."""

from __future__ import annotations

import dataclasses

from tests.builders import inventory_of, managed
from tests.test_failover import record
from vcsched.control.lost import HOST_ANSWERS, HOST_FENCED, HOST_GONE, Lost, lost_vms
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
