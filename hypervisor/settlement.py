"""Settling in-doubt VMs (``vcsched repair``): one explicit action, under the cluster lock, never a read.

A VM is *in doubt* after an interrupted migration (:class:`vcsched.inventory.InDoubt`): active on two hosts,
or a lone paused arrival whose source may still hold a copy.  Reading an inventory only reports it; this
module is the one place that destroys a paused twin or resumes an orphaned arrival, and only:

* under the cluster lock — :func:`settle` takes the lock's ``guard`` and calls it before every action;
* on an inventory in which every host that **may hold another copy** of the VM answered (the hosts its copies'
  migration marks name, or every host for copies from before migration generations:
  :func:`vcsched.plans.repair.may_hold`); while one does not answer, that VM waits (a host that did not answer
  may hold a copy), and the others are settled — one host down no longer leaves every copy in doubt paused for
  as long as it is down (found by the fault simulation, docs/faultsim.md);
* after re-reading, right before each action, every copy's host: each copy must still be in the state the
  plan saw and have no libvirt job (a migration holds one on both sides until its source is confirmed gone);
  an arrival is resumed only once its source host, read in this same action, has no copy — unless libvirt
  reported the arrival's migration complete (below: its source never runs again).

A host that a recovery *fenced* (powered off; the definitions store's mark, cleared once it answers again) holds
no copy: nothing waits for it.  But the copy it held may have been the newest: libvirt resumes a migration's
source when Finish failed (Confirm cancelled), and that source may have run past its paused arrival.  So:

* an arrival marked ``completed`` (``migrate3`` returned: the source was confirmed, never to run again,
  :func:`hypervisor.migration.mark_completed`) holds the newest state: resumed without reading its source's
  host, whether that host was fenced or does not answer;
* an arrival whose source's host was fenced and that carries no such mark is destroyed, not resumed: the VM is
  then lost and restarted from its definition record (a fresh boot, as every VM of a fenced host), never run
  from a state its source may have run past (found by the fault simulation: seed 7, schedules 3541 and 4501).

What it may do:

* a VM running on exactly one host whose other copies are paused and carry vcsched's metadata: the paused
  copies are destroyed (a paused copy never executed guest code since the migration began: vcsched resumes a
  destination only after its source is gone, so the running copy holds the VM's state);
* a lone paused arrival (``arriving_from``) whose source host answers and has no copy: resumed, its mark
  dropped (vcsched stopped between migrating and resuming);
* a VM whose copies are all paused (no copy runs): the copy holding the newest state is resumed and the
  others destroyed first, when that copy can be named (:func:`vcsched.plans.repair.newest_paused`, by the
  migration *generation* each attempt records, :mod:`hypervisor.migration`): e.g. a paused arrival beside
  its source that libvirt paused for the migration (the client went away after the destination's Finish and
  before the source's Confirm: the migration is completed as it would have been), or, beside a stale arrival
  of an earlier cut attempt, the arrival of the newest one (issue 37: found by the fault simulation,
  docs/faultsim.md);
* a lone paused copy that libvirt paused for a migration (``VIR_DOMAIN_PAUSED_MIGRATION``, no job) while no
  other host has a copy (the client went away after the copy completed and before Finish: the destination
  cancelled its incoming domain, the source keeps its copy paused): resumed.  Found by the fault simulation
  (docs/faultsim.md); a copy paused by someone's ``suspend`` is never resumed.

Everything else — two running copies, paused copies whose newest cannot be named, an arrival
whose source is not a host of the cluster, a copy without vcsched's metadata — is left to the operator and
reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hypervisor import hazards
from hypervisor.base import HypervisorError
from hypervisor.live_state import copy_state, has_job, paused_for_migration
from hypervisor.migration import clear_attempt, destroy_copy, resume_marked
from vcsched.inventory import InDoubt, Inventory
from vcsched.plans.repair import DESTROY, RESUME, RepairAction, RepairReport, plan_repair

if TYPE_CHECKING:
    from hypervisor.libvirt_backend import LibvirtHypervisor

def interrupted_copies(hv: LibvirtHypervisor, inventory: Inventory) -> frozenset[str]:
    """UUIDs of the lone paused managed copies (no arrival mark, no other copy) that libvirt paused for a
    migration and that no job holds: one read per such copy, of which there are normally none."""
    doubtful = {d.uuid for d in inventory.in_doubt}
    out = set()
    for v in inventory.vms:
        if not (v.paused and v.meta is not None and v.arriving_from is None and v.uuid is not None
                and v.uuid not in doubtful):
            continue
        try:
            conn = hv.conn(v.host)
            if paused_for_migration(conn, v.host, v.uuid) and not has_job(conn, v.host, v.uuid):
                out.add(v.uuid)
        except HypervisorError:
            continue  # cannot tell now: a later repair looks again
    return frozenset(out)


def migration_paused_copies(hv: LibvirtHypervisor, inventory: Inventory) -> frozenset[tuple[str, str]]:
    """``(host, uuid)`` of the paused copies (no arrival mark) of in-doubt VMs that run nowhere which libvirt
    paused for a migration and no job holds: one read per such copy (:func:`newest_paused` needs to know)."""
    out: set[tuple[str, str]] = set()
    if hazards.on(hazards.RESUME_WITHOUT_GENERATION):  # mutation switch: the rule before generations reads none
        return frozenset()
    for d in inventory.in_doubt:
        if "running" in d.states:
            continue
        for h, src in zip(d.hosts, d.arriving_from or (None,) * len(d.hosts), strict=True):
            if src is not None:
                continue
            try:
                conn = hv.conn(h)
                if paused_for_migration(conn, h, d.uuid) and not has_job(conn, h, d.uuid):
                    out.add((h, d.uuid))
            except HypervisorError:
                continue  # cannot tell now: left for a later repair
    return frozenset(out)


def settle(hv: LibvirtHypervisor, guard: Callable[[], None], *, apply: bool = True,
           inventory: Inventory | None = None, fenced: frozenset[str] = frozenset()) -> RepairReport:
    """Plan the repair on an inventory of every host (read now unless given) and, with ``apply``, carry it out.

    ``guard`` is the cluster lock's: called before every action, it raises when the lock is no longer ours
    (then nothing more is done).  The dry run (``apply=False``) reads only.
    """
    inv = inventory if inventory is not None else hv.inventory()
    if {h.name for h in inv.hosts} != {h.name for h in hv.cluster.hosts}:
        raise ValueError("settle needs an inventory of every host of the cluster")
    plan = plan_repair(inv, interrupted_copies(hv, inv), migration_paused_copies(hv, inv), fenced=fenced,
                       unread_hosts=hazards.on(hazards.RESUME_UNREAD_SOURCE),  # mutation switches (test_faultsim.py)
                       ignore_generations=hazards.on(hazards.RESUME_WITHOUT_GENERATION))
    if not apply or plan.refused is not None:
        return RepairReport(plan, applied=False)
    outcomes = []
    doubts = {d.uuid: d for d in (*plan.in_doubt, *plan.interrupted)}
    removed: set[tuple[str, str]] = set()  # (host, uuid) of the copies this repair destroyed
    answered = frozenset(h.name for h in inv.hosts if h.down is None)
    asleep = frozenset(h.name for h in inv.asleep_hosts())
    for a in plan.actions:
        guard()
        problem = _recheck(hv, a, doubts[a.uuid], removed, answered, asleep)
        if problem is not None:
            outcomes.append((a, "skipped", problem))
            continue
        try:
            if a.action == DESTROY:
                destroy_copy(hv, a.host, a.vm, a.uuid)
                removed.add((a.host, a.uuid))
            else:
                resume_marked(hv, a.host, a.vm, a.uuid)
        except HypervisorError as exc:
            outcomes.append((a, "failed", str(exc)))
        else:
            outcomes.append((a, "done", ""))
    forget_marks(hv, guard, inv, removed)
    return RepairReport(plan, True, tuple(outcomes))


def forget_marks(hv: LibvirtHypervisor, guard: Callable[[], None], inv: Inventory,
                 removed: set[tuple[str, str]]) -> None:
    """Drop the ``migrating_to`` mark of every running managed copy whose marked host answered in ``inv`` and holds
    no copy of it now (none was there, or this repair destroyed it): the cut attempt left nothing there, so that
    host stopping later must not keep the VM from migrating.  A mark naming a host that did not answer stays (it
    may hold a copy).  Bookkeeping, not a change to any guest: not reported; ``guard`` before each."""
    copies = {(v.host, v.uuid) for v in inv.vms if v.active} - removed
    answered = {h.name for h in inv.hosts if h.down is None}
    for v in inv.vms:
        mark = v.meta.migrating_to if v.meta is not None else None
        if mark is None or v.uuid is None or not v.active or v.paused or mark == v.host \
                or mark not in answered or (mark, v.uuid) in copies:
            continue
        guard()
        clear_attempt(hv, v.host, v.name, v.uuid, mark)


def _recheck(hv: LibvirtHypervisor, a: RepairAction, d: InDoubt, removed: set[tuple[str, str]],
             answered: frozenset[str], asleep: frozenset[str] = frozenset()) -> str | None:
    """Every copy's host read again right before ``a``: None if it may go ahead, else why not.  The hosts
    ``asleep`` (powered off empty by vcsched's power saving, docs/power.md) hold no copy and are not read.

    A copy this repair already destroyed (``removed``: a VM with two paused twins) is expected gone: found by
    the fault simulation (seed 1, schedule 9915), where the second twin was skipped for the first's absence.
    A resume also expects no copy on every other host that ``answered`` the plan's read (the plan waited for
    every host that may hold one: :func:`vcsched.plans.repair.may_hold`).
    """
    expected = {h: "gone" if (h, d.uuid) in removed else st for h, st in zip(d.hosts, d.states, strict=True)}
    if a.action == RESUME:
        source = next((src for h, src in zip(d.hosts, d.arriving_from or (), strict=False) if h == a.host), None)
        if source is None:  # a lone copy a migration left paused: no other host may have one
            # Read in name order, not the set's (which changes with each process's hash seed): which host is read
            # first decides what the reads see when one stops answering meanwhile (issue 37: the fault simulation's
            # seed 7 schedule 484 did not replay exactly).
            expected |= {h: "gone" for h in sorted(answered) if h != a.host}
        elif hazards.on(hazards.RESUME_UNREAD_SOURCE):  # mutation switch (tests/test_faultsim.py)
            expected.pop(source, None)
        else:
            expected[source] = "gone"
        for host in a.unread:  # fenced, or the source of an arrival libvirt reported complete: nothing there runs
            expected.pop(host, None)
    for host, state in expected.items():
        if state == "gone" and host in asleep:  # powered off empty: nothing to read there (seed 1, schedule 6290)
            continue
        try:
            now = copy_state(hv.conn(host), host, a.uuid)
            busy = now != "gone" and has_job(hv.conn(host), host, a.uuid)
        except HypervisorError as exc:
            return f"its copy on {host} cannot be read again ({exc}): left for a later repair"
        if now != state:
            return (f"its copy on {host} is now {now}, not {state} (a migration in progress or just completed): "
                    "left for a later repair")
        if busy:
            return f"its copy on {host} has a libvirt job (a migration in progress): left for a later repair"
    return None
