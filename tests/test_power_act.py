"""Power saving's acting half (acting/power.py) on the in-memory hypervisor, a fake lock and a fake agent: a host
sleeps only emptied, switched off and seen off; it wakes only as the machine that slept; every refusal leaves
it as it was and says why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from acting.fence import AgentRun
from acting.power import PowerRefused, PowerStore, clear_host, sleep_host, wake_host
from acting.unit_of_work import UnitOfWork
from hypervisor.memory import MemoryHypervisor
from tests.builders import cluster_of, managed
from tests.test_unit_of_work import Lock
from vcsched.control.power import ON, SLEEPING, PowerState, describe, sleep_check, wake_candidates
from vcsched.formats.cluster import Cluster, FenceConfig
from vcsched.formats.power import HostPower as HostPowerConfig
from vcsched.formats.power import PowerSettings
from vcsched.inventory import HostState, VmState
from vcsched.plans.plan import Plan

MiB = 1 << 20
UUIDS = {f"h{i}": f"00000000-0000-0000-0000-00000000000{i}" for i in range(3)}


def powered() -> Cluster:
    c = cluster_of(3)
    hosts = tuple(dataclasses.replace(h, power=HostPowerConfig(FenceConfig("fence_dummy"), True, 100.0, 300.0))
                  for h in c.hosts)
    return dataclasses.replace(c, hosts=hosts, power=PowerSettings("auto", 1, 1.0, 0.0, 60.0, "consolidate",
                                                                   0.0, 0.0))


def hypervisor(*extra: VmState) -> MemoryHypervisor:
    hosts = [HostState(f"h{i}", 4, 4096 * MiB, uuid=UUIDS[f"h{i}"]) for i in range(3)]
    vms = [managed(f"v{i}", f"h{i}", f"v{i}", 0.2) for i in range(3)]
    return MemoryHypervisor("lab", hosts, [*vms, *extra])


class Agent:
    """A power agent over the in-memory hosts: ``off`` makes a host not answer, ``on`` makes it answer again;
    each way of failing is a switch."""

    def __init__(self, hv: MemoryHypervisor) -> None:
        self.hv = hv
        self.calls: list[str] = []
        self.off_fails = False
        self.still_on = False  # off exits 0 but the host stays on
        self.on_fails = False
        self.comes_back = True
        self.other_uuid: str | None = None
        self.store: PowerStore | None = None
        self.recorded_at_off: str | None = None

    def __call__(self, host: str, action: str) -> AgentRun:
        self.calls.append(action)
        if action == "off":
            if self.store is not None:
                self.recorded_at_off = self.store.read().of(host).state
            if self.off_fails:
                return AgentRun(action, 1, "", "Failed: Unable to connect/login to fencing device", 0.0)
            if not self.still_on:
                self.hv.down[host] = "powered off"
            return AgentRun(action, 0, "Success: Powered OFF", "", 0.0)
        if action == "status":
            off = host in self.hv.down
            return AgentRun(action, 2 if off else 0, f"Status: {'OFF' if off else 'ON'}", "", 0.0)
        assert action == "on"
        if self.on_fails:
            return AgentRun(action, 1, "", "Failed: Timed out waiting to power ON", 0.0)
        if self.comes_back:
            self.hv.down.pop(host, None)
            if self.other_uuid is not None:
                self.hv.hosts[host] = dataclasses.replace(self.hv.hosts[host], uuid=self.other_uuid)
        return AgentRun(action, 0, "Success: Powered ON", "", 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


@pytest.fixture
def store(tmp_path: Path) -> PowerStore:
    return PowerStore(f"file://{tmp_path}", "k")


def put_to_sleep(hv: MemoryHypervisor, agent: Agent, store: PowerStore, host: str = "h2", clock: Clock | None = None,
                 meanwhile: VmState | None = None) -> object:
    """``host`` put to sleep by the decision's plan; ``meanwhile``: a domain defined there after the decision."""
    cluster = powered()
    with UnitOfWork(hv, Lock(), power=store.read) as uow:
        why, evacuation = sleep_check(cluster, uow.inventory(), store.read(), host, 0.0, 1 << 40)
        assert why is None and evacuation is not None and evacuation.plan is not None
        if meanwhile is not None:
            hv.vms[meanwhile.name] = meanwhile
        return sleep_host(uow, cluster, host, evacuation.plan, store=store, agent=agent, clock=clock or Clock())


def test_a_host_sleeps_emptied_switched_off_and_seen_off_and_is_read_as_asleep_not_down(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)
    agent.store = store
    result = put_to_sleep(hv, agent, store)
    assert result.slept, result.reason  # type: ignore[attr-defined]
    assert agent.calls == ["off", "status"]
    assert agent.recorded_at_off == SLEEPING  # written ahead: a process killed meanwhile leaves no host off and "on"
    assert not [v for v in hv.vms.values() if v.host == "h2"] and len(hv.vms) == 3  # moved, none lost
    record = store.read().of("h2")
    assert (record.state, record.since, record.uuid, record.cores) == (SLEEPING, 1000.0, UUIDS["h2"], 4)
    with UnitOfWork(hv, None, power=store.read) as uow:
        inv = uow.inventory()
    assert [h.name for h in inv.asleep_hosts()] == ["h2"] and not inv.down_hosts()  # recovery never fences it
    assert "sleeping" in str(inv.host("h2").down)


def test_a_domain_left_on_the_host_even_defined_only_stops_the_power_off(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)  # an operator defines a domain there after the decision: unmanaged, not running
    result = put_to_sleep(hv, agent, store, meanwhile=VmState("old-template", "h2", 1, 256 * MiB, False))
    assert not result.slept  # type: ignore[attr-defined]
    assert "not empty" in result.reason and "old-template (unmanaged, defined, not running)" in result.reason  # type: ignore[attr-defined]
    assert agent.calls == [] and store.read().of("h2").state == ON and "h2" not in hv.down


def test_an_agent_whose_off_fails_leaves_the_host_on_and_recorded_on(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)
    agent.off_fails = True
    agent.store = store
    result = put_to_sleep(hv, agent, store)
    assert agent.recorded_at_off == SLEEPING
    assert not result.slept and "Unable to connect" in result.reason  # type: ignore[attr-defined]
    # the record goes back to on once status says on (asked, since off failed before any status)
    assert agent.calls == ["off", "status"] and store.read().of("h2").state == ON


def test_off_exiting_0_while_status_says_on_is_not_a_sleep(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)
    agent.still_on = True
    result = put_to_sleep(hv, agent, store)
    assert not result.slept and "still on" in result.reason  # type: ignore[attr-defined]
    assert agent.calls == ["off", "status"] and store.read().of("h2").state == ON


def test_a_sleep_of_a_host_already_asleep_is_refused(store: PowerStore) -> None:
    hv = hypervisor()
    assert put_to_sleep(hv, Agent(hv), store).slept  # type: ignore[attr-defined]
    with UnitOfWork(hv, Lock()) as uow:
        result = sleep_host(uow, powered(), "h2", Plan("drain", "lab", "", 1.0, 1.0, {}, ()), store=store,
                            agent=Agent(hv))
    assert not result.slept and "sleeping, not on" in result.reason


def wake(hv: MemoryHypervisor, agent: Agent, store: PowerStore, clock: Clock, **kw: object) -> object:
    with UnitOfWork(hv, Lock(), power=store.read) as uow:
        return wake_host(uow, powered(), "h2", store=store, agent=agent, clock=clock, sleep=clock.sleep, **kw)


def test_a_wake_counts_once_the_host_answers_as_itself_and_its_wake_time_is_measured(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)
    clock = Clock()
    assert put_to_sleep(hv, agent, store, clock=clock).slept  # type: ignore[attr-defined]
    agent.comes_back = False
    calls = 0
    real = hv.inventory

    def later(hosts: object = None) -> object:  # the host answers at the third read of it
        nonlocal calls
        calls += hosts == ["h2"]
        if calls == 3:
            hv.down.pop("h2", None)
        return real(hosts)  # type: ignore[arg-type]

    hv.inventory = later  # type: ignore[method-assign]
    result = wake(hv, agent, store, clock, poll=5.0)
    assert result.woke, result.reason  # type: ignore[attr-defined]
    record = store.read().of("h2")
    assert (record.state, record.wake_s, record.failed) == (ON, 10.0, False)  # two polls of 5 s


def test_a_host_that_answers_with_another_uuid_is_wake_failed_and_not_chosen_until_cleared(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)
    clock = Clock()
    assert put_to_sleep(hv, agent, store).slept  # type: ignore[attr-defined]
    agent.other_uuid = "11111111-2222-3333-4444-555555555555"
    events: list[tuple[str, dict[str, object]]] = []
    with UnitOfWork(hv, Lock()) as uow:
        result = wake_host(uow, powered(), "h2", store=store, agent=agent, clock=clock, sleep=clock.sleep,
                           emit=lambda e, **f: events.append((e, f)))
    assert not result.woke and "11111111-2222-3333-4444-555555555555" in result.reason
    record = store.read().of("h2")
    assert describe(record) == "wake-failed" and record.reason == result.reason
    assert events and events[0][0] == "power_wake_failed"
    assert wake_candidates(powered(), store.read()) == ()
    clear_host(store, "h2")
    assert wake_candidates(powered(), store.read()) == ("h2",)


def test_a_wake_that_never_answers_fails_at_its_deadline(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)
    clock = Clock()
    assert put_to_sleep(hv, agent, store).slept  # type: ignore[attr-defined]
    agent.comes_back = False
    result = wake(hv, agent, store, clock)
    assert not result.woke and "did not answer within 120 s" in result.reason  # type: ignore[attr-defined]
    assert 120.0 <= result.seconds <= 122.0  # type: ignore[attr-defined]  # 2 x wake_time 60 s, polls of 2 s
    assert store.read().of("h2").failed


def test_an_agent_whose_on_fails_marks_the_host_wake_failed_at_once(store: PowerStore) -> None:
    hv = hypervisor()
    agent = Agent(hv)
    clock = Clock()
    assert put_to_sleep(hv, agent, store).slept  # type: ignore[attr-defined]
    agent.on_fails = True
    result = wake(hv, agent, store, clock)
    assert not result.woke and "action=on exited 1: Failed: Timed out" in result.reason  # type: ignore[attr-defined]
    assert result.seconds == 0.0 and store.read().of("h2").failed  # type: ignore[attr-defined]


def test_a_host_on_is_not_woken(store: PowerStore) -> None:
    hv = hypervisor()
    with pytest.raises(PowerRefused, match="h2 is on"):
        wake(hv, Agent(hv), store, Clock())


def test_the_power_record_round_trips(store: PowerStore) -> None:
    hv = hypervisor()
    assert put_to_sleep(hv, Agent(hv), store).slept  # type: ignore[attr-defined]
    state = store.read()
    assert PowerState.from_dict(state.to_dict()) == state


def test_an_agent_that_cannot_run_leaves_the_host_on_and_recorded_on(store: PowerStore) -> None:
    hv = hypervisor()

    def missing(host: str, action: str) -> AgentRun:
        raise PowerRefused(f"host {host} has no power agent")

    result = put_to_sleep(hv, missing, store)  # type: ignore[arg-type]
    assert not result.slept and "cannot be run" in result.reason  # type: ignore[attr-defined]
    assert store.read().of("h2").state == ON and "h2" not in hv.down
