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
decision supersedes the previous one, or keeps it and extends its validity.

**One proposal, one id.**  An operator lists, reads, then types an id; an id
that changed in between (every interval, as estimates wobble by a few hundredths
of a core) makes every approve a race.  So a recommendation's identity is
its *effect*, not its bytes: the same steps on the same VMs and hosts, every
cap within :data:`SAME_CAP_CORES` or :data:`SAME_CAP_FRACTION` of the other
(:func:`same_proposal`).  The same proposal made again keeps its id, its plan
renewed to the newest (what approving it applies).  An id that *was*
superseded still answers: approve and skip name what superseded it, and act
on the successor when it is the same proposal made again (:func:`resolve`).

**Only proposals worth an operator's time.**  A proposal whose predicted
gain (:func:`predicted_gain`) is under the controller's rebalance threshold
(a re-cap "min yield 1.000 -> 1.000") is not recorded (:func:`worth_proposing`).

**Floors checked when approved, not only when made.**  The controller writes
its newest estimates of the VMs' needs into the book every interval
(:func:`note_needs`); approving re-checks every VM the plan touches against
its floor with them (:func:`check_floors`) and refuses, naming the VM.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vcsched.errors import InputError, VcschedError
from vcsched.units import YIELD_TOLERANCE

OPEN, APPROVED, APPLIED, FAILED, STALE, SKIPPED, SUPERSEDED, EXPIRED = (
    "open", "approved", "applied", "failed", "stale", "skipped", "superseded", "expired")

#: How many closed recommendations a book keeps (the newest), so that it does not grow for ever.
KEEP_CLOSED = 50
#: Two caps are "the same" for a proposal's identity when within this many cores of each other, or within this
#: fraction of the larger: the estimates a plan follows move by about that much between windows of a steady
#: load (a twentieth of a core: what separates a small VM's windows in the lab).
SAME_CAP_CORES = 0.05
SAME_CAP_FRACTION = 0.05
#: Seconds the controller's estimates in the book stay current for an approval's floor check; older (no
#: controller running), the VMs' declared needs are used.
NEEDS_FRESH_S = 600.0


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
    superseded_by: str | None = None  # the id of the recommendation that superseded it

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
                "detail": self.detail, "superseded_by": self.superseded_by, "plan": dict(self.plan)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Recommendation:
        return Recommendation(str(d["id"]), str(d["kind"]), str(d["cluster"]), str(d["reason"]),
                              tuple(str(s.get("reason", "")) for s in d["steps"]), d["plan"], d["effect"],
                              float(d["made_at"]), float(d["valid_until"]), str(d.get("made_by", "")),
                              str(d["state"]), d.get("decided_at"), d.get("decided_by"), str(d.get("detail", "")),
                              d.get("superseded_by"))


@dataclass(frozen=True)
class Veto:
    """A skipped recommendation's moves: their VMs stay where they are until ``until`` (the controller pins them);
    a skipped sleep's host (``stays_on``) is not put to sleep again until then either — an empty host's sleep
    moves no VM, so without it the same sleep would be proposed again at the next interval."""

    id: str
    vms: tuple[str, ...]
    until: float
    stays_on: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "vms": list(self.vms), "until": self.until, "stays_on": list(self.stays_on)}


@dataclass(frozen=True)
class Book:
    """Every recommendation of one cluster (newest first), the vetoes in force, and the controller's newest
    estimates of the VMs' needs (cores) with when it made them (for an approval's floor check)."""

    recommendations: tuple[Recommendation, ...] = ()
    vetoes: tuple[Veto, ...] = field(default=())
    needs: Mapping[str, float] = field(default_factory=dict)
    needs_at: float | None = None

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

    def kept_on(self, now: float) -> dict[str, str]:
        """Hosts a skipped sleep in force keeps on, each with why (for the power decision's refusals)."""
        return {host: f"its sleep was skipped ({v.id}): kept on until {_clock(v.until)}"
                for v in sorted(self.vetoes, key=lambda v: v.until) if v.until > now for host in v.stays_on}

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "recommendations": [r.to_dict() for r in self.recommendations],
                "vetoes": [v.to_dict() for v in self.vetoes], "needs": dict(self.needs), "needs_at": self.needs_at}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Book:
        return Book(tuple(Recommendation.from_dict(r) for r in d.get("recommendations", [])),
                    tuple(Veto(str(v["id"]), tuple(v["vms"]), float(v["until"]), tuple(v.get("stays_on", ())))
                          for v in d.get("vetoes", [])),
                    {str(k): float(v) for k, v in d.get("needs", {}).items()}, d.get("needs_at"))

    def _with(self, rec: Recommendation) -> Book:
        return replace(self, recommendations=tuple(rec if r.id == rec.id else r for r in self.recommendations))


def recommendation_id(cluster: str, plan: Mapping[str, Any], made_at: float, prefix: str = "r") -> str:
    """Short and unique enough to type: 8 hex digits of the plan and the moment it was made (``prefix`` "p": a
    plan the controller applied itself, as its audit names it)."""
    text = json.dumps({"c": cluster, "p": plan, "t": made_at}, sort_keys=True)
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:8]


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= max(SAME_CAP_CORES, SAME_CAP_FRACTION * max(abs(a), abs(b)))
    return bool(a == b)


def same_proposal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether plans ``a`` and ``b`` (as dicts) propose the same thing: the same steps in the same order (op, VM,
    hosts), every number (a cap) within tolerance (module docstring), and the same host to sleep or wake (a power
    proposal's ``power``: a wake has no step).  The snapshot is left out: it is the inventory's, not the
    proposal's."""
    sa, sb = list(a.get("steps", [])), list(b.get("steps", []))
    return a.get("power") == b.get("power") and len(sa) == len(sb) and all(
        x.keys() == y.keys() and all(_same_value(x[k], y[k]) for k in x) for x, y in zip(sa, sb, strict=True))


def record(book: Book, rec: Recommendation) -> tuple[Book, Recommendation]:
    """Add ``rec`` to the book: an open one of the same kind proposing the same (:func:`same_proposal`) is kept,
    its id and when it was first made, renewed with ``rec``'s plan, reasons, effect and validity; any other open
    one of that kind is superseded by ``rec``.  Returns what is open now."""
    kept = []
    for r in book.recommendations:
        if r.kind == rec.kind and r.state == OPEN and r.state_at(rec.made_at) == OPEN and \
                same_proposal(r.plan, rec.plan):
            rec = replace(rec, id=r.id, made_at=r.made_at, made_by=r.made_by)
            continue
        kept.append(r)
    kept = [replace(r, state=SUPERSEDED, decided_at=rec.made_at, superseded_by=rec.id,
                    detail=f"superseded by {rec.id} at {_clock(rec.made_at)}")
            if r.kind == rec.kind and r.state == OPEN else r for r in kept]
    closed = [r for r in kept if r.state != OPEN][:KEEP_CLOSED]
    still_open = [r for r in kept if r.state == OPEN]
    vetoes = tuple(v for v in book.vetoes if v.until > rec.made_at)
    return replace(book, recommendations=(rec, *still_open, *closed), vetoes=vetoes), rec


def note_needs(book: Book, needs: Mapping[str, float], now: float) -> tuple[Book, None]:
    """The controller's newest estimates of the VMs' needs, for the floor check of an approval."""
    return replace(book, needs={k: float(v) for k, v in needs.items()}, needs_at=now), None


def current_needs(book: Book, declared: Mapping[str, float], now: float) -> tuple[dict[str, float], str]:
    """The needs an approval checks floors with, and where they come from: the controller's estimates when it
    wrote them less than :data:`NEEDS_FRESH_S` ago (declared needs for VMs it did not estimate), else the declared
    needs."""
    if book.needs_at is not None and now - book.needs_at <= NEEDS_FRESH_S:
        return {**declared, **book.needs}, f"the controller's estimates of {_clock(book.needs_at)}"
    return dict(declared), "the declared needs (no current estimate from a running controller)"


def predicted_gain(effect: Mapping[str, Any]) -> float:
    """What a proposal is predicted to gain: the rise of the minimum yield or, when the minimum stays, of the
    mean (a re-cap that lifts starved VMs without moving the lowest one still gains); 0 when it lowers the
    minimum (it is then no gain, whatever the mean does)."""
    lo = float(effect.get("min_yield_after", 0.0)) - float(effect.get("min_yield_before", 0.0))
    mean = float(effect.get("mean_yield_after", 0.0)) - float(effect.get("mean_yield_before", 0.0))
    return 0.0 if lo < -YIELD_TOLERANCE else max(lo, mean, 0.0)


def worth_proposing(effect: Mapping[str, Any], threshold: float) -> str | None:
    """None when a proposal with ``effect`` is worth an operator's time; else why not, in words."""
    gain = predicted_gain(effect)
    if gain <= YIELD_TOLERANCE or gain < threshold - YIELD_TOLERANCE:
        return (f"predicted gain {gain:.4f} (min yield {effect.get('min_yield_before', 0):.3f} -> "
                f"{effect.get('min_yield_after', 0):.3f}) under the threshold {threshold:g}: not proposed")
    return None


def check_floors(rec: Recommendation, caps: Mapping[str, float], needs: Mapping[str, float],
                 floors: Mapping[str, float], source: str) -> None:
    """Refuse (naming the VM) a recommendation whose caps ``caps`` (VM -> cores after it) would put a VM below
    its floor with ``needs`` (from ``source``, said in the refusal).  ``floors``: VM -> min_yield."""
    for vm in sorted(caps):
        need, floor = needs.get(vm), floors.get(vm, 0.0)
        if need is None or need <= YIELD_TOLERANCE or floor <= 0:
            continue
        got = min(1.0, caps[vm] / need)
        if got < floor - 1e-6:
            raise Refused(f"recommendation {rec.id} would put {vm} below its floor: cap {caps[vm]:.3f} cores over "
                          f"need {need:.3f} ({source}) is yield {got:.3f}, under its min_yield {floor:g}; "
                          "nothing changed")


def resolve(book: Book, rec_id: str, now: float) -> tuple[Recommendation, str | None]:
    """The recommendation an approve or skip of ``rec_id`` acts on, and a note when that is not ``rec_id``.

    A superseded id is followed to what superseded it (and on, to the newest): when that is open and proposes
    the same (:func:`same_proposal`), it is the one acted on, and the note says so; otherwise the refusal names
    it, its state and its steps."""
    r = book.get(rec_id)
    if r.state != SUPERSEDED:
        return r, None
    chain = [r]
    while chain[-1].superseded_by is not None and len(chain) <= len(book.recommendations):
        try:
            chain.append(book.get(chain[-1].superseded_by))
        except InputError:
            break  # dropped from the book (KEEP_CLOSED): the last one known is named
    last = chain[-1]
    via = " -> ".join(x.id for x in chain[1:]) or "?"
    if last is not r and last.state_at(now) == OPEN and same_proposal(r.plan, last.plan):
        return last, (f"recommendation {rec_id} was superseded by {via}, the same proposal made again: "
                      f"acting on {last.id}")
    if last is r:
        raise Refused(f"recommendation {rec_id} was {r.detail or 'superseded'}, which is no longer in the book; "
                      "nothing changed (`vcsched recommendations` lists the open ones)")
    what = "the same proposal made again" if same_proposal(r.plan, last.plan) else \
        f"a different proposal ({summary(last)})"
    raise Refused(f"recommendation {rec_id} was superseded by {via} at {_clock(r.decided_at)}, {last.id} now "
                  f"{last.state_at(now)} and {what}; nothing changed (`vcsched recommendations --all` shows it)")


def summary(rec: Recommendation) -> str:
    """Its steps in a few words: ``set-cap a-0 0.400, migrate b-0 h0->h1``."""
    parts = []
    for s in rec.plan.get("steps", []):
        if s.get("op") == "migrate":
            parts.append(f"migrate {s.get('vm')} {s.get('from')}->{s.get('to')}")
        elif s.get("cap_cores") is not None:
            parts.append(f"{s.get('op')} {s.get('vm')} {float(s['cap_cores']):.3f}")
        else:
            parts.append(f"{s.get('op')} {s.get('vm')}")
    return ", ".join(parts) or "no step"


def approve(book: Book, rec_id: str, now: float, who: str) -> tuple[Book, Recommendation]:
    """Mark ``rec_id`` (or the same proposal that superseded it: :func:`resolve`) approved (it is then applied);
    refused when it is not open, or past its validity."""
    r, _ = resolve(book, rec_id, now)
    rec_id = r.id
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
    """Skip ``rec_id`` (or the same proposal that superseded it: :func:`resolve`): it is closed, and the VMs it
    would move stay put for ``veto_s`` seconds."""
    r, _ = resolve(book, rec_id, now)
    rec_id = r.id
    if r.state != OPEN:
        raise Refused(f"recommendation {rec_id} is already {r.state}; nothing changed")
    vms = tuple(vm for vm, _ in r.moves)
    power = r.plan.get("power")
    stays_on = (str(power["host"]),) if isinstance(power, Mapping) and power.get("action") == "sleep" else ()
    said = [f"{', '.join(vms)} stay put"] if vms else []
    said += [f"{stays_on[0]} is not put to sleep"] if stays_on else []
    r = replace(r, state=SKIPPED, decided_at=now, decided_by=who,
                detail=f"vetoed until {_clock(now + veto_s)}" + (f": {'; '.join(said)}" if said else ""))
    vetoes = book.vetoes + ((Veto(rec_id, vms, now + veto_s, stays_on),) if vms or stays_on else ())
    return replace(book._with(r), vetoes=vetoes), r


def open_ones(book: Book, now: float) -> list[Recommendation]:
    return [r for r in book.recommendations if r.state_at(now) == OPEN]


def _clock(t: float | None) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def new_recommendation(kind: str, cluster: str, reason: str, plan: Mapping[str, Any], step_reasons: Iterable[str],
                       effect: Mapping[str, Any], now: float, valid_s: float, who: str) -> Recommendation:
    return Recommendation(recommendation_id(cluster, plan, now), kind, cluster, reason, tuple(step_reasons), plan,
                          effect, now, now + valid_s, who)
