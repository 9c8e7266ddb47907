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

import heapq
import math
from collections.abc import Iterable, Mapping

from vcsched.errors import VcschedError
from vcsched.iocaps import IO_RESOURCES
from vcsched.plans.steps import Step
from vcsched.units import CAP_TOLERANCE, CPU, IO_TOLERANCE


class PlanError(VcschedError):
    """A plan cannot be ordered safely (a core bug, or a cluster already over capacity)."""


HostCaps = Mapping[str, Mapping[str, float]]  # host -> vm -> cap in cores (or bytes/s for disk and net)

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


def _step_vms(step: Step) -> set[str]:
    return {vm for _, vm, _ in step.cap_changes()} | {vm for _, _, vm, _ in step.io_changes()}


class _Tracker:
    """The cap state, and for each VM the hosts holding one of its caps.

    A step changes only the hosts it names and the hosts its VMs are on
    (:func:`_apply_changes` moves a VM's caps with it), so its effect is
    computed on a copy of those few hosts, not of the whole cluster: at 1,000
    hosts and 10,000 VMs a copy per candidate step cost ~7 ms, and ordering
    thousands of steps was quadratic on top of that.
    """

    def __init__(self, state: State) -> None:
        self.state = state
        self.holders: dict[str, set[str]] = {}
        for by_host in state.values():
            for h, vms in by_host.items():
                for vm in vms:
                    self.holders.setdefault(vm, set()).add(h)

    def touched(self, step: Step) -> set[str]:
        """The hosts whose caps ``step`` may change."""
        out: set[str] = set()
        for host, vm, _cap in step.cap_changes():
            out.add(host)
            out |= self.holders.get(vm, set())
        for _r, host, vm, _amount in step.io_changes():
            out.add(host)
            out |= self.holders.get(vm, set())
        return out

    def trial(self, step: Step, hosts: set[str]) -> State:
        """The state of ``hosts`` (``touched(step)``) after ``step``, leaving the state as it is."""
        view = {r: {h: dict(by_host[h]) for h in hosts if h in by_host} for r, by_host in self.state.items()}
        _apply_changes(view, step)
        return view

    def apply(self, step: Step, hosts: set[str]) -> None:
        view = self.trial(step, hosts)
        for r, by_host in view.items():
            self.state.setdefault(r, {}).update(by_host)
        for vm in _step_vms(step):
            self.holders[vm] = {h for by_host in self.state.values() for h in hosts if vm in by_host.get(h, {})}


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
    tracker = _Tracker(_state(caps_now, io_now))
    limits = _limits(host_cores, io_capacity)
    rank = {h: k for k, h in enumerate(host_cores)}
    problems = []
    for i, step in enumerate(steps):
        hosts = tracker.touched(step)
        mine = sorted((h for h in hosts if h in rank), key=rank.__getitem__)  # the hosts' order, as reported
        before = {(r, h): _total(tracker.state, r, h) for r in limits for h in mine}
        tracker.apply(step, hosts)
        for (r, h), was in before.items():
            after, cap, tol = _total(tracker.state, r, h), limits[r][h], _tolerance(r)
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

    Each step's effect is kept and recomputed only when a step taken before it
    changed one of the hosts it reads or moved one of its VMs; the first
    eligible step comes from two heaps of positions.  So a plan of n steps
    costs O(n log n) plus the re-evaluations of steps sharing a host, instead
    of n^2 evaluations of the whole cluster.
    """
    pending = list(steps)
    tracker = _Tracker(_state(caps_now, io_now))
    limits = _limits(host_cores, io_capacity)
    n = len(pending)
    effects: list[tuple[bool, bool]] = [(False, False)] * n  # (raises nothing, raises within capacity)
    done = [False] * n
    readers: dict[str, set[int]] = {}  # host -> steps whose effect read it
    vms_of = [_step_vms(s) for s in pending]
    movers: dict[str, set[int]] = {}  # VM -> steps that name it
    for i, vms in enumerate(vms_of):
        for vm in vms:
            movers.setdefault(vm, set()).add(i)
    heaps: tuple[list[int], list[int]] = ([], [])

    def evaluate(i: int) -> None:
        hosts = tracker.touched(pending[i])
        trial = tracker.trial(pending[i], hosts)
        raises_ok = lowers_only = True
        for r, caps in limits.items():
            for h in hosts:  # the others keep their totals
                if h not in caps:
                    continue
                before, after, tol = _total(tracker.state, r, h), _total(trial, r, h), _tolerance(r)
                if after > before + tol:
                    lowers_only = False
                    if after > caps[h] + tol:
                        raises_ok = False
        effects[i] = (lowers_only, raises_ok)
        for h in hosts:
            readers.setdefault(h, set()).add(i)
        for k, flag in enumerate(effects[i]):
            if flag:
                heapq.heappush(heaps[k], i)

    def first(k: int) -> int | None:
        heap = heaps[k]
        while heap:
            i = heap[0]
            if not done[i] and effects[i][k]:
                return i
            heapq.heappop(heap)  # taken, or its effect changed since it was pushed
        return None

    for i in range(n):
        evaluate(i)
    out: list[Step] = []
    while len(out) < n:
        pick = first(0)
        if pick is None:
            pick = first(1)
        if pick is None:
            names = ", ".join(f"{s.op} {s.vm}" for i, s in enumerate(pending) if not done[i])
            raise PlanError(f"no order of the remaining steps keeps every host within its capacity: {names}")
        done[pick] = True
        hosts = tracker.touched(pending[pick])
        tracker.apply(pending[pick], hosts)
        out.append(pending[pick])
        stale = set().union(*(readers.get(h, set()) for h in hosts), *(movers[vm] for vm in vms_of[pick]))
        for j in sorted(stale):
            if not done[j]:
                evaluate(j)
    return tuple(out)
