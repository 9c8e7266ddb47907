"""Recommendations: what `vcsched run --mode recommend` would have done, for an operator to approve or skip.

VMware DRS's manual mode and OpenStack Watcher's action plans show the same
thing: an operator who can read each proposed change with its reason and its
predicted gain, and veto it, trusts a re-balancer sooner.  So in recommend
mode the controller decides exactly as it would act (:mod:`vcsched.control.rebalance`:
thresholds, hysteresis, cool-downs, windows) but records each decision it
would act on as a :class:`Recommendation` — its plan, why (the decision's
reason and one sentence per step, :mod:`vcsched.plans.reasons`), the predicted
effect (minimum and mean yield before and after, per affected VM, bytes to
move), when it was made and until when it holds — in a :class:`Book` kept in
the coordination backend (acting/recommendations.py), so every operator
and a standby controller see one list.

Lifecycle (every transition a pure function of the book, applied atomically by the store)::

    open --approve--> approved --(applied)--> applied | failed | stale
    open --skip--> skipped (a veto: its VMs are not moved again until it ends)
    open --(a newer recommendation of the same kind)--> superseded
    open --(past valid_until)--> expired (shown so; approving it is refused)

Only one open recommendation of each kind (re-cap, re-balance) exists at a time: the controller's next
decision supersedes the previous one, or keeps it (same steps) and extends its validity.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vcsched.errors import InputError, VcschedError

OPEN, APPROVED, APPLIED, FAILED, STALE, SKIPPED, SUPERSEDED, EXPIRED = (
    "open", "approved", "applied", "failed", "stale", "skipped", "superseded", "expired")

#: How many closed recommendations a book keeps (the newest), so that it does not grow for ever.
KEEP_CLOSED = 50


class Refused(VcschedError):
    """An approve or skip that cannot be done (already decided, expired, stale): exit 1 with the reason."""

    exit_code = 1


@dataclass(frozen=True)
class Recommendation:
    id: str
    kind: str  # "re-cap" or "re-balance"
    cluster: str
    reason: str  # the decision's reason, in words
    step_reasons: tuple[str, ...]  # one per plan step
    plan: Mapping[str, Any]  # the plan, as `vcsched apply` reads it
    effect: Mapping[str, Any]  # :class:`vcsched.plans.reasons.Effect` as a dict
    made_at: float
    valid_until: float
    made_by: str = ""
    state: str = OPEN
    decided_at: float | None = None
    decided_by: str | None = None
    detail: str = ""  # why it was refused, skipped or failed; what applying it did

    @property
    def moves(self) -> tuple[tuple[str, str], ...]:
        """(VM, destination) of each migration, the final one for a relayed VM."""
        ends: dict[str, str] = {}
        for s in self.plan.get("steps", []):
            if s.get("op") == "migrate":
                ends[str(s["vm"])] = str(s["to"])
        return tuple(sorted(ends.items()))

    def state_at(self, now: float) -> str:
        return EXPIRED if self.state == OPEN and now > self.valid_until else self.state

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "cluster": self.cluster,
                "state": self.state if now is None else self.state_at(now), "reason": self.reason,
                "steps": [{**s, "reason": r} for s, r in zip(self.plan.get("steps", []), self.step_reasons,
                                                             strict=True)],
                "effect": dict(self.effect), "made_at": self.made_at, "valid_until": self.valid_until,
                "made_by": self.made_by, "decided_at": self.decided_at, "decided_by": self.decided_by,
                "detail": self.detail, "plan": dict(self.plan)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Recommendation:
        return Recommendation(str(d["id"]), str(d["kind"]), str(d["cluster"]), str(d["reason"]),
                              tuple(str(s.get("reason", "")) for s in d["steps"]), d["plan"], d["effect"],
                              float(d["made_at"]), float(d["valid_until"]), str(d.get("made_by", "")),
                              str(d["state"]), d.get("decided_at"), d.get("decided_by"), str(d.get("detail", "")))


@dataclass(frozen=True)
class Veto:
    """A skipped recommendation's moves: their VMs stay where they are until ``until`` (the controller pins them)."""

    id: str
    vms: tuple[str, ...]
    until: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "vms": list(self.vms), "until": self.until}


@dataclass(frozen=True)
class Book:
    """Every recommendation of one cluster (newest first) and the vetoes in force."""

    recommendations: tuple[Recommendation, ...] = ()
    vetoes: tuple[Veto, ...] = field(default=())

    def get(self, rec_id: str) -> Recommendation:
        for r in self.recommendations:
            if r.id == rec_id:
                return r
        known = ", ".join(r.id for r in self.recommendations[:5]) or "none"
        raise InputError(f"recommendation {rec_id!r}: no such recommendation (newest: {known}; "
                         "`vcsched recommendations` lists them)")

    def vetoed(self, now: float) -> frozenset[str]:
        """VMs a veto in force keeps where they are."""
        return frozenset(vm for v in self.vetoes if v.until > now for vm in v.vms)

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "recommendations": [r.to_dict() for r in self.recommendations],
                "vetoes": [v.to_dict() for v in self.vetoes]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Book:
        return Book(tuple(Recommendation.from_dict(r) for r in d.get("recommendations", [])),
                    tuple(Veto(str(v["id"]), tuple(v["vms"]), float(v["until"])) for v in d.get("vetoes", [])))

    def _with(self, rec: Recommendation) -> Book:
        return replace(self, recommendations=tuple(rec if r.id == rec.id else r for r in self.recommendations))


def recommendation_id(cluster: str, plan: Mapping[str, Any], made_at: float) -> str:
    """Short and unique enough to type: 8 hex digits of the plan and the moment it was made."""
    text = json.dumps({"c": cluster, "p": plan, "t": made_at}, sort_keys=True)
    return "r" + hashlib.sha256(text.encode()).hexdigest()[:8]


def _same_steps(a: Recommendation, b: Recommendation) -> bool:
    return list(a.plan.get("steps", [])) == list(b.plan.get("steps", [])) and \
        a.plan.get("snapshot") == b.plan.get("snapshot")


def record(book: Book, rec: Recommendation) -> tuple[Book, Recommendation]:
    """Add ``rec`` to the book: an open one of the same kind with the same steps is kept (its validity extended,
    its reason and effect renewed); any other open one of that kind is superseded.  Returns what is open now."""
    kept = []
    for r in book.recommendations:
        if r.kind == rec.kind and r.state == OPEN and r.state_at(rec.made_at) == OPEN and _same_steps(r, rec):
            rec = replace(r, valid_until=rec.valid_until, reason=rec.reason, effect=rec.effect,
                          step_reasons=rec.step_reasons)
            continue
        if r.kind == rec.kind and r.state == OPEN:
            r = replace(r, state=SUPERSEDED, decided_at=rec.made_at, detail=f"superseded by {rec.id}")
        kept.append(r)
    closed = [r for r in kept if r.state != OPEN][:KEEP_CLOSED]
    still_open = [r for r in kept if r.state == OPEN]
    vetoes = tuple(v for v in book.vetoes if v.until > rec.made_at)
    return Book((rec, *still_open, *closed), vetoes), rec


def approve(book: Book, rec_id: str, now: float, who: str) -> tuple[Book, Recommendation]:
    """Mark ``rec_id`` approved (it is then applied); refused when it is not open, or past its validity."""
    r = book.get(rec_id)
    state = r.state_at(now)
    if state == EXPIRED:
        raise Refused(f"recommendation {rec_id} is stale: it was valid until {_clock(r.valid_until)}; nothing "
                      "changed (the controller makes a new one if it still holds)")
    if state != OPEN:
        by = f" by {r.decided_by}" if r.decided_by else ""
        when = f" at {_clock(r.decided_at)}" if r.decided_at is not None else ""
        raise Refused(f"recommendation {rec_id} is already {state}{by}{when}; nothing changed"
                      + (f" ({r.detail})" if r.detail else ""))
    r = replace(r, state=APPROVED, decided_at=now, decided_by=who)
    return book._with(r), r


def settle(book: Book, rec_id: str, state: str, detail: str) -> tuple[Book, Recommendation]:
    """An approved recommendation's end: applied, failed (a step failed) or stale (no longer holds)."""
    r = replace(book.get(rec_id), state=state, detail=detail)
    return book._with(r), r


def skip(book: Book, rec_id: str, now: float, who: str, veto_s: float) -> tuple[Book, Recommendation]:
    """Skip ``rec_id``: it is closed, and the VMs it would move stay put for ``veto_s`` seconds."""
    r = book.get(rec_id)
    if r.state != OPEN:
        raise Refused(f"recommendation {rec_id} is already {r.state}; nothing changed")
    vms = tuple(vm for vm, _ in r.moves)
    r = replace(r, state=SKIPPED, decided_at=now, decided_by=who,
                detail=f"vetoed until {_clock(now + veto_s)}" + (f": {', '.join(vms)} stay put" if vms else ""))
    vetoes = book.vetoes + ((Veto(rec_id, vms, now + veto_s),) if vms else ())
    return replace(book._with(r), vetoes=vetoes), r


def open_ones(book: Book, now: float) -> list[Recommendation]:
    return [r for r in book.recommendations if r.state_at(now) == OPEN]


def _clock(t: float | None) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def new_recommendation(kind: str, cluster: str, reason: str, plan: Mapping[str, Any], step_reasons: Iterable[str],
                       effect: Mapping[str, Any], now: float, valid_s: float, who: str) -> Recommendation:
    return Recommendation(recommendation_id(cluster, plan, now), kind, cluster, reason, tuple(step_reasons), plan,
                          effect, now, now + valid_s, who)
