"""Why each step of a plan is there, in words, and what the plan does to yields: what an operator reads before
approving a recommendation or applying an ``adapt`` / ``drain`` plan.

A re-balancer that moves VMs without saying why is the most common complaint
about such tools: each step here names the VM, the hosts and the numbers that
make it worth doing (a host whose VMs want more cores than it has, a VM whose
yield rises, a host being drained).  Pure: a plan and the inventory it was
computed on in, sentences and numbers out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vcsched.inventory import Inventory, VmState
from vcsched.plans.plan import Plan
from vcsched.plans.steps import (
    AdoptStep,
    CreateStep,
    MigrateStep,
    ReleaseStep,
    RemoveStep,
    SetCapStep,
    SetNeedStep,
    Step,
)

_EPS = 1e-9


def _need(v: VmState, needs: Mapping[str, float]) -> float:
    if v.name in needs:
        return needs[v.name]
    return v.meta.cpu_need_cores if v.meta is not None else v.cap_or_vcpus


def yield_of(cap: float, need: float) -> float:
    """A VM's yield: its cap over its need, at most 1 (a VM needing nothing has all it needs)."""
    return 1.0 if need <= _EPS else min(1.0, cap / need)


def host_demand(inventory: Inventory, host: str, needs: Mapping[str, float]) -> float:
    """Cores the running managed VMs of ``host`` need together."""
    return sum(_need(v, needs) for v in inventory.vms_on(host) if v.managed and v.active)


def _load(inventory: Inventory, host: str, needs: Mapping[str, float]) -> str:
    """``its VMs need 0.80 cores of its 1``; with unmanaged domains there, of what they leave (what plans use)."""
    h = next((h for h in inventory.hosts if h.name == host), None)
    demand = host_demand(inventory, host, needs)
    if h is None:
        return f"its VMs need {demand:.2f} cores of its 0"
    held = inventory.unmanaged_cores(host)
    if held <= 0:
        return f"its VMs need {demand:.2f} cores of its {h.cores:g}"
    return (f"its VMs need {demand:.2f} cores of the {inventory.usable_cores(h):.2f} its unmanaged domains leave of "
            f"its {h.cores:g}")


def step_reason(step: Step, plan: Plan, inventory: Inventory, needs: Mapping[str, float],
                drain: str | None = None) -> str:
    """One sentence: why ``step`` is in ``plan`` (computed on ``inventory`` with ``needs``)."""
    v = inventory.vm(step.vm)
    after = plan.per_vm.get(step.vm)
    if isinstance(step, MigrateStep):
        before = yield_of(v.cap_or_vcpus, _need(v, needs)) if v is not None else None
        change = (f"; its yield {before:.2f} -> {after.yield_:.2f}" if before is not None and after is not None
                  else "")
        if step.final is not None:
            return f"relay hop: {step.vm} passes through {step.target} on its way to {step.final} " \
                   "(a swap between full hosts)"
        if drain is not None and step.source == drain:
            return f"{step.vm} must leave {drain}, which is being drained for maintenance{change}"
        if step.squeezed:
            return f"{step.vm} arrives on {step.target} squeezed until the VM it swaps with has left{change}"
        src = next((h for h in inventory.hosts if h.name == step.source), None)
        if (src is not None and before is not None and before >= 1 - _EPS and after is not None
                and after.yield_ >= 1 - _EPS
                and host_demand(inventory, step.source, needs) <= inventory.usable_cores(src) + _EPS):
            return (f"spare room (every VM at its yield already; the cluster's spare): {step.source} "
                    f"({_load(inventory, step.source, needs)}) to {step.target} "
                    f"({_load(inventory, step.target, needs)}){change}")
        return (f"{step.source} is over-committed ({_load(inventory, step.source, needs)}); {step.target} has room "
                f"({_load(inventory, step.target, needs)}){change}")
    if isinstance(step, SetCapStep) and step.cap_cores is not None and v is not None:
        need = _need(v, needs)
        was, will = yield_of(v.cap_or_vcpus, need), yield_of(step.cap_cores, need)
        if step.cap_cores < v.cap_or_vcpus - _EPS:
            if was >= 1 - _EPS and will >= 1 - _EPS:
                return f"{step.vm} needs only {need:.2f} cores: its cap comes down to it, freeing room on {step.host}"
            return (f"room on {step.host} ({_load(inventory, step.host, needs)}) is shared at a common yield: "
                    f"{step.vm}'s yield {was:.2f} -> {will:.2f}")
        return f"{step.vm} gets more of what it needs ({need:.2f} cores): its yield {was:.2f} -> {will:.2f}"
    if isinstance(step, SetCapStep):
        return f"{step.vm}'s disk or network cap follows its share on {step.host}"
    if isinstance(step, CreateStep):
        return f"new VM of virtual cluster {step.cluster} (request)"
    if isinstance(step, RemoveStep):
        return f"virtual cluster {step.cluster} departs"
    if isinstance(step, SetNeedStep):
        return f"records {step.vm}'s new need of {step.cpu_need_cores:.2f} cores in its metadata"
    if isinstance(step, AdoptStep):
        return f"{step.vm} joins virtual cluster {step.definition.cluster} where it runs (adopted)"
    if isinstance(step, ReleaseStep):
        return f"{step.vm} is handed back: it runs on, uncapped and unmanaged"
    return step.op


def step_reasons(plan: Plan, inventory: Inventory, needs: Mapping[str, float] | None = None,
                 drain: str | None = None) -> list[str]:
    """:func:`step_reason` for every step, in plan order."""
    needs = needs or {}
    return [step_reason(s, plan, inventory, needs, drain) for s in plan.steps]


@dataclass(frozen=True)
class Effect:
    """What a plan does to the yields of the VMs it touches, and what it moves."""

    min_yield_before: float
    min_yield_after: float
    mean_yield_before: float
    mean_yield_after: float
    per_vm: Mapping[str, Mapping[str, Any]]  # vm -> host, cap and yield before and after (the VMs it touches)
    bytes_to_move: int
    #: VMs whose need is a censored estimate (a lower bound): their yields, and a minimum they attain, are upper
    #: bounds — predicted gains for them are not promises (docs/contention.md).
    censored: tuple[str, ...] = ()
    #: The minimum yields before / after are attained by a VM with a censored need: upper bounds.
    min_before_upper_bound: bool = False
    min_after_upper_bound: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"min_yield_before": self.min_yield_before, "min_yield_after": self.min_yield_after,
                "mean_yield_before": self.mean_yield_before, "mean_yield_after": self.mean_yield_after,
                "per_vm": {k: dict(v) for k, v in self.per_vm.items()}, "bytes_to_move": self.bytes_to_move,
                "censored_vms": list(self.censored), "min_yield_before_upper_bound": self.min_before_upper_bound,
                "min_yield_after_upper_bound": self.min_after_upper_bound}


def effect(plan: Plan, inventory: Inventory, needs: Mapping[str, float] | None = None,
           censored: Iterable[str] = ()) -> Effect:
    """Yields before (caps now over needs) and after (the plan's predictions), over the running managed VMs.
    ``censored``: VMs whose need is a lower bound; their yields are marked upper bounds."""
    needs = needs or {}
    lower_bounded = frozenset(censored)
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for v in inventory.managed():
        if not v.active:
            continue
        before[v.name] = yield_of(v.cap_or_vcpus, _need(v, needs))
        p = plan.per_vm.get(v.name)
        after[v.name] = p.yield_ if p is not None else before[v.name]
    touched: Sequence[str] = sorted({s.vm for s in plan.steps})
    per_vm = {}
    for name in touched:
        was = inventory.vm(name)
        p = plan.per_vm.get(name)
        per_vm[name] = {"host_before": was.host if was is not None else None,
                        "host_after": p.host if p is not None else None,
                        "cap_before": was.cap_cores if was is not None else None,
                        "cap_after": p.cap_cores if p is not None else None,
                        "yield_before": before.get(name), "yield_after": after.get(name),
                        "yield_upper_bound": name in lower_bounded}
    moved = sum(s.bytes for s in plan.steps if isinstance(s, MigrateStep))
    mean = (lambda d: sum(d.values()) / len(d) if d else 1.0)  # noqa: E731
    low_before, low_after = min(before.values(), default=1.0), min(after.values(), default=1.0)

    def bounded(ys: Mapping[str, float], low: float) -> bool:
        return any(ys[v] <= low + _EPS for v in lower_bounded if v in ys)

    return Effect(low_before, low_after, mean(before), mean(after), per_vm, moved,
                  tuple(sorted(lower_bounded & set(before))), bounded(before, low_before), bounded(after, low_after))
