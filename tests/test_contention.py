"""Starvation is not low demand: the censored need estimate, driven through the controller's deciding on synthetic
traces (no lab).  docs/contention.md; the estimate's rules in vcsched.control.observe."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import pytest

from acting.executor import apply_plan
from acting.sampling import CpuSampler
from hypervisor.base import CpuCounters
from tests.builders import inventory_of, memory_hypervisor
from tests.fake_load import FakeClock
from vcsched.control.observe import (
    MEASURED,
    STARVED,
    Sample,
    estimate_all,
    estimate_need,
    is_censored,
)
from vcsched.control.rebalance import RebalanceOptions, Rebalancer
from vcsched.inventory import VmMeta, VmState

MiB = 1 << 20
SAMPLE_S, PER_INTERVAL = 1.0, 5  # five one-second samples per interval, a window of one interval

#: (used, waited) cores one VM gets in one second at fake time ``t``, given its demand and cap.
Trace = Callable[[float, float], tuple[float, float]]


def fl(name: str, host: str, need: float, cap: float, min_yield: float = 0.8) -> VmState:
    return VmState(name, host, 1, 128 * MiB, True, VmMeta("fl", need, 128 * MiB, 1, min_yield=min_yield), cap)


def starved(share: float, rng: random.Random) -> Callable[[float, float], tuple[float, float]]:
    """A VM that wants ``min(demand, cap)`` and gets ``share`` of it (the host's CPUs are taken by a busy guest
    vcsched does not manage); the rest of the second its runnable vCPU waits in the run queue."""
    def trace(demand: float, cap: float) -> tuple[float, float]:
        want = min(demand, cap)
        got = want * share * rng.uniform(0.85, 1.15)
        return got, want - got

    return trace


def quiet(rng: random.Random) -> Callable[[float, float], tuple[float, float]]:
    def trace(demand: float, cap: float) -> tuple[float, float]:
        got = min(demand * rng.uniform(0.95, 1.05), cap)
        return got, 0.002  # a host with nothing else to run: almost no run-queue delay
    return trace


def run_intervals(vms: list[VmState], demand: dict[str, float], traces: dict[str, Callable[[float, float],
                  tuple[float, float]]], intervals: int, measure_wait: bool = True) -> list[dict[str, float | None]]:
    """The controller's deciding, interval after interval: samples -> estimate (previous: the last planned needs)
    -> Rebalancer.decide -> its re-cap applied to an in-memory hypervisor.  Returns each interval's caps."""
    hv = memory_hypervisor(inventory_of(vms, n_hosts=2, cores=1))
    rebalancer = Rebalancer(RebalanceOptions(0, settle=1))
    windows: dict[str, deque[Sample]] = {v.name: deque(maxlen=PER_INTERVAL) for v in vms}
    planned: dict[str, float] = {}
    history = []
    t = 0.0
    for _ in range(intervals):
        inventory = hv.inventory()
        for v in inventory.managed():
            assert v.cap_cores is not None
            for _ in range(PER_INTERVAL):
                t += SAMPLE_S
                used, wait = traces[v.name](demand[v.name], v.cap_cores)
                windows[v.name].append(Sample(t, SAMPLE_S, used, v.cap_cores, 1, False, 0.0,
                                              wait if measure_wait else None))
        estimates = estimate_all(inventory, {k: list(w) for k, w in windows.items()}, planned)
        planned = {k: e.estimate for k, e in estimates.items()}
        decision = rebalancer.decide(inventory, planned, t)
        if decision.plan is not None and decision.plan.steps:
            assert apply_plan(hv, decision.plan).ok
        history.append({v.name: v.cap_cores for v in hv.inventory().managed()})
    return history


def test_a_starved_vm_whose_demand_stays_constant_never_has_its_cap_lowered_over_100_intervals() -> None:
    """The downward spiral of issue 39: fl-0 wants its whole 0.4 core but gets a quarter of it while a busy guest
    holds the host's CPU.  Read as demand, that lowers its cap (0.4 -> 0.28 on the lab, below its floor); read
    as "needs at least this", its cap stays."""
    rng = random.Random(39)
    vms = [fl("fl-0", "h0", 0.4, 0.4), fl("fl-1", "h1", 0.4, 0.4)]
    history = run_intervals(vms, {"fl-0": 0.4, "fl-1": 0.4}, {"fl-0": starved(0.25, rng), "fl-1": starved(0.5, rng)},
                            100)
    for caps in history:
        for name in ("fl-0", "fl-1"):
            cap = caps[name]
            assert cap is not None and cap >= 0.4 - 1e-9, (name, history.index(caps), cap)


def test_the_same_starved_trace_without_delay_counters_is_read_as_low_demand() -> None:
    """Where a host does not report vcpu.N.delay the starvation cannot be seen (docs/contention.md): the same trace
    then lowers the cap.  This is why the sampler names a missing signal instead of guessing."""
    rng = random.Random(39)
    vms = [fl("fl-0", "h0", 0.4, 0.4), fl("fl-1", "h1", 0.4, 0.4)]
    history = run_intervals(vms, {"fl-0": 0.4, "fl-1": 0.4}, {"fl-0": starved(0.25, rng), "fl-1": starved(0.5, rng)},
                            10, measure_wait=False)
    final = history[-1]["fl-0"]
    assert final is not None and final < 0.4 * 0.8


def test_a_vm_that_really_wants_less_is_still_lowered_when_nothing_waits() -> None:
    rng = random.Random(7)
    vms = [fl("fl-0", "h0", 0.4, 0.4), fl("fl-1", "h1", 0.4, 0.4)]
    history = run_intervals(vms, {"fl-0": 0.1, "fl-1": 0.4}, {"fl-0": quiet(rng), "fl-1": quiet(rng)}, 5)
    final = history[-1]["fl-0"]
    assert final is not None and final < 0.2


def samples(used: list[float], cap: float, waited: float | None, throttled: float | None = 0.0) -> list[Sample]:
    return [Sample(float(i), 1.0, u, cap, 1, False, throttled, waited) for i, u in enumerate(used)]


def test_a_sample_that_waited_or_was_throttled_is_censored_and_a_plain_one_is_not() -> None:
    assert is_censored(Sample(0, 1, 0.2, 0.8, 1, False, 0.0, 0.3))  # waited 0.3 core
    assert is_censored(Sample(0, 1, 0.5, 0.8, 1, False, 0.7, 0.0))  # throttled in 70 % of its periods
    assert is_censored(Sample(0, 1, 0.8, 0.8))  # used its cap
    assert not is_censored(Sample(0, 1, 0.5, 0.8, 1, False, 0.1, 0.01))
    assert not is_censored(Sample(0, 1, 0.5, 0.8))  # nothing measured beyond used: it shows demand


def test_a_starved_estimate_keeps_the_declared_need_is_censored_and_has_no_confidence() -> None:
    vm = fl("a", "h0", 0.6, 0.6)
    e = estimate_need(vm, samples([0.15, 0.2, 0.18, 0.16, 0.2], 0.6, waited=0.4))
    assert e.basis == STARVED and e.censored
    assert e.estimate == pytest.approx(0.6) and e.confidence == 0.0
    assert e.to_dict()["censored"] is True and e.to_dict()["waited_cores"] == pytest.approx(0.4)


def test_a_starved_vm_that_uses_more_than_its_estimate_raises_it_to_that_lower_bound() -> None:
    e = estimate_need(fl("a", "h0", 0.3, 0.8), samples([0.5, 0.52, 0.5, 0.51, 0.5], 0.8, waited=0.3))
    assert e.basis == STARVED and e.estimate == pytest.approx(0.61)  # 0.52 * 1.1 + 0.03 = 0.602 -> 0.61


def test_lowering_needs_enough_samples_that_did_not_wait() -> None:
    vm = fl("a", "h0", 0.6, 0.6)
    mixed = samples([0.2, 0.2, 0.2, 0.2, 0.2, 0.2], 0.6, waited=None)
    two_clean = [replace(s, waited_cores=0.3 if i < 4 else 0.0) for i, s in enumerate(mixed)]
    assert estimate_need(vm, two_clean).basis == STARVED
    three_clean = [replace(s, waited_cores=0.3 if i < 3 else 0.0) for i, s in enumerate(mixed)]
    e = estimate_need(vm, three_clean)
    assert e.basis == MEASURED and not e.censored and e.estimate == pytest.approx(0.25)  # 0.2 * 1.1 + 0.03
    assert e.confidence == pytest.approx(0.5)  # three of six samples bound the need from both sides


class Counting:
    """A hypervisor answering cumulative counters VM by VM from a script (what libvirt would report)."""

    def __init__(self, inv_vms: list[VmState], readings: dict[str, list[CpuCounters]]) -> None:
        self.hv = memory_hypervisor(inventory_of(inv_vms))
        self.readings = {k: deque(v) for k, v in readings.items()}

    def inventory(self, hosts: object = None) -> object:
        return self.hv.inventory()

    def cpu_counters(self, host: str, vm: str) -> CpuCounters | None:
        return self.readings[vm].popleft()


def test_the_sampler_turns_counters_into_throttled_and_waited_shares_and_names_what_is_missing() -> None:
    clock = FakeClock()
    vms = [fl("a", "h0", 0.5, 0.5), fl("b", "h1", 0.5, 0.5)]
    hv = Counting(vms, {
        "a": [CpuCounters(0, 0, 0, 0, 0, None), CpuCounters(int(0.3e9), 0, 4, 10, int(0.2e9), None)],
        "b": [CpuCounters(0), CpuCounters(int(0.5e9))]})
    sampler = CpuSampler(10.0, clock)
    sampler.sample(hv)  # type: ignore[arg-type]
    clock.advance(1.0)
    sampler.sample(hv)  # type: ignore[arg-type]
    a, b = sampler.samples()["a"][0], sampler.samples()["b"][0]
    assert a.used_cores == pytest.approx(0.3) and a.throttled == pytest.approx(0.4)
    assert a.waited_cores == pytest.approx(0.2)
    assert b.throttled is None and b.waited_cores is None
    assert sampler.missing == {"h0": ("wait",), "h1": ("delay", "throttled", "wait")}


def test_observe_shows_used_throttled_waited_and_a_censored_estimate_as_a_lower_bound() -> None:
    from rich.console import Console

    import cli.observe as observe
    from cli import app

    e = estimate_need(fl("a", "h0", 0.6, 0.6), samples([0.15, 0.2, 0.18, 0.16, 0.2], 0.6, waited=0.4))
    out = {"cluster": "lab", "window": 5.0, "sample": 1.0, "hosts_down": [], "apply": {},
           "vms": [{**e.to_dict(), "vc": "fl"}], "signals_missing": {"h0": ["throttled", "wait"]},
           "machine": {"cpu_pressure_some": 0.5, "steal_cores": None}}
    console = Console(record=True, width=200)
    saved, observe.console = app.console, console  # type: ignore[attr-defined]
    try:
        observe._render(out)
    finally:
        observe.console = saved  # type: ignore[attr-defined]
    text = console.export_text()
    assert "≥0.600" in text and "starved" in text and "0.400" in text
    assert "host h0: not measured there: throttled, wait" in text
    assert "some task waited for a CPU 50% of the time" in text


def test_waiting_is_the_run_queue_delay_less_the_time_its_own_cap_throttled_it() -> None:
    """vcpu.N.delay also counts the wait of a throttled vCPU for its next period: that part is the cap's."""
    clock = FakeClock()
    vms = [fl("a", "h0", 0.5, 0.5)]
    hv = Counting(vms, {"a": [CpuCounters(0, 0, 0, 0, 0), CpuCounters(int(0.3e9), int(0.5e9), 9, 10, int(0.6e9))]})
    sampler = CpuSampler(10.0, clock)
    sampler.sample(hv)  # type: ignore[arg-type]
    clock.advance(1.0)
    sampler.sample(hv)  # type: ignore[arg-type]
    assert sampler.samples()["a"][0].waited_cores == pytest.approx(0.1)


# ---- one yield: cap over the estimated need, everywhere (vcsched.control.status.vm_yield) ------------------------


def _gold_and_web() -> tuple[list[VmState], dict[str, object]]:
    vms = [VmState("gold-0", "h0", 1, 128 * MiB, True, VmMeta("gold", 1.0, 128 * MiB, 1, 0.6), 0.5),
           VmState("web-0", "h0", 1, 128 * MiB, True, VmMeta("web", 0.4, 128 * MiB, 1), 0.3)]
    starved_gold = estimate_need(vms[0], samples([0.2, 0.21, 0.2, 0.22, 0.2], 0.5, waited=0.3), previous=0.8)
    measured_web = estimate_need(vms[1], samples([0.2, 0.2, 0.21, 0.2, 0.2], 0.3, waited=0.0))
    return vms, {"gold-0": starved_gold, "web-0": measured_web}


def test_the_yield_is_cap_over_the_estimate_and_an_upper_bound_when_the_estimate_is_censored() -> None:
    from vcsched.control.status import vm_yield

    vms, est = _gold_and_web()
    gold, web = vm_yield(vms[0], est["gold-0"]), vm_yield(vms[1], est["web-0"])  # type: ignore[arg-type]
    assert gold is not None and web is not None
    assert gold.value == pytest.approx(0.5 / 0.8) and gold.upper_bound and gold.shown() == "≤0.625"
    assert gold.declared_cores == 1.0 and gold.estimated_cores == pytest.approx(0.8)
    assert web.value == 1.0 and not web.upper_bound  # 0.3 over 0.26 measured: all it needs
    declared = vm_yield(vms[0])
    assert declared is not None and declared.value == 0.5 and not declared.upper_bound  # no estimate: declared


def test_status_top_and_the_controllers_metrics_give_one_number_for_the_same_estimates() -> None:
    from acting.metrics import ControllerMetrics
    from cli.status import status_dict
    from vcsched.control.top import last_estimates, top_view

    vms, est = _gold_and_web()
    inv = inventory_of(vms, n_hosts=1, cores=1)
    events = [{"event": "observe", "vms": [e.to_dict() for e in est.values()]}]  # type: ignore[attr-defined]
    read_back = last_estimates(events)
    assert read_back["gold-0"].censored and read_back["gold-0"].estimate == pytest.approx(0.8)
    doc = status_dict(inv, {}, 0.0, estimates=read_back)
    status_yields = {v["name"]: (v["predicted_yield"], v["yield_upper_bound"]) for v in doc["vms"]}
    top = {r.name: (r.yield_, r.yield_upper_bound) for r in top_view(inv, "yield", {}, est, []).vms}  # type: ignore[arg-type]
    assert status_yields == top == {"gold-0": (pytest.approx(0.625), True), "web-0": (1.0, False)}

    from acting.controller import Controller  # the controller's _publish: VmMetrics from the same function
    published = ControllerMetrics("lab")

    class Host:
        _power_metrics = Controller._power_metrics  # the real one: without power saving it publishes nothing

        def __init__(self) -> None:
            self.metrics, self.down_intervals, self.sampler = published, {}, CpuSampler(10.0)
            self.window, self.power_saving = None, None

    Controller._publish(Host(), inv, est)  # type: ignore[arg-type]
    assert {v.vm: (v.yield_, v.upper_bound) for v in published.vms} == status_yields


def test_a_recommendations_predicted_yields_are_upper_bounds_for_vms_with_a_censored_need() -> None:
    from vcsched.control.observe import cap_plan
    from vcsched.plans.reasons import effect

    vms, est = _gold_and_web()
    inv = inventory_of(vms, n_hosts=1, cores=1)
    needs = {k: e.estimate for k, e in est.items()}  # type: ignore[attr-defined]
    got = effect(cap_plan(inv, {"gold-0": 0.6}), inv, needs, ["gold-0"]).to_dict()
    assert got["censored_vms"] == ["gold-0"] and got["per_vm"]["gold-0"]["yield_upper_bound"]
    assert got["min_yield_before_upper_bound"]  # gold-0's 0.5 / 0.8 is the lowest


def test_the_controller_never_lowers_a_starved_vms_cap_over_100_intervals() -> None:
    """The whole loop in memory: the sampler reads delay from the fake hypervisor (what a VM wanted and did not
    get because an unmanaged uncapped busy VM shares its host's core), the controller estimates and re-caps."""
    from tests.fake_load import FakeLocks, LoadedHypervisor, busy
    from tests.test_controller import Run

    clock = FakeClock()
    hog = VmState("hog", "h0", 2, 128 * MiB, True, None, None)  # not managed, uncapped, wants 2 cores
    inv = inventory_of([fl("fl-0", "h0", 0.4, 0.4), fl("fl-1", "h1", 0.4, 0.4), hog], n_hosts=2, cores=1)
    hv = LoadedHypervisor("lab", inv.hosts, inv.vms, clock, {"fl-0": busy(0.4), "fl-1": busy(0.4), "hog": busy(2.0)})
    run = Run(hv, clock, FakeLocks(), probe_seconds=0.0, budget=0)
    run.cycles(100)
    caps = [(s["vm"], s["cap_cores"]) for s in run.events("step") if s["vm"] == "fl-0" and s.get("cap_cores")]
    assert all(cap >= 0.4 - 1e-9 for _, cap in caps), caps
    assert hv.vms["fl-0"].cap_cores == pytest.approx(0.4)
    last = run.events("observe")[-1]["vms"]
    fl0 = next(v for v in last if v["vm"] == "fl-0")
    assert fl0["censored"] and fl0["basis"] == STARVED and fl0["waited_cores"] > 0.2  # gets 0.4 / 2.4 of a core
