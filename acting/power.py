"""Power saving, acting half: put a host to sleep by plan, wake it, and keep each host's power record.

The decision is pure (:mod:`vcsched.control.power`: which host may sleep, with its evacuation plan; which must
wake); this module carries it out, through the one unit of work (acting/unit_of_work.py), so that the rules
every change of hosts follows hold here too (the cluster lock, the plan validated whole before its first step,
each step under the guard).

**Sleep** (:func:`sleep_host`), in this order, each failure before the power-off leaving the host on and saying
why — nothing is powered off with a VM on it:

1. the evacuation plan, validated whole against the live inventory and applied (:meth:`UnitOfWork.apply`);
   a step that fails stops here;
2. the host read again: it must answer and hold **no domain at all** — managed or not, running, paused or
   merely defined — since a power-off takes whatever is there with it;
3. the lock still ours (:meth:`UnitOfWork.guard`), then ``off`` through the host's ``power`` agent (its
   fence agent by default) and ``status`` must then say off (:func:`acting.fence.switch_off`, the very check
   fencing uses);
4. the record says sleeping, with the size and the libvirt host UUID it slept with — written *ahead* of the
   power-off, and put back if the agent fails: a process killed during the power-off leaves a host recorded
   sleeping, which, if it still answers, is read as it is (awake) and is made on again by a wake (its agent
   answers ``on`` at once), rather than a host powered off and recorded on, which would be read as failed.

**Wake** (:func:`wake_host`): the record says waking; ``on`` through the agent; then the host is read until
libvirt answers with **the UUID it slept with** (another machine behind the same URI is not that host), within
a bounded wait (:func:`wake_deadline`); the record says on, with the wake's seconds measured (the longest kept:
the decision plans with it).  An agent that fails, a wait that runs out, or another UUID marks the host
*wake-failed* with the reason (an event): it is never chosen again — for sleeping, or to be woken for room —
until an operator clears it (:func:`clear_host`, ``vcsched power clear``).

**The record** (:class:`PowerStore`) is one document per cluster on the coordination backend, beside the lock
and the recommendations (:class:`acting.recommendations.SharedDocument`): ``file://`` (the default, under the
state directory) writes it atomically under a file lock; etcd by compare-and-swap.  It is keyed like the lock,
by the hosts' identities (hypervisor/identity.py): a sleeping host does not answer, so it is named by the UUID
its cluster file declares or a changing command here last read (``known-hosts.json``), as a down host is.

**Reading** (:func:`vcsched.control.power.mark_asleep`, applied by :meth:`UnitOfWork.inventory`): a host that
does not answer because it sleeps is ``asleep``, not down — ``Inventory.down_hosts()`` leaves it out, so
recovery never fences it and status says sleeping — and still gets nothing planned onto it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from acting.fence import DEFAULT_AGENT_TIMEOUT_S, AgentRun, FenceResult, run_agent, run_state, switch_off
from acting.recommendations import SharedDocument
from hypervisor import hazards
from vcsched.control.power import (
    ON,
    PowerState,
    cleared,
    describe,
    mark_asleep,
    slept,
    wake_deadline,
    wake_failed,
    waking,
    woke,
)
from vcsched.errors import VcschedError
from vcsched.formats.cluster import Cluster
from vcsched.inventory import Inventory
from vcsched.plans.plan import Plan

if TYPE_CHECKING:
    from acting.executor import ApplyReport
    from acting.unit_of_work import UnitOfWork
    from hypervisor.identity import Identities

#: Seconds between two reads of a waking host.
WAKE_POLL_S = 2.0

#: ``agent(host, action)``: one run of ``host``'s power agent (tests pass fakes; :func:`agents` runs the real one).
Agent = Callable[[str, str], AgentRun]
#: ``emit(event, **fields)``: where events go (the controller's :meth:`acting.events.EventLog.emit`).
Emit = Callable[..., Any]


class HasIdentities(Protocol):
    def identities(self) -> Identities: ...


class PowerRefused(VcschedError):
    """A power action was refused before anything changed (exit 1: the reason says what to do)."""

    exit_code = 1


def _nothing(*_: object, **__: object) -> None:
    return None


def agents(cluster: Cluster, timeout_s: float = DEFAULT_AGENT_TIMEOUT_S) -> Agent:
    """The hosts' own ``power`` agents (the ClusterLabs interface, acting/fence.py), each run bounded by
    ``timeout_s``."""

    def run(host: str, action: str) -> AgentRun:
        config = cluster.host(host).power.agent
        if config is None:
            raise PowerRefused(f"host {host} has no power agent (cluster file: power = {{agent = ...}}, or fence)")
        return run_agent(config, action, timeout_s)

    return run


# ------------------------------------------------------------------------------------------------ the record


class PowerStore(SharedDocument[PowerState]):
    """The power record of one cluster (lock ``key``) on the coordination backend ``url`` (module docstring)."""

    def __init__(self, url: str, key: str, *, timeout: float = 5.0) -> None:
        super().__init__(url, key, "power", PowerState.from_dict, PowerState.to_dict, PowerState, timeout=timeout)

    def change(self, fn: Callable[[PowerState], PowerState]) -> PowerState:
        """Apply the pure transition ``fn`` atomically; the new state."""
        def step(state: PowerState) -> tuple[PowerState, PowerState]:
            new = fn(state)
            return new, new

        return self.update(step)


def store_for(cluster: Cluster, identities: Identities, coordination: str | None = None) -> PowerStore:
    """The cluster's power record, on its coordination backend, named like its lock: the first key its hosts'
    ``identities`` (``hv.identities()``) are claimed under (acting/lock_names.py), as the recommendations are.
    Only looks at the claims: the changing command that holds the lock has already written them."""
    from acting.lock import resolve_url
    from acting.lock_names import lock_keys

    url = resolve_url(coordination, cluster.coordination)
    return PowerStore(url, lock_keys(url, cluster.name, identities, record=False)[0])


def asleep_in(inventory: Inventory, power: Callable[[], PowerState] | None,
              note: Callable[[str], object]) -> Inventory:
    """``inventory`` with the hosts vcsched put to sleep marked so (:func:`vcsched.control.power.mark_asleep`):
    not failed hosts, never fenced.  ``power`` reads the record, only when a host is down or answers empty; a
    record that cannot be read is said to ``note`` and the hosts stay down (as they were before power saving
    existed).  The one place every reader (the unit of work, the controller's sampling rounds) turns "down" into
    "asleep".

    A host recorded sleeping, waking or wake-failed that answers with no domain at all is asleep too (nothing
    is planned onto it): a process killed during its power-off or its wake, a host that came back on its own,
    or one whose wake failed (another machine behind its URI, a wake past its deadline) is used again only
    once a wake records it on (:func:`wake_host`, ``vcsched power wake``; a failed one once cleared).  So a host
    read asleep never holds a copy of a VM, and repair need not wait for it (hypervisor/settlement.py)."""
    if power is None:
        return inventory
    occupied = {v.host for v in inventory.vms}
    empty = [h.name for h in inventory.hosts if h.down is None and h.name not in occupied]
    if not inventory.down_hosts() and not empty:
        return inventory
    try:
        state = power()
    except VcschedError as exc:
        note(f"the power record cannot be read ({exc}): hosts down are not known to be asleep")
        return inventory
    inventory = mark_asleep(inventory, state)
    idle = {h for h in empty if state.of(h).state != ON}
    if not idle:
        return inventory
    return dataclasses.replace(inventory, hosts=tuple(
        dataclasses.replace(h, asleep=True, answers_asleep=True, power=describe(state.of(h.name)),
                            down=f"{describe(state.of(h.name))} (vcsched power saving): it answers, empty; a wake "
                            "records it on before it is used")
        if h.name in idle else h for h in inventory.hosts))


def record_reader(cluster: Cluster, hv: HasIdentities, coordination: str | None = None
                  ) -> Callable[[], PowerState]:
    """What reads the cluster's power record when a host is down, for a command that takes no lock (a dry run,
    `status`): the record's key is the lock's, named by asking every host (``hv.identities()``) only then.  A
    host down that no command here ever read cannot be one this machine put to sleep: an empty record."""
    def read() -> PowerState:
        from hypervisor.identity import LockUnnamed

        try:
            return store_for(cluster, hv.identities(), coordination).read()
        except LockUnnamed:
            return PowerState()

    return read


def clear_host(store: PowerStore, host: str) -> PowerState:
    """An operator cleared ``host``'s failed wake: it may be chosen again (to sleep, or to be woken for room)."""
    return store.change(lambda s: cleared(s, host))


# ------------------------------------------------------------------------------------------------ sleeping


@dataclass(frozen=True)
class SleepResult:
    """What :func:`sleep_host` did: ``slept`` only when the host was emptied, switched off and ``status`` said
    off; ``reason`` in words either way; ``report`` the evacuation's (None: nothing to move, or refused before)."""

    host: str
    slept: bool
    reason: str
    report: ApplyReport | None = None
    off: FenceResult | None = None

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "slept": self.slept, "reason": self.reason,
                "evacuation": None if self.report is None else self.report.to_dict(),
                "off": None if self.off is None else self.off.to_dict()}


def sleep_host(uow: UnitOfWork, cluster: Cluster, host: str, evacuation: Plan, *, store: PowerStore,
               agent: Agent, clock: Callable[[], float] = time.time, planned_here: bool = True,
               emit: Emit = _nothing) -> SleepResult:
    """Empty ``host`` by ``evacuation`` (the decision's plan), verify it holds no domain, power it off and verify
    ``status`` off, record it sleeping (module docstring).  ``uow`` must be open and acting (the lock held).

    Raises what :meth:`UnitOfWork.apply` raises before its first step (the plan refused whole: nothing
    changed); every later refusal is a :class:`SleepResult` with ``slept`` False, the host left on."""
    def refused(reason: str, report: ApplyReport | None = None, off: FenceResult | None = None) -> SleepResult:
        emit("power_sleep_refused", host=host, reason=reason)
        return SleepResult(host, False, reason, report, off)

    record = store.read().of(host)
    if record.state != ON:
        return refused(f"host {host} is {describe(record)}, not on")
    report = None
    if evacuation.steps:
        report = uow.apply(evacuation, planned_here=planned_here)
        assert report is not None  # no irreversible action: always a report
        if not report.ok:
            bad = report.failed()
            why = report.stopped if bad is None else f"{bad.step.op} {bad.step.vm}: {bad.outcome}: {bad.detail}"
            return refused(f"the evacuation of {host} stopped ({why}): the host stays on", report)
    uow.guard()
    fresh = uow.hv.inventory([host])
    read = fresh.hosts[0]
    if read.down is not None:
        return refused(f"host {host} does not answer after its evacuation ({read.down}): it cannot be seen empty, "
                       "so it is not powered off", report)
    left = [v for v in fresh.vms if v.host == host]
    if left and not hazards.on(hazards.POWER_OFF_UNCHECKED):  # mutation switch (tests/test_faultsim_power.py)
        names = ", ".join(f"{v.name} ({'managed' if v.meta is not None else 'unmanaged'}, "
                          f"{'paused' if v.paused else 'running' if v.active else 'defined, not running'})"
                          for v in left[:5])
        return refused(f"host {host} is not empty after its evacuation ({len(left)} domain(s): {names}): nothing "
                       "is powered off with a VM on it", report)
    uow.guard()  # the lock still ours just before the one step that cannot be undone by vcsched alone
    at = clock()
    store.change(lambda s: slept(s, read, at))  # written ahead: a process killed during the power-off leaves it
    config = cluster.host(host).power.agent
    runs: list[AgentRun] = []

    def run(action: str) -> AgentRun:
        runs.append(agent(host, action))
        return runs[-1]

    try:
        off = switch_off(host, config.agent if config is not None else "(none)", run, clock=clock)
    except VcschedError as exc:  # the agent could not be run at all (none, not executable): nothing was switched
        store.change(lambda s: s.with_host(record))
        return refused(f"host {host}: its power agent cannot be run ({exc}): the host stays on", report)
    if not off.fenced:
        if _says_on(host, runs, agent):
            store.change(lambda s: s.with_host(record))
            return refused(f"{off.detail}: the host is not recorded asleep (it is empty; `vcsched power status` "
                           "shows what its agent says)", report, off)
        # An agent killed at its timeout, or a status that cannot say, may have left the host off: the record
        # written ahead stays (a host off and recorded on would be read as failed); it is read as it is while it
        # answers, and a wake makes it on again.
        return refused(f"{off.detail}: its agent does not say the host is on, so it stays recorded asleep "
                       "(empty; a wake powers it on and records it on)", report, off)
    from hypervisor import down_hosts
    from hypervisor.files import state_dir

    # Every later command gives it one short probe, never its host_timeout (hypervisor/down_hosts.py).
    down_hosts.asleep(state_dir(), cluster.connect_uri(host), f"asleep since {time.strftime('%H:%M:%S')} (vcsched "
                      "power saving)")
    emit("power_slept", host=host, seconds=round(off.seconds, 3), uuid=read.uuid)
    return SleepResult(host, True, f"host {host} is asleep ({off.detail})", report, off)


def _says_on(host: str, runs: list[AgentRun], agent: Agent) -> bool:
    """Whether ``host``'s agent says it is on after a power-off that was not confirmed: its last ``status`` of
    ``runs``, else one asked now.  Only this puts the record written ahead back to on (the module docstring)."""
    said = next((run_state(r) for r in reversed(runs) if r.action == "status"), None)
    if said is None:
        try:
            said = run_state(agent(host, "status"))
        except VcschedError:
            said = "unknown"
    return said == "on"


# ------------------------------------------------------------------------------------------------ waking


def _woke(store: PowerStore, host: str, start: float, at: float, uuid: str | None, emit: Emit) -> WakeResult:
    new = store.change(lambda s: woke(s, host, at))
    emit("power_woke", host=host, seconds=round(at - start, 3), longest=new.of(host).wake_s)
    return WakeResult(host, True, f"host {host} answers again as {uuid or 'itself'} after {at - start:.1f} s",
                      at - start)


@dataclass(frozen=True)
class WakeResult:
    """What :func:`wake_host` did: ``woke`` once the host answered with the UUID it slept with, after ``seconds``
    (the measured wake time); else ``reason`` is why it is now wake-failed."""

    host: str
    woke: bool
    reason: str
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "woke": self.woke, "reason": self.reason, "seconds": round(self.seconds, 3)}


def wake_host(uow: UnitOfWork, cluster: Cluster, host: str, *, store: PowerStore, agent: Agent,
              clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
              timeout: float | None = None, poll: float = WAKE_POLL_S, emit: Emit = _nothing) -> WakeResult:
    """Power ``host`` on and wait until libvirt answers there with the UUID it slept with (module docstring);
    ``timeout``: the bounded wait (None: :func:`wake_deadline`).  A failure marks it wake-failed (a
    :class:`WakeResult` with ``woke`` False, and the event ``power_wake_failed``).  A host already on is left
    alone (:class:`PowerRefused`)."""
    state = store.read()
    record = state.of(host)
    if record.state == ON:
        raise PowerRefused(f"host {host} is on (not put to sleep by vcsched): nothing to wake")
    expected = record.uuid or cluster.host(host).uuid
    limit = wake_deadline(cluster, state, host) if timeout is None else timeout
    uow.guard()
    start = clock()
    store.change(lambda s: waking(s, host, start))

    def failed(reason: str) -> WakeResult:
        at = clock()
        store.change(lambda s: wake_failed(s, host, at, reason))
        emit("power_wake_failed", host=host, reason=reason, seconds=round(at - start, 3))
        return WakeResult(host, False, reason, at - start)

    try:
        on = agent(host, "on")
    except VcschedError as exc:
        return failed(f"power agent: {exc}")
    if on.returncode != 0:
        said = "did not finish (killed)" if on.returncode is None else f"exited {on.returncode}: {on.said()}"
        return failed(f"power agent action=on {said}")
    forget = getattr(uow.hv, "forget", None)
    if forget is not None:
        forget(host)  # a connection (and UUID) read before it slept says nothing of the machine that answers now
    last = "not read yet"
    while True:
        uow.guard()
        read = uow.hv.inventory([host]).hosts[0]
        if read.down is None:
            if expected is not None and read.uuid != expected and not hazards.on(hazards.WAKE_ANY_UUID):
                return failed(f"answers as libvirt host UUID {read.uuid}, it slept as {expected}: another machine "
                              "behind its URI; not used")
            return _woke(store, host, start, clock(), read.uuid, emit)
        last = read.down
        if clock() - start >= limit:
            return failed(f"did not answer within {limit:g} s after power on ({last})")
        sleep(poll)

