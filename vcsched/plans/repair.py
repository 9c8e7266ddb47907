"""What settling in-doubt VMs would do (``vcsched repair``), decided on an inventory: a pure function.

The rules (which paused twin is destroyed, which orphaned arrival resumed, what is left to the operator, and why
nothing is settled while a host does not answer) are in :mod:`hypervisor.settlement`'s docstring, beside the
code that carries them out through libvirt under the cluster lock.  Deciding lives in the core so that a dry
run, ``status`` and the unit of work's notes say what repair would do without importing the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vcsched.inventory import InDoubt, Inventory

DESTROY, RESUME = "destroy", "resume"


@dataclass(frozen=True)
class RepairAction:
    """One thing repair would do: ``destroy`` a paused twin or ``resume`` an orphaned arrival, and why."""

    vm: str
    uuid: str
    host: str
    action: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"vm": self.vm, "uuid": self.uuid, "host": self.host, "action": self.action, "why": self.why}


@dataclass(frozen=True)
class RepairPlan:
    """What repair would do on an inventory (:func:`plan_repair`): actions, what it leaves, or why it refuses."""

    in_doubt: tuple[InDoubt, ...]
    actions: tuple[RepairAction, ...] = ()
    #: In-doubt VMs repair does not touch, one line each (why).
    left: tuple[str, ...] = ()
    #: Why repair does nothing at all (a host did not answer), or None.
    refused: str | None = None
    #: Lone paused copies that a migration stopped and nothing resumed (not in ``in_doubt``: an inventory cannot
    #: tell them from a copy someone paused), one each, for the re-checks of their resume actions.
    interrupted: tuple[InDoubt, ...] = ()


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
                "left": list(self.plan.left)}

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
        return out


def plan_repair(inventory: Inventory, interrupted: frozenset[str] = frozenset(), *,
                unread_hosts: bool = False) -> RepairPlan:
    """What repair would do on ``inventory`` (a pure function: nothing is read or changed).

    Refused when any host is down: a host that did not answer may hold a copy of any VM.  ``interrupted``:
    the UUIDs of lone paused managed copies that libvirt paused for a migration
    (:func:`hypervisor.settlement.interrupted_copies` reads them).  ``unread_hosts``: plan despite hosts that
    did not answer — only ever the fault simulation's mutation switch ``resume-unread-source``
    (hypervisor/hazards.py), which shows the simulation catches the hazard.
    """
    doubts = inventory.in_doubt
    down = [h for h in inventory.hosts if h.down is not None]
    if down and not unread_hosts:
        names = ", ".join(h.name for h in down)
        return RepairPlan(doubts, refused=f"host(s) {names} did not answer: a copy there cannot be ruled out, so "
                                          "no in-doubt VM is settled (nothing changed)")
    hosts = {h.name for h in inventory.hosts}
    actions: list[RepairAction] = []
    left: list[str] = []
    by_copy = {(v.host, v.uuid): v for v in inventory.vms if v.uuid is not None}
    for d in doubts:
        where = ", ".join(f"{h} ({st})" for h, st in zip(d.hosts, d.states, strict=True))
        running = [h for h, st in zip(d.hosts, d.states, strict=True) if st == "running"]
        paused = [h for h, st in zip(d.hosts, d.states, strict=True) if st == "paused"]
        if len(d.hosts) == 1:
            source = d.arriving_from[0] if d.arriving_from else None
            if source is None or source not in hosts:
                left.append(f"{d.vm}: paused arrival on {d.hosts[0]} from {source!r}, not a host of this cluster: "
                            "its source cannot be read")
                continue
            actions.append(RepairAction(d.vm, d.uuid, d.hosts[0], RESUME,
                                        f"its migration from {source} completed but it was left paused; {source} "
                                        "answered and has no copy"))
            continue
        arrivals = [h for h, src in zip(d.hosts, d.arriving_from or (None,) * len(d.hosts), strict=True)
                    if src is not None and src in d.hosts and src != h]
        if not running and len(d.hosts) == 2 and len(arrivals) == 1:
            target = arrivals[0]
            source = next(h for h in d.hosts if h != target)
            if all((c := by_copy.get((h, d.uuid))) is not None and c.meta is not None for h in d.hosts):
                actions += [RepairAction(d.vm, d.uuid, source, DESTROY,
                                         f"its migration to {target} completed (the arrival is there, paused, without "
                                         "a job) but was never confirmed: the source copy is removed first"),
                            RepairAction(d.vm, d.uuid, target, RESUME,
                                         f"its migration from {source} completed; the source copy was removed")]
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
        actions += [RepairAction(d.vm, d.uuid, h, DESTROY,
                                 f"a paused copy that never ran since its migration began; it runs on {running[0]}")
                    for h in paused]
    lone: list[InDoubt] = []
    for v in inventory.vms:
        if v.uuid in interrupted and v.paused and v.meta is not None and v.arriving_from is None \
                and v.uuid not in {d.uuid for d in doubts}:
            lone.append(InDoubt(v.name, v.uuid, (v.host,), ("paused",), arriving_from=(None,)))
            actions.append(RepairAction(v.name, v.uuid, v.host, RESUME,
                                        "a migration paused it and ended before its destination finished (no other "
                                        "host has a copy)"))
    return RepairPlan(doubts, tuple(actions), tuple(left), interrupted=tuple(lone))
