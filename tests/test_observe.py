"""Need discovery (vcsched.control.observe): what the estimate says for each kind of window, and the probe's caps."""

from __future__ import annotations

from pathlib import Path

import pytest

from acting.executor import apply_plan
from hypervisor.domain_xml import metadata_xml, parse_metadata, stamp_migrated_at
from tests.builders import inventory_of, managed, memory_hypervisor
from vcsched.control.observe import (
    MEASURED,
    NO_SAMPLES,
    PROBE_SATURATED,
    PROBED,
    SATURATED,
    SQUEEZED,
    ObserveParams,
    Sample,
    cap_plan,
    estimate_need,
    is_saturated,
    percentile,
    probe_caps,
    record_plan,
)
from vcsched.errors import InputError
from vcsched.inventory import VmMeta


def window(used: list[float], cap: float | None, probe: bool = False, start: float = 0.0) -> list[Sample]:
    return [Sample(start + i, 1.0, u, cap, 1, probe) for i, u in enumerate(used)]


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    assert percentile([5.0], 90) == 5.0


def test_a_sample_at_its_cap_less_the_emulator_tolerance_is_saturated() -> None:
    assert is_saturated(Sample(0, 1, 0.495, 0.5))
    assert not is_saturated(Sample(0, 1, 0.4, 0.5))
    assert is_saturated(Sample(0, 1, 0.995, None, vcpus=1))  # uncapped: saturates at its vCPUs


def test_a_vm_below_its_cap_reveals_its_need_with_headroom() -> None:
    e = estimate_need(managed("a", "h0", "a", 1.0, 0.8), window([0.3, 0.31, 0.29, 0.3, 0.3], 0.8))
    assert e.basis == MEASURED and not e.saturated
    assert e.estimate == pytest.approx(0.37)  # p90 0.306 * 1.1 + 0.03 = 0.3666, rounded up to 0.01
    assert e.confidence == 1.0
    assert e.declared == 1.0


def test_a_vm_at_its_full_estimate_is_a_lower_bound_taken_as_its_declared_need() -> None:
    e = estimate_need(managed("a", "h0", "a", 0.9, 0.4), window([0.4] * 5, 0.4), previous=0.4)
    assert e.basis == SATURATED and e.saturated and e.wants_probe
    assert e.estimate == pytest.approx(0.9)  # max(0.4 * 1.1 + 0.03, declared 0.9)
    assert e.confidence == 0.0


def test_a_saturated_vm_beyond_its_declared_need_grows_by_the_headroom() -> None:
    e = estimate_need(managed("a", "h0", "a", 0.3, 0.5), window([0.5] * 5, 0.5), previous=0.5)
    assert e.basis == SATURATED
    assert e.estimate == pytest.approx(0.58)


def test_an_idle_vm_whose_bursts_touch_its_cap_is_measured_not_saturated() -> None:
    """A VM below its cap fills a sample only when a burst happens to: one such sample among the recent ones (the
    latest half of the window, at least three) is not saturation, whether it is the latest or not, so its
    estimate follows what it used instead of jumping to its declared core."""
    vm = managed("a", "h0", "a", 1.0, 0.21)
    for used in ([0.15, 0.16, 0.21, 0.14], [0.15, 0.16, 0.15, 0.21], [0.21, 0.14, 0.15, 0.21],
                 [0.21, 0.21, 0.14, 0.15, 0.14, 0.21]):
        e = estimate_need(vm, window(used, 0.21), previous=0.21)
        assert e.basis == MEASURED and not e.saturated, used
        assert e.estimate < 0.3, used


def test_a_busy_vm_is_saturated_through_one_slow_sample() -> None:
    """Two of the three recent samples at the cap, the latest among them: saturated, even when the machine made
    one sample fall short of the cap (a busy lab guest capped at 0.32 measured 0.30 in such a sample)."""
    vm = managed("a", "h0", "a", 1.0, 0.32)
    for used in ([0.33, 0.33, 0.30, 0.33], [0.15, 0.30, 0.33, 0.33], [0.15, 0.33, 0.29, 0.33]):
        e = estimate_need(vm, window(used, 0.32), previous=0.32)
        assert e.basis == SATURATED and e.estimate == 1.0, used


def test_a_vm_that_just_became_busy_is_saturated_once_its_recent_samples_are_at_the_cap() -> None:
    """Busy in the last sample only: measured, its cap rises by the headroom, and the next interval sees it
    saturated; busy in the last two of four: saturated at once."""
    vm = managed("a", "h0", "a", 1.0, 0.21)
    e = estimate_need(vm, window([0.15, 0.14, 0.15, 0.21], 0.21), previous=0.21)
    assert e.basis == MEASURED and e.estimate == pytest.approx(0.25)  # p90 0.192 * 1.1 + 0.03 = 0.2412 -> 0.25
    e = estimate_need(vm, window([0.27, 0.27, 0.27], 0.27), previous=0.27)
    assert e.basis == SATURATED and e.estimate == 1.0
    e = estimate_need(vm, window([0.15, 0.14, 0.21, 0.21], 0.21), previous=0.21)
    assert e.basis == SATURATED and e.estimate == 1.0
    # A long window (observe --window 60): its recent half counts.
    e = estimate_need(vm, window([0.15] * 15 + [0.21] * 5, 0.21), previous=0.21)
    assert e.basis == SATURATED and e.estimate == 1.0
    e = estimate_need(vm, window([0.15] * 16 + [0.21] * 4, 0.21), previous=0.21)
    assert e.basis == MEASURED


def test_a_squeezed_vm_keeps_its_estimate() -> None:
    """Capped at half its estimate by a yield of 0.5, it uses all of it: that says nothing new about its need."""
    e = estimate_need(managed("a", "h0", "a", 1.0, 0.3), window([0.3] * 5, 0.3), previous=0.6)
    assert e.basis == SQUEEZED and e.saturated and not e.wants_probe
    assert e.estimate == 0.6


def test_a_probe_that_the_vm_does_not_fill_reveals_its_need() -> None:
    samples = window([0.2] * 6, 0.2) + window([0.55, 0.56], 0.9, probe=True, start=6)
    e = estimate_need(managed("a", "h0", "a", 1.0, 0.2), samples, previous=0.2)
    assert e.basis == PROBED
    assert e.estimate == pytest.approx(0.65)  # p90 of what it used under the probe: 0.559 * 1.1 + 0.03


def test_a_probe_that_the_vm_fills_too_gives_a_lower_bound_at_the_probe_cap() -> None:
    samples = window([0.2] * 4, 0.2) + window([0.6] * 4, 0.6, probe=True, start=4)
    e = estimate_need(managed("a", "h0", "a", 0.3, 0.2), samples, previous=0.2)
    assert e.basis == PROBE_SATURATED and e.wants_probe
    assert e.estimate == pytest.approx(0.69)


def test_too_few_samples_keep_the_previous_estimate_with_no_confidence() -> None:
    e = estimate_need(managed("a", "h0", "a", 0.5, 0.5), window([0.1, 0.1], 0.5), previous=0.4)
    assert (e.basis, e.estimate, e.confidence) == (NO_SAMPLES, 0.4, 0.0)


def test_a_small_change_stays_inside_the_dead_band() -> None:
    e = estimate_need(managed("a", "h0", "a", 0.5, 0.8), window([0.45] * 5, 0.8), previous=0.52)
    assert e.raw == pytest.approx(0.53) and e.estimate == 0.52


def test_the_estimate_stays_within_the_vcpus_and_above_the_smallest_cap() -> None:
    hi = estimate_need(managed("a", "h0", "a", 1.0, 1.0), window([0.99] * 5, None), previous=1.0)
    assert hi.estimate == 1.0
    lo = estimate_need(managed("a", "h0", "a", 1.0, 1.0), window([0.0] * 5, 1.0))
    assert lo.estimate == pytest.approx(0.03)


def test_a_mixed_window_lowers_only_once_the_busy_past_has_left_it() -> None:
    busy_then_idle = window([0.9, 0.9, 0.9, 0.05, 0.05, 0.05], 1.0)
    e = estimate_need(managed("a", "h0", "a", 1.0, 1.0), busy_then_idle, previous=1.0)
    assert e.basis == MEASURED and e.estimate == 1.0  # the percentile still sees the busy samples
    idle = estimate_need(managed("a", "h0", "a", 1.0, 1.0), window([0.05] * 5, 1.0), previous=1.0)
    assert idle.estimate == pytest.approx(0.09)


def test_unmanaged_vms_have_no_estimate() -> None:
    from vcsched.inventory import VmState

    with pytest.raises(InputError, match="not managed"):
        estimate_need(VmState("x", "h0", 1, 1 << 27, True), [])


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(InputError, match="percentile"):
        ObserveParams(percentile=0)
    with pytest.raises(InputError, match="headroom"):
        ObserveParams(headroom=-0.1)


# ---------------------------------------------------------------------------------------------- the probe


def test_a_probe_shares_the_hosts_uncapped_capacity_among_the_vms_that_want_it() -> None:
    inv = inventory_of([managed("a", "h0", "a", 1.0, 0.2), managed("b", "h0", "b", 1.0, 0.2),
                        managed("c", "h0", "c", 1.0, 0.2)])
    est = {"a": estimate_need(inv.vm("a"), window([0.2] * 5, 0.2), 0.2),  # type: ignore[arg-type]
           "b": estimate_need(inv.vm("b"), window([0.2] * 5, 0.2), 0.2),  # type: ignore[arg-type]
           "c": estimate_need(inv.vm("c"), window([0.05] * 5, 0.2), 0.2)}  # type: ignore[arg-type]
    caps = probe_caps(inv, est)
    assert set(caps) == {"a", "b"}  # c uses less than its cap: nothing to learn
    assert caps["a"] == pytest.approx(0.4) and caps["b"] == pytest.approx(0.4)
    assert sum(caps.values()) + 0.2 <= 1.0 + 1e-9


def test_no_probe_on_a_host_whose_caps_fill_its_cores() -> None:
    inv = inventory_of([managed("a", "h0", "a", 1.0, 0.5), managed("b", "h0", "b", 1.0, 0.5)])
    est = {v: estimate_need(inv.vm(v), window([0.5] * 5, 0.5), 0.5) for v in ("a", "b")}  # type: ignore[arg-type]
    assert probe_caps(inv, est) == {}


def test_a_probe_and_putting_caps_back_go_through_the_executor() -> None:
    inv = inventory_of([managed("a", "h0", "a", 1.0, 0.2)])
    hv = memory_hypervisor(inv)
    assert apply_plan(hv, cap_plan(inv, {"a": 0.7})).ok
    assert hv.vms["a"].cap_cores == pytest.approx(0.7)
    assert apply_plan(hv, cap_plan(hv.inventory(), {"a": 0.2})).ok
    assert hv.vms["a"].cap_cores == pytest.approx(0.2)


def test_recording_writes_the_estimates_as_needs_with_set_need_steps() -> None:
    inv = inventory_of([managed("a", "h0", "a", 1.0, 0.8), managed("b", "h1", "b", 0.5, 0.5)])
    hv = memory_hypervisor(inv)
    ests = [estimate_need(inv.vm("a"), window([0.3] * 5, 0.8)),  # type: ignore[arg-type]
            estimate_need(inv.vm("b"), window([0.1, 0.1], 0.5))]  # type: ignore[arg-type]  # too few: unchanged
    plan = record_plan(inv, ests)
    assert [(s.op, s.vm) for s in plan.steps] == [("set-need", "a")]
    assert apply_plan(hv, plan).ok
    assert hv.vms["a"].meta.cpu_need_cores == pytest.approx(0.36)  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------- metadata


def test_migrated_at_round_trips_through_the_metadata_and_old_metadata_still_parses() -> None:
    meta = VmMeta("web", 0.5, 1 << 27, 1, 0.3, migrated_at=1_700_000_123.25)
    assert parse_metadata(metadata_xml(meta)) == meta
    old = '<vm cluster="web" cpu_need_cores="0.5" memory_bytes="134217728" vcpus="1"/>'
    assert parse_metadata(old) == VmMeta("web", 0.5, 1 << 27, 1)


def test_a_migrating_domain_xml_is_stamped_with_the_time_of_its_move() -> None:
    meta = metadata_xml(VmMeta("web", 0.5, 1 << 27, 1))
    xml = f"<domain type='qemu'><name>web-0</name><metadata>{meta}</metadata></domain>"
    stamped = stamp_migrated_at(xml, 1234.5)
    import xml.etree.ElementTree as ET

    from vcsched.inventory import METADATA_NS

    el = ET.fromstring(stamped).find(f"metadata/{{{METADATA_NS}}}vm")
    assert el is not None and el.get("migrated_at") == "1234.5"
    assert stamp_migrated_at("<domain><name>x</name></domain>", 1.0) == "<domain><name>x</name></domain>"


# ---------------------------------------------------------------------------------------------- vcsched observe


def test_observe_samples_probes_puts_caps_back_and_records_on_a_loaded_cluster(tmp_path: Path) -> None:
    """`vcsched observe --probe --record`'s library path, with CPU load on a fake clock (no real time passes)."""
    import threading

    from acting.definitions import DefinitionStore
    from acting.sampling import CpuSampler, probe_and_restore, record_estimates
    from acting.unit_of_work import UnitOfWork
    from tests.fake_load import FakeClock, FakeLocks, LoadedHypervisor, busy
    from vcsched.control.observe import estimate_all
    from vcsched.plans.steps import Boot, CreateStep

    clock = FakeClock()
    inv = inventory_of([managed("hungry", "h0", "a", 0.2, 0.2), managed("light", "h0", "b", 0.5, 0.5),
                        managed("away", "h1", "c", 0.5, 0.5)])
    hv = LoadedHypervisor("lab", inv.hosts, inv.vms, clock,
                          {"hungry": busy(0.6), "light": busy(0.1), "away": busy(0.3)})
    sampler = CpuSampler(60 + 5, clock)
    stop = threading.Event()
    after = sampler.sample_for(hv, 60, 5, stop)
    assert after is not None and len(sampler.samples()["light"]) == 12
    before = estimate_all(after, sampler.samples())
    assert before["hungry"].saturated and before["hungry"].wants_probe  # at its cap 0.2 = its declared need
    assert before["light"].estimate == pytest.approx(0.14) and not before["light"].saturated
    assert before["away"].estimate == pytest.approx(0.36)

    done, inventory, estimates = probe_and_restore(hv, sampler, 6, 1, stop)
    assert done.caps == {"hungry": pytest.approx(0.5)}  # h0's unused 0.3 core went to the one VM that wanted it
    assert done.raised is not None and done.raised.ok and done.restored is not None and done.restored.ok
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.2)  # put back
    e = estimates["hungry"]
    assert e.basis == "saturated at probe" and e.estimate == pytest.approx(0.58)  # filled 0.5 too: a lower bound

    store = DefinitionStore.for_url(f"file://{tmp_path}/coordination", "lab")
    store.put(CreateStep("light", "h0", "b", 1, 128 << 20, 0.5, 0.5, Boot("kernel", "/k", "/i", "quiet")))
    with UnitOfWork(hv, FakeLocks().lock("lab", "me"), store=store) as uow:
        plan, report = record_estimates(uow, estimates)
    assert report.ok and {s.vm for s in plan.steps} == {"hungry", "light", "away"}
    recorded = store.get("light")
    assert recorded is not None and recorded.step.cpu_need_cores == pytest.approx(0.14), "a restart keeps the need"
    assert hv.vms["light"].meta.cpu_need_cores == pytest.approx(0.14)  # type: ignore[union-attr]
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.2)  # recording changes no cap
    assert inventory.vm("hungry") is not None


def test_a_round_moments_after_the_last_makes_no_sample_and_the_next_spans_the_whole_gap() -> None:
    """A vCPU that runs in bursts reads 0 or a whole core over a few milliseconds (acting/sampling.py):
    the controller's tick, a round just after the last idle round, once made such a sample the window's latest."""
    from dataclasses import replace

    from acting.sampling import CpuSampler
    from tests.fake_load import FakeClock, LoadedHypervisor

    clock = FakeClock()
    inv = inventory_of([managed("bursty", "h0", "a", 1.0, None), managed("moved", "h1", "b", 0.5, 0.5)])
    burst = lambda t: 1.0 if round(t * 1000) % 100 < 50 else 0.0  # noqa: E731 - the first half of each 100 ms
    hv = LoadedHypervisor("lab", inv.hosts, inv.vms, clock, {"bursty": burst, "moved": burst})

    def rounds(sampler: CpuSampler, gaps: list[float]) -> list[tuple[float, float]]:
        sampler.sample(hv)
        for gap in gaps:
            clock.advance(gap)
            if gap == 0.01:
                hv.vms["moved"] = replace(hv.vms["moved"], cap_cores=0.4)
            sampler.sample(hv)
        return [(round(s.seconds, 3), round(s.used_cores, 3)) for s in sampler.samples()["bursty"]]

    naive = CpuSampler(60, clock)
    assert rounds(naive, [2.0, 0.01, 1.99]) == [(2.0, 0.5), (0.01, 1.0), (1.99, 0.503)]  # the tiny one: a whole core
    hv.vms["moved"] = replace(hv.vms["moved"], cap_cores=0.5)
    sampler = CpuSampler(60, clock, min_seconds=1.0)
    assert rounds(sampler, [2.0, 0.01, 1.99]) == [(2.0, 0.5), (2.0, pytest.approx(0.5, abs=0.01))]
    # A cap changed in the short gap still starts the VM afresh: no sample mixes two caps.
    assert [(s.cap_cores, round(s.seconds, 3)) for s in sampler.samples()["moved"]] == [(0.5, 2.0), (0.4, 1.99)]
