"""Power actions in the fault simulation (docs/faultsim.md, "Power actions").

Two kinds of schedule, chosen by index so that every other schedule replays as before: **sleep** (index
:data:`SLEEP_AT` modulo :data:`POWER_EVERY`) puts a host to sleep through the real
:func:`acting.power.sleep_host` (the evacuation plan of :func:`vcsched.control.power.sleep_check`, the
decision's own, else a drain's: an operator's ``drain`` then ``power sleep``); **wake** (:data:`WAKE_AT`)
starts with that host put to sleep (the same code, without faults) and wakes it through the real
:func:`acting.power.wake_host`, the host chosen as the decision chooses (:func:`vcsched.control.power.
wake_candidates`: never one whose wake failed).  Each process of either may also run, in its own unit of work
under the same simulated lock and lease, the scenario's command (place, drain or adapt) or ``vcsched recover``
of the power host (which must refuse a host asleep: it has not failed).

The power agent (``off``, ``status``, ``on``: the ClusterLabs actions :func:`acting.fence.switch_off` and the
wake run) is simulated: ``off`` switches the simulated host off (:meth:`SimWorld.power_off`), ``on`` brings it
back with no guest.  Under faults (one roll per agent run, from the schedule's seeded random) the agent fails,
hangs past its timeout (having switched the host all the same, or not), says ``off`` exited 0 while the host
stays on, or ``status`` cannot say; the process is killed between the evacuation (and the record written ahead)
and the power-off, or right after the power-off; a host wakes as another machine (another libvirt host UUID),
or never answers after ``on``; someone starts a domain of their own on the host while it is being emptied
(``intruder``); and the sleeping host comes back on its own (``host_up`` of a host switched off).

Invariants added (:meth:`PowerWork.check`, with every existing one): nothing is powered off with a domain on
it, managed or not, nor without a valid lease; the power record never says *on* for a host that is off; a host
recorded asleep is never fenced; a host that answers as another machine is never recorded on (used as the one
that slept); a host whose wake failed is never chosen (to wake or to sleep) until cleared.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from acting.power import PowerStore
from hypervisor.simlibvirt import RUNNING, Call, ProcessKilled, SimDomain
from vcsched.control.power import PowerState

if TYPE_CHECKING:
    from acting.fence import AgentRun
    from faultsim.simulation import Schedule
    from vcsched.formats.cluster import Cluster

T = TypeVar("T")

#: Schedules whose index is SLEEP_AT (WAKE_AT) modulo POWER_EVERY are sleep (wake) schedules.  Both residues are
#: command schedules (not probe, twin or recover), and no schedule pinned by a test (docs/faultsim.md).
POWER_EVERY, SLEEP_AT, WAKE_AT = 16, 2, 10
#: Per ``off`` under faults: the agent fails (exit 1, the host stays on), hangs (killed at its timeout; half the
#: time it switched the host off all the same), exits 0 with the host still on, switches it off but ``status``
#: cannot say; or the process dies before the power-off (after the evacuation and the record written ahead) or
#: right after it.
OFF_FAIL, OFF_HANG, OFF_STILL_ON, STATUS_UNKNOWN, KILL_BEFORE_OFF, KILL_AFTER_OFF = 0.08, 0.08, 0.05, 0.05, 0.06, 0.06
#: Per ``on`` under faults: the agent fails (the host stays off), hangs (half the time the host comes on all the
#: same), the host answers as another machine, never answers; or the process dies right after ``on``.
ON_FAIL, ON_HANG, ON_OTHER_UUID, ON_NEVER, KILL_AFTER_ON = 0.06, 0.06, 0.08, 0.05, 0.05
#: Per libvirt call while a host is being emptied for sleep: someone starts a domain of their own on it.
INTRUDER = 0.004
INTRUDER_MIB = 128
#: The cluster's power settings in power schedules: a host may sleep whenever the others hold every VM at half
#: its need (the scenarios are small), at once (no hysteresis: the schedule is short); a wake is assumed to take
#: 20 s (its deadline 40 s).
POWER_YIELD, WAKE_TIME_S = 0.5, 20.0
MIB = 1 << 20


def kind_of(index: int) -> str | None:
    """``"sleep"`` or ``"wake"`` for a power schedule's index, else None (:class:`Schedule` decides the rest)."""
    if index % POWER_EVERY == SLEEP_AT:
        return "sleep"
    if index % POWER_EVERY == WAKE_AT:
        return "wake"
    return None


def power_cluster(cluster: Cluster) -> Cluster:
    """``cluster`` with power saving on: every host's power agent is its (simulated) fence agent."""
    from faultsim.simulation import CONTROLLER_FAILURE_S
    from vcsched.formats.power import HostPower, PowerSettings

    hosts = tuple(dataclasses.replace(h, power=HostPower(h.fence)) for h in cluster.hosts)
    # A host down (not asleep) for the controller's failure_timeout is failed: fenced, its VMs restarted.
    return dataclasses.replace(cluster, hosts=hosts, failure_timeout=CONTROLLER_FAILURE_S, power=PowerSettings(
        "auto", 1, POWER_YIELD, 0.0, WAKE_TIME_S, "consolidate", 0.1, 0.0))


class MemoryPowerStore(PowerStore):
    """:class:`acting.power.PowerStore` in memory: the coordination backend outlives every simulated process and
    host, as etcd does (a write is atomic and instant: no fault is injected into it)."""

    def __init__(self) -> None:
        super().__init__("file:///nonexistent/vcsched-faultsim", "sim")
        self.doc = PowerState()

    def read(self) -> PowerState:
        return self.doc

    def update(self, change: Callable[[PowerState], tuple[PowerState, T]]) -> T:
        self.doc, out = change(self.doc)
        return out


_CHECKS: dict[tuple[Any, ...], Any] = {}


def _cached(key: tuple[Any, ...], make: Any) -> Any:
    """The planners are pure: the same inputs give the same plan (as :func:`faultsim.simulation.plan_on`)."""
    if key not in _CHECKS:
        if len(_CHECKS) > 20000:
            _CHECKS.clear()
        _CHECKS[key] = make()
    return _CHECKS[key]


class PowerWork:
    """The power workload of one schedule (module docstring): its host, record, simulated agent and checks."""

    def __init__(self, s: Schedule, kind: str) -> None:
        self.s = s
        self.kind = kind
        self.store = MemoryPowerStore()
        # The host to sleep: the one, h0 aside (it holds the unmanaged domain), with the fewest managed VMs' memory.
        memory = collections.Counter({f"h{i}": 0 for i in range(1, s.sc.hosts)})
        for v in s.sc.vms:
            if v[1] != "h0":
                memory[v[1]] += v[3]
        self.host = min(memory, key=lambda h: (memory[h], h))
        #: What each process runs besides its power action, in its own unit of work (None: nothing): the scenario's
        #: command, ``recover`` of the power host then ``restart`` of what the store says is lost, or ``vcsched
        #: run``'s controller (failover on, reading the power record) for its intervals.
        self.companion = s.rng.choice(("command", "command", "recover", "controller", None))
        if self.companion == "controller":
            import tempfile
            from pathlib import Path

            from faultsim.simulation import SimLockService

            s.leader = SimLockService(s.world)
            s.journals = Path(tempfile.mkdtemp(prefix="vcsched-faultsim-journal-"))
        #: Hosts the simulated agent switched off (and nothing has powered on since).
        self.off: set[str] = set()
        #: Hosts that answer as another machine since a wake (their old libvirt UUID).
        self.replaced: dict[str, str] = {}
        self.fenced_seen: set[str] = set()
        self.evacuating: str | None = None
        self.intruders = 0
        #: The wake schedule's start: whether the host was put to sleep (else nothing to wake).
        self.started_asleep = False

    # -------------------------------------------------------------- the simulated agent

    def agent(self, host: str, action: str) -> AgentRun:
        from acting.fence import STATUS_OFF, STATUS_ON, AgentRun

        s, w = self.s, self.s.world
        pid = s.rt.pid
        s.note(f"p{pid} power agent of {host}: {action}")
        roll = s.rng.random() if s.injecting else 1.0
        if action == "status":
            if self.unknown:
                return AgentRun(action, 1, "", "Failed: Unable to obtain correct plug status", 0.0)
            return AgentRun(action, STATUS_OFF if host in self.off else STATUS_ON, "", "", 0.0)
        if action == "off":
            self.unknown = False
            edges = _edges(OFF_FAIL, OFF_HANG, OFF_STILL_ON, STATUS_UNKNOWN, KILL_BEFORE_OFF, KILL_AFTER_OFF)
            if roll < edges[0]:
                s.fault("power_off_fail", f"the power agent of {host}: off exits 1")
                return AgentRun(action, 1, "", "Failed: Unable to connect/login to fencing device", 0.0)
            if roll < edges[1]:
                return self._hang(host, action, self.switch_off)
            if roll < edges[2]:
                s.fault("power_still_on", f"the power agent of {host}: off exits 0, the host stays on")
                return AgentRun(action, 0, "Success: Powered OFF", "", 0.0)
            if roll < edges[4] and roll >= edges[3]:
                self._kill("before_off", f"between the evacuation of {host} and its power-off")
            self.switch_off(host)
            if roll < edges[3]:
                s.fault("power_status_unknown", f"the power agent of {host}: status cannot say")
                self.unknown = True
            elif roll < edges[5]:
                self._kill("after_off", f"right after {host} was powered off")
            return AgentRun(action, 0, "Success: Powered OFF", "", 0.0)
        assert action == "on", action
        edges = _edges(ON_FAIL, ON_HANG, ON_OTHER_UUID, ON_NEVER, KILL_AFTER_ON)
        if roll < edges[0]:
            s.fault("power_on_fail", f"the power agent of {host}: on exits 1")
            return AgentRun(action, 1, "", "Failed: Timed out waiting to power ON", 0.0)
        if roll < edges[1]:
            return self._hang(host, action, self.switch_on)
        if edges[1] <= roll < edges[2] and host in self.off:
            old = w.hosts[host].uuid
            w.hosts[host].uuid = w.new_uuid()
            self.replaced.setdefault(host, old)
            s.fault("power_other_uuid", f"{host} wakes as another machine (libvirt host UUID "
                    f"{w.hosts[host].uuid}, was {old})")
        elif edges[2] <= roll < edges[3] and host in self.off:
            s.fault("power_never_back", f"{host}: on exits 0, the host never answers")
            return AgentRun(action, 0, "Success: Powered ON", "", 0.0)
        self.switch_on(host)
        if edges[3] <= roll < edges[4]:
            self._kill("after_on", f"right after {host} was powered on")
        return AgentRun(action, 0, "Success: Powered ON", "", 0.0)

    #: The last ``off`` switched the host off, but ``status`` cannot say so.
    unknown = False

    def _hang(self, host: str, action: str, switch: Callable[[str], None]) -> AgentRun:
        """The agent does not finish within its timeout and is killed; half the time it had done its action."""
        from acting.fence import DEFAULT_AGENT_TIMEOUT_S, AgentRun

        s = self.s
        s.world.now += DEFAULT_AGENT_TIMEOUT_S
        did = s.rng.random() < 0.5
        s.fault(f"power_{action}_hang", f"the power agent of {host} killed at its timeout"
                + (f" (it had switched the host {action})" if did else ""))
        if did:
            switch(host)
        return AgentRun(action, None, "", "", DEFAULT_AGENT_TIMEOUT_S)

    def _kill(self, kind: str, when: str) -> None:
        pid = self.s.rt.pid
        self.s.fault(f"power_kill_{kind}", f"process {pid} killed {when}")
        self.s.world.process_died(pid)
        raise ProcessKilled(pid)

    def switch_off(self, host: str) -> None:
        """The agent switches ``host`` off: nothing may be on it, and only under a valid lease."""
        s = self.s
        if host in self.off:
            return
        doms = s.world.hosts[host].domains.values()
        if doms:
            said = ", ".join(f"{d.name} ({'managed' if d.meta is not None else 'unmanaged'})" for d in doms)
            s.violate(f"{host} powered off with {len(doms)} domain(s) on it: {said}")
        if not s.lock.valid(s.rt.pid):
            s.violate(f"{host} powered off by p{s.rt.pid} without a valid lease")
        s.world.power_off(host)
        self.off.add(host)
        s.check(f"after {host} was powered off")

    def switch_on(self, host: str) -> None:
        if host not in self.off:
            return
        self.off.discard(host)
        self.s.world.set_up(host, True)  # with no guest (the simulated domains are transient)
        self.s.check(f"after {host} was powered on")

    # -------------------------------------------------------------- faults at libvirt calls

    def hook(self, c: Call) -> None:
        """At a libvirt call under faults (no second process running): while a host is emptied for sleep, someone
        may start a domain of their own on it (``virsh create``): the emptiness check must see it."""
        s = self.s
        host = self.evacuating
        if host is None or s.rng.random() >= INTRUDER:
            return
        h = s.world.hosts[host]
        if not h.up or sum(d.memory_bytes for d in h.domains.values() if d.active) + INTRUDER_MIB * MIB \
                > h.memory_bytes:
            return
        self.intruders += 1
        name = f"intruder{self.intruders}"
        s.fault("intruder", f"someone starts {name} (not vcsched's) on {host}")
        s.world.add_domain(host, SimDomain(name, s.world.new_uuid(), 1, INTRUDER_MIB * MIB, RUNNING, False,
                                           100000, 100000))

    # -------------------------------------------------------------- invariants

    def check(self, where: str) -> None:
        from vcsched.control.power import ON, describe

        s = self.s
        state = self.store.read()
        for host in sorted(self.off):
            if s.world.hosts[host].up:  # it came back on its own (someone pressed its button): it answers, empty
                self.off.discard(host)
                s.fault("slept_back", f"{host}, powered off, answers again on its own")
                continue
            if state.of(host).state == ON:
                s.violate(f"{host} is powered off and its power record says on ({where})")
        for name, rec in ((h.host, h) for h in state.hosts if h.state != ON):
            held = sorted(d.name for d in s.world.hosts[name].domains.values() if d.meta is not None)
            if held:  # nothing is planned onto a host recorded asleep until a wake records it on (wake-failed: cleared)
                s.violate(f"{name}, recorded {describe(rec)}, holds managed VMs {held} ({where})")
        for host in sorted(s.powered - self.fenced_seen):
            self.fenced_seen.add(host)
            if state.of(host).state != ON:
                s.violate(f"{host} was fenced while its power record says {state.of(host).state} ({where})")
        for host, old in self.replaced.items():
            rec = state.of(host)
            now = s.world.hosts[host].uuid
            if rec.state == ON and rec.uuid is not None and rec.uuid != now and rec.uuid == old:
                s.violate(f"{host} answers as another machine ({now}, it slept as {old}) and its power record "
                          f"says on: used as the host that slept ({where})")

    # -------------------------------------------------------------- processes

    def start(self) -> None:
        """A wake schedule starts with the host put to sleep (the real code, without faults)."""
        if self.kind != "wake":
            return
        s = self.s
        s.injecting = False
        pid = s.new_pid()
        result = s.process(pid, lambda hv: self._sleep(hv, pid, final=True))
        s.rt.alive.discard(pid)
        s.note(f"p{pid} (start) put {self.host} to sleep: {result}")
        self.started_asleep = self.host in self.off
        s.injecting = True

    def run(self, pid: int, *, final: bool = False) -> str:
        """One process: the power action, then (not in the final process) perhaps its companion."""
        s = self.s
        body = self._sleep if self.kind == "sleep" else self._wake
        if final and s.fenced_away:  # a companion fenced a host: what the operator runs next (`status` lists them)
            restarted = s.restart(pid, final=True)
            s.note(f"p{pid} (final) restart of the lost VMs: {restarted}")
            if not (restarted == "ok" or restarted.startswith("stranded")):
                s.violate(f"did not converge: the final restart {restarted}")
        result = s.process(pid, lambda hv: body(hv, pid, final=final))
        if final or self.companion is None or s.rng.random() < 0.5:
            return result
        if self.companion == "recover":
            s.target = self.host
            s.note(f"p{pid} then: recover {self.host} -> {s.recover(pid)}")
            s.note(f"p{pid} then: restart -> {s.restart(pid)}")
        elif self.companion == "controller":
            s.note(f"p{pid} then: the controller -> {s.controller(pid)}")
        else:
            s.note(f"p{pid} then: {s.sc.command} -> {s.command(pid)}")
        return result

    def _options(self) -> dict[str, Any]:
        w, s = self.s.world, self.s

        def sleep(seconds: float) -> None:
            w.now += seconds

        def emit(event: str, **fields: Any) -> None:
            s.note(f"p{s.rt.pid} event {event}: {fields}")

        return {"store": self.store, "agent": self.agent, "clock": lambda: 1_800_000_000.0 + w.now, "emit": emit,
                "sleep": sleep}

    def _set_right(self, uow: Any) -> Any:
        """Hosts recorded asleep or waking that answer (a process killed during a power-off or a wake, or a host
        that came back on its own): a wake makes them on again (their agent answers ``on`` at once), as
        docs/power.md §6 says.  The inventory, read again if anything changed."""
        from acting.power import wake_host
        from vcsched.control.power import ON

        state = self.store.read()
        for h in uow.hv.inventory().hosts:  # as libvirt answers (the unit of work reads such a host asleep)
            rec = state.of(h.name)
            if rec.state != ON and not rec.failed and h.down is None:
                o = self._options()
                r = wake_host(uow, self.s.cluster, h.name, store=o["store"], agent=o["agent"], clock=o["clock"],
                              sleep=o["sleep"], emit=o["emit"])
                self.s.note(f"p{self.s.rt.pid} {h.name} answers, recorded {rec.state}: woken again: {r.reason}")
        return uow.inventory()

    def _sleep(self, hv: Any, pid: int, *, final: bool) -> str:
        """``vcsched power sleep HOST --apply`` (or the controller's sleep): the decision's evacuation (else a
        drain's), then :func:`acting.power.sleep_host`."""
        from acting.power import sleep_host
        from vcsched.control.live import adapt_inventory
        from vcsched.control.power import ON, describe, sleep_check
        from vcsched.plans.migration import MigrationBlocked

        s, host = self.s, self.host
        with s.unit_of_work(hv, pid) as uow:
            inv = self._set_right(uow)
            state = self.store.read()
            rec = state.of(host)
            if rec.state != ON:
                return "ok" if host in self.off else f"refused: {host} is {describe(rec)}"
            now = 1_800_000_000.0 + s.world.now
            why, evacuation = _cached(("sleep", s.sc.index, inv, state, host), lambda: sleep_check(
                s.cluster, inv, state, host, now, 1 << 40))
            plan = None if evacuation is None else evacuation.plan
            if plan is None:  # the operator drains it first (the drain planner), then asks for the sleep

                def drained() -> Any:
                    try:
                        return adapt_inventory(s.cluster.name, inv, 1 << 40, cluster=s.cluster, drain=host).plan
                    except MigrationBlocked:
                        return None

                if inv.host(host).down is not None:
                    return f"refused: {host} does not answer"
                plan = _cached(("drain", s.sc.index, inv, host), drained)
                if plan is None:
                    return f"refused: {host} may not sleep: {why}"
            s.note(f"p{pid} sleep {host}: {'the decision' if why is None else 'a drain'}'s evacuation "
                   f"{[str(x) for x in plan.steps]}")
            self.evacuating = host
            try:
                r = sleep_host(uow, s.cluster, host, plan, store=self.store, agent=self.agent,
                               clock=self._options()["clock"], emit=self._options()["emit"])
            finally:
                self.evacuating = None
            s.note(f"p{pid} sleep {host}: {r.reason}")
            return "ok" if r.slept else f"refused: {r.reason}"

    def _wake(self, hv: Any, pid: int, *, final: bool) -> str:
        """The wake the decision would choose (:func:`wake_candidates`: never a host whose wake failed), through
        :func:`acting.power.wake_host`; the final process is the operator who fixed a failed host and clears it
        (``vcsched power clear``) first."""
        from acting.power import clear_host, wake_host
        from vcsched.control.power import ON, wake_candidates

        s, host = self.s, self.host
        with s.unit_of_work(hv, pid) as uow:
            self._set_right(uow)
            state = self.store.read()
            rec = state.of(host)
            if rec.state == ON:
                return "ok"
            if rec.failed and final:
                s.note(f"the operator clears {host} ({rec.reason})")
                state = clear_host(self.store, host)
            candidates = wake_candidates(s.cluster, state)
            if host not in candidates:
                return f"wake-failed: {rec.reason}" if rec.failed else f"refused: {host} is not to be woken"
            chosen = candidates[0]
            if state.of(chosen).failed:
                s.violate(f"{chosen}, whose wake failed, chosen to wake again before it was cleared")
            o = self._options()
            r = wake_host(uow, s.cluster, chosen, store=o["store"], agent=o["agent"], clock=o["clock"],
                          sleep=o["sleep"], emit=o["emit"])
            s.note(f"p{pid} wake {chosen}: {r.reason}")
            return "ok" if r.woke else f"wake-failed: {r.reason}"

    # -------------------------------------------------------------- the end

    def final(self, result: str) -> None:
        """After the final process: the host asleep (off, recorded sleeping, empty) or the sleep refused with a
        reason; woken (answering as itself, recorded on) or its wake failed with a reason."""
        from vcsched.control.power import ON, SLEEPING

        s, host = self.s, self.host
        rec = self.store.read().of(host)
        if self.kind == "sleep":
            if result == "ok" and not (host in self.off and rec.state == SLEEPING):
                s.violate(f"did not converge: the final sleep of {host} said ok, but it is "
                          f"{'off' if host in self.off else 'on'} and recorded {rec.state}")
            elif result != "ok" and not result.startswith("refused"):
                s.violate(f"did not converge: the final sleep of {host}: {result}")
            return
        if result == "ok":
            if host in self.off or rec.state != ON or s.world.hosts[host].uuid != (rec.uuid or
                                                                                      s.world.hosts[host].uuid):
                s.violate(f"did not converge: the final wake of {host} said ok, but it is "
                          f"{'off' if host in self.off else 'on'} and recorded {rec.state}")
        elif result.startswith("wake-failed"):
            if not rec.failed:
                s.violate(f"did not converge: the final wake of {host} failed but it is not recorded failed")
        elif not result.startswith("refused"):
            s.violate(f"did not converge: the final wake of {host}: {result}")


def _edges(*chances: float) -> list[float]:
    """Cumulative bounds of consecutive chances (a roll below ``edges[i]`` and above ``edges[i-1]`` is case i)."""
    out, total = [], 0.0
    for c in chances:
        total += c
        out.append(total)
    return out

