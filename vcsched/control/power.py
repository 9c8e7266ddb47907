"""Power saving, deciding half: which host may sleep now, which sleeping host must wake (docs/power.md).

Pure: it takes the cluster file, the inventory, the power state and the clock, and returns a
:class:`PowerDecision` — an action, the host, the reason in words, the evacuation plan of a sleep, and the
next state.  Acting on it (evacuate, power off through the host's agent, verify, wake) is the acting
layer's; the simulator (:mod:`vcsched.simulate.power`) calls the very same function.

**A host may sleep** when all of this holds, checked cheapest first, each refusal a reason:

* power saving is on, the host is not excluded (``power_saving = false``), has an agent to power it
  (``power``, else ``fence``), is on and answers, is not in maintenance, and is not one of the last
  ``min_hosts_on`` hosts on;
* it runs no VM vcsched may not move: no unmanaged VM (never touched), no VM in doubt, no pinned VM, no
  VM with disks on storage no other host on shares (the peers' failed wakes come from local storage); and
  it holds no domain that does not run (an evacuation moves running VMs only, and the power-off must find
  the host without any domain at all);
* migrations are allowed now (the cluster's windows and blackouts), and nothing is waiting for room;
* its drain (:func:`vcsched.control.live.adapt_inventory` with ``drain``, the planner ``vcsched drain``
  uses) empties it within the migration budget, leaving no virtual cluster below its floor and every VM
  at the cluster's ``power_yield`` or more;
* on the hosts left on, as that plan leaves them, the room holds (:func:`room_short`) for the demand
  predicted one wake time ahead and ``sleep_margin`` more — so that a host never sleeps only to be woken at
  once — including ``failures_tolerated`` host failures (:func:`vcsched.control.failover.failover_refusal`).

**Hysteresis.**  A host sleeps only once the condition has held for ``sleep_after`` without a break
(``ready_since`` in its :class:`HostPower` state), and at most one host per decision, since each sleep
changes every other host's question.  A host that wakes starts its count again.

**A sleeping host must wake** when the room is short on the hosts on (:func:`room_short`) for the
demand predicted at ``now`` plus the longest wake time among the hosts that could wake, and ``wake_margin``
more (below ``sleep_margin``: the band between them is the hysteresis, and a host wakes while the room
still holds rather than once VMs slow down): each VM's CPU
need moved along its trend (``Demand.trend``, never below today's need), the requests waiting
(``Demand.pending``) admitted one after the other, and the ``failures_tolerated`` room.  The host woken is
the quickest to wake that restores the room alone (else the largest); a wake time is the longest one
measured for that host (:func:`woke`), and the cluster's ``wake_time`` until one was.  A host whose wake
failed is never chosen again until an operator clears it (:func:`cleared`).  Waking needs no migration,
so it is not bound by the windows.

**Energy** (:func:`watts`): a host on draws ``idle_watts`` plus ``(peak_watts - idle_watts)`` times
its CPU utilisation; a sleeping host is counted at 0 W.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from vcsched.control.admission import admit, existing_jobs, model_hosts
from vcsched.control.failover import after_plan, failover_refusal, without_hosts
from vcsched.control.live import LiveAdaptation, adapt_inventory
from vcsched.errors import InputError, VcschedError
from vcsched.formats.cluster import Cluster
from vcsched.formats.power import HostPower as HostPowerConfig
from vcsched.formats.request import Request
from vcsched.inventory import HostState, Inventory, VmState
from vcsched.model import Instance
from vcsched.yields import allocate

ON, SLEEPING, WAKING = "on", "sleeping", "waking"
#: Finished sleeps kept per host: a month of two a day, for the energy saved over a window.
SLEEPS_KEPT = 64
SLEEP, WAKE, NONE = "sleep", "wake", "none"

T = TypeVar("T")

#: Yields are compared with this slack: a plan's yields come from LPs solved to about 1e-9.
YIELD_TOLERANCE = 1e-6


@dataclass(frozen=True)
class HostPower:
    """One host's power state.

    ``since``: when it entered ``state``; ``ready_since``: since when the sleep condition has held without
    a break (None: it does not hold now); ``wake_s``: its longest measured wake (None: never measured);
    ``failed``: its last wake failed (never chosen again until cleared), ``reason`` why; ``cores``/
    ``memory_bytes``: its size when it went to sleep, the capacity a wake brings back; ``uuid``: its libvirt host
    UUID when it went to sleep (a wake counts only when the host answers with this one: another machine behind
    the same URI is not the host that slept).  Times are the caller's clock: the acting side's wall time (the
    record outlives the process), the simulator's seconds.
    """

    host: str
    state: str = ON
    since: float = 0.0
    ready_since: float | None = None
    wake_s: float | None = None
    failed: bool = False
    cores: int = 0
    memory_bytes: int = 0
    memory_reserved: int = 0
    uuid: str | None = None
    reason: str | None = None
    #: Its last finished sleeps, ``(powered off, woken)`` (the newest :data:`SLEEPS_KEPT`): the energy it saved
    #: (:func:`energy_saved`).
    sleeps: tuple[tuple[float, float], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(where: str, d: object) -> HostPower:
        """A record as :meth:`to_dict` wrote it; :class:`InputError` naming the field otherwise."""
        if not isinstance(d, Mapping) or not isinstance(d.get("host"), str):
            raise InputError(f"{where}: not a host power record (no host name)")
        if d.get("state", ON) not in (ON, SLEEPING, WAKING):
            raise InputError(f"{where}.state: {d.get('state')!r} is not one of {ON!r}, {SLEEPING!r}, {WAKING!r}")
        known = {f.name for f in dataclasses.fields(HostPower)}
        try:
            fields = {k: v for k, v in d.items() if k in known}
            fields["sleeps"] = tuple((float(a), float(b)) for a, b in fields.get("sleeps", ()))
            return HostPower(**fields)
        except TypeError as exc:
            raise InputError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class PowerState:
    """Every host's :class:`HostPower`; a host it does not name is on, never measured."""

    hosts: tuple[HostPower, ...] = ()

    def of(self, host: str) -> HostPower:
        return next((h for h in self.hosts if h.host == host), HostPower(host))

    def with_host(self, h: HostPower) -> PowerState:
        return PowerState(tuple(sorted((*(x for x in self.hosts if x.host != h.host), h), key=lambda x: x.host)))

    def in_state(self, state: str) -> tuple[str, ...]:
        return tuple(h.host for h in self.hosts if h.state == state)

    def to_dict(self) -> dict[str, object]:
        return {"version": 1, "hosts": [h.to_dict() for h in self.hosts]}

    @staticmethod
    def from_dict(d: object) -> PowerState:
        if not isinstance(d, Mapping) or d.get("version") != 1 or not isinstance(d.get("hosts"), list):
            raise InputError("power state: not a vcsched power record (version 1)")
        return PowerState(tuple(sorted((HostPower.from_dict(f"power state hosts[{i}]", h)
                                        for i, h in enumerate(d["hosts"])), key=lambda h: h.host)))


@dataclass(frozen=True)
class Demand:
    """What is coming: ``trend`` each VM's CPU need's rate of change in cores per second (from the
    estimates), ``pending`` the requests waiting for room."""

    trend: Mapping[str, float] = field(default_factory=dict)
    pending: tuple[Request, ...] = ()
    #: The whole cluster's CPU demand's relative rate of change, per second (e.g. 1e-4: +36 % an hour), from the
    #: history of the estimates: every VM's need moves along it, on top of its own trend.
    growth: float = 0.0


NO_DEMAND = Demand()


@dataclass(frozen=True)
class PowerDecision:
    """``action`` (:data:`SLEEP`, :data:`WAKE` or :data:`NONE`) on ``host``, ``reason`` in words, the
    evacuation ``plan`` of a sleep, ``refusals`` why each other host may not sleep, and the ``state``
    to pass to the next decision."""

    action: str
    host: str | None
    reason: str
    state: PowerState
    plan: LiveAdaptation | None = None
    refusals: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"action": self.action, "host": self.host, "reason": self.reason,
                "migrated_bytes": None if self.plan is None or self.plan.plan is None
                else self.plan.plan.extra.get("migrated_bytes"),
                "refusals": {h: why for h, why in self.refusals}}


# --- energy ------------------------------------------------------------------------------------


def watts(power: HostPowerConfig, utilisation: float, *, asleep: bool = False) -> float:
    """What a host draws: linear from idle to peak in its CPU utilisation (clipped to [0, 1]); 0 asleep or
    undeclared."""
    if asleep or power.idle_watts is None or power.peak_watts is None:
        return 0.0
    u = min(max(utilisation, 0.0), 1.0)
    return power.idle_watts + (power.peak_watts - power.idle_watts) * u


def energy_saved(cluster: Cluster, state: PowerState, now: float, window: float) -> float:
    """Joules power saving saved over the ``window`` seconds before ``now``: each host's ``idle_watts`` for the
    time it slept in it (a host asleep draws ~0 W, and the load it shed draws the same on the hosts that took
    it, energy being linear in utilisation).  A host whose wake failed counts nothing from then on (what it
    draws is unknown), nor does a host without ``idle_watts``."""
    start = now - window
    total = 0.0
    for h in state.hosts:
        idle = cluster.host(h.host).power.idle_watts if h.host in cluster.host_names else None
        if idle is None:
            continue
        spans = list(h.sleeps) + ([(h.since, now)] if h.state == SLEEPING and not h.failed else [])
        total += idle * sum(max(0.0, min(b, now) - max(a, start)) for a, b in spans)
    return total


# --- state transitions the acting side (or the simulator) reports ---------------------------------


def slept(state: PowerState, host: HostState, now: float) -> PowerState:
    """``host`` is powered off (``status`` said off) at ``now``: remember its size for the wake."""
    old = state.of(host.name)
    return state.with_host(dataclasses.replace(old, state=SLEEPING, since=now, ready_since=None, cores=host.cores,
                                               memory_bytes=host.memory_bytes, memory_reserved=host.memory_reserved,
                                               uuid=host.uuid or old.uuid))


def waking(state: PowerState, host: str, now: float) -> PowerState:
    """``host``'s agent was told ``on`` at ``now``: its sleep (unless its last wake failed: what it drew since is
    unknown) ends here."""
    old = state.of(host)
    sleeps = old.sleeps
    if old.state == SLEEPING and not old.failed:
        sleeps = (*sleeps, (old.since, now))[-SLEEPS_KEPT:]
    return state.with_host(dataclasses.replace(old, state=WAKING, since=now, ready_since=None, sleeps=sleeps))


def woke(state: PowerState, host: str, now: float, most: float | None = None) -> PowerState:
    """``host`` answers again (with its own UUID) at ``now``: its wake time measured (the longest kept), at most
    ``most`` seconds when given (a wake cut short and settled later: the time since is the controller's absence,
    not the host's wake)."""
    old = state.of(host)
    took = now - old.since if most is None else min(now - old.since, most)
    return state.with_host(dataclasses.replace(old, state=ON, since=now, ready_since=None, failed=False, reason=None,
                                               wake_s=took if old.wake_s is None else max(old.wake_s, took)))


def wake_failed(state: PowerState, host: str, now: float, reason: str = "") -> PowerState:
    """``host`` did not come back (``reason``): asleep (as far as anyone knows) and never chosen again until
    cleared."""
    return state.with_host(dataclasses.replace(state.of(host), state=SLEEPING, since=now, failed=True,
                                               reason=reason or None))


def cleared(state: PowerState, host: str) -> PowerState:
    """An operator cleared ``host``'s failed wake."""
    return state.with_host(dataclasses.replace(state.of(host), failed=False, reason=None))


def describe(h: HostPower) -> str:
    """One word for ``h``'s state as an operator reads it: on, sleeping, waking or wake-failed."""
    return "wake-failed" if h.failed else h.state


def mark_asleep(inventory: Inventory, state: PowerState) -> Inventory:
    """``inventory`` with each host that does not answer *because vcsched put it to sleep* (``state`` says
    sleeping or waking) marked :attr:`HostState.asleep`, at the size it slept with: it is not a failed host
    (recovery never fences it, status says sleeping), and still gets nothing planned onto it.  A host recorded
    asleep that answers is left as read (it is awake, whatever the record says)."""
    hosts = []
    for h in inventory.hosts:
        p = state.of(h.name)
        if h.down is not None and p.state in (SLEEPING, WAKING):
            h = dataclasses.replace(h, asleep=True, power=describe(p),
                                    down=f"{describe(p)} (powered off by vcsched power saving)",
                                    cores=p.cores or h.cores, memory_bytes=p.memory_bytes or h.memory_bytes,
                                    uuid=p.uuid or h.uuid)
        hosts.append(h)
    return dataclasses.replace(inventory, hosts=tuple(hosts))


def wake_time(cluster: Cluster, state: PowerState, host: str) -> float:
    """Seconds ``host`` takes to wake: measured, else the cluster's ``wake_time``."""
    measured = state.of(host).wake_s
    return cluster.power.wake_time if measured is None else measured


#: A wake may take this many times the host's wake time (measured, else the cluster's ``wake_time``) before it
#: counts as failed: a host a little slower than its slowest wake is not marked failed for it.
WAKE_DEADLINE_FACTOR = 2.0


def wake_deadline(cluster: Cluster, state: PowerState, host: str) -> float:
    """Seconds a wake of ``host`` may take before it counts as failed (:data:`WAKE_DEADLINE_FACTOR`)."""
    return WAKE_DEADLINE_FACTOR * wake_time(cluster, state, host)


def overdue(cluster: Cluster, state: PowerState, now: float) -> tuple[str, ...]:
    """Hosts recorded waking for longer than their deadline: a wake cut short (its process killed), which no
    decision resolves by itself (a host waking holds every sleep back) — a wake of it does (its agent answers
    ``on`` at once if it is on)."""
    return tuple(h.host for h in state.hosts if h.state == WAKING and h.host in cluster.host_names
                 and now - h.since > wake_deadline(cluster, state, h.host))


# --- the room --------------------------------------------------------------------------------------


def predicted(inventory: Inventory, demand: Demand, horizon: float, margin: float = 0.0) -> Inventory:
    """``inventory`` with each managed VM's CPU need moved ``horizon`` seconds along its trend and the cluster's
    growth, then ``margin`` more (never below today's need, never above its vCPUs)."""
    vms = []
    grow = (1.0 + max(demand.growth, 0.0) * horizon) * (1.0 + margin)
    for v in inventory.vms:
        slope = max(demand.trend.get(v.name, 0.0), 0.0)
        if v.meta is None or (slope == 0 and grow == 1.0):
            vms.append(v)
            continue
        need = min(v.meta.cpu_need_cores * grow + slope * horizon, float(v.vcpus))
        vms.append(dataclasses.replace(v, meta=dataclasses.replace(v.meta, cpu_need_cores=need)))
    return dataclasses.replace(inventory, vms=tuple(vms))


def with_needs(inventory: Inventory, needs: Mapping[str, float] | None) -> Inventory:
    """``inventory`` with each managed VM's CPU need replaced by its measured one in ``needs`` (a copy to judge the
    room on: plans are made on the inventory as read, with ``needs`` beside it, so that their snapshot matches)."""
    if not needs:
        return inventory
    vms = tuple(dataclasses.replace(v, meta=dataclasses.replace(v.meta, cpu_need_cores=needs[v.name]))
                if v.meta is not None and v.name in needs else v for v in inventory.vms)
    return dataclasses.replace(inventory, vms=vms)


def demand_trend(history: Sequence[tuple[float, Mapping[str, float]]]) -> Demand:
    """The demand to come from a history of measured needs, ``(time, {VM: cores})`` oldest first: each VM's trend
    is the least-squares slope of its needs over the times it was measured (cores per second; 0 with fewer than
    two measurements).  A rising need wakes a host one wake time before it would break the room; a falling one
    counts as flat (:func:`predicted` never goes below today's need)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for t, needs in history:
        for vm, need in needs.items():
            series.setdefault(vm, []).append((t, need))
    trend = {}
    for vm, points in series.items():
        if len(points) < 2:
            continue
        ts = np.array([p[0] for p in points])
        ys = np.array([p[1] for p in points])
        spread = float(((ts - ts.mean()) ** 2).sum())
        if spread > 0:
            trend[vm] = float(((ts - ts.mean()) * (ys - ys.mean())).sum() / spread)
    return Demand(trend=trend)


def vm_yields(inventory: Inventory) -> dict[str, float]:
    """Each running managed VM's yield where it runs now: admission's allocation (min yield, then average)."""
    inv = inventory.up()
    existing = existing_jobs(inv)
    if not existing.jobs:
        return {}
    instance = Instance(model_hosts(inv), existing.jobs)
    yields = allocate(instance, np.asarray(existing.hosts, dtype=np.int64)).yields(instance)
    return {v.name: float(yields[int(instance.task_job[t])]) for t, v in enumerate(existing.vms)}


def min_yield(inventory: Inventory) -> float:
    """The lowest yield of the managed VMs where they run now (1.0 with none)."""
    return min(vm_yields(inventory).values(), default=1.0)


def room_short(cluster: Cluster, inventory: Inventory, demand: Demand, horizon: float,
               margin: float = 0.0) -> str | None:
    """Why the hosts on in ``inventory`` lack room for the demand predicted ``horizon`` seconds ahead and
    ``margin`` more; None when they have it: every VM at ``power_yield``, the pending requests admitted,
    ``failures_tolerated`` kept."""
    ahead = predicted(inventory, demand, horizon, margin)
    for request in demand.pending:  # admitted one after the other, each around the ones before
        d = admit(cluster, ahead, request)
        if not d.admitted or d.plan is None:
            return f"request {request.name!r} waits: {d.reason}"
        ahead = after_plan(ahead, d.plan)
    target = cluster.power.target_yield
    low = min_yield(ahead)
    if low < target - YIELD_TOLERANCE:
        said = [f"the demand predicted {horizon:.0f} s ahead"] if demand.trend or demand.growth > 0 else []
        said += [f"{100 * margin:.0f} % more CPU demand"] if margin > 0 else []
        said += [f"{len(demand.pending)} waiting request(s) admitted"] if demand.pending else []
        return f"min yield {low:.3f} below power_yield {target:g}" + (f" with {' and '.join(said)}" if said else "")
    return failover_refusal(cluster, ahead)


# --- sleeping --------------------------------------------------------------------------------------


def never_sleeps(cluster: Cluster, inventory: Inventory, state: PowerState, host: str) -> str | None:
    """Why ``host`` may not sleep whatever the load (the "never" rules of the module docstring), or None."""
    config = cluster.host(host)
    if not config.power.saving:
        return "excluded (power_saving = false)"
    if config.power.agent is None:
        return "no agent to power it on (power or fence)"
    if state.of(host).state != ON:
        return f"{state.of(host).state}, not on"
    hs = next((h for h in inventory.hosts if h.name == host), None)
    if hs is None or hs.down is not None:
        return f"does not answer ({hs.down if hs is not None else 'not in the inventory'})"
    if host in cluster.cordoned:
        return "in maintenance"
    on = [h.name for h in inventory.up().hosts if state.of(h.name).state == ON]
    if len(on) <= cluster.power.min_hosts_on:
        return f"one of the last min_hosts_on = {cluster.power.min_hosts_on} hosts on"
    vms = [v for v in inventory.vms_on(host) if v.active]
    if unmanaged := sorted(v.name for v in vms if v.meta is None):
        return f"runs unmanaged VMs ({', '.join(unmanaged[:3])}): vcsched never moves them"
    if stopped := sorted(v.name for v in inventory.vms_on(host) if not v.active):
        # An evacuation moves running VMs only, and the power-off must find the host without any domain at all.
        return f"holds domains that do not run ({', '.join(stopped[:3])}): a power-off would take them along"
    if doubtful := sorted(v.name for v in vms if v.in_doubt):
        return f"runs VMs in doubt ({', '.join(doubtful[:3])})"
    if pinned := sorted(v.name for v in vms if v.meta is not None and v.meta.pinned):
        return f"runs pinned VMs ({', '.join(pinned[:3])}): they never move"
    if stuck := sorted(v.name for v in vms if _disk_stuck(cluster, on, v)):
        return (f"runs VMs with disks on storage {config.storage_name!r} that no other host on shares "
                f"({', '.join(stuck[:3])})")
    return None


def _disk_stuck(cluster: Cluster, on: Sequence[str], vm: VmState) -> bool:
    return vm.disk_bytes > 0 and not any(h != vm.host and cluster.shares_storage(vm.host, h) for h in on)


def sleep_check(cluster: Cluster, inventory: Inventory, state: PowerState, host: str, now: float, budget: int,
                demand: Demand = NO_DEMAND, needs: Mapping[str, float] | None = None
                ) -> tuple[str | None, LiveAdaptation | None]:
    """``(None, evacuation)`` when ``host`` may sleep now (module docstring), else ``(why not, None)``.

    ``needs``: the VMs' measured CPU needs in cores (`vcsched run`'s estimates), which the evacuation is planned
    with and the room judged on, instead of the needs recorded in their metadata (which the plan leaves alone)."""
    never = never_sleeps(cluster, inventory, state, host)
    if never is not None:
        return never, None
    closed = cluster.schedule.why_closed(now)
    if closed is not None:
        return f"no migration now: {closed}", None
    if demand.pending:
        return f"{len(demand.pending)} request(s) wait for room", None
    on = _on(inventory, state)
    seen = with_needs(on, needs)
    lacking = _capacity_short(cluster, seen, host)
    if lacking is not None:
        return lacking, None
    try:
        evacuation = adapt_inventory(cluster.name, _off_marked(inventory, state), budget, cluster=cluster,
                                     drain=host, needs=needs, record_needs=False)
    except VcschedError as e:
        return f"cannot be emptied: {e}", None
    if evacuation.plan is None:
        return f"cannot be emptied: {evacuation.infeasible}", None
    if evacuation.stays:
        vm, why, _ = evacuation.stays[0]
        return f"cannot be emptied within the budget and rules ({vm}: {why})", None
    if evacuation.floors_missed:
        vc, y, floor = evacuation.floors_missed[0]
        return f"emptying it leaves {vc} at yield {y:.3f}, below its floor {floor:g}", None
    target = cluster.power.target_yield
    if evacuation.plan.min_yield < target - YIELD_TOLERANCE:
        low = evacuation.plan.min_yield
        return f"with it asleep the min yield would be {low:.3f}, below power_yield {target:g}", None
    after = without_hosts(_moved(seen, evacuation), [host])
    short = room_short(cluster, after, demand, wake_time(cluster, state, host), cluster.power.sleep_margin)
    if short is not None:
        return f"with it asleep: {short}", None
    return None, evacuation


def _capacity_short(cluster: Cluster, on: Inventory, host: str) -> str | None:
    """Why the other hosts on cannot hold every VM at ``power_yield`` whatever the placement (the totals of memory
    and CPU), or None: a necessary condition only, checked before the drain's search because it is cheap."""
    others = [h for h in on.hosts if h.name != host]
    memory = sum(v.memory_bytes for v in on.vms if v.active)
    if memory > sum(h.usable_memory for h in others):
        return "the other hosts on lack the memory for every VM"
    target = cluster.power.target_yield
    cpu = sum(min(v.meta.cpu_need_cores, v.vcpus) * target for v in on.managed() if v.meta is not None)
    # (the sleep margin is not applied here: a VM's need grows only up to its vCPUs, so this stays a lower bound)
    if cpu > sum(h.cores for h in others) + YIELD_TOLERANCE:
        return f"the other hosts on lack the cores for every VM at power_yield {target:g}"
    return None


def _on(inventory: Inventory, state: PowerState) -> Inventory:
    """The hosts on: up in ``inventory`` and neither sleeping nor waking in ``state``."""
    off = [h.name for h in inventory.hosts if state.of(h.name).state != ON]
    return without_hosts(inventory, off).up() if off else inventory.up()


def _off_marked(inventory: Inventory, state: PowerState) -> Inventory:
    """``inventory`` with every host not on in ``state`` down (nothing is planned onto it) but still there: a plan's
    snapshot is of the whole cluster as read, so that it matches the live read its first step is checked against
    (a host asleep is in that read, down)."""
    hosts = tuple(h if h.down is not None or state.of(h.name).state == ON
                  else dataclasses.replace(h, down=f"{describe(state.of(h.name))} (power saving)")
                  for h in inventory.hosts)
    return dataclasses.replace(inventory, hosts=hosts)


def _moved(inventory: Inventory, evacuation: LiveAdaptation) -> Inventory:
    """``inventory`` as the evacuation plan leaves it: each managed VM on its planned host."""
    assert evacuation.plan is not None
    where = {name: p.host for name, p in evacuation.plan.per_vm.items()}
    return dataclasses.replace(inventory, vms=tuple(dataclasses.replace(v, host=where.get(v.name, v.host))
                                                    for v in inventory.vms))


# --- waking -----------------------------------------------------------------------------------------


def _with_awake(on: Inventory, state: PowerState, host: str) -> Inventory:
    """``on`` plus sleeping ``host`` awake and empty, at the size it slept with."""
    h = state.of(host)
    return dataclasses.replace(on, hosts=(*on.hosts, HostState(host, h.cores, h.memory_bytes, h.memory_reserved)))


def woken(inventory: Inventory, state: PowerState, hosts: Sequence[str]) -> Inventory:
    """``inventory`` as it would be with sleeping ``hosts`` awake: each up and empty, at the size it slept with (what
    `place` and `headroom` count as capacity that costs a wake)."""
    names = set(hosts)
    return dataclasses.replace(inventory, hosts=tuple(
        HostState(h.name, state.of(h.name).cores or h.cores, state.of(h.name).memory_bytes or h.memory_bytes,
                  state.of(h.name).memory_reserved or h.memory_reserved, disk_bps=h.disk_bps, net_bps=h.net_bps,
                  cannot_cap=h.cannot_cap, storage=h.storage, uuid=state.of(h.name).uuid or h.uuid)
        if h.name in names else h for h in inventory.hosts))


def wakeable(cluster: Cluster, inventory: Inventory, state: PowerState) -> tuple[str, ...]:
    """The hosts of :func:`wake_candidates` that ``inventory`` reads asleep (not answering): the quickest first."""
    asleep = {h.name for h in inventory.asleep_hosts()}
    return tuple(h for h in wake_candidates(cluster, state) if h in asleep)


def unwakeable(cluster: Cluster, inventory: Inventory, state: PowerState) -> dict[str, str]:
    """The hosts ``inventory`` reads asleep that no wake for room chooses (:func:`wake_candidates`), each with why
    in words: capacity `place` and `headroom` do not count, which they must say rather than leave out silently."""
    chosen = set(wakeable(cluster, inventory, state))
    out = {}
    for h in inventory.asleep_hosts():
        p = state.of(h.name)
        if h.name in chosen:
            continue
        if p.failed:
            out[h.name] = f"its last wake failed: not woken until `vcsched power clear {h.name}`"
        elif h.name in cluster.host_names and cluster.host(h.name).power.agent is None:
            out[h.name] = "it has no power agent to wake it"
        elif p.state == WAKING:
            out[h.name] = "it is waking already"
    return out


def wake_to_admit(cluster: Cluster, inventory: Inventory, state: PowerState,
                  admit_on: Callable[[Inventory], T]) -> tuple[str, T] | None:
    """The sleeping host whose wake alone lets ``admit_on`` admit (its decision's ``admitted``), quickest to wake
    first, with that decision; None when no one wake does.  For `place` when the hosts on refuse a request: a wake
    is the only way to admit, and a host whose wake failed is never chosen (:func:`wake_candidates`)."""
    for h in wakeable(cluster, inventory, state):
        decision = admit_on(woken(inventory, state, [h]))
        if getattr(decision, "admitted", False):
            return h, decision
    return None


def wake_candidates(cluster: Cluster, state: PowerState) -> tuple[str, ...]:
    """Sleeping hosts that may be woken: not failed, with an agent; the quickest to wake first."""
    sleeping = [h for h in cluster.host_names if state.of(h).state == SLEEPING and not state.of(h).failed
                and cluster.host(h).power.agent is not None]
    return tuple(sorted(sleeping, key=lambda h: (wake_time(cluster, state, h), -state.of(h).cores, h)))


def wake_check(cluster: Cluster, inventory: Inventory, state: PowerState, demand: Demand = NO_DEMAND,
               needs: Mapping[str, float] | None = None) -> tuple[str | None, str]:
    """``(host, why)``: the sleeping host to wake now and why, or ``(None, why not)`` (``needs`` as for
    :func:`sleep_check`)."""
    candidates = wake_candidates(cluster, state)
    if not candidates:
        return None, "no host to wake"
    horizon = max(wake_time(cluster, state, h) for h in candidates)
    coming = state.in_state(WAKING)
    on = with_needs(_on(inventory, state), needs)
    for h in coming:  # hosts already waking count as room that is coming
        on = _with_awake(on, state, h)
    margin = cluster.power.wake_margin
    short = room_short(cluster, on, demand, horizon, margin)
    if short is None:
        return None, "the room holds"
    for h in candidates:
        if room_short(cluster, _with_awake(on, state, h), demand, horizon, margin) is None:
            return h, short
    largest = max(candidates, key=lambda h: (state.of(h).cores, state.of(h).memory_bytes, h))
    return largest, f"{short} (no one host restores the room: the largest first)"


# --- the decision ------------------------------------------------------------------------------------


def decide(cluster: Cluster, inventory: Inventory, state: PowerState, now: float, *, budget: int,
           demand: Demand = NO_DEMAND, needs: Mapping[str, float] | None = None,
           kept_on: Mapping[str, str] | None = None) -> PowerDecision:
    """The next power action at ``now`` (module docstring): a wake before any sleep, at most one of either.

    ``budget``: the bytes an evacuation may migrate; ``needs``: the VMs' measured needs (:func:`sleep_check`;
    None: those recorded in their metadata); ``kept_on``: hosts an operator's veto keeps on (a skipped sleep,
    `vcsched skip`), each with why: they are never chosen to sleep, and their count starts again.  The
    returned state carries the hysteresis forward; a sleep or a wake is not in it until the caller reports it
    (:func:`slept`, :func:`waking`).
    """
    if cluster.power.mode == "off":
        return PowerDecision(NONE, None, "power_saving is off", state)
    host, why = wake_check(cluster, inventory, state, demand, needs)
    if host is not None:
        reset = state
        for h in cluster.host_names:
            if reset.of(h).ready_since is not None:
                reset = reset.with_host(dataclasses.replace(reset.of(h), ready_since=None))
        return PowerDecision(WAKE, host, why, reset)
    if state.in_state(WAKING):
        return PowerDecision(NONE, None, f"{', '.join(state.in_state(WAKING))} waking", state)
    refusals: list[tuple[str, str]] = []
    ready: list[tuple[int, float, str, LiveAdaptation]] = []
    nxt = state
    for name in cluster.host_names:
        if state.of(name).state != ON:
            continue
        kept = (kept_on or {}).get(name)
        why_not, evacuation = (kept, None) if kept is not None else \
            sleep_check(cluster, inventory, state, name, now, budget, demand, needs)
        old = state.of(name)
        if why_not is not None:
            refusals.append((name, why_not))
            if old.ready_since is not None:
                nxt = nxt.with_host(dataclasses.replace(old, ready_since=None))
            continue
        assert evacuation is not None and evacuation.plan is not None
        since = now if old.ready_since is None else old.ready_since
        if old.ready_since is None:
            nxt = nxt.with_host(dataclasses.replace(old, ready_since=now))
        if now - since < cluster.power.sleep_after:
            refusals.append((name, f"not yet: ready for {now - since:.0f} s of sleep_after = "
                                   f"{cluster.power.sleep_after:.0f} s"))
            continue
        moved = int(evacuation.plan.extra.get("migrated_bytes", 0))
        idle = cluster.host(name).power.idle_watts or 0.0
        ready.append((moved, -idle, name, evacuation))
    if not ready:
        return PowerDecision(NONE, None, "no host may sleep now", nxt, refusals=tuple(refusals))
    moved, _, name, evacuation = min(ready, key=lambda r: r[:3])
    return PowerDecision(SLEEP, name, f"its VMs fit on the others at power_yield {cluster.power.target_yield:g} "
                                      f"with the room kept, moving {moved} bytes", nxt, evacuation,
                         tuple(refusals))
