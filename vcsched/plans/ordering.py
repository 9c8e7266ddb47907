"""Ordering a plan's steps so that no host's caps ever sum above its cores, not even between two steps.

Caps are what the paper's model allocates (section 2.3: the CPU fractions on
a host sum to at most its capacity).  A plan must never let a host's caps
sum above its cores, not even between two steps, or a VM created early could
take CPU promised to another.  So steps that lower a host's total go first,
then the rest in an order that keeps every prefix within capacity
(:func:`order_steps`); :func:`cap_overruns` checks any order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vcsched.caps import CAP_TOLERANCE
from vcsched.errors import VcschedError
from vcsched.plans.steps import Step


class PlanError(VcschedError):
    """A plan cannot be ordered safely (a core bug, or a cluster already over capacity)."""


HostCaps = Mapping[str, Mapping[str, float]]  # host -> vm -> cap in cores


def _apply_changes(caps: dict[str, dict[str, float]], step: Step) -> None:
    for host, vm, cap in step.cap_changes():
        on = caps.setdefault(host, {})
        if cap is None:
            on.pop(vm, None)
        else:
            on[vm] = cap
        # A VM is on one host only: a step placing it here removes it elsewhere (migrations).
        if cap is not None:
            for other, vms in caps.items():
                if other != host:
                    vms.pop(vm, None)


def cap_overruns(steps: Iterable[Step], caps_now: HostCaps, host_cores: Mapping[str, float]) -> list[str]:
    """Every step after which some host's caps sum above its cores *because the step raised them*.

    A step that lowers a host's total is always fine (even if the host started
    over capacity, e.g. uncapped VMs): it moves toward the plan's target.
    """
    caps = {h: dict(v) for h, v in caps_now.items()}
    problems = []
    for i, step in enumerate(steps):
        before = {h: sum(caps.get(h, {}).values()) for h in host_cores}
        _apply_changes(caps, step)
        for h, cores in host_cores.items():
            after = sum(caps.get(h, {}).values())
            if after > before[h] + CAP_TOLERANCE and after > cores + CAP_TOLERANCE:
                problems.append(f"step {i} ({step.op} {step.vm}): host {h} caps {after:.4f} > {cores:g} cores")
    return problems


def order_steps(steps: Iterable[Step], caps_now: HostCaps, host_cores: Mapping[str, float]) -> tuple[Step, ...]:
    """Order ``steps`` so that no prefix overruns a host (see the module docstring).

    Greedy: repeatedly take the first remaining step that lowers some host's
    total without raising any, else the first one that keeps every host it
    raises within capacity.  Raises :class:`PlanError` if no safe order exists
    from this state (which a correct allocation never produces).
    """
    pending = list(steps)
    caps = {h: dict(v) for h, v in caps_now.items()}
    out: list[Step] = []

    def effect(step: Step) -> tuple[bool, bool]:
        trial = {h: dict(v) for h, v in caps.items()}
        _apply_changes(trial, step)
        raises_ok = lowers_only = True
        for h, cores in host_cores.items():
            before, after = sum(caps.get(h, {}).values()), sum(trial.get(h, {}).values())
            if after > before + CAP_TOLERANCE:
                lowers_only = False
                if after > cores + CAP_TOLERANCE:
                    raises_ok = False
        return lowers_only, raises_ok

    while pending:
        effects = [effect(s) for s in pending]
        pick = next((i for i, (low, _) in enumerate(effects) if low), None)
        if pick is None:
            pick = next((i for i, (_, ok) in enumerate(effects) if ok), None)
        if pick is None:
            names = ", ".join(f"{s.op} {s.vm}" for s in pending)
            raise PlanError(f"no order of the remaining steps keeps every host within its cores: {names}")
        step = pending.pop(pick)
        _apply_changes(caps, step)
        out.append(step)
    return tuple(out)
