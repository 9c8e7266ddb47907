"""`vcsched run` managing power (acting/power_saving.py) on the in-memory hypervisor, a fake clock and a fake power
agent: it sleeps a host only once the condition has held for ``sleep_after``, never while something is recovered,
a VM is below its floor or the failover room would be short; it wakes one when demand rises, and a host whose
wake failed is never chosen again until cleared; recommend mode proposes the same sleep and changes nothing until
it is approved, re-validated against the hosts as they are then.  The acting itself (sleep_host, wake_host) is
tested in tests/test_power_act.py; the whole cycle on real libvirt in tests/test_power_lab.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from acting.fence import AgentRun
from acting.power import PowerStore, clear_host
from acting.power_saving import PowerSaving, Stale, carry_out, sleep_held
from acting.recommendations import RecommendationStore
from acting.unit_of_work import UnitOfWork
from tests.builders import MiB, cluster_of, managed
from tests.fake_load import Demand, FakeClock, FakeLocks, LoadedHypervisor, busy
from tests.test_controller import Run, scrape
from tests.test_unit_of_work import Lock
from vcsched.control import recommend as rc
from vcsched.control.power import ON, SLEEPING, WAKING, HostPower, PowerState
from vcsched.errors import VcschedError
from vcsched.formats.cluster import Cluster, FenceConfig
from vcsched.formats.power import HostPower as HostPowerConfig
from vcsched.formats.power import PowerSettings
from vcsched.inventory import HostState, Inventory, VmState

UUIDS = {f"h{i}": f"00000000-0000-0000-0000-00000000000{i}" for i in range(3)}
SLEEP_AFTER = 60.0  # six intervals of tests/test_controller.py's 10 s
WAKE_S = 25.0  # what the fake agent's host takes to answer after `on`


def power_cluster(mode: str = "auto", *, failures_tolerated: int = 0, wake_test_every: float | None = None,
                  wake_margin: float = 0.0, sleep_margin: float = 0.1, min_hosts_on: int = 1) -> Cluster:
    c = cluster_of(3)
    hosts = tuple(dataclasses.replace(h, power=HostPowerConfig(FenceConfig("fence_fake"), True, 100.0, 300.0))
                  for h in c.hosts)
    return dataclasses.replace(c, hosts=hosts, failures_tolerated=failures_tolerated,
                               power=PowerSettings(mode, min_hosts_on, 1.0, SLEEP_AFTER, 60.0, "consolidate",
                                                   sleep_margin, wake_margin, wake_test_every=wake_test_every))


class Agent:
    """A power agent over the in-memory hosts on the fake clock: ``off`` makes a host stop answering at once,
    ``on`` makes it answer again :data:`WAKE_S` later (or never, ``on_fails``)."""

    def __init__(self, hv: LoadedHypervisor, clock: FakeClock) -> None:
        self.hv, self.clock = hv, clock
        self.calls: list[tuple[str, str]] = []
        self.on_fails = False

    def __call__(self, host: str, action: str) -> AgentRun:
        self.calls.append((host, action))
        if action == "off":
            self.hv.down[host] = "powered off"
            return AgentRun(action, 0, "Success: Powered OFF", "", 0.0)
        if action == "status":
            off = host in self.hv.down
            return AgentRun(action, 2 if off else 0, f"Status: {'OFF' if off else 'ON'}", "", 0.0)
        if self.on_fails:
            return AgentRun(action, 1, "", "Failed: Timed out waiting to power ON", 0.0)
        self.clock.at.append((self.clock.now + WAKE_S, lambda: self.hv.down.pop(host, None)))
        return AgentRun(action, 0, "Success: Powered ON", "", 0.0)

    def actions(self, action: str) -> list[str]:
        return [h for h, a in self.calls if a == action]


@dataclasses.dataclass
class Setup:
    run: Run
    hv: LoadedHypervisor
    clock: FakeClock
    agent: Agent
    store: PowerStore
    book: RecommendationStore

    def asleep(self) -> list[str]:
        return sorted(h.host for h in self.store.read().hosts if h.state == SLEEPING)

    def with_cluster(self, cluster: Cluster) -> None:
        ps = self.run.controller.power_saving
        assert ps is not None
        self.run.controller.power_saving = dataclasses.replace(ps, cluster=cluster)


def setup(tmp_path: Path, cluster: Cluster, demand: dict[str, Demand] | None = None,
          vms: list[VmState] | None = None, **options: Any) -> Setup:
    """Three hosts of 2 cores and 2 GiB, one light VM on each (0.2 cores of 1 vCPU)."""
    clock = FakeClock()
    hosts = [HostState(f"h{i}", 2, 2048 * MiB, uuid=UUIDS[f"h{i}"]) for i in range(3)]
    vms = vms or [managed(f"v{i}", f"h{i}", f"v{i}", 0.2, 0.2) for i in range(3)]
    hv = LoadedHypervisor("lab", hosts, vms, clock, demand or {v.name: busy(0.2) for v in vms})
    store = PowerStore(f"file://{tmp_path}", "k")
    book = RecommendationStore(f"file://{tmp_path}", "k")
    agent = Agent(hv, clock)
    run = Run(hv, clock, FakeLocks(), probe_seconds=0.0, **options)
    run.controller.recommendations = book
    run.controller.power_saving = PowerSaving(cluster, store, agent, 1 << 40)
    run.controller.power = store.read
    return Setup(run, hv, clock, agent, store, book)


def slept_at(s: Setup) -> list[float]:
    return [s.run.at(e) for e in s.run.events("power_slept")]


# ---------------------------------------------------------------------------------------------- auto


def test_auto_sleeps_one_empty_host_once_the_condition_held_for_sleep_after_and_not_before(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster())
    s.run.cycles(6)  # the first interval only samples; the condition then holds from the second (t = 10 s)
    assert not s.run.events("power_slept") and not s.agent.calls, "slept before sleep_after"
    waiting = s.run.events("power_decision")[-1]["refusals"]
    assert all("of sleep_after = 60 s" in why for why in waiting.values()), waiting
    s.run.cycles(3)
    slept = s.run.events("power_slept")
    assert len(slept) == 1, s.run.events("power_decision")
    host = slept[0]["host"]
    assert s.run.at(slept[0]) >= 10.0 + SLEEP_AFTER
    assert s.agent.calls == [(host, "off"), (host, "status")]
    assert host in s.hv.down and not [v for v in s.hv.vms.values() if v.host == host]
    assert len(s.hv.vms) == 3 and all(v.active for v in s.hv.vms.values()), "no VM lost"
    assert s.asleep() == [host]
    body = scrape(s.run.controller.metrics)
    assert 'vcsched_hosts_sleeping{cluster="lab"} 1.0' in body
    s.run.cycles(2)
    assert not s.run.events("host_failed"), "a host put to sleep is not a failed host"
    saved = float(next(line.split()[-1] for line in scrape(s.run.controller.metrics).splitlines()
                       if line.startswith("vcsched_energy_saved_joules_total")))
    counted = s.run.at(s.run.events("interval")[-1]) - s.run.at(slept[0])  # up to the last interval's count
    assert counted > 0 and saved == pytest.approx(100.0 * counted), "idle_watts x the seconds it slept"


def test_a_host_down_holds_every_sleep_and_the_count_starts_again_once_it_answers(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster())
    s.run.cycles(3)
    s.hv.down["h0"] = "host h0: did not answer within 5 s (host_timeout)"  # failing, not put to sleep
    s.run.cycles(10)
    assert not s.run.events("power_slept") and not s.agent.calls
    assert any("down: recovery first" in e["reason"] for e in s.run.events("power_decision"))
    del s.hv.down["h0"]
    back = s.clock.now
    s.run.cycles(9)
    assert len(slept_at(s)) == 1 and slept_at(s)[0] >= back + SLEEP_AFTER


def test_never_sleeps_while_a_vm_is_below_its_floor(tmp_path: Path) -> None:
    """h0 is over-committed (two VMs that each want 1.5 of its 2 cores, floor 0.9) and no migration may fix it
    (re-balancing budget 0): h2 could sleep by the decision, yet nothing sleeps while they are below their floor."""
    vms = [dataclasses.replace(managed("a-0", "h0", "a", 1.5, 1.0, vcpus=2)),
           dataclasses.replace(managed("b-0", "h0", "b", 1.5, 1.0, vcpus=2)),
           managed("c-0", "h1", "c", 0.2, 0.2), managed("d-0", "h2", "d", 0.2, 0.2)]
    vms = [dataclasses.replace(v, meta=dataclasses.replace(v.meta, min_yield=0.9)) if v.name in ("a-0", "b-0")
           else v for v in vms]
    demand = {"a-0": busy(1.5), "b-0": busy(1.5), "c-0": busy(0.2), "d-0": busy(0.2)}
    s = setup(tmp_path, power_cluster(), demand, vms, budget=0)
    s.run.cycles(12)
    assert not s.run.events("power_slept") and not s.agent.calls
    held = [e["reason"] for e in s.run.events("power_decision")]
    assert held and all("below their floor (a-0, b-0)" in r for r in held), held
    s.hv.demand.update({"a-0": busy(0.5), "b-0": busy(0.5)})  # the same cluster with the floors met: it sleeps
    s.run.cycles(10)
    assert len(s.run.events("power_slept")) == 1


def test_never_sleeps_when_the_failover_room_would_be_short(tmp_path: Path) -> None:
    """failures_tolerated = 1 on three hosts loaded so that two cannot absorb the loss of one: no sleep; the same
    cluster without the failover room asked does sleep (so the room is what kept it on)."""
    vms = [managed(f"v{i}", f"h{i}", f"v{i}", 0.9, 0.9) for i in range(3)]
    vms = [dataclasses.replace(v, meta=dataclasses.replace(v.meta, min_yield=0.9)) for v in vms]
    s = setup(tmp_path, power_cluster(failures_tolerated=1), {v.name: busy(0.9) for v in vms}, vms)
    s.run.cycles(14)
    assert not s.run.events("power_slept") and not s.agent.calls
    s.with_cluster(power_cluster(failures_tolerated=0))
    s.run.cycles(9)
    assert len(s.run.events("power_slept")) == 1


def test_a_sleeping_host_wakes_when_demand_rises_and_its_wake_is_measured(tmp_path: Path) -> None:
    level = {"v": 0.2}
    s = setup(tmp_path, power_cluster(), {f"v{i}": (lambda _t: level["v"]) for i in range(3)})
    s.run.cycles(9)
    assert len(s.asleep()) == 1
    host = s.asleep()[0]
    s.run.cycles(9)  # a second host may sleep too: the load is light
    level["v"] = 0.95  # three VMs of 0.95 do not fit on one or two 2-core hosts at full speed
    s.run.cycles(10)
    woke = s.run.events("power_woke")
    assert woke and woke[0]["seconds"] == pytest.approx(WAKE_S, abs=2.5)
    assert not s.asleep(), s.run.events("power_decision")
    assert s.store.read().of(host).wake_s is not None
    assert s.agent.actions("on") and all(e["host"] in UUIDS for e in woke)
    assert not s.run.events("host_failed")
    body = scrape(s.run.controller.metrics)
    assert f'vcsched_host_wake_seconds{{cluster="lab",host="{woke[0]["host"]}"}}' in body


def test_a_failed_wake_marks_the_host_and_it_is_not_chosen_again_until_cleared(tmp_path: Path) -> None:
    level = {"v": 0.2}
    s = setup(tmp_path, power_cluster(), {f"v{i}": (lambda _t: level["v"]) for i in range(3)})
    s.run.cycles(18)
    assert len(s.asleep()) == 2, "the light load leaves one host on"
    s.agent.on_fails = True
    level["v"] = 0.95  # as in the test above: a host must wake
    for _ in range(10):
        s.run.cycles(1)
        if s.agent.actions("on"):
            break
    failed = s.run.events("power_wake_failed")
    host = s.agent.actions("on")[0]
    assert [e["host"] for e in failed] == [host] and "Timed out" in failed[0]["reason"]
    record = s.store.read().of(host)
    assert record.failed and record.state == SLEEPING
    assert f'vcsched_host_wake_failed{{cluster="lab",host="{host}"}} 1.0' in scrape(s.run.controller.metrics)
    s.agent.on_fails = False
    s.run.cycles(8)
    other = next(h for h in ("h0", "h1", "h2") if h != host and h in s.agent.actions("off"))
    assert s.agent.actions("on") == [host, other], "the other sleeping host is woken instead, never the failed one"
    assert s.store.read().of(other).state == ON and s.store.read().of(host).failed
    clear_host(s.store, host)
    level["v"] = 1.0  # with the failed one cleared, it may be chosen again when the room needs it
    s.run.cycles(8)
    assert s.agent.actions("on")[:2] == [host, other]


def test_the_periodic_wake_test_wakes_a_sleeping_host_and_puts_it_back(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster(wake_test_every=120.0, min_hosts_on=2))
    s.run.cycles(9)
    host = s.asleep()[0]
    s.run.cycles(10)
    assert not s.run.events("power_wake_test"), "not before wake_test_every"
    s.run.cycles(4)
    tests = [e for e in s.run.events("power_wake_test") if "ok" in e]
    assert len(tests) == 1 and tests[0]["ok"] and tests[0]["asleep_again"] and tests[0]["host"] == host
    assert s.agent.calls[2:] == [(host, "on"), (host, "off"), (host, "status")]
    assert s.asleep() == [host] and s.store.read().of(host).wake_s == pytest.approx(WAKE_S, abs=2.5)


def test_a_periodic_wake_test_that_fails_marks_the_host_wake_failed(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster(wake_test_every=120.0, min_hosts_on=2))
    s.run.cycles(9)
    host = s.asleep()[0]
    s.agent.on_fails = True
    s.run.cycles(14)
    assert [e["host"] for e in s.run.events("power_wake_failed")] == [host]
    assert s.store.read().of(host).failed
    assert s.agent.actions("on") == [host], "tested once; not again until cleared"


def test_a_wake_cut_short_is_settled_by_the_next_interval(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster("off"))
    s.store.change(lambda st: st.with_host(HostPower("h1", WAKING, s.clock.time(), uuid=UUIDS["h1"], cores=2,
                                                     memory_bytes=2048 * MiB)))
    s.hv.down["h2"] = "powered off"  # and h2 recorded waking since long before its deadline, not answering
    s.store.change(lambda st: st.with_host(HostPower("h2", WAKING, s.clock.time() - 1000.0, uuid=UUIDS["h2"],
                                                     cores=2, memory_bytes=2048 * MiB)))
    s.run.cycles(2)
    assert s.store.read().of("h1").state == ON and s.run.events("power_woke")[0]["settled"]
    h2 = s.store.read().of("h2")
    assert h2.failed and h2.state == SLEEPING and "cut short" in str(h2.reason)
    assert [e["host"] for e in s.run.events("power_wake_failed")] == ["h2"] and not s.run.events("host_failed")



def test_a_wake_cut_short_and_settled_late_counts_at_most_its_deadline(tmp_path: Path) -> None:
    """Found on the lab: a controller stopped mid-wake and started 41 s later recorded a 41 s wake for a host
    that wakes in 1 s, kept as its longest for good; after an hour's stop, an hour.  Bounded by the deadline."""
    s = setup(tmp_path, power_cluster("off"))
    s.store.change(lambda st: st.with_host(HostPower("h1", WAKING, s.clock.time() - 3600.0, uuid=UUIDS["h1"],
                                                     cores=2, memory_bytes=2048 * MiB)))
    s.run.cycles(2)
    h1 = s.store.read().of("h1")
    assert h1.state == ON and h1.wake_s == pytest.approx(2 * 60.0), "twice wake_time (60 s), not 3600 s"


# ---------------------------------------------------------------------------------------------- recommend


def test_recommend_proposes_the_same_sleep_and_nothing_changes_until_it_is_approved(tmp_path: Path) -> None:
    auto = setup(tmp_path / "auto", power_cluster())
    auto.run.cycles(9)
    s = setup(tmp_path / "rec", power_cluster("recommend"))
    s.run.cycles(14)
    proposed = s.run.events("power_proposed")
    assert proposed and {e["host"] for e in proposed} == set(auto.asleep()), "the same sleep as auto"
    assert not s.agent.calls and not s.hv.down and not s.asleep(), "nothing changed"
    book = s.book.read()
    rec = rc.open_ones(book, s.clock.time())[0]
    assert rec.kind == "sleep" and rec.effect["power"]["watts_saved"] == 100.0
    assert rec.effect["min_yield_after"] >= 1.0 - 1e-6 and "fit on the others" in rec.reason
    assert len(rc.open_ones(book, s.clock.time())) == 1, "the same proposal keeps its id"
    s.book.update(lambda b: rc.approve(b, rec.id, s.clock.time(), "op"))
    with UnitOfWork(s.hv, Lock(), power=s.store.read) as uow:
        result = carry_out(uow, power_cluster("recommend"), rec.plan, store=s.store, agent=s.agent,
                           clock=s.clock.time)
    assert result.slept, result.reason  # type: ignore[union-attr]
    assert s.asleep() == auto.asleep() and len(s.hv.vms) == 3


def test_a_stale_approval_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster("recommend"))
    s.run.cycles(9)
    rec = rc.open_ones(s.book.read(), s.clock.time())[0]
    host = rec.plan["power"]["host"]
    s.hv.vms["x"] = VmState("x", host, 1, 128 * MiB, True)  # an unmanaged VM started there since
    with UnitOfWork(s.hv, Lock(), power=s.store.read) as uow, pytest.raises(Stale, match="unmanaged") as exc:
        carry_out(uow, power_cluster("recommend"), rec.plan, store=s.store, agent=s.agent, clock=s.clock.time)
    assert exc.value.exit_code == 1 and not s.agent.calls and not s.asleep()
    del s.hv.vms["x"]
    step = rec.plan["steps"][0]
    other = next(h for h in UUIDS if h not in (host, step["to"]))
    s.hv.vms[step["vm"]] = dataclasses.replace(s.hv.vms[step["vm"]], host=other)  # moved elsewhere meanwhile
    with UnitOfWork(s.hv, Lock(), power=s.store.read) as uow, pytest.raises(VcschedError) as exc2:
        carry_out(uow, power_cluster("recommend"), rec.plan, store=s.store, agent=s.agent, clock=s.clock.time)
    assert f"is on host {other}" in str(exc2.value) and exc2.value.exit_code == 1 and not s.agent.calls
    assert len(s.hv.vms) == 3 and s.hv.vms[step["vm"]].host == other, "nothing moved"


def test_a_wake_proposal_is_refused_once_the_host_no_longer_sleeps(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster("recommend"))
    plan = {"steps": [], "power": {"action": "wake", "host": "h1"}}
    with UnitOfWork(s.hv, Lock(), power=s.store.read) as uow, pytest.raises(Stale, match="no longer asleep"):
        carry_out(uow, power_cluster("recommend"), plan, store=s.store, agent=s.agent, clock=s.clock.time)


def test_a_skipped_sleep_is_not_proposed_again_while_its_veto_lasts(tmp_path: Path) -> None:
    """`vcsched skip` of a sleep keeps that host on for --for: without it the same sleep came back at the next
    interval (found on the lab: an empty host's sleep vetoes no VM, so nothing held it)."""
    s = setup(tmp_path, power_cluster("recommend"))
    s.run.cycles(9)
    rec = rc.open_ones(s.book.read(), s.clock.time())[0]
    host = rec.plan["power"]["host"]
    skipped = s.book.update(lambda b: rc.skip(b, rec.id, s.clock.time(), "op", 3600.0))
    assert f"{host} is not put to sleep" in skipped.detail
    s.run.cycles(9)  # longer than sleep_after again
    again = [e for e in s.run.events("power_proposed") if e["host"] == host and e["id"] != rec.id]
    assert not again, "the skipped sleep was proposed again"
    assert "its sleep was skipped" in s.run.events("power_decision")[-1]["refusals"][host]
    book = s.book.read()
    assert book.kept_on(s.clock.time() + 3600.0) == {}, "the veto ends with --for"
    auto = setup(tmp_path / "auto", power_cluster())  # and in auto mode (vetoes hold in both modes)
    auto.book.update(lambda b: (rc.Book(vetoes=book.vetoes), None))
    auto.run.cycles(12)
    assert auto.asleep() and host not in auto.asleep()


def test_a_sleep_approved_outside_the_controller_starts_every_other_hosts_count_again(tmp_path: Path) -> None:
    """Hosts sleep sleep_after apart at least (docs/power.md §8), also when the sleep was an approval: the other
    hosts' counts, held while the proposal waited, were carried on, and the next sleep came one interval later."""
    s = setup(tmp_path, power_cluster("recommend"))
    s.run.cycles(9)
    rec = rc.open_ones(s.book.read(), s.clock.time())[0]
    s.book.update(lambda b: rc.approve(b, rec.id, s.clock.time(), "op"))
    with UnitOfWork(s.hv, Lock(), power=s.store.read) as uow:
        assert carry_out(uow, power_cluster("recommend"), rec.plan, store=s.store, agent=s.agent,
                         clock=s.clock.time).slept  # type: ignore[union-attr]
    approved_at = s.clock.time() - s.clock.start
    s.run.cycles(4)  # 40 s < sleep_after
    early = [e for e in s.run.events("power_proposed") if s.run.at(e) > approved_at]
    assert not early, f"proposed less than sleep_after after the last sleep: {early}"
    s.run.cycles(4)
    assert [e for e in s.run.events("power_proposed") if s.run.at(e) > approved_at + SLEEP_AFTER]


# ---------------------------------------------------------------------------------------------- pieces


def test_sleep_is_held_for_hosts_down_lost_vms_vms_in_doubt_and_vms_below_their_floor() -> None:
    inv = Inventory("lab", (HostState("h0", 2, 1 << 30), HostState("h1", 2, 1 << 30, down="no answer")), ())
    assert "h1 down" in str(sleep_held(inv, [], None))
    up = dataclasses.replace(inv, hosts=inv.hosts[:1])
    assert "2 recorded VM(s)" in str(sleep_held(up, [], 2))
    assert "below their floor (a-0)" in str(sleep_held(up, ["a-0"], 0))
    assert sleep_held(up, [], 0) is None


def test_power_state_is_left_as_is_by_a_controller_without_power_saving(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster("off"))
    s.run.cycles(12)
    assert not s.run.events("power_slept") and not s.agent.calls
    assert s.store.read() == PowerState()


def test_wake_test_every_is_off_by_default_read_as_a_duration_and_checked() -> None:
    from vcsched.errors import InputError
    from vcsched.formats.cluster import cluster_from_dict

    base: dict[str, Any] = {"name": "c", "hosts": [{"name": "h0", "uri": "test:///default"}]}
    assert cluster_from_dict(base).power.wake_test_every is None
    assert cluster_from_dict(base | {"wake_test_every": "7d"}).power.wake_test_every == 7 * 86400.0
    assert cluster_from_dict(base | {"wake_test_every": "168h"}).power.wake_test_every == 7 * 86400.0
    for value, said in (("often", "wake_test_every: 'often' is not a duration"),
                        (0, "wake_test_every: 0 must be above 0 seconds"),
                        ("5m", "wake_test_every: '5m' is shorter than wake_time (600 s)")):
        with pytest.raises(InputError) as exc:
            cluster_from_dict(base | {"wake_test_every": value})
        assert str(exc.value).startswith(said), str(exc.value)


def test_the_demand_trend_is_each_vms_least_squares_slope_of_its_measured_needs() -> None:
    from vcsched.control.power import demand_trend

    history = [(0.0, {"a": 1.0, "b": 2.0}), (10.0, {"a": 1.2, "b": 1.0}), (20.0, {"a": 1.4, "c": 0.5})]
    d = demand_trend(history)
    assert d.trend["a"] == pytest.approx(0.02) and d.trend["b"] == pytest.approx(-0.1)
    assert "c" not in d.trend and d.pending == () and d.growth == 0.0, "one measurement is no trend"


def test_the_power_metrics_are_the_leaders_and_a_standby_exports_none(tmp_path: Path) -> None:
    s = setup(tmp_path, power_cluster())
    s.run.cycles(9)
    body = scrape(s.run.controller.metrics)
    assert 'vcsched_hosts_sleeping{cluster="lab"} 1.0' in body and "vcsched_failover_room_short" in body
    s.run.controller._step_down("test: lease lost")
    body = scrape(s.run.controller.metrics)
    assert "vcsched_hosts_sleeping{" not in body and "vcsched_host_wake_failed{" not in body


def test_vcsched_run_with_power_saving_needs_a_backend_that_keeps_the_power_record(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli.main import cli

    path = tmp_path / "cluster.toml"
    path.write_text('name = "t"\npower_saving = "auto"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    r = CliRunner().invoke(cli, ["run", "--cluster", str(path), "--budget-per-interval", "0", "--coordination",
                                 "zookeeper://127.0.0.1:2181"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == ("vcsched: error: power_saving: 'auto': coordination zookeeper://127.0.0.1:2181 keeps "
                                "no power record (use file:///DIR or etcd3+http://HOST:2379)")
