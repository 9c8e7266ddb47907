"""`vcsched run`'s controller on the in-memory hypervisor with CPU load and a fake clock.

No test here waits for real time: the clock moves only when the controller
waits (tests/fake_load.py), and every assertion is on what it did (its
events, the hypervisor's state), never on how long it took.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from acting.controller import Controller, RunOptions
from acting.events import EventLog
from acting.lock import ClusterLock, leader_lock_name, state_dir
from acting.metrics import ControllerMetrics, MetricsServer
from hypervisor.base import HypervisorError
from hypervisor.memory import MemoryHypervisor
from tests.builders import MiB, inventory_of, managed
from tests.fake_load import Demand, FakeClock, FakeLocks, LoadedHypervisor, busy, phases
from vcsched.control.rebalance import RebalanceOptions
from vcsched.formats.windows import ALWAYS
from vcsched.inventory import VmState

INTERVAL = 10.0
BUDGET = 256 * MiB


class Run:
    """One controller process: its controller, its event stream, its clock."""

    def __init__(self, hv: MemoryHypervisor, clock: FakeClock, locks: FakeLocks, member: str = "m1",
                 **options: Any) -> None:
        floor = options.pop("min_yield_floor", 0.0)
        # A journal directory of its own (under the test run's state directory, removed with it): one test's
        # controller must never see another's probe journal (they are all of cluster "lab", in one process).
        journals = options.pop("journals", None) or Path(tempfile.mkdtemp(prefix="journal-", dir=state_dir()))
        rebalance = RebalanceOptions(options.pop("budget", BUDGET), options.pop("threshold", 0.05),
                                     options.pop("settle", 2), options.pop("cooldown", 600.0),
                                     schedule=options.pop("schedule", ALWAYS))
        opts = RunOptions(options.pop("interval", INTERVAL), rebalance, sample=options.pop("sample", 2.5),
                          probe_seconds=options.pop("probe_seconds", 3.0), **options)
        self.stream = io.StringIO()
        self.clock = clock
        self.member = member
        self.controller = Controller("lab", hv, opts, leader_lock=lambda: locks.lock("leader", member),
                                     cluster_lock=lambda: locks.lock("cluster", member),
                                     events=EventLog(self.stream, member, clock.time),
                                     metrics=ControllerMetrics("lab", floor), clock=clock, journals=journals)

    def cycles(self, n: int) -> None:
        for _ in range(n):
            self.controller.cycle()

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        docs = [json.loads(line) for line in self.stream.getvalue().splitlines()]
        return [d for d in docs if kind is None or d["event"] == kind]

    def at(self, d: dict[str, Any]) -> float:
        return float(d["time"]) - self.clock.start


def loaded(vms: list[VmState], demand: dict[str, Demand], n_hosts: int = 2) -> tuple[LoadedHypervisor, FakeClock]:
    clock = FakeClock()
    inv = inventory_of(vms, n_hosts=n_hosts)
    return LoadedHypervisor("lab", inv.hosts, inv.vms, clock, demand), clock


def caps_after_tick(run: Run, hv: LoadedHypervisor, vm: str, cycles: int) -> list[tuple[float, float | None]]:
    """(time, cap) of ``vm`` after each of ``cycles`` intervals."""
    out = []
    for _ in range(cycles):
        run.controller.cycle()
        out.append((run.clock.now, hv.vms[vm].cap_cores))
    return out


# ---------------------------------------------------------------------------------------------- caps follow load


def test_caps_follow_a_vm_that_goes_busy_and_idle_within_two_intervals() -> None:
    hv, clock = loaded([managed("a-0", "h0", "a", 0.5, 0.5), managed("z-0", "h0", "z", 0.3, 0.3)],
                       {"a-0": phases((0.05, 60), (0.9, 60)), "z-0": busy(0.1)})
    run = Run(hv, clock, FakeLocks())
    caps = dict(caps_after_tick(run, hv, "a-0", 15))  # ticks at 0, 10, ..., 140; caps read after each interval
    assert caps[20.0] is not None and caps[20.0] < 0.15  # idle: lowered from 0.5 at the first acting tick
    # Busy from t=60: the tick at 70 sees it at its cap, probes and raises it; at the latest by t=80.
    assert max(c for t, c in caps.items() if 60 < t <= 80 + 1e-9) >= 0.85  # type: ignore[operator]
    # Idle again from t=120: lowered by the tick at 130 or 140.
    assert caps[150.0] is not None and caps[150.0] < 0.15
    probes = run.events("probe")
    assert probes and all(p["dry_run"] is False for p in probes)


def test_a_probe_never_lets_a_hosts_caps_exceed_its_cores() -> None:
    hv, clock = loaded([managed("a-0", "h0", "a", 0.3, 0.1), managed("b-0", "h0", "b", 0.3, 0.1),
                        managed("c-0", "h0", "c", 0.3, 0.3)],
                       {"a-0": busy(1.0), "b-0": busy(1.0), "c-0": busy(0.2)}, n_hosts=1)
    run = Run(hv, clock, FakeLocks())
    hosts_over: list[float] = []

    def check() -> None:
        total = sum(v.cap_or_vcpus for v in hv.vms.values() if v.host == "h0")
        if total > 1.0 + 1e-9:
            hosts_over.append(total)

    original = hv.set_cap

    def set_cap(host: str, vm: str, cap: float) -> None:
        original(host, vm, cap)
        check()

    hv.set_cap = set_cap  # type: ignore[method-assign]
    run.cycles(8)
    assert run.events("probe") and not hosts_over


# ---------------------------------------------------------------------------------------------- migrations


def crowded_h0() -> tuple[LoadedHypervisor, FakeClock]:
    return loaded([managed("a-0", "h0", "a", 1.0, 0.5), managed("b-0", "h0", "b", 1.0, 0.5),
                   managed("c-0", "h1", "c", 1.0, 1.0)],
                  {"a-0": busy(1.0), "b-0": busy(1.0), "c-0": busy(0.05)})


def test_an_overloaded_host_sheds_a_vm_once_the_gain_has_lasted_settle_intervals() -> None:
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks())
    run.cycles(6)
    migrations = [s for s in run.events("step") if s["op"] == "migrate" and s["outcome"] == "done"]
    assert len(migrations) == 1
    decisions = [d for d in run.events("decision") if d.get("gain")]
    assert decisions[0]["kind"] != "re-balance" and decisions[0]["streak"] == 1
    assert {hv.vms["a-0"].host, hv.vms["b-0"].host} == {"h0", "h1"}
    moved = migrations[0]["vm"]
    assert hv.vms[moved].meta.migrated_at == pytest.approx(clock.start + 20)  # type: ignore[union-attr]


def test_migrations_never_exceed_the_budget_in_any_interval() -> None:
    vms = [managed(f"v{i}", "h0", f"v{i}", 1.0, 0.25) for i in range(4)] + [managed("w", "h1", "w", 0.1, 0.1)]
    demand: dict[str, Demand] = {f"v{i}": busy(1.0) for i in range(4)} | {"w": busy(0.05)}
    hv, clock = loaded(vms, demand, n_hosts=4)
    run = Run(hv, clock, FakeLocks(), budget=128 * MiB, settle=1)
    run.cycles(12)
    per_tick: dict[int, int] = {}
    tick = 0
    for e in run.events():
        if e["event"] == "interval":
            tick += 1
        if e["event"] == "step" and e["op"] == "migrate" and e["outcome"] == "done":
            per_tick[tick] = per_tick.get(tick, 0) + e["bytes"]
    assert per_tick and max(per_tick.values()) <= 128 * MiB
    assert len(per_tick) >= 2  # it needed several intervals: one VM per interval
    assert all(a["migrated_bytes"] <= 128 * MiB for a in run.events("applied"))


def test_oscillating_load_does_not_ping_pong() -> None:
    """Two pairs take turns being busy, every interval: whatever it moves, no VM moves again within the cool-down."""
    vms = [managed(n, h, n[0], 1.0, 0.5) for n, h in (("a-0", "h0"), ("b-0", "h0"), ("c-0", "h1"), ("d-0", "h1"))]
    demand = {n: phases((1.0, INTERVAL), (0.05, INTERVAL), start=0.0 if n in ("a-0", "b-0") else INTERVAL)
              for n in ("a-0", "b-0", "c-0", "d-0")}
    for settle in (1, 2):
        hv, clock = loaded(vms, dict(demand))
        run = Run(hv, clock, FakeLocks(), settle=settle, cooldown=300.0)
        run.cycles(60)  # 600 s: two cool-downs
        moves: dict[str, list[tuple[float, str, str]]] = {}
        for s in run.events("step"):
            if s["op"] == "migrate" and s["outcome"] == "done":
                moves.setdefault(s["vm"], []).append((run.at(s), s["from"], s["to"]))
        for vm, ms in moves.items():
            for (t1, _, _), (t2, _, _) in itertools.pairwise(ms):
                assert t2 - t1 >= 300.0, (vm, ms)
        assert sum(len(ms) for ms in moves.values()) <= 4, moves  # at most once per VM per cool-down, and settles


def test_a_restarted_controller_keeps_a_migrated_vm_put_for_its_cooldown() -> None:
    hv, clock = crowded_h0()
    locks = FakeLocks()
    first = Run(hv, clock, locks, settle=1)
    first.cycles(3)
    moved = next(s["vm"] for s in first.events("step") if s["op"] == "migrate")
    first.controller.stop.set()
    first.controller.run()  # returns at once: steps down and releases the leader lock
    # Now the VM that moved shares h1 with a busy c-0, and h0 is idle: moving it back would pay.
    stayed = "b-0" if moved == "a-0" else "a-0"
    hv.demand.update({stayed: busy(0.05), "c-0": busy(1.0)})
    second = Run(hv, clock, locks, member="m2", settle=1)
    second.cycles(8)
    assert second.events("leader")
    assert not [s for s in second.events("step") if s["op"] == "migrate" and s["vm"] == moved]
    assert all(moved in d["pinned"] for d in second.events("decision") if "pinned" in d)


# ---------------------------------------------------------------------------------------------- faults


def test_a_host_that_stops_answering_is_left_out_until_it_returns() -> None:
    hv, clock = crowded_h0()
    clock.at.append((25.0, lambda: hv.down.__setitem__("h1", "connection refused")))
    clock.at.append((65.0, lambda: hv.down.pop("h1")))
    run = Run(hv, clock, FakeLocks(), budget=0)
    run.cycles(9)
    down, up = run.events("host-down"), run.events("host-up")
    assert [d["host"] for d in down] == ["h1"] and [u["host"] for u in up] == ["h1"]
    t_down, t_up = run.at(down[0]), run.at(up[0])
    for plan in run.events("plan"):
        if t_down <= run.at(plan) < t_up:
            assert all("h1" not in (s.get("host"), s.get("from"), s.get("to")) for s in plan["plan"]["steps"])
    for obs in run.events("observe"):
        if t_down <= run.at(obs) < t_up:
            assert "c-0" not in {v["vm"] for v in obs["vms"]}
    assert any(run.at(o) > t_up and "c-0" in {v["vm"] for v in o["vms"]} for o in run.events("observe"))


def test_a_libvirt_error_in_one_interval_does_not_stop_the_next() -> None:
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks(), budget=0)
    real = hv.inventory
    calls = {"n": 0}

    def flaky(hosts: Any = None) -> Any:
        calls["n"] += 1
        if calls["n"] == 12:
            raise HypervisorError("host h0: cannot list domains: internal error")
        return real(hosts)

    hv.inventory = flaky  # type: ignore[method-assign]
    hv.fail[("set-cap", "c-0")] = "host h1: cannot cap 'c-0': operation failed"
    run.cycles(6)
    errors = run.events("error")
    assert errors and "internal error" in errors[0]["error"]
    assert any(not a["ok"] for a in run.events("applied"))  # the failed step stopped that plan ...
    assert hv.vms["c-0"].cap_cores == pytest.approx(0.08, abs=0.02)  # ... and a later interval applied it
    assert len(run.events("interval")) == 6


def test_stop_lets_the_running_step_finish_and_starts_no_other() -> None:
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks(), settle=1)
    stop = run.controller.stop
    hv.before[("migrate", "a-0")] = stop.set
    hv.before[("migrate", "b-0")] = stop.set
    run.controller.run()  # returns once stopped
    steps = run.events("step")
    migrate = [s for s in steps if s["op"] == "migrate"]
    assert len(migrate) == 1 and migrate[0]["outcome"] == "done"
    after = steps[steps.index(migrate[0]) + 1:]
    assert not after  # the set-caps planned after it were not started
    applied = run.events("applied")[-1]
    assert applied["stopped"] and "stopping" in applied["stopped"]
    assert run.events()[-1]["event"] == "stop"
    assert run.events("standby")[-1]["reason"] == "stopping"


def test_dry_run_logs_plans_and_changes_nothing() -> None:
    hv, clock = crowded_h0()
    before = dict(hv.vms)
    run = Run(hv, clock, FakeLocks(), settle=1, dry_run=True)
    run.cycles(5)
    assert hv.vms == before and not [c for c in hv.calls if c[0] != "cpu"]
    assert run.events("plan") and all(p["dry_run"] for p in run.events("plan"))
    assert not run.events("applied")


# ---------------------------------------------------------------------------------------------- leadership


def test_one_leader_and_a_standby_that_takes_over_when_the_leader_loses_its_lease() -> None:
    hv = MemoryHypervisor("lab", inventory_of().hosts, [managed("a-0", "h0", "a", 0.5, 0.5)])
    locks = FakeLocks()
    a = Run(hv, FakeClock(), locks, member="a")
    b = Run(hv, FakeClock(), locks, member="b")
    for _ in range(3):
        a.cycles(1)
        b.cycles(1)
        assert [a.controller.leader, b.controller.leader] == [True, False]
    locks.lost.add("a")  # a's lease can no longer be renewed: its guard fails from now on
    a.cycles(1)
    assert not a.controller.leader and "lease" in a.events("standby")[-1]["reason"]
    locks.holders.pop("leader", None)  # the lease ran out (or a released it on stepping down)
    b.cycles(1)
    assert b.controller.leader and b.events("leader")
    a.cycles(1)
    assert not a.controller.leader
    assert a.controller.metrics.leader is False and b.controller.metrics.leader is True


def test_a_leader_that_loses_its_lease_mid_plan_starts_no_further_step() -> None:
    hv, clock = crowded_h0()
    locks = FakeLocks()
    run = Run(hv, clock, locks, settle=1)
    hv.before[("migrate", "a-0")] = lambda: locks.lost.add("m1")
    hv.before[("migrate", "b-0")] = lambda: locks.lost.add("m1")
    run.cycles(2)
    events = run.events()
    migrate = [i for i, e in enumerate(events) if e["event"] == "step" and e["op"] == "migrate"]
    assert len(migrate) == 1
    after = [e["event"] for e in events[migrate[0] + 1:]]
    standby = after.index("standby")
    assert "step" not in after[:after.index("leader") if "leader" in after else len(after)]
    assert after[standby - 1] == "applied" and events[migrate[0] + 1 + standby - 1]["stopped"]
    assert "lease" in events[migrate[0] + 1 + standby]["reason"]


def test_leadership_on_the_file_backend_passes_to_the_standby_when_the_leader_stops(tmp_path: Path) -> None:
    hv = MemoryHypervisor("lab", inventory_of().hosts, [managed("a-0", "h0", "a", 0.5, 0.5)])
    url = f"file://{tmp_path}"

    def run(member: str) -> Controller:
        clock = FakeClock()
        opts = RunOptions(INTERVAL, RebalanceOptions(0), sample=2.5)
        return Controller("lab", hv, opts,
                          leader_lock=lambda: ClusterLock(url, "lab", member, name=leader_lock_name("lab")),
                          cluster_lock=lambda: ClusterLock(url, "lab", member),
                          events=EventLog(io.StringIO(), member, clock.time), metrics=ControllerMetrics("lab"),
                          clock=clock)

    a, b = run("a@t:1"), run("b@t:2")
    a.cycle()
    b.cycle()
    assert a.leader and not b.leader
    a.stop.set()
    a.run()
    b.cycle()
    assert b.leader
    b.stop.set()
    b.run()


# ---------------------------------------------------------------------------------------------- metrics


def test_metrics_show_needs_caps_use_and_yields_of_the_leader() -> None:
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks(), settle=1)
    run.cycles(4)
    server = MetricsServer(run.controller.metrics, 0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    assert 'vcsched_leader{cluster="lab"} 1.0' in body
    for name in ("vcsched_vm_need_cores", "vcsched_vm_estimated_need_cores", "vcsched_vm_cap_cores",
                 "vcsched_vm_used_cores", "vcsched_vm_yield", "vcsched_cluster_min_yield",
                 "vcsched_cluster_avg_yield", "vcsched_interval_duration_seconds"):
        assert f'{name}{{cluster="lab"' in body, name
    assert 'vcsched_migrated_bytes_total{cluster="lab"} 1.34217728e+08' in body
    assert 'vcsched_plans_applied_total{cluster="lab",outcome="ok"}' in body


def scrape(metrics: ControllerMetrics) -> str:
    server = MetricsServer(metrics, 0)
    try:
        return str(urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode())
    finally:
        server.close()


def test_metrics_count_the_intervals_a_host_stays_down_and_reset_when_it_answers() -> None:
    hv, clock = crowded_h0()
    clock.at.append((25.0, lambda: hv.down.__setitem__("h1", "connection refused")))
    clock.at.append((65.0, lambda: hv.down.pop("h1")))
    run = Run(hv, clock, FakeLocks(), budget=0)
    seen = []
    for _ in range(9):  # ticks at 0, 10, ..., 80: h1 is found down by the ticks at 30, 40, 50, 60
        run.controller.cycle()
        seen.append({h.host: (h.up, h.down_intervals) for h in run.controller.metrics.hosts}["h1"])
    assert seen == [(True, 0)] * 3 + [(False, 1), (False, 2), (False, 3), (False, 4), (True, 0), (True, 0)], seen
    clock.at.append((95.0, lambda: hv.down.__setitem__("h1", "connection refused")))
    run.cycles(2)  # ticks at 90 (up) and 100 (down)
    body = scrape(run.controller.metrics)
    assert 'vcsched_host_up{cluster="lab",host="h1"} 0.0' in body
    assert 'vcsched_host_down_intervals{cluster="lab",host="h1"} 1.0' in body  # counted afresh, not 5
    assert 'vcsched_host_up{cluster="lab",host="h0"} 1.0' in body


def test_metrics_count_steps_by_kind_and_outcome_from_zero() -> None:
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks(), settle=1)
    body = scrape(run.controller.metrics)  # before anything ran: every pair at 0, so increase() sees the first
    assert 'vcsched_steps_total{cluster="lab",op="migrate",outcome="failed"} 0.0' in body
    hv.fail[("migrate", "a-0")] = "host h0: cannot migrate 'a-0': operation failed"
    hv.fail[("migrate", "b-0")] = "host h0: cannot migrate 'b-0': operation failed"
    run.cycles(6)
    steps = run.events("step")
    failed = [s for s in steps if s["op"] == "migrate" and s["outcome"] == "failed"]
    assert failed, [(s["op"], s["outcome"]) for s in steps]
    body = scrape(run.controller.metrics)
    assert f'vcsched_steps_total{{cluster="lab",op="migrate",outcome="failed"}} {float(len(failed))}' in body
    done = sum(1 for s in steps if s["op"] == "set-cap" and s["outcome"] == "done")
    assert done and f'vcsched_steps_total{{cluster="lab",op="set-cap",outcome="done"}} {float(done)}' in body


def test_metrics_show_vms_in_doubt_and_floors_and_a_standby_shows_neither() -> None:
    from vcsched.inventory import InDoubt

    hv, clock = crowded_h0()
    a = hv.vms["a-0"]
    assert a.meta is not None
    hv.vms["a-0"] = dataclasses.replace(a, meta=dataclasses.replace(a.meta, min_yield=0.4))
    real = hv.inventory

    def with_a_doubt(hosts: Any = None) -> Any:
        inv = real(hosts)
        return dataclasses.replace(inv, in_doubt=(InDoubt("x", "u-1", ("h0", "h1"), ("running", "running")),
                                                  InDoubt("y", "u-2", ("h0", "h1"), ("running", "paused"),
                                                          resolved="removed the paused copy on h1")))

    hv.inventory = with_a_doubt  # type: ignore[method-assign]
    locks = FakeLocks()
    run = Run(hv, clock, locks, min_yield_floor=0.25)
    run.cycles(2)
    body = scrape(run.controller.metrics)
    assert 'vcsched_vms_in_doubt{cluster="lab"} 1.0' in body  # the resolved one is not counted
    assert 'vcsched_vm_min_yield{cluster="lab",host="h0",vc="a",vm="a-0"} 0.4' in body
    assert 'vcsched_vm_min_yield{cluster="lab",host="h0",vc="b"' not in body  # no floor recorded: no series
    assert 'vcsched_cluster_min_yield_floor{cluster="lab"} 0.25' in body
    run.controller._step_down("test: lease lost")
    body = scrape(run.controller.metrics)
    assert 'vcsched_leader{cluster="lab"} 0.0' in body
    assert "vcsched_vms_in_doubt{" not in body and "vcsched_host_up{" not in body
    assert "vcsched_vm_min_yield{" not in body


def test_every_event_has_its_name_a_unix_time_and_the_member() -> None:
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks())
    run.cycles(3)
    for e in run.events():
        assert isinstance(e["event"], str) and e["member"] == "m1"
        assert clock.start <= e["time"] <= clock.start + 30 + 1e-6


def test_run_options_out_of_range_are_bad_input() -> None:
    from vcsched.errors import InputError

    with pytest.raises(InputError, match="--interval"):
        RunOptions(0, RebalanceOptions(0))
    with pytest.raises(InputError, match="--window"):
        RunOptions(1, RebalanceOptions(0), window=-1)


def test_a_hung_host_costs_its_timeout_once_an_interval_not_at_every_sampling_round() -> None:
    """A host that does not answer costs ``host_timeout`` each time it is read.  Read again at every sampling
    round (4 a 10 s interval here), it stretched each interval to ~30 s; read once, at the interval, an interval
    lasts 10 s plus one timeout, and the host is still found down at every interval (failure detection)."""
    host_timeout = 5.0
    hv, clock = crowded_h0()
    asked: list[float] = []

    class Hung(type(hv)):  # type: ignore[misc]
        def inventory(self, hosts: Any = None) -> Any:
            if hosts is None or "h1" in hosts:
                asked.append(clock.monotonic())
                clock.advance(host_timeout)  # the read waits for host_timeout, then counts h1 down
            return super().inventory(hosts)

    hv.__class__ = Hung
    hv.down["h1"] = f"host h1: did not answer within {host_timeout:g} s (host_timeout)"
    run = Run(hv, clock, FakeLocks(), budget=0)
    start = clock.monotonic()
    run.cycles(4)
    took = clock.monotonic() - start
    assert len(asked) == 4, asked  # once an interval
    assert took <= 4 * (INTERVAL + host_timeout) + 1e-6, took
    assert {h.host: h.down_intervals for h in run.controller.metrics.hosts}["h1"] == 4


def test_the_leader_publishes_what_each_vm_used_over_its_last_sample_for_status() -> None:
    """acting/window.py: after each interval, the VMs' last measured use (what `status` shows without --sample)."""
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks(), settle=1)
    published: list[dict[str, float | None]] = []
    run.controller.window = lambda used: published.append(dict(used))
    run.cycles(3)
    assert published and set(published[-1]) == {v.name for v in hv.inventory().managed()}
    assert any(u is not None and u > 0 for u in published[-1].values())
