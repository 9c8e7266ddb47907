"""What settling in-doubt VMs would do (``vcsched repair``), decided on an inventory: a pure function.

The rules (which paused twin is destroyed, which orphaned arrival resumed, what is left to the operator, and why
nothing is settled while a host does not answer) are in :mod:`hypervisor.settlement`'s docstring, beside the
code that carries them out through libvirt under the cluster lock.  Deciding lives in the core so that a dry
run, ``status`` and the unit of work's notes say what repair would do without importing the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vcsched.inventory import InDoubt, Inventory, VmMeta

DESTROY, RESUME = "destroy", "resume"
#: Why a paused arrival whose source host was fenced is destroyed rather than resumed.  libvirt resumes a
#: migration's source when the attempt fails after the destination finished (Confirm cancelled), and the source
#: may then have run past the arrival's state; only the source's paused reason could tell, and the fence took it.
#: Resuming the arrival could run the VM from a stale state against a disk its source wrote since; with no copy
#: left the VM is lost and restarted from its record (a fresh boot, as every VM of a fenced host).
SOURCE_FENCED = ("its source host {source} was fenced, and the copy there may have run after this arrival's state "
                 "was taken: resuming it could run the VM from a stale state; the VM is restarted from its record")


@dataclass(frozen=True)
class RepairAction:
    """One thing repair would do: ``destroy`` a paused twin or ``resume`` an orphaned arrival, and why."""

    vm: str
    uuid: str
    host: str
    action: str
    why: str
    #: Hosts the re-check right before a resume does not read (``hypervisor.settlement._recheck``): the fenced
    #: source host of an arrival libvirt reported complete (off: it holds no copy).
    unread: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, str]:
        return {"vm": self.vm, "uuid": self.uuid, "host": self.host, "action": self.action, "why": self.why}


@dataclass(frozen=True)
class RepairPlan:
    """What repair would do on an inventory (:func:`plan_repair`): actions, what it leaves, or why it refuses."""

    in_doubt: tuple[InDoubt, ...]
    actions: tuple[RepairAction, ...] = ()
    #: In-doubt VMs repair does not touch, one line each (why).
    left: tuple[str, ...] = ()
    #: Why repair does nothing at all (every VM in doubt waits for a host that did not answer), or None.
    refused: str | None = None
    #: Lone paused copies that a migration stopped and nothing resumed (not in ``in_doubt``: an inventory cannot
    #: tell them from a copy someone paused), one each, for the re-checks of their resume actions.
    interrupted: tuple[InDoubt, ...] = ()
    #: In-doubt VMs not settled now because a host that may hold another copy of them did not answer, one line each
    #: (settled by a later repair, once that host answers).
    waiting: tuple[str, ...] = ()
    #: The hosts those VMs wait for: fencing one (a recovery) lets repair settle them.
    blocked: tuple[str, ...] = ()
    #: Hosts that do not answer (and were not fenced) that a running VM's ``migrating_to`` mark names: its cut
    #: migration may have left a paused copy there, which only that host answering (then repair destroys it) or
    #: its fence removes.
    leftovers: tuple[str, ...] = ()


@dataclass(frozen=True)
class RepairReport:
    """What :func:`settle` found and did: the plan, and per action ``done`` or why it was skipped or failed."""

    plan: RepairPlan
    applied: bool
    outcomes: tuple[tuple[RepairAction, str, str], ...] = ()  # (action, "done"/"skipped"/"failed", detail)

    @property
    def ok(self) -> bool:
        """Nothing refused and no action failed (skipped ones are left for a later repair)."""
        return self.plan.refused is None and all(o != "failed" for _, o, _ in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {"applied": self.applied, "refused": self.plan.refused,
                "in_doubt": [{"vm": d.vm, "uuid": d.uuid, "hosts": list(d.hosts), "states": list(d.states)}
                             for d in self.plan.in_doubt],
                "actions": [{**a.to_dict(), **({"outcome": o, "detail": why} if self.applied else {})}
                            for a, o, why in self._rows()],
                "left": list(self.plan.left), "waiting": list(self.plan.waiting)}

    def _rows(self) -> list[tuple[RepairAction, str, str]]:
        if self.applied:
            return list(self.outcomes)
        return [(a, "would", "") for a in self.plan.actions]

    def lines(self) -> list[str]:
        """One line per action (done, or what it would do) and per VM left alone; the refusal first."""
        out = [f"repair refused: {self.plan.refused}"] if self.plan.refused else []
        for a, outcome, detail in self._rows():
            verb = {"destroy": "destroy the paused copy of", "resume": "resume the paused arrival"}[a.action]
            if not self.applied:
                out.append(f"would {verb} {a.vm} on {a.host}: {a.why}")
            elif outcome == "done":
                out.append(f"{verb.replace('destroy', 'destroyed').replace('resume', 'resumed')} {a.vm} on "
                           f"{a.host}: {a.why}")
            else:
                out.append(f"{a.vm} on {a.host}: {outcome} ({detail})")
        out += [f"left to the operator: {line}" for line in self.plan.left]
        if self.plan.refused is None:
            out += [f"not settled yet: {line}" for line in self.plan.waiting]
        return out


def plan_repair(inventory: Inventory, interrupted: frozenset[str] = frozenset(),
                migration_paused: frozenset[tuple[str, str]] = frozenset(), *, fenced: frozenset[str] = frozenset(),
                unread_hosts: bool = False, ignore_generations: bool = False) -> RepairPlan:
    """What repair would do on ``inventory`` (a pure function: nothing is read or changed).

    An in-doubt VM waits (``waiting``) while a host that may hold another copy of it does not answer
    (:func:`may_hold`); the others are settled as if every host answered, so that one host down does not leave
    a copy paused everywhere and running nowhere for as long as it is down (found by the fault simulation,
    docs/faultsim.md).  Refused (nothing at all done) when every VM in doubt waits.  ``fenced``: hosts that do not
    answer because a recovery powered them off (the definitions store's fence marks, cleared once a host answers
    again): they hold no copy, so nothing waits for them; but a copy there may have been the newest, so an
    arrival whose source was fenced is not resumed (:data:`SOURCE_FENCED`).  ``interrupted``:
    the UUIDs of lone paused managed copies that libvirt paused for a migration
    (:func:`hypervisor.settlement.interrupted_copies` reads them); ``migration_paused``: ``(host, uuid)`` of the
    paused copies without an arrival mark of in-doubt VMs that run nowhere which libvirt paused for a migration,
    no job holding them (:func:`hypervisor.settlement.migration_paused_copies`; a dry run that did not read them
    leaves such a source and its arrival to the operator).  ``unread_hosts`` and ``ignore_generations``: only
    ever the fault simulation's mutation switches ``resume-unread-source`` (plan despite hosts that did not
    answer) and ``resume-without-generation`` (the rule before generations), hypervisor/hazards.py, which show
    the simulation catches each hazard.
    """
    doubts = inventory.in_doubt
    # The mutation switch resume-unread-source plans as if every host had answered.  A host vcsched put to sleep
    # was seen empty before its power-off and is never planned onto until a wake records it on (acting/power.py):
    # it holds no copy, and holds no repair back for as long as it sleeps.
    unanswered = frozenset(h.name for h in inventory.hosts if h.down is not None and not h.asleep)
    down = frozenset() if unread_hosts else unanswered - fenced
    hosts = {h.name for h in inventory.hosts}
    actions: list[RepairAction] = []
    left: list[str] = []
    waiting: list[str] = []
    blocked: set[str] = set()
    by_copy = {(v.host, v.uuid): v for v in inventory.vms if v.uuid is not None}

    def waits(vm: str, where: str, holders: frozenset[str], why: str) -> bool:
        unread = sorted(holders & down)
        if unread:
            blocked.update(unread)
            waiting.append(f"{vm}: on {where}: {', '.join(unread)} did not answer and may hold a copy ({why})")
        return bool(unread)

    for d in doubts:
        where = ", ".join(f"{h} ({st})" for h, st in zip(d.hosts, d.states, strict=True))
        metas = {h: c.meta for h in d.hosts if (c := by_copy.get((h, d.uuid))) is not None and c.meta is not None}
        source_of = dict(zip(d.hosts, d.arriving_from or (None,) * len(d.hosts), strict=True))
        # A fenced source of an arrival libvirt reported complete never ran past it (module docstring of
        # hypervisor.settlement): that arrival holds the newest state.
        done_sources = {source_of[h] for h, m in metas.items() if m.completed and source_of[h] is not None}
        if waits(d.vm, where, *may_hold(d.hosts, d.generations or (None,) * len(d.hosts), d.arriving_from,
                                        tuple(metas.values()), hosts)):
            continue
        running = [h for h, st in zip(d.hosts, d.states, strict=True) if st == "running"]
        paused = [h for h, st in zip(d.hosts, d.states, strict=True) if st == "paused"]
        if len(d.hosts) == 1:
            source = d.arriving_from[0] if d.arriving_from else None
            if source is None or source not in hosts:
                left.append(f"{d.vm}: paused arrival on {d.hosts[0]} from {source!r}, not a host of this cluster: "
                            "its source cannot be read")
                continue
            if source in fenced and source not in done_sources:
                actions.append(RepairAction(d.vm, d.uuid, d.hosts[0], DESTROY, SOURCE_FENCED.format(source=source)))
                continue
            if source in unanswered:  # fenced (or the mutation switch resume-unread-source)
                actions.append(RepairAction(d.vm, d.uuid, d.hosts[0], RESUME, _unread_source(source),
                                            unread=(source,)))
                continue
            actions.append(RepairAction(d.vm, d.uuid, d.hosts[0], RESUME,
                                        f"its migration from {source} completed but it was left paused; {source} "
                                        "answered and has no copy"))
            continue
        if not running:
            newest = newest_paused(d, hosts, {h for h in d.hosts
                                              if (c := by_copy.get((h, d.uuid))) is None or c.meta is None},
                                   migration_paused, ignore_generations)
            if newest.host is None:
                left.append(f"{d.vm}: on {where}: no copy runs: {newest.why}")
                continue
            source = source_of[newest.host]
            if source in fenced and source not in done_sources:
                actions += [RepairAction(d.vm, d.uuid, h, DESTROY, SOURCE_FENCED.format(source=source))
                            for h in d.hosts]
                continue
            actions += [RepairAction(d.vm, d.uuid, h, DESTROY,
                                     f"an older paused copy (generation {g}); the newest is on {newest.host}, "
                                     "removed first")
                        for h, g in zip(d.hosts, d.generations or (0,) * len(d.hosts), strict=True)
                        if h != newest.host]
            unread = (source,) if source in unanswered else ()
            actions.append(RepairAction(d.vm, d.uuid, newest.host, RESUME,
                                        f"{newest.why}; {_unread_source(source)}" if unread else newest.why,
                                        unread=unread))
            continue
        if len(running) != 1:
            left.append(f"{d.vm}: on {where}: " + ("runs on several hosts: vcsched cannot tell which copy holds "
                                                    "the newer state" if running else
                                                    "no copy runs: vcsched cannot tell which one to resume"))
            continue
        unmanaged = [h for h in paused if (c := by_copy.get((h, d.uuid))) is None or c.meta is None]
        if unmanaged:
            left.append(f"{d.vm}: on {where}: its paused copy on {', '.join(unmanaged)} has no vcsched metadata")
            continue
        gens = dict(zip(d.hosts, d.generations or (0,) * len(d.hosts), strict=True))
        newer = [h for h in paused if (gens[h] or 0) > (gens[running[0]] or 0)]
        if newer and not ignore_generations:
            # Never reached by vcsched's own migrations (a copy runs only once it is the newest): a copy recorded
            # newer than the running one means someone else resumed a copy, and destroying either may lose state.
            left.append(f"{d.vm}: on {where}: its paused copy on {', '.join(newer)} has a newer migration "
                        f"generation than the copy running on {running[0]}: vcsched cannot tell which holds the "
                        "newer state")
            continue
        actions += [RepairAction(d.vm, d.uuid, h, DESTROY,
                                 f"a paused copy that never ran since its migration began; it runs on {running[0]}")
                    for h in paused]
    lone: list[InDoubt] = []
    for v in inventory.vms:
        if v.uuid in interrupted and v.paused and v.meta is not None and v.arriving_from is None \
                and v.uuid not in {d.uuid for d in doubts}:
            if waits(v.name, f"{v.host} (paused)", *may_hold((v.host,), (v.meta.generation,), (None,), (v.meta,),
                                                              hosts)):
                continue
            lone.append(InDoubt(v.name, v.uuid, (v.host,), ("paused",), arriving_from=(None,)))
            actions.append(RepairAction(v.name, v.uuid, v.host, RESUME,
                                        "a migration paused it and ended before its destination finished (no other "
                                        "host has a copy)"))
    doubtful = {d.uuid for d in doubts}
    leftovers = sorted({mark for v in inventory.vms if v.meta is not None and v.active and not v.paused
                        and v.uuid not in doubtful and (mark := v.meta.migrating_to) is not None and mark in down})
    refused = None
    if waiting and not actions:
        refused = (f"host(s) {', '.join(sorted(blocked))} did not answer: a copy there cannot be ruled out, so no "
                   "in-doubt VM is settled (nothing changed)")
    return RepairPlan(doubts, tuple(actions), tuple(left), refused, tuple(lone), tuple(waiting), tuple(sorted(blocked)),
                      tuple(leftovers))


def _unread_source(source: str | None) -> str:
    """Why an arrival is resumed although its source's host does not answer."""
    return (f"its source host {source} was fenced (it holds no copy) and libvirt had reported this migration "
            "complete: the source never ran past it")


def may_hold(copies: tuple[str, ...], generations: tuple[int | None, ...], arriving_from: tuple[str | None, ...],
             metas: tuple[VmMeta, ...], hosts: set[str]) -> tuple[frozenset[str], str]:
    """The hosts other than ``copies`` (the hosts a VM has copies on) that may hold another copy of it, and why.

    vcsched makes a second copy of a VM only by migrating it, and every attempt names its destination on the
    source before it starts (``migrating_to``, with the new generation: :func:`hypervisor.migration.
    record_attempt`); the destination's copy names its source (``arriving_from``).  A mark stays until the
    attempt's destination is verified to hold no copy, and no step migrates a VM while the host its mark names
    does not answer (:func:`vcsched.plans.check.holder_answers`), so a copy elsewhere is always named by a mark
    on a copy that can be read, or by an arrival's source.  Copies from before generations (generation 0, or
    no metadata: a VM in doubt has been the source of an attempt, which raises its number to 1 at least) carry
    no such marks: any host may hold another copy of them.
    """
    if any(not g for g in generations):
        return frozenset(hosts) - set(copies), "a copy without a migration generation: any host may hold another"
    named = {src for src in arriving_from if src} | {m.migrating_to for m in metas if m.migrating_to}
    return frozenset(named & hosts) - set(copies), "named by its copies' migration marks"


@dataclass(frozen=True)
class Newest:
    """The copy :func:`newest_paused` names (``host``) and why, or None and why none can be named."""

    host: str | None
    why: str


def newest_paused(d: InDoubt, hosts: set[str], unmanaged: set[str],
                  migration_paused: frozenset[tuple[str, str]], ignore_generations: bool = False) -> Newest:
    """Which paused copy of an in-doubt VM that runs nowhere holds its newest state, if that can be told.

    **Which paused copy is the newest.**  A copy executes guest code only while it runs, and at most one runs
    at a time; the state moves between hosts only by migration.  Each migration attempt first raises the
    source's generation, then creates the destination with that same number (:func:`hypervisor.migration.
    record_attempt`), so the number only grows along the path the state takes:

    * a copy with a *lower* generation than another cannot have run after that other's state was taken: to
      run later it would have had to be the source of a later attempt (raising its number first) or a copy
      resumed by vcsched, which resumes only the newest;
    * an *equal* number is shared only by one attempt's source and its arrival (``arriving_from`` names the
      source).  The arrival holds the state of the switch-over; the source holds the same unless libvirt
      resumed it after the attempt failed.  A resumed source is paused again only by a new attempt (a higher
      number) or by someone's ``suspend`` (reason ``VIR_DOMAIN_PAUSED_USER``): so when the source is paused
      *for a migration* (``migration_paused``), it has not run since the switch-over and the arrival is whole
      (Finish ran: the arrival has no job) — the migration is completed as it would have been.

    The newest copy is resumed only when it is an arrival from a host of the cluster (the source's host is
    read again before the resume: it must hold no copy then) or a copy libvirt paused for a migration (not
    one someone paused).  Every other copy is older and is destroyed first.  Anything else — copies without
    vcsched's metadata, several copies sharing the newest number other than a source and its arrival — is
    left to the operator.  Copies from before generations existed read as generation 0: two such copies that
    are a source and its arrival are ordered as above, more are left alone.
    """
    if unmanaged:
        return Newest(None, f"its paused copy on {', '.join(sorted(unmanaged))} has no vcsched metadata")
    blind = ignore_generations  # the mutation switch resume-without-generation (tests/test_faultsim.py)
    gens = [0 if blind else (g or 0) for g in (d.generations or (0,) * len(d.hosts))]
    top = max(gens)
    tied = [h for h, g in zip(d.hosts, gens, strict=True) if g == top]
    source_of = dict(zip(d.hosts, d.arriving_from or (None,) * len(d.hosts), strict=True))
    if blind:  # the hazard: the rule before generations (an arrival beside its source wins, nothing else)
        pair = [h for h in d.hosts if source_of[h] in d.hosts and source_of[h] != h]
        if len(d.hosts) == 2 and len(pair) == 1:
            return Newest(pair[0], f"its migration from {source_of[pair[0]]} completed but was never confirmed")
        return Newest(None, "vcsched cannot tell which one to resume")
    if len(tied) == 2 and sum(source_of[h] is not None for h in tied) == 1:
        pick = next(h for h in tied if source_of[h] is not None)
        source = next(h for h in tied if h != pick)
        if source_of[pick] != source:
            return Newest(None, f"its copies on {' and '.join(tied)} share generation {top} but the arrival "
                                f"names {source_of[pick]} as its source: vcsched cannot tell which one to resume")
        if (source, d.uuid) not in migration_paused:
            return Newest(None, f"its source copy on {source} (generation {top}, like its arrival on {pick}) was "
                                "not paused by the migration: it may have run after the arrival's copy was taken")
        return Newest(pick, f"its migration from {source} (generation {top}) completed but was never confirmed "
                            "(the arrival is there, paused, without a job): the newest copy")
    if len(tied) != 1:
        return Newest(None, f"copies on {', '.join(tied)} share the newest generation {top}: vcsched cannot tell "
                            "which one to resume")
    pick = tied[0]
    arrived_from = source_of[pick]
    older = f"; the copies on {', '.join(h for h in d.hosts if h != pick)} are older" if len(d.hosts) > 1 else ""
    if arrived_from is not None:
        if arrived_from not in hosts:
            return Newest(None, f"its newest copy on {pick} is an arrival from {arrived_from!r}, not a host of "
                                "this cluster: its source cannot be read")
        return Newest(pick, f"the arrival of its newest migration (generation {top}, from {arrived_from}){older}")
    if (pick, d.uuid) not in migration_paused:
        return Newest(None, f"its newest copy on {pick} (generation {top}) was not paused by a migration "
                            "(someone paused it): left to the operator")
    return Newest(pick, f"its newest copy (generation {top}), paused by its migration, which ended before its "
                        f"destination finished{older}")
