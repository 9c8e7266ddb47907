"""Lost VMs: the managed VMs the definitions store records that run nowhere, in the pure core.

Every command that creates, migrates or removes a managed VM records it in the
definitions store (acting/definitions.py), so the store is the list of VMs
vcsched promised to keep running.  A recorded VM that no host that answered
holds is one of three things (docs/failures.md):

* **awaiting recovery**: its recorded host does not answer and was not fenced.
  It may still run there (a network split, a daemon restart): nobody may start
  it elsewhere yet.  ``status`` shows the host down; the controller (or
  ``vcsched recover HOST``) fences the host and restarts it.  Not lost.
* **lost, its host was fenced**: the host does not answer and vcsched powered it
  off (a recovery fenced it), yet the VM was not restarted elsewhere (stranded:
  ``on_failure = "strand"``, no memory, a local disk).  It runs nowhere for
  sure.  ``since``: when the host was fenced.  A fence older than the VM's
  record does not count (the host came back and took the VM after it): the
  VM awaits recovery again.
* **lost, its host answers without it**: the host it was recorded on answers and
  holds no domain of that name (the fence killed it and the host came back, or
  it was destroyed outside vcsched).  ``since``: the record's last write, the
  last moment vcsched knew it ran.

* **lost, its host is asleep**: vcsched's power saving put the host it was
  recorded on to sleep (docs/power.md), which it does only once it saw the host
  hold no domain at all: the VM is not there (a fence that took it, before the
  host came back and slept, left nothing to restart it from but this record).

A recorded VM whose recorded host has left the cluster file is lost too (its
host "is not in the cluster file").  A VM with any domain of its name on a host
that answered — running, paused, shut off, or a copy in doubt — is not lost:
it is there, and ``repair`` or the operator settles it.

**No VM is lost while a host that may hold it does not answer.**  The record
names where a VM ran when last written, not where it runs now: a migration cut
after its switch-over and before its step was recorded leaves the VM running
on the migration's destination while the record still names its source.  If
that destination then stops answering, "the recorded host answers without it"
is true and the VM runs all the same (found by the fault simulation: seed 1,
schedule 2709, docs/faultsim.md).  So every host that does not answer is taken
to hold any VM, unless it is *fenced*: a recovery powered it off and it has
not answered since, so it holds none.  A fence mark lives exactly that long:
the unit of work clears it as soon as it sees the host answer under the lock
(acting/unit_of_work.py), before anything can be placed there; a mark left
after the host came back would make a VM migrated to it count as lost once it
stopped answering again, and be started a second time (seed 90210, schedule
6229).

``vcsched restart VM`` and the controller start lost VMs again from their
records (:func:`vcsched.control.failover.failover` places them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from vcsched.inventory import Inventory
from vcsched.plans.steps import CreateStep

#: ``why`` of a lost VM whose recorded host answers without it.
HOST_ANSWERS = "host answers without it"
#: ``why`` of a lost VM whose recorded host was fenced and that was not restarted.
HOST_FENCED = "host fenced, not restarted"
#: ``why`` of a lost VM whose recorded host is asleep (powered off empty by vcsched's power saving).
HOST_ASLEEP = "host asleep without it"
#: ``why`` of a lost VM recorded on a host the cluster file no longer lists.
HOST_GONE = "host not in the cluster file"


@dataclass(frozen=True)
class Lost:
    """A recorded VM that runs nowhere: its virtual cluster, the host it was recorded on, why it counts as lost,
    and since when (Unix seconds: the fence, or the record's last write)."""

    vm: str
    cluster: str
    host: str
    why: str
    since: float

    def to_dict(self) -> dict[str, object]:
        return {"vm": self.vm, "cluster": self.cluster, "host": self.host, "why": self.why,
                "since": round(self.since, 3)}


def unseen_holders(inventory: Inventory, fenced: Collection[str]) -> tuple[str, ...]:
    """The hosts that may run any recorded VM unseen (module docstring, "No VM is lost while a host that may hold
    it does not answer"): those that do not answer and were not ``fenced``.  A host asleep was seen empty before
    its power-off (acting/power.py): it holds none.  The one rule of lost VMs, of a recovery that restarts nothing
    while another such host exists (:func:`vcsched.control.failover.plan_recovery`), and of why a VM a restart is
    asked for is not lost yet (acting/recovery.py)."""
    return tuple(h.name for h in inventory.hosts if h.down is not None and not h.asleep and h.name not in fenced)


def lost_vms(inventory: Inventory, records: Iterable[tuple[CreateStep, float]],
             fenced: Mapping[str, float] | None = None, *, ignore_down_hosts: bool = False) -> tuple[Lost, ...]:
    """Every record (``(create step, time written)``) whose VM no answering host holds and that is not awaiting
    recovery, in name order.  ``fenced``: hosts a recovery fenced, and when (a mark lives until the host is seen
    answering again: module docstring).  None while a host that does not answer is not fenced: it may hold any
    of them.  ``ignore_down_hosts``: only ever the fault simulation's mutation switch ``lost-while-holder-down``
    (hypervisor/hazards.py), the rule before."""
    fenced = fenced or {}
    if not ignore_down_hosts and unseen_holders(inventory, fenced):
        return ()
    present = {v.name for v in inventory.vms} | {d.vm for d in inventory.in_doubt}
    hosts = {h.name: h for h in inventory.hosts}
    out = []
    for step, updated in records:
        if step.vm in present:
            continue
        host = hosts.get(step.host)
        if host is None:
            out.append(Lost(step.vm, step.cluster, step.host, HOST_GONE, updated))
        elif host.down is None:
            out.append(Lost(step.vm, step.cluster, step.host, HOST_ANSWERS, updated))
        elif host.asleep:  # seen empty before its power-off (found by the fault simulation: seed 7, schedule 9810)
            out.append(Lost(step.vm, step.cluster, step.host, HOST_ASLEEP, updated))
        elif fenced.get(step.host, -1.0) >= updated:  # a fence older than the record: the host came back since
            out.append(Lost(step.vm, step.cluster, step.host, HOST_FENCED, fenced[step.host]))
    return tuple(sorted(out, key=lambda lost: lost.vm))


def awaiting(inventory: Inventory, records: Iterable[tuple[CreateStep, float]], fenced: Mapping[str, float],
             host: str) -> tuple[CreateStep, ...]:
    """The records a recovery of ``host`` (down in ``inventory``) starts again besides those recorded on it: the VMs
    that no answering host holds and that only ``host`` may still hold — lost once it is fenced, awaiting it until
    then (e.g. a VM whose migration to ``host`` was cut before its step was recorded: its record names the source,
    which answers without it).  Without them a recovery with nothing recorded on the host would fence nothing and
    they would wait for ever (found by the fault simulation, docs/faultsim.md)."""
    records = list(records)
    once_fenced = lost_vms(inventory, records, {**fenced, host: float("inf")})
    mine = {x.vm for x in once_fenced if x.host != host}
    return tuple(step for step, _ in records if step.vm in mine)
