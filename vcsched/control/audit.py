"""Every applied plan audited against its prediction: the yield it predicted for the VMs it touched, and the yield
they achieved once it settled (docs/contention.md, "Audit").

No peer re-balancer reports predicted against achieved gain per move, so a wrong model goes unseen: a
re-balance "gaining" 0.3 min-yield points that achieved nothing is repeated for ever.  vcsched predicts each
plan's yields from the needs it planned with (:mod:`vcsched.plans.reasons`, the one yield of
:func:`vcsched.control.status.vm_yield`); this module measures what happened, as pure functions of samples.

**Achieved yield.**  Per sample, what the VM got of its need: 1 when the sample is uncensored (neither at its
cap nor waiting for a host CPU: it got all it wanted), else the cores it used over the need it was planned
with, at most 1 (:func:`sample_yield`).  A VM's achieved yield over a settle period is the mean over its
samples there.  A VM held at its cap achieves its cap over its need, which is the prediction; one starved by a
busy host achieves less, which is what the audit is for.

**Gain.**  The plan's predicted gain is its touched VMs' lowest predicted yield after less their lowest
yield before (caps before over the same needs); its achieved gain is their lowest achieved yield after
(samples that began once the plan was applied, over ``settle`` seconds) less their lowest achieved yield in the
window before it was applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vcsched.control.observe import DEFAULT_PARAMS, ObserveParams, Sample, is_censored
from vcsched.plans.plan import Plan
from vcsched.plans.reasons import yield_of


def sample_yield(s: Sample, need: float, params: ObserveParams = DEFAULT_PARAMS) -> float:
    """What the VM got of its ``need`` in one sample (module docstring)."""
    return 1.0 if not is_censored(s, params) else yield_of(s.used_cores, need)


def achieved_yields(samples: Mapping[str, Sequence[Sample]], needs: Mapping[str, float], vms: Iterable[str],
                    since: float | None = None, until: float | None = None,
                    params: ObserveParams = DEFAULT_PARAMS) -> dict[str, float]:
    """Each of ``vms``' mean :func:`sample_yield` over its samples that began at or after ``since`` and ended by
    ``until`` (Unix times; None: no bound); a VM without such samples is left out."""
    out = {}
    for vm in vms:
        got = [sample_yield(s, needs[vm], params) for s in samples.get(vm, ())
               if vm in needs and (since is None or s.time - s.seconds >= since - 1e-6)
               and (until is None or s.time <= until + 1e-6)]
        if got:
            out[vm] = sum(got) / len(got)
    return out


@dataclass(frozen=True)
class PendingAudit:
    """An applied plan waiting to settle: what it predicted, and what its VMs achieved before it."""

    kind: str
    applied_at: float  # Unix time the plan's last step ended
    settle_s: float
    needs: Mapping[str, float]  # the touched VMs' needs it was planned with
    predicted_before: Mapping[str, float]
    predicted_after: Mapping[str, float]
    achieved_before: Mapping[str, float]
    censored: tuple[str, ...] = ()  # touched VMs whose need was a censored estimate: predictions are upper bounds

    @property
    def due(self) -> float:
        return self.applied_at + self.settle_s


def pending_audit(kind: str, plan: Plan, caps_before: Mapping[str, float], needs: Mapping[str, float],
                  samples: Mapping[str, Sequence[Sample]], applied_at: float, settle_s: float,
                  censored: Iterable[str] = (), params: ObserveParams = DEFAULT_PARAMS) -> PendingAudit | None:
    """The audit of ``plan`` just applied (None when it touched no VM with a prediction): ``caps_before`` (VM ->
    cores, its cap before the plan), ``needs`` (what it was planned with), ``samples`` (the window before it)."""
    touched = sorted({s.vm for s in plan.steps} & set(plan.per_vm) & set(needs) & set(caps_before))
    if not touched:
        return None
    used = {vm: needs[vm] for vm in touched}
    return PendingAudit(kind, applied_at, settle_s, used,
                        {vm: yield_of(caps_before[vm], needs[vm]) for vm in touched},
                        {vm: plan.per_vm[vm].yield_ for vm in touched},
                        achieved_yields(samples, used, touched, params=params),
                        tuple(sorted(set(censored) & set(touched))))


@dataclass(frozen=True)
class AuditRecord:
    """A settled plan: predicted against achieved, per VM and for the plan (module docstring)."""

    kind: str
    applied_at: float
    settled_at: float
    predicted_gain: float
    achieved_gain: float | None  # None: no achieved yield before or after to compare
    per_vm: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    censored: tuple[str, ...] = ()

    @property
    def shortfall(self) -> float | None:
        """Predicted less achieved gain (positive: the model promised more than happened)."""
        return None if self.achieved_gain is None else self.predicted_gain - self.achieved_gain

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "applied_at": self.applied_at, "settled_at": self.settled_at,
                "predicted_gain": round(self.predicted_gain, 4),
                "achieved_gain": None if self.achieved_gain is None else round(self.achieved_gain, 4),
                "shortfall": None if self.shortfall is None else round(self.shortfall, 4),
                "per_vm": {vm: dict(v) for vm, v in sorted(self.per_vm.items())}, "censored": list(self.censored)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> AuditRecord:
        return AuditRecord(str(d["kind"]), float(d["applied_at"]), float(d["settled_at"]), float(d["predicted_gain"]),
                           None if d.get("achieved_gain") is None else float(d["achieved_gain"]),
                           dict(d.get("per_vm", {})), tuple(d.get("censored", ())))


def settle(p: PendingAudit, samples: Mapping[str, Sequence[Sample]], now: float,
           params: ObserveParams = DEFAULT_PARAMS) -> AuditRecord:
    """The audit of ``p`` from the samples taken since it was applied (module docstring)."""
    after = achieved_yields(samples, p.needs, p.needs, since=p.applied_at, params=params)
    vms = sorted(p.needs)
    predicted_gain = min(p.predicted_after[vm] for vm in vms) - min(p.predicted_before[vm] for vm in vms)
    both = [vm for vm in vms if vm in after and vm in p.achieved_before]
    achieved_gain = (min(after[vm] for vm in both) - min(p.achieved_before[vm] for vm in both)) if both else None
    per_vm = {vm: {"need_cores": p.needs[vm], "predicted_before": round(p.predicted_before[vm], 4),
                   "predicted_after": round(p.predicted_after[vm], 4),
                   "achieved_before": None if vm not in p.achieved_before else round(p.achieved_before[vm], 4),
                   "achieved_after": None if vm not in after else round(after[vm], 4)} for vm in vms}
    return AuditRecord(p.kind, p.applied_at, now, predicted_gain, achieved_gain, per_vm, p.censored)


def audits_of(events: Iterable[Mapping[str, Any]]) -> list[AuditRecord]:
    """The ``audit`` events of a controller's log (oldest first), as records."""
    return [AuditRecord.from_dict(e) for e in events if e.get("event") == "audit"]
