"""Unmanaged domains' CPU is reserved on their host, by one mechanism, in every plan (vcsched/control/unmanaged.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.builders import GiB, MiB, cluster_of, inventory_of, managed, memory_hypervisor, request
from vcsched.control.admission import admit
from vcsched.control.failover import plan_recovery
from vcsched.control.headroom import headroom_for
from vcsched.control.live import adapt_inventory
from vcsched.control.observe import Sample, probe_caps
from vcsched.control.sharing import host_capacities
from vcsched.control.unmanaged import (
    RESERVE_PERCENTILE,
    fills,
    io_full,
    io_reservation,
    reservation,
    unmanaged_io_reserves,
    unmanaged_reserves,
)
from vcsched.formats.cluster import FenceConfig
from vcsched.inventory import VmState
from vcsched.plans.steps import Boot, CreateStep, MigrateStep


def legacy(host: str = "h0", vcpus: int = 1, cap: float | None = None, reserve: float | None = None) -> VmState:
    """An unmanaged, running domain of 512 MiB (``virsh define`` + ``start``)."""
    return VmState("legacy", host, vcpus, 512 * MiB, True, None, cap, measured_reserve=reserve)


def test_an_uncapped_unmanaged_domain_reserves_every_vcpu_and_a_capped_one_its_cap() -> None:
    inv = inventory_of([legacy(vcpus=2)], cores=4)
    assert inv.unmanaged_cores("h0") == 2.0 and inv.usable_cores(inv.host("h0")) == 2.0
    assert inventory_of([legacy(vcpus=2, cap=0.5)], cores=4).unmanaged_cores("h0") == 0.5
    assert inventory_of([legacy(vcpus=2, reserve=0.3)], cores=4).unmanaged_cores("h0") == 0.3
    assert inventory_of([legacy(vcpus=2, reserve=3.0)], cores=4).unmanaged_cores("h0") == 2.0  # never above vCPUs
    assert inv.unmanaged_cores("h1") == 0.0


def test_place_avoids_the_host_its_unmanaged_domain_fills() -> None:
    inv = inventory_of([legacy("h0")], n_hosts=2)
    d = admit(cluster_of(2), inv, request("web", vms=1, need=1.0))
    assert d.admitted and d.plan is not None
    assert [s.host for s in d.plan.steps if isinstance(s, CreateStep)] == ["h1"]
    assert d.plan.per_vm["web-0"].cap_cores == pytest.approx(1.0)


def test_a_request_that_fits_only_by_ignoring_unmanaged_use_is_refused_naming_it() -> None:
    inv = inventory_of([legacy("h0")], n_hosts=2)
    d = admit(cluster_of(2, min_yield=1.0), inv, request("web", vms=2, need=1.0))
    assert not d.admitted and d.reason is not None
    assert d.reason.endswith("(unmanaged domains reserve h0 1.00 of 1 cores)")
    spread = admit(cluster_of(2), inv, request("web", vms=2, need=1.0, spread="required"))
    assert not spread.admitted and "unmanaged domains reserve h0 1.00 of 1 cores" in str(spread.reason)


def test_a_measured_idle_unmanaged_domain_leaves_its_host_usable() -> None:
    inv = inventory_of([legacy("h0", reserve=0.1)], n_hosts=1, cores=2)
    d = admit(cluster_of(1), inv, request("web", vms=2, need=0.45))  # 0.9 cores each
    assert d.admitted and d.plan is not None
    assert sum(p.cap_cores for p in d.plan.per_vm.values()) <= 1.9 + 1e-9


def test_headroom_agrees_with_place_around_an_unmanaged_domain() -> None:
    inv = inventory_of([legacy("h0")], n_hosts=3, cores=1, memory=4 * GiB)
    cluster = dataclasses.replace(cluster_of(3), min_yield=1.0)
    room = headroom_for(cluster, inv, request("shape", vms=1, need=1.0))
    assert room.count == 2 and "h0" not in room.per_host
    assert admit(cluster, inv, request("web", vms=2, need=1.0)).admitted
    assert not admit(cluster, inv, request("web", vms=3, need=1.0)).admitted


def test_adapt_moves_nothing_onto_a_host_its_unmanaged_domain_fills() -> None:
    # h1 is empty of managed VMs but its unmanaged domain takes its core: the two crowded VMs on h0 stay.
    vms = [managed("a-0", "h0", "a", 1.0, cap=0.5), managed("a-1", "h0", "a", 1.0, cap=0.5), legacy("h1")]
    live = adapt_inventory("lab", inventory_of(vms, n_hosts=2, memory=4 * GiB), 10 * GiB)
    assert live.plan is None or not any(isinstance(s, MigrateStep) and s.target == "h1" for s in live.plan.steps)
    free = adapt_inventory("lab", inventory_of([*vms[:2], legacy("h1", reserve=0.0)], n_hosts=2, memory=4 * GiB),
                           10 * GiB)
    assert free.plan is not None and any(isinstance(s, MigrateStep) and s.target == "h1" for s in free.plan.steps)


def test_recovery_restarts_nothing_on_a_host_its_unmanaged_domain_fills() -> None:
    hv = memory_hypervisor(inventory_of([legacy("h0")], n_hosts=3))
    hv.down["h1"] = "host h1: did not answer"
    cluster = dataclasses.replace(cluster_of(3), hosts=tuple(
        dataclasses.replace(h, fence=FenceConfig("/bin/true")) if h.name == "h1" else h for h in cluster_of(3).hosts))
    rec = [CreateStep("web-0", "h1", "web", 1, 128 * MiB, 1.0, 1.0, Boot("kernel", "/k", "/i", ""))]
    recovery = plan_recovery(cluster, hv.inventory(), "h1", rec)
    assert recovery.restarts == (("web-0", "h2"),)


def test_a_probe_never_hands_out_the_unmanaged_reservation() -> None:
    from vcsched.control.observe import SATURATED, Estimate
    vm = managed("a-0", "h0", "a", 0.5, cap=0.5)
    inv = inventory_of([vm, legacy("h0")], n_hosts=1, cores=2)
    est = {"a-0": Estimate("a-0", "h0", 1, 0.5, 0.5, 0.5, 0.5, 1.0, True, SATURATED, 5, 0.5, 0.5)}
    assert probe_caps(inv, est) == {"a-0": 1.0}  # 2 cores - 1 reserved - 0.5: 0.5 to hand out
    assert probe_caps(inventory_of([dataclasses.replace(vm, vcpus=2), legacy("h0", vcpus=2)], n_hosts=1, cores=2),
                      est) == {}


def samples(*used: float) -> list[Sample]:
    return [Sample(float(i), 1.0, u, None, 2) for i, u in enumerate(used)]


def test_a_host_is_full_when_its_unmanaged_domains_reserve_all_its_cores() -> None:
    assert fills(1.0, 1) and fills(2.5, 2) and not fills(0.99, 1) and not fills(0.0, 1)


def test_a_measured_reservation_is_a_high_percentile_with_headroom_capped_by_the_vcpus() -> None:
    vm = legacy(vcpus=2)
    assert reservation(vm, samples(0.5, 0.5)) is None  # too few samples: the single-read bound applies
    assert RESERVE_PERCENTILE > 90  # above a managed need's: nothing caps an unmanaged domain's bursts
    got = reservation(vm, samples(*([0.2] * 99 + [1.0])))
    assert got is not None and 0.2 * 1.1 < got < 1.0 * 1.1 + 0.03
    assert reservation(vm, samples(1.9, 1.95, 2.0)) == 2.0
    inv = inventory_of([vm, managed("m", "h0", "m", 0.5)], cores=4)
    assert unmanaged_reserves(inv, {"legacy": samples(0.1, 0.1, 0.1), "m": samples(1, 1, 1)}) == {"legacy": 0.14}


# ---------------------------------------------------------------------------------------------- the controller


def controller_with_legacy_on_h1(legacy_load: float) -> tuple[Any, Any]:
    """h0 crowded (a-0 and b-0 busy, capped 0.5 each), h1 with idle c-0 and an unmanaged ``legacy``."""
    from tests.fake_load import FakeClock, FakeLocks, LoadedHypervisor, busy
    from tests.test_controller import Run

    clock = FakeClock()
    inv = inventory_of([managed("a-0", "h0", "a", 1.0, 0.5), managed("b-0", "h0", "b", 1.0, 0.5),
                        managed("c-0", "h1", "c", 1.0, 1.0), legacy("h1")])
    hv = LoadedHypervisor("lab", inv.hosts, inv.vms, clock,
                          {"a-0": busy(1.0), "b-0": busy(1.0), "c-0": busy(0.05), "legacy": busy(legacy_load)})
    run = Run(hv, clock, FakeLocks())
    run.cycles(6)
    return hv, run


def test_the_controller_sheds_nothing_onto_a_host_a_busy_unmanaged_domain_fills() -> None:
    hv, run = controller_with_legacy_on_h1(1.0)
    assert not [s for s in run.events("step") if s["op"] == "migrate"]
    assert hv.vms["a-0"].host == hv.vms["b-0"].host == "h0"
    from tests.test_controller import scrape
    body = scrape(run.controller.metrics)
    # What legacy used while competing with c-0 is reserved only beside c-0's cap, never out of it
    # (vcsched/control/unmanaged.py beside_managed): h1 keeps no room for anything more.
    left = 1.0 - hv.vms["c-0"].cap_cores
    for series in ('vcsched_host_unmanaged_reserved_cores{cluster="lab",host="h1"}',
                   'vcsched_unmanaged_reserved_cores{cluster="lab",host="h1",vm="legacy"}'):
        got = re.search(re.escape(series) + r" (\S+)", body)
        assert got is not None and float(got.group(1)) == pytest.approx(left, abs=1e-6), (series, left)
    assert re.search(r'vcsched_unmanaged_used_cores\{cluster="lab",host="h1",vm="legacy"\} 0\.[5-9]', body)


def test_the_controller_measures_an_idle_unmanaged_domain_and_uses_the_room_it_leaves() -> None:
    _hv, run = controller_with_legacy_on_h1(0.02)
    assert [s for s in run.events("step") if s["op"] == "migrate" and s["outcome"] == "done"]
    reserved = {h.host: h.unmanaged_cores for h in run.controller.metrics.hosts}
    assert 0 < reserved["h1"] < 0.1  # p99 of 0.02 cores, with headroom and margin


# ---------------------------------------------------------------------------------------------- status and top


def test_status_shows_each_hosts_unmanaged_reservation_and_each_domains(tmp_path: Path) -> None:
    from tests.test_libvirt_backend import cluster_toml, domain_of, node_xml, run

    (tmp_path / "h0.xml").write_text(node_xml(1, 1 << 20, domain_of("stranger")))
    (tmp_path / "h1.xml").write_text(node_xml(2, 1 << 20))
    cluster = cluster_toml(tmp_path, [("h0", f"test://{tmp_path}/h0.xml"), ("h1", f"test://{tmp_path}/h1.xml")])
    result = run("status", "--cluster", cluster, "--json", "--sample", "0")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    h0, h1 = doc["hosts"]
    assert (h0["unmanaged_reserved_cores"], h0["unmanaged_full"]) == (1.0, True)
    assert (h1["unmanaged_reserved_cores"], h1["unmanaged_full"]) == (0.0, False)
    assert h0["unmanaged_measured_cores"] is None and h0["unmanaged_measured_disk_bps"] is None  # --sample 0
    assert [(v["name"], v["reserved_cores"]) for v in doc["vms"]] == [("stranger", 1.0)]
    text = run("status", "--cluster", cluster, "--sample", "0")
    assert text.exit_code == 0 and "unmanaged domains reserve 1.00 of its 1 cores" in " ".join(text.stdout.split())


def test_top_shows_the_reservation_measured_over_its_window() -> None:
    from vcsched.control.observe import estimate_all
    from vcsched.control.top import top_view

    inv = inventory_of([legacy("h0", vcpus=2), managed("m", "h1", "m", 0.5, 0.5)], n_hosts=2, cores=2)
    windows = {"legacy": samples(0.4, 0.4, 0.4)}
    view = top_view(inv, "yield", windows, estimate_all(inv, windows), [])
    h0, h1 = view.hosts
    assert h0.unmanaged_cores == pytest.approx(0.47) and not h0.unmanaged_over and h1.unmanaged_cores == 0
    rows = {v.name: v for v in view.vms}
    assert rows["legacy"].reserved_cores == pytest.approx(0.47) and rows["m"].reserved_cores is None
    full = top_view(inv, "yield", {}, {}, [])
    assert full.hosts[0].unmanaged_cores == 2.0 and full.hosts[0].unmanaged_over


def test_managed_vms_on_a_host_its_unmanaged_domain_fills_refuse_admission_naming_it_until_adapt_moves_them() -> None:
    inv = inventory_of([managed("one-0", "h1", "one", 0.5, cap=0.5), legacy("h1")], n_hosts=3, memory=4 * GiB)
    d = admit(cluster_of(3), inv, request("big", vms=1, need=1.0))
    assert not d.admitted and str(d.reason).endswith("(unmanaged domains reserve h1 1.00 of 1 cores)")
    assert headroom_for(cluster_of(3), inv, request("shape", vms=1, need=1.0)).count == 0
    live = adapt_inventory("lab", inv, GiB)
    assert live.plan is not None and live.plan.per_vm["one-0"].host != "h1"
    hv = memory_hypervisor(inv)
    from acting.executor import apply_plan
    assert apply_plan(hv, live.plan).ok
    assert admit(cluster_of(3), hv.inventory(), request("big", vms=1, need=1.0)).admitted


def test_failover_room_never_places_a_displaced_vm_on_a_host_its_unmanaged_domain_fills() -> None:
    from vcsched.control.failover import headroom

    vms = [managed("one-0", "h1", "one", 0.5, cap=0.5), managed("two-0", "h0", "two", 0.5, cap=0.5), legacy("h1")]
    inv = inventory_of(vms, n_hosts=3, memory=4 * GiB)
    rows = {f.host: f for f in headroom(cluster_of(3), inv)}
    assert rows["h0"].placed == (("two-0", "h2"),), rows["h0"]  # not h1, where one-0 already gets no CPU


def test_step_reasons_count_the_room_unmanaged_domains_leave() -> None:
    from vcsched.plans.reasons import step_reasons

    vms = [managed("a-0", "h0", "a", 1.0, cap=0.5), managed("a-1", "h0", "a", 1.0, cap=0.5),
           legacy("h1", vcpus=1, reserve=0.25)]
    inv = inventory_of(vms, n_hosts=2, cores=1, memory=4 * GiB)
    live = adapt_inventory("lab", inv, 10 * GiB)
    assert live.plan is not None
    said = " ".join(step_reasons(live.plan, inv))
    assert "h1 has room (its VMs need 0.00 cores of the 0.75 its unmanaged domains leave of its 1)" in said, said


# --- disk and network: the measured rates of unmanaged domains are reserved off the declared ones -----------

RATE = 100 * MiB  # bytes/s each host declares for disk and for network


def io_cluster(n_hosts: int = 2, min_yield: float = 1.0) -> Any:
    """``cluster_of`` with every host declaring ``disk_bps`` and ``net_bps`` of :data:`RATE`."""
    c = cluster_of(n_hosts, min_yield)
    return dataclasses.replace(c, hosts=tuple(dataclasses.replace(h, disk_bps=RATE, net_bps=RATE) for h in c.hosts))


def io_inventory(io: tuple[tuple[str, float], ...]) -> Any:
    """Two 4-core hosts declaring :data:`RATE`; on h0 an idle unmanaged domain whose measured I/O is ``io``."""
    inv = inventory_of([dataclasses.replace(legacy("h0", reserve=0.1), measured_io=io)], n_hosts=2, cores=4,
                       memory=4 * GiB)
    return dataclasses.replace(inv, hosts=tuple(dataclasses.replace(h, disk_bps=RATE, net_bps=RATE)
                                                for h in inv.hosts))


def io_sample(t: float, disk: float | None, net: float | None) -> Sample:
    return Sample(t, 5.0, 0.05, None, 1, disk_bps=disk, net_bps=net)


def test_an_unmanaged_domains_io_reservation_is_a_high_percentile_of_its_window() -> None:
    samples = [io_sample(float(i), float(MiB * (1 + i % 10)), None) for i in range(100)]
    got = io_reservation(samples, "disk")
    assert got is not None and got >= 10 * MiB and got == float(int(got))  # its peak, plus headroom, whole B/s
    assert io_reservation(samples, "net") is None  # not measured: nothing to reserve
    assert io_reservation(samples[:1], "disk") is None  # too few samples
    inv = inventory_of([legacy("h0")], n_hosts=1)
    windows = {"legacy": samples}
    assert unmanaged_io_reserves(inv, windows) == {"legacy": (("disk", got),)}
    reserved = inv.with_reserves({}, unmanaged_io_reserves(inv, windows))
    assert reserved.unmanaged_io("h0", "disk") == got and reserved.unmanaged_io("h0", "net") == 0.0


@pytest.mark.parametrize("resource", ["disk", "net"])
def test_a_request_needing_io_is_kept_off_a_host_whose_unmanaged_io_leaves_too_little(resource: str) -> None:
    need = {f"{resource}_bps": 40 * MiB}
    busy = io_inventory(((resource, 80.0 * MiB),))  # h0 keeps 20 MiB/s of its 100 for the new VMs
    one = admit(io_cluster(), busy, request("io", vms=1, need=0.1, **need))
    assert one.admitted and one.plan is not None
    assert [s.host for s in one.plan.steps if isinstance(s, CreateStep)] == ["h1"]
    two = admit(io_cluster(), busy, request("io", vms=2, need=0.1, spread="required", **need))
    assert not two.admitted
    assert f"h0 83.89 of 104.86 MB/s {resource}" in str(two.reason)
    assert io_full(busy) == {}
    full = io_inventory(((resource, 120.0 * MiB),))  # more than the host declares: reported, capacity 0
    assert io_full(full) == {"h0": (resource,)}
    assert host_capacities(io_cluster(), full, {resource: RATE})["h0"] == ((resource, 0.0),)
    assert not admit(io_cluster(), full, request("io", vms=2, need=0.1, spread="required", **need)).admitted


@pytest.mark.parametrize("resource", ["disk", "net"])
def test_a_request_needing_io_fits_where_unmanaged_io_leaves_room_or_was_not_measured(resource: str) -> None:
    need = {f"{resource}_bps": 40 * MiB}
    spread = request("io", vms=2, need=0.1, spread="required", **need)
    assert admit(io_cluster(), io_inventory(((resource, 50.0 * MiB),)), spread).admitted  # 50 of 100 left: fits
    nothing = io_inventory(())
    assert nothing.unmanaged_io("h0", resource) == 0.0  # not measured: nothing reserved
    assert host_capacities(io_cluster(), nothing, {resource: RATE})["h0"] == ((resource, 1.0),)
    assert admit(io_cluster(), nothing, spread).admitted


def test_the_controllers_sampler_measures_unmanaged_io_and_its_reservation_follows() -> None:
    """The controller's samples (acting/sampling.py, ``every_vm``) carry an unmanaged domain's disk and network
    rates; a managed VM's I/O is not read.  Disk 10 MiB/s; network 1 MiB/s in, 3 MiB/s out (the busier counts)."""
    from acting.sampling import CpuSampler
    from hypervisor.base import HypervisorError, IoCounters
    from tests.fake_load import FakeClock, LoadedHypervisor

    class IoHypervisor(LoadedHypervisor):
        def io_counters(self, host: str, vm: str) -> IoCounters | None:
            self._vm_on(host, vm)
            t = self.fake.monotonic()
            return IoCounters(int(10 * MiB * t), int(MiB * t), int(3 * MiB * t))

    clock = FakeClock()
    inv = inventory_of([legacy("h0"), managed("a-0", "h1", "a", 0.5, 0.5)], n_hosts=2)
    hv = IoHypervisor("lab", inv.hosts, inv.vms, clock)
    sampler = CpuSampler(60, clock, every_vm=True)
    for _ in range(6):
        sampler.sample(hv)
        clock.now += 5.0
    windows = sampler.samples()
    assert {(s.disk_bps, s.net_bps) for s in windows["legacy"]} == {(10.0 * MiB, 3.0 * MiB)}
    assert {(s.disk_bps, s.net_bps) for s in windows["a-0"]} == {(None, None)}
    reserved = inv.with_reserves({}, unmanaged_io_reserves(inv, windows))
    assert reserved.unmanaged_io("h0", "disk") == pytest.approx(11 * MiB, abs=1)  # p99 plus 10 % headroom
    assert reserved.unmanaged_io("h0", "net") == pytest.approx(3.3 * MiB, abs=1)
    assert reserved.unmanaged_io("h1", "disk") == 0.0

    class Unreadable(IoHypervisor):
        def io_counters(self, host: str, vm: str) -> IoCounters | None:
            raise HypervisorError(f"host {host}: blockStats failed")

    hv = Unreadable("lab", inv.hosts, inv.vms, clock)
    sampler = CpuSampler(60, clock, every_vm=True)
    for _ in range(4):
        sampler.sample(hv)
        clock.now += 5.0
    windows = sampler.samples()  # I/O unread: its CPU is still sampled, and no I/O is reserved
    assert len(windows["legacy"]) == 3 and {(s.disk_bps, s.net_bps) for s in windows["legacy"]} == {(None, None)}
    assert unmanaged_io_reserves(inv, windows) == {}


def test_top_marks_a_host_whose_unmanaged_io_takes_its_declared_rate() -> None:
    from cli.top_view import host_marks
    from vcsched.control.top import top_view

    inv = io_inventory(())
    busy_disk = [io_sample(float(i), 120.0 * MiB, 1.0 * MiB) for i in range(5)]  # more than h0's 100 MiB/s
    view = top_view(inv, "yield", {"legacy": busy_disk}, {}, [])
    h0, h1 = view.hosts
    assert h0.unmanaged_io_full == ("disk",) and host_marks(h0) == "full of unmanaged disk"
    assert h1.unmanaged_io_full == () and host_marks(h1) == ""
    idle = top_view(inv, "yield", {"legacy": [io_sample(float(i), 1.0 * MiB, None) for i in range(5)]}, {}, [])
    assert idle.hosts[0].unmanaged_io_full == ()


def test_a_copy_in_doubt_keeps_its_cap_on_its_host_for_every_plan() -> None:
    """A paused arrival in doubt (its source down, not fenced) is never acted on, but repair may resume it where it
    stands, so the whole-plan check keeps its cap there; a recovery planned around it as if that host were free
    was refused at every interval, and the failed host's VMs stayed down (scripts/faultsim --seed 1 --replay
    7157).  Every plan is built on usable_cores, which now leaves that cap out."""
    arrival = dataclasses.replace(managed("db-0", "h0", "db", 0.5, cap=0.75), paused=True, in_doubt=True,
                                  arriving_from="h1")
    inv = inventory_of([arrival], n_hosts=3, cores=1)
    assert inv.doubtful_cores("h0") == 0.75 and inv.usable_cores(inv.host("h0")) == 0.25
    assert inv.unmanaged_cores("h0") == 0.0  # not an unmanaged domain: shown as the managed VM's copy
    hv = memory_hypervisor(inv)
    hv.down["h1"] = "host h1: did not answer"
    cluster = dataclasses.replace(cluster_of(3), hosts=tuple(
        dataclasses.replace(h, fence=FenceConfig("/bin/true")) if h.name == "h1" else h for h in cluster_of(3).hosts))
    rec = [CreateStep("web-0", "h1", "web", 1, 128 * MiB, 0.5, 0.5, Boot("kernel", "/k", "/i", ""))]
    recovery = plan_recovery(cluster, hv.inventory(), "h1", rec)
    assert recovery.restarts == (("web-0", "h2"),)  # h0's quarter core is too small for a need of half a core
