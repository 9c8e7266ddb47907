"""Every move audited: what a plan predicted for the VMs it touched, against what they got once it settled.

A re-balancer that is never checked against its own predictions can be wrong
for ever and say it is doing good (#39: a recommendation predicted "min yield
1.000 -> 1.000" and left two VMs under their floors).  So every plan
`vcsched run` applies, and every recommendation an operator approves, is
audited once it has settled: ``settle_windows`` estimation windows after it
was applied (default :data:`DEFAULT_SETTLE_WINDOWS`), the CPU each touched VM
used over the last window is set against the yield the plan predicted for it.

**One measure, before and after.**  A VM's *achieved yield* is the CPU it
used over the need the plan predicted against (:func:`achieved_yield`), at
most 1.  It is measured the same way over the window *before* the plan (the
controller's samples at the moment it applied it, or at its last interval
before an approval it then saw), so the *achieved gain* (after less before)
compares like with like: an estimate with headroom (a VM that never uses all
of its need) lowers both ends and cancels out of the gain.  The *predicted
gain* is the plan's: its yield for the VM less the VM's cap before over the
same need.  For a plan, both gains are those of the lowest yield among the
VMs it touches (vcsched's objective is the minimum): predicted, the lowest of
the plan's yields less the lowest before; achieved, the lowest of each VM's
yield before plus the gain it achieved, less the same lowest before.  (The
lowest *measured* yield would be an idle VM's, whose use is far below its
need whatever its cap: the gain would read 0 for a plan that did all it
said.)  Each VM's numbers are kept too.

A plan *fell short* when its achieved gain is below its predicted gain by
more than :data:`SHORT_BY`: the model is wrong for these VMs here (their
need, the host's capacity, or contention the caps do not see).  A plan with a
VM that has no sample after settling (it left, its host went down) is
*unmeasured* for that VM; a plan none of whose VMs could be measured is
neither short nor met.

Pure: predictions and samples in, a :class:`PlanAudit` out.  The controller
(:mod:`acting.controller`) keeps the pending audits and feeds them; the
records live beside the recommendations (acting/audits.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vcsched.control.observe import Sample
from vcsched.errors import InputError

#: Windows a plan is given to settle before its VMs' use is measured: the first window after it still holds the
#: caps' and migrations' transients (a migrated VM's guest catching up; a raised cap's first period).
DEFAULT_SETTLE_WINDOWS = 2
#: Yield points by which an achieved gain may fall below the predicted before the plan counts as short: the
#: calibration's 0.05-core tolerance on a cap, on a VM needing about a core (docs/calibration.md).
SHORT_BY = 0.05
#: Audits a cluster's log keeps (the newest).
KEEP_AUDITS = 200
MET, SHORT, UNMEASURED = "met", "short", "unmeasured"


def achieved_yield(used_cores: float | None, need_cores: float) -> float | None:
    """A VM's achieved yield: the cores it used over the need a plan predicted against, at most 1 (None: not
    measured).  The one place the audit turns use into yield, to follow the controller's own yield when that
    becomes one function."""
    if used_cores is None:
        return None
    return 1.0 if need_cores <= 1e-9 else min(1.0, max(0.0, used_cores) / need_cores)


def mean_used(samples: Sequence[Sample]) -> float | None:
    """Cores used on average over ``samples`` (weighted by their lengths); None without any."""
    seconds = sum(s.seconds for s in samples)
    return sum(s.used_cores * s.seconds for s in samples) / seconds if seconds > 0 else None


@dataclass(frozen=True)
class Touched:
    """One VM a plan touches, as predicted when it was applied."""

    vm: str
    need_cores: float  # the need the plan predicted against
    predicted_before: float  # its cap before over that need
    predicted_after: float  # the plan's yield for it
    used_before: float | None  # cores it used over the window before (None: not measured)


@dataclass(frozen=True)
class Pending:
    """A plan applied and not yet audited: due ``settle_s`` seconds after it was applied."""

    plan_id: str
    kind: str  # "re-cap", "re-balance", ... (the plan's decision)
    source: str  # "run" (the controller applied it) or "approve" (an operator approved a recommendation)
    applied_at: float  # Unix seconds
    settle_s: float
    vms: tuple[Touched, ...]


def pending(plan_id: str, kind: str, source: str, plan: Mapping[str, Any], effect: Mapping[str, Any],
            used_before: Mapping[str, float | None], applied_at: float, settle_s: float) -> Pending:
    """The audit of ``plan`` (a plan document) to run once it settled, from its predictions and its ``effect``
    (:class:`vcsched.plans.reasons.Effect` as a dict: each touched VM's yield before).  VMs it removes, or
    predicts nothing for, are left out."""
    predicted = plan.get("predicted", {}).get("per_vm", {})
    vms = []
    for vm, e in sorted(effect.get("per_vm", {}).items()):
        p = predicted.get(vm)
        if p is None or e.get("yield_before") is None:
            continue
        vms.append(Touched(vm, float(p["cpu_need_cores"]), float(e["yield_before"]), float(p["yield"]),
                           used_before.get(vm)))
    return Pending(plan_id, kind, source, applied_at, settle_s, tuple(vms))


@dataclass(frozen=True)
class VmAudit:
    vm: str
    need_cores: float
    predicted_before: float
    predicted_after: float
    used_before: float | None
    used_after: float | None

    @property
    def achieved_before(self) -> float | None:
        return achieved_yield(self.used_before, self.need_cores)

    @property
    def achieved_after(self) -> float | None:
        return achieved_yield(self.used_after, self.need_cores)

    @property
    def predicted_gain(self) -> float:
        return self.predicted_after - self.predicted_before

    @property
    def achieved_gain(self) -> float | None:
        a, b = self.achieved_after, self.achieved_before
        return None if a is None or b is None else a - b

    def to_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "need_cores": self.need_cores, "predicted_before": self.predicted_before,
                "predicted_after": self.predicted_after, "used_before": self.used_before,
                "used_after": self.used_after, "achieved_before": self.achieved_before,
                "achieved_after": self.achieved_after, "predicted_gain": self.predicted_gain,
                "achieved_gain": self.achieved_gain}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> VmAudit:
        return VmAudit(str(d["vm"]), float(d["need_cores"]), float(d["predicted_before"]),
                       float(d["predicted_after"]), d.get("used_before"), d.get("used_after"))


@dataclass(frozen=True)
class PlanAudit:
    """A settled plan: predicted against achieved, per plan and per VM (module docstring)."""

    plan_id: str
    kind: str
    source: str
    applied_at: float
    audited_at: float
    settle_s: float
    vms: tuple[VmAudit, ...]

    def _measured(self) -> list[VmAudit]:
        return [v for v in self.vms if v.achieved_gain is not None]

    @property
    def predicted_gain(self) -> float:
        """The plan's predicted gain of the lowest yield among the VMs it touches."""
        if not self.vms:
            return 0.0
        return min(v.predicted_after for v in self.vms) - min(v.predicted_before for v in self.vms)

    @property
    def achieved_gain(self) -> float | None:
        """The achieved gain of the lowest yield among the touched VMs: each VM's yield before (as predicted) plus
        the gain it achieved, an unmeasured VM's as predicted (module docstring).  None: no VM measured."""
        if not self._measured():
            return None
        after = []
        for v in self.vms:
            gain = v.achieved_gain
            after.append(v.predicted_after if gain is None else min(1.0, v.predicted_before + gain))
        return min(after) - min(v.predicted_before for v in self.vms)

    @property
    def result(self) -> str:
        achieved = self.achieved_gain
        if achieved is None:
            return UNMEASURED
        return SHORT if achieved < self.predicted_gain - SHORT_BY else MET

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan_id, "kind": self.kind, "source": self.source, "applied_at": self.applied_at,
                "audited_at": self.audited_at, "settle_seconds": self.settle_s,
                "predicted_gain": self.predicted_gain, "achieved_gain": self.achieved_gain, "result": self.result,
                "vms": [v.to_dict() for v in self.vms]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PlanAudit:
        return PlanAudit(str(d["plan"]), str(d["kind"]), str(d["source"]), float(d["applied_at"]),
                         float(d["audited_at"]), float(d["settle_seconds"]),
                         tuple(VmAudit.from_dict(v) for v in d.get("vms", [])))


def audit(p: Pending, samples: Mapping[str, Sequence[Sample]], now: float) -> PlanAudit:
    """Audit the settled plan ``p`` with the samples of its VMs over the window after settling."""
    return PlanAudit(p.plan_id, p.kind, p.source, p.applied_at, now, p.settle_s, tuple(
        VmAudit(t.vm, t.need_cores, t.predicted_before, t.predicted_after, t.used_before,
                mean_used(samples.get(t.vm, ()))) for t in p.vms))


def interrupted(p: Pending, touched: frozenset[str]) -> bool:
    """Whether a later plan touching ``touched`` changed a VM of ``p`` before it settled (its audit would then
    measure the later plan, not this one: it is dropped)."""
    return any(t.vm in touched for t in p.vms)


@dataclass(frozen=True)
class AuditLog:
    """A cluster's audits, newest first (at most :data:`KEEP_AUDITS`)."""

    audits: tuple[PlanAudit, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "audits": [a.to_dict() for a in self.audits]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> AuditLog:
        return AuditLog(tuple(PlanAudit.from_dict(a) for a in d.get("audits", [])))

    def last(self, n: int) -> tuple[PlanAudit, ...]:
        if n < 1:
            raise InputError(f"--last: {n} is below 1")
        return self.audits[:n]


def add(log: AuditLog, a: PlanAudit) -> tuple[AuditLog, PlanAudit]:
    """``a`` first in the log (the oldest dropped beyond :data:`KEEP_AUDITS`)."""
    return replace(log, audits=(a, *log.audits)[:KEEP_AUDITS]), a
