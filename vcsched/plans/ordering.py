"""Ordering a plan's steps so that no host's caps ever sum above its capacity, not even between two steps.

Caps are what the paper's model allocates (section 2.3: the CPU fractions on
a host sum to at most its capacity).  A plan must never let a host's caps
sum above its cores, not even between two steps, or a VM created early could
take CPU promised to another.  So steps that lower a host's total go first,
then the rest in an order that keeps every prefix within capacity
(:func:`order_steps`); :func:`cap_overruns` checks any order.

The same holds for every resource vcsched caps: disk and network caps on a
host (:mod:`vcsched.iocaps`) must stay within the capacity the cluster file
declares for it, at every prefix.  A step is "lowering" only if it raises no
total on any host and resource, so a step that lowers a VM's CPU but raises
its disk waits like any other raise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from vcsched.caps import CAP_TOLERANCE
from vcsched.errors import VcschedError
from vcsched.iocaps import IO_RESOURCES
from vcsched.plans.steps import Step


class PlanError(VcschedError):
    """A plan cannot be ordered safely (a core bug, or a cluster already over capacity)."""


HostCaps = Mapping[str, Mapping[str, float]]  # host -> vm -> cap in cores (or bytes/s for disk and net)
CPU = "cpu"
#: Disk and network caps are whole bytes per second: sums compare within float noise of that.
IO_TOLERANCE = 1e-6

State = dict[str, dict[str, dict[str, float]]]  # resource -> host -> vm -> cap


def _apply_changes(state: State, step: Step) -> None:
    caps = state[CPU]
    leaving: dict[tuple[str, str], float] = {}  # (resource, vm) -> cap, of a VM this step takes off a host
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
        for r in IO_RESOURCES:  # its disk and network caps go where it goes (the domain XML carries them)
            hosts = state.setdefault(r, {})
            if cap is None:
                amount = hosts.get(host, {}).pop(vm, None)
                if amount is not None:
                    leaving[(r, vm)] = amount
                continue
            found = [hosts[h].pop(vm) for h in list(hosts) if h != host and vm in hosts[h]]
            amount = found[0] if found else leaving.pop((r, vm), None)
            if amount is not None:
                hosts.setdefault(host, {})[vm] = amount
    for r, host, vm, amount in step.io_changes():
        state.setdefault(r, {}).setdefault(host, {})[vm] = amount


def _state(caps_now: HostCaps, io_now: Mapping[str, HostCaps] | None) -> State:
    state: State = {CPU: {h: dict(v) for h, v in caps_now.items()}}
    for r in IO_RESOURCES:
        state[r] = {h: dict(v) for h, v in (io_now or {}).get(r, {}).items()}
    return state


def _limits(host_cores: Mapping[str, float], io_capacity: Mapping[str, Mapping[str, float | None]] | None
            ) -> dict[str, dict[str, float]]:
    """resource -> host -> capacity; a capacity the cluster file does not declare bounds nothing here
    (the plan check refuses caps on such a host)."""
    out = {CPU: dict(host_cores)}
    for r in IO_RESOURCES:
        given = (io_capacity or {}).get(r, {})
        out[r] = {h: math.inf if given.get(h) is None else float(given[h] or 0.0) for h in host_cores}
    return out


def _total(state: State, resource: str, host: str) -> float:
    return sum(state.get(resource, {}).get(host, {}).values())


def _tolerance(resource: str) -> float:
    return CAP_TOLERANCE if resource == CPU else IO_TOLERANCE


def cap_overruns(steps: Iterable[Step], caps_now: HostCaps, host_cores: Mapping[str, float], *,
                 io_now: Mapping[str, HostCaps] | None = None,
                 io_capacity: Mapping[str, Mapping[str, float | None]] | None = None) -> list[str]:
    """Every step after which some host's caps on a resource sum above its capacity *because the step raised them*.

    A step that lowers a host's total is always fine (even if the host started
    over capacity, e.g. uncapped VMs): it moves toward the plan's target.
    ``io_now``/``io_capacity``: resource (``disk``, ``net``) -> host -> VM's
    cap / host's capacity in bytes per second.
    """
    state = _state(caps_now, io_now)
    limits = _limits(host_cores, io_capacity)
    problems = []
    for i, step in enumerate(steps):
        before = {(r, h): _total(state, r, h) for r, hosts in limits.items() for h in hosts}
        _apply_changes(state, step)
        for (r, h), was in before.items():
            after, cap, tol = _total(state, r, h), limits[r][h], _tolerance(r)
            if after > was + tol and after > cap + tol:
                unit = "cores" if r == CPU else f"B/s of {r}"
                problems.append(f"step {i} ({step.op} {step.vm}): host {h} caps {after:.4f} > {cap:g} {unit}")
    return problems


def order_steps(steps: Iterable[Step], caps_now: HostCaps, host_cores: Mapping[str, float], *,
                io_now: Mapping[str, HostCaps] | None = None,
                io_capacity: Mapping[str, Mapping[str, float | None]] | None = None) -> tuple[Step, ...]:
    """Order ``steps`` so that no prefix overruns a host on any resource (see the module docstring).

    Greedy: repeatedly take the first remaining step that lowers some total
    without raising any, else the first one that keeps every host and
    resource it raises within capacity.  Raises :class:`PlanError` if no safe
    order exists from this state (which a correct allocation never produces).
    """
    pending = list(steps)
    state = _state(caps_now, io_now)
    limits = _limits(host_cores, io_capacity)
    out: list[Step] = []

    def effect(step: Step) -> tuple[bool, bool]:
        trial = {r: {h: dict(v) for h, v in hosts.items()} for r, hosts in state.items()}
        _apply_changes(trial, step)
        raises_ok = lowers_only = True
        for r, hosts in limits.items():
            for h, cap in hosts.items():
                before, after, tol = _total(state, r, h), _total(trial, r, h), _tolerance(r)
                if after > before + tol:
                    lowers_only = False
                    if after > cap + tol:
                        raises_ok = False
        return lowers_only, raises_ok

    while pending:
        effects = [effect(s) for s in pending]
        pick = next((i for i, (low, _) in enumerate(effects) if low), None)
        if pick is None:
            pick = next((i for i, (_, ok) in enumerate(effects) if ok), None)
        if pick is None:
            names = ", ".join(f"{s.op} {s.vm}" for s in pending)
            raise PlanError(f"no order of the remaining steps keeps every host within its capacity: {names}")
        step = pending.pop(pick)
        _apply_changes(state, step)
        out.append(step)
    return tuple(out)
