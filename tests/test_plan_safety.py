"""Plan safety: caps on the quota grid, whole plans checked before their first step, steps re-checked before
they act — so no plan, hand edit or second operator can over-commit a host or leave a VM uncapped."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from acting.executor import DONE, FAILED, NOT_RUN, apply_plan
from hypervisor.memory import MemoryHypervisor
from tests.builders import cluster_of, inventory_of, managed, request
from vcsched.caps import PERIOD_US, min_cap, quota_for, realisable_cap, same_cap
from vcsched.control.admission import admit
from vcsched.control.live import adapt_inventory
from vcsched.errors import InputError
from vcsched.formats.cluster import cluster_from_dict
from vcsched.inventory import HostState, Inventory
from vcsched.plans.plan import Plan
from vcsched.plans.steps import Boot, CreateStep, MigrateStep, SetCapStep, Step

GIB = 1 << 30


class LibvirtRounding(MemoryHypervisor):
    """Holds caps as libvirt stores a quota it is given in cores by older clients: whole µs, *nearest*."""

    def realised_cap(self, host: str, vcpus: int, cap_cores: float) -> float:
        return round(cap_cores / vcpus * PERIOD_US) / PERIOD_US * vcpus


def caps_on(inv: Inventory, host: str) -> float:
    return sum(v.cap_or_vcpus for v in inv.vms if v.host == host and v.managed and v.active)


# ---------------------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("cap,vcpus", [(0.5555556, 1), (1 / 3, 1), (0.7, 2), (1.0, 4), (0.123456789, 3)])
def test_a_planned_cap_is_the_grid_point_at_or_below_it(cap: float, vcpus: int) -> None:
    got = realisable_cap(cap, vcpus)
    assert got <= cap and cap - got < vcpus / PERIOD_US
    assert realisable_cap(got, vcpus) == got and same_cap(got, cap, vcpus)
    assert quota_for(got, vcpus) == quota_for(cap, vcpus)


def test_caps_one_quota_step_apart_are_different_caps() -> None:
    assert not same_cap(0.55556, 0.55555, 1)
    assert same_cap(0.555559, 0.55555, 1)
    assert min_cap(2) == pytest.approx(0.02)


def test_admission_keeps_working_after_adapt_on_hosts_that_round_caps() -> None:
    """Issue: after an adapt, caps read back rounded (0.5555556 -> 0.55556) and a later request landing on a
    full host was refused as bad input ("no order of the remaining steps ..."), or hosts were over by 1e-5.
    Seeds 9, 33 and 48 failed before caps were planned on the grid."""
    for seed in range(60):
        rng = random.Random(seed)
        inv = inventory_of(n_hosts=2)
        hv = LibvirtRounding(inv.cluster, inv.hosts, inv.vms)
        for name in ("a", "b"):
            d = admit(cluster_of(), hv.inventory(), request(name, vms=rng.choice([1, 2, 3]),
                                                            need=rng.choice([0.3, 0.45, 0.7, 0.9])))
            if d.plan is not None:
                assert apply_plan(hv, d.plan).ok
        vms = [v.name for v in hv.inventory().managed()]
        live = adapt_inventory("lab", hv.inventory(), 1 << 40, needs={rng.choice(vms): rng.choice([0.2, 0.35, 0.55])})
        assert live.plan is not None and apply_plan(hv, live.plan).ok
        d = admit(cluster_of(), hv.inventory(), request("c", vms=1, need=rng.choice([0.1, 0.2, 0.3])))
        assert d.plan is not None, (seed, d.reason)
        assert apply_plan(hv, d.plan).ok, seed
        after = hv.inventory()
        for h in after.hosts:
            assert caps_on(after, h.name) <= h.cores + 1e-9, (seed, h.name)


# ---------------------------------------------------------------------------------------- whole plan


def two_full_hosts() -> MemoryHypervisor:
    inv = inventory_of([managed("a-0", "h0", "a", 0.9, cap=0.5), managed("b-0", "h0", "b", 0.9, cap=0.5),
                        managed("c-0", "h1", "c", 0.9, cap=0.9)])
    return MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)


def hand_edited(hv: MemoryHypervisor, *steps: Step) -> Plan:
    from vcsched.inventory import snapshot_hash

    return Plan("place", "lab", snapshot_hash(hv.inventory()), 1.0, 1.0, {}, tuple(steps))


def test_an_unknown_host_in_a_later_step_refuses_the_plan_before_the_first_step() -> None:
    hv = two_full_hosts()
    plan = hand_edited(hv, SetCapStep("a-0", "h0", 0.4), SetCapStep("c-0", "h9", 0.5))
    with pytest.raises(InputError, match=r"plan\.steps\[1\]: host 'h9' is not in the cluster"):
        apply_plan(hv, plan)
    assert hv.calls == [] and hv.vms["a-0"].cap_cores == 0.5


def test_a_migration_to_an_unknown_host_moves_nothing() -> None:
    hv = two_full_hosts()
    plan = hand_edited(hv, MigrateStep("a-0", "h0", "h1", 128 << 20, 0.044),
                       SetCapStep("a-0", "nowhere", 0.9))
    with pytest.raises(InputError, match="'nowhere'"):
        apply_plan(hv, plan, force=True)  # even forced past the snapshot, the plan itself is checked
    assert hv.calls == [] and hv.vms["a-0"].host == "h0"


def test_a_cap_larger_than_the_vm_is_refused_and_never_written() -> None:
    inv = inventory_of([managed("big-0", "h0", "big", 1.0, cap=1.0, vcpus=2)], cores=8)
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    with pytest.raises(InputError, match=r"plan\.steps\[0\]\.cap_cores: 5 cores is more than the VM's 2 vCPUs"):
        apply_plan(hv, hand_edited(hv, SetCapStep("big-0", "h0", 5.0)))
    assert hv.calls == [] and hv.vms["big-0"].cap_cores == 1.0


def test_raising_two_vms_beyond_their_host_is_refused() -> None:
    hv = two_full_hosts()
    plan = hand_edited(hv, SetCapStep("a-0", "h0", 0.9), SetCapStep("b-0", "h0", 0.9))
    with pytest.raises(InputError, match=r"host h0 would have caps of 1\.4 cores on 1 cores"):
        apply_plan(hv, plan)
    assert hv.calls == []


def test_creating_a_vm_on_a_full_host_is_refused() -> None:
    hv = two_full_hosts()
    create = CreateStep("d-0", "h1", "d", 1, 128 << 20, 1.0, 1.0, Boot("kernel", kernel="/k", initrd="/i"))
    with pytest.raises(InputError, match=r"host h1 would have caps of 1\.9 cores"):
        apply_plan(hv, hand_edited(hv, create))
    assert "d-0" not in hv.vms


def test_creating_a_vm_beyond_a_hosts_memory_is_refused() -> None:
    hv = two_full_hosts()
    create = CreateStep("d-0", "h1", "d", 1, 2 * GIB, 0.05, 0.05, Boot("kernel", kernel="/k", initrd="/i"))
    with pytest.raises(InputError, match="needs 2147483648 bytes, host h1 has"):
        apply_plan(hv, hand_edited(hv, create))


def test_two_steps_for_one_vm_in_one_wave_are_refused() -> None:
    inv = inventory_of([managed("a-0", "h0", "a", 0.2, cap=0.2)], n_hosts=3)
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    plan = hand_edited(hv, MigrateStep("a-0", "h0", "h1", 128 << 20, 0.2, wave=1),
                       MigrateStep("a-0", "h1", "h2", 128 << 20, 0.2, wave=1))
    with pytest.raises(InputError, match="'a-0' has two steps in one wave"):
        apply_plan(hv, plan, force=True)


def test_a_bad_vm_name_in_a_create_step_is_refused() -> None:
    hv = two_full_hosts()
    create = CreateStep("../../evil", "h1", "d", 1, 1 << 20, 0.05, 0.05, Boot("kernel", kernel="/k", initrd="/i"))
    with pytest.raises(InputError, match=r"plan\.steps\[0\]\.vm: '\.\./\.\./evil' is not a name"):
        apply_plan(hv, hand_edited(hv, create))


# ---------------------------------------------------------------------------------------- step by step


def test_a_second_operator_filling_a_host_stops_the_plan_before_it_overcommits() -> None:
    inv = inventory_of([managed("a-0", "h0", "a", 0.5, cap=0.5)])
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    d = admit(cluster_of(), hv.inventory(), request("web", vms=2, need=0.5))
    assert d.plan is not None
    first = d.plan.steps[0]

    def second_operator() -> None:  # between our first and second step, someone fills both hosts
        for h in ("h0", "h1"):
            hv.vms[f"x-{h}"] = managed(f"x-{h}", h, "x", 1.0, cap=0.9)

    hv.before[(first.op, first.vm)] = second_operator
    report = apply_plan(hv, d.plan)
    outcomes = [r.outcome for r in report.results]
    assert outcomes[0] == DONE and FAILED in outcomes and set(outcomes[outcomes.index(FAILED) + 1:]) <= {NOT_RUN}
    failed = next(r for r in report.results if r.outcome == FAILED)
    assert failed.detail.startswith("pre-condition: ") and "would have caps of" in failed.detail
    # The second step would have over-committed h1, which the other operator had just filled: it did not run.
    assert "web-1" not in hv.vms and caps_on(hv.inventory(), "h1") == pytest.approx(0.9)


def test_a_migrated_vm_arrives_with_its_planned_cap_not_its_source_cap() -> None:
    inv = inventory_of([managed("a-0", "h0", "a", 0.9, cap=0.9)], n_hosts=2)
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    seen: list[float | None] = []
    hv.before[("set-cap", "a-0")] = lambda: seen.append(hv.vms["a-0"].cap_cores)  # right after the move
    report = apply_plan(hv, hand_edited(hv, MigrateStep("a-0", "h0", "h1", 128 << 20, 0.3)), force=True)
    assert report.ok and seen == [0.3]


def test_a_host_down_gets_nothing_planned_and_plans_for_it_are_refused() -> None:
    inv = inventory_of([managed("a-0", "h0", "a", 0.5, cap=0.5)], n_hosts=3)
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    hv.down["h2"] = "connection refused"
    live = hv.inventory()
    assert [h.down for h in live.hosts] == [None, None, "connection refused"]
    d = admit(cluster_of(3), live, request("web", vms=3, need=0.5))
    assert d.plan is not None and {p.host for p in d.plan.per_vm.values()} <= {"h0", "h1"}
    assert apply_plan(hv, d.plan).ok
    create = CreateStep("z-0", "h2", "z", 1, 1 << 20, 0.1, 0.1, Boot("kernel", kernel="/k", initrd="/i"))
    with pytest.raises(InputError, match=r"host h2 is down \(connection refused\)"):
        apply_plan(hv, hand_edited(hv, create))


def test_a_plan_made_while_a_host_was_down_is_stale_once_it_answers() -> None:
    inv = inventory_of([managed("a-0", "h2", "a", 0.5, cap=0.5)], n_hosts=3)
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    hv.down["h2"] = "no route"
    d = admit(cluster_of(3), hv.inventory(), request("web", vms=1, need=0.5))
    assert d.plan is not None
    del hv.down["h2"]
    from acting.executor import SnapshotMismatch

    with pytest.raises(SnapshotMismatch, match="vcsched place"):
        apply_plan(hv, d.plan)


def test_every_host_down_is_an_error_not_an_empty_plan() -> None:
    inv = inventory_of(n_hosts=1)
    from vcsched.control.admission import HostsDown

    live = replace(inv, hosts=(replace(inv.hosts[0], down="gone"),))
    with pytest.raises(HostsDown, match="every host of cluster 'lab' is down: h0: gone"):
        admit(cluster_of(1), live, request())


# ---------------------------------------------------------------------------------------- files


def test_a_cluster_file_listing_one_uri_twice_is_refused() -> None:
    doc = {"name": "lab", "hosts": [{"name": "h0", "uri": "qemu:///system"}, {"name": "h1", "uri": "qemu:///system"}]}
    with pytest.raises(InputError, match=r"^hosts\[1\]\.uri: 'qemu:///system' is also hosts\[0\]'s URI$"):
        cluster_from_dict(doc)


def test_host_state_reports_memory_in_bytes() -> None:
    assert HostState("h", 1, GIB, memory_reserved=GIB // 2).usable_memory == GIB // 2


# ---------------------------------------------------------------------------------------- stopping


def test_ctrl_c_during_a_step_reports_what_was_done_and_converges_on_rerun() -> None:
    from acting.executor import INTERRUPTED

    inv = inventory_of()
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    d = admit(cluster_of(), hv.inventory(), request("web", vms=2, need=0.5))
    assert d.plan is not None
    second = d.plan.steps[1]

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    hv.before[(second.op, second.vm)] = ctrl_c
    report = apply_plan(hv, d.plan)
    assert [r.outcome for r in report.results] == [DONE, INTERRUPTED]
    assert report.stopped == "interrupted (Ctrl-C)" and not report.ok
    assert report.to_dict()["stopped"] == "interrupted (Ctrl-C)"
    again = apply_plan(hv, d.plan)
    assert again.ok and set(hv.vms) == {"web-0", "web-1"}


def test_a_lost_lock_starts_no_further_step() -> None:
    from vcsched.errors import VcschedError

    inv = inventory_of()
    hv = MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)
    d = admit(cluster_of(), hv.inventory(), request("web", vms=2, need=0.5))
    assert d.plan is not None
    calls = iter([None, VcschedError("cluster 'lab': cannot renew the lock")])

    def guard() -> None:
        outcome = next(calls)
        if outcome is not None:
            raise outcome

    report = apply_plan(hv, d.plan, guard=guard)
    assert [r.outcome for r in report.results] == [DONE, NOT_RUN]
    assert report.stopped == "cluster 'lab': cannot renew the lock" and "web-1" not in hv.vms


def test_the_whole_plan_check_sums_only_the_hosts_a_step_changes() -> None:
    """Issue 40: every dry run now runs the whole-plan check, which summed every host's caps, I/O and memory for
    every step: 22 s of CPU for 20 set-caps on 1,000 hosts of 10 VMs (45 s for `place`'s 8 creates there).  Only
    the hosts a step changes are summed; measured 0.04 s.  The bound is loose for a loaded machine."""
    import time

    from vcsched.plans.check import check_plan

    inv = inventory_of([managed(f"vm{h}-{k}", f"h{h}", "vc", 0.5, 0.5) for h in range(1000) for k in range(10)],
                       n_hosts=1000, cores=8, memory=32 << 30)
    steps = [SetCapStep(f"vm{h}-0", f"h{h}", 0.25) for h in range(20)]
    start = time.process_time()
    check_plan(steps, inv)
    assert time.process_time() - start < 2.0
    # Still refused where a host it changes would be over-committed (h1: 7 VMs at 1 core and 3 at 0.5, on 8).
    with pytest.raises(InputError, match=r"^plan\.steps\[7\] \(set-cap vm1-6\): host h1 would have caps of 8\.5 "
                                         r"cores on 8 cores$"):
        check_plan([steps[0], *[SetCapStep(f"vm1-{k}", "h1", 1.0) for k in range(10)]], inv)
