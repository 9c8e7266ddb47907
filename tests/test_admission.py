"""Admission: the whole-cluster instance, pinned existing VMs, refusals, and the plan it yields."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import MiB, cluster_of, inventory_of, managed, request
from vcsched.control.admission import admit, current_caps
from vcsched.errors import InputError
from vcsched.inventory import VmMeta, VmState, snapshot_hash
from vcsched.plans.ordering import cap_overruns
from vcsched.plans.steps import CreateStep, SetCapStep


def test_a_request_that_fits_gets_full_yield_and_caps_equal_to_its_need() -> None:
    d = admit(cluster_of(), inventory_of(), request(need=0.5))
    assert d.admitted and d.plan is not None
    assert d.min_yield == pytest.approx(1.0)
    creates = [s for s in d.plan.steps if isinstance(s, CreateStep)]
    assert [s.vm for s in creates] == ["web-0", "web-1"]
    assert all(s.cap_cores == pytest.approx(0.5) for s in creates)


def test_an_oversubscribed_request_shares_cpu_fairly() -> None:
    # 4 VMs needing a whole core on two 1-core hosts: each can get half.
    d = admit(cluster_of(), inventory_of(), request(vms=4, need=1.0))
    assert d.admitted and d.plan is not None
    assert d.min_yield == pytest.approx(0.5, abs=1e-3)
    assert {s.host for s in d.plan.steps} == {"h0", "h1"}


def test_existing_vms_keep_their_hosts_and_are_capped_down_to_make_room() -> None:
    inv = inventory_of([managed("old-0", "h0", "old", 1.0, cap=1.0), managed("old-1", "h1", "old", 1.0, cap=1.0)])
    d = admit(cluster_of(), inv, request(vms=2, need=1.0))
    assert d.admitted and d.plan is not None
    setcaps = {s.vm: s for s in d.plan.steps if isinstance(s, SetCapStep)}
    assert setcaps["old-0"].host == "h0" and setcaps["old-1"].host == "h1"
    assert setcaps["old-0"].cap_cores == pytest.approx(0.5, abs=1e-3)
    assert d.plan.steps[0].op == "set-cap" and d.plan.steps[1].op == "set-cap"  # lowered before creating


def test_no_set_cap_step_when_an_existing_cap_does_not_change() -> None:
    inv = inventory_of([managed("old-0", "h0", "old", 0.5, cap=0.5)])
    d = admit(cluster_of(), inv, request(vms=1, need=0.25))
    assert d.plan is not None and [s.op for s in d.plan.steps] == ["create"]


def test_plan_steps_never_overrun_a_host() -> None:
    inv = inventory_of([managed("a-0", "h0", "a", 0.9, cap=0.9), managed("b-0", "h1", "b", 0.7, cap=0.7)])
    d = admit(cluster_of(), inv, request(vms=3, need=0.6))
    assert d.plan is not None
    assert cap_overruns(d.plan.steps, current_caps(inv), {"h0": 1.0, "h1": 1.0}) == []


def test_the_plan_names_the_inventory_it_was_computed_from() -> None:
    inv = inventory_of([managed("old-0", "h0", "old", 0.5, cap=0.5)])
    d = admit(cluster_of(), inv, request())
    assert d.plan is not None and d.plan.snapshot == snapshot_hash(inv)


def test_a_request_whose_memory_does_not_fit_is_refused_with_the_reason() -> None:
    d = admit(cluster_of(), inventory_of(memory=512 * MiB), request(vms=5, mem=256 * MiB))
    assert not d.admitted and d.plan is None
    assert d.reason is not None and d.reason.startswith("memory: 5 VMs of 256 MiB do not fit")


def test_memory_of_unmanaged_domains_is_taken_off_their_host() -> None:
    stranger = VmState("stranger", "h0", 1, 900 * MiB, True)
    d = admit(cluster_of(n_hosts=1), inventory_of([stranger], n_hosts=1), request(vms=1, mem=200 * MiB))
    assert not d.admitted and d.reason is not None and "memory" in d.reason


def test_a_request_below_its_min_yield_is_refused() -> None:
    d = admit(cluster_of(), inventory_of(), request(vms=4, need=1.0, min_yield=0.8))
    assert not d.admitted
    assert d.reason == "the minimum yield would be 0.5000, below request 'web' min_yield 0.8"


def test_the_cluster_min_yield_also_refuses() -> None:
    d = admit(cluster_of(min_yield=0.6), inventory_of(), request(vms=4, need=1.0))
    assert not d.admitted and d.reason is not None and "cluster 'lab' min_yield 0.6" in d.reason


def test_a_vm_larger_than_any_host_is_refused_naming_both_sizes() -> None:
    with pytest.raises(InputError, match=r"memory: 2 GiB per VM is larger than the largest host \(1 GiB usable\)"):
        admit(cluster_of(), inventory_of(), request(mem=2048 * MiB))


def test_more_cpu_than_the_vcpus_allow_is_refused_naming_both_numbers() -> None:
    # Reference host of 4 cores: cpu_need 0.5 = 2 cores, but a VM has 1 vCPU.
    with pytest.raises(InputError, match="cpu_need: 2 cores per VM is more than its 1 vCPUs"):
        admit(cluster_of(), inventory_of(cores=4), request(need=0.5))


def test_a_request_named_like_an_existing_virtual_cluster_is_refused() -> None:
    inv = inventory_of([managed("web-7", "h0", "web", 0.5)])
    with pytest.raises(InputError, match="name: virtual cluster 'web' already exists"):
        admit(cluster_of(), inv, request())


def test_a_new_vm_named_like_any_existing_domain_is_refused() -> None:
    inv = inventory_of([VmState("web-1", "h1", 1, MiB, True)])
    with pytest.raises(InputError, match="name: VM 'web-1' already exists"):
        admit(cluster_of(), inv, request())


def test_a_bound_only_algorithm_cannot_place() -> None:
    with pytest.raises(InputError, match="algorithm: 'lpbound' computes a bound"):
        admit(cluster_of(), inventory_of(), request(), algorithm="lpbound")


@pytest.mark.parametrize("algorithm", ["mcb8", "mcb5", "gr", "sg", "best"])
def test_any_placing_algorithm_of_the_registry_can_admit(algorithm: str) -> None:
    d = admit(cluster_of(), inventory_of([managed("a-0", "h0", "a", 0.8, cap=0.8)]), request(vms=2, need=0.4),
              algorithm=algorithm)
    assert d.admitted and d.min_yield is not None and d.min_yield > 0.5


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.05, 1.0)), max_size=6),
       st.integers(1, 4), st.floats(0.05, 1.0))
def test_admitted_plans_respect_every_host_at_every_step(existing: list[Any], k: int, need: float) -> None:
    vms = [managed(f"e{i}-0", f"h{h}", f"e{i}", n, cap=None) for i, (h, n) in enumerate(existing)]
    inv = inventory_of(vms, n_hosts=3, cores=2)
    d = admit(cluster_of(n_hosts=3), inv, request(vms=k, need=need, vcpus=2))
    assert d.admitted and d.plan is not None
    caps: dict[str, float] = {}
    for name, p in d.plan.per_vm.items():
        caps[p.host] = caps.get(p.host, 0.0) + p.cap_cores
        assert p.cap_cores <= p.cpu_need_cores + 1e-6
        assert p.yield_ >= d.plan.min_yield - 1e-6, name
    assert all(total <= 2 + 1e-6 for total in caps.values())
    assert cap_overruns(d.plan.steps, current_caps(inv), {f"h{i}": 2.0 for i in range(3)}) == []


def test_pinned_vms_that_already_overload_a_host_bound_the_yield() -> None:
    # h0 carries 2 cores of need on 1 core: nobody can get more than 0.5, whatever the new VM does.
    inv = inventory_of([managed("a-0", "h0", "a", 1.0, cap=0.5), managed("a-1", "h0", "a", 1.0, cap=0.5)])
    d = admit(cluster_of(), inv, request(vms=1, need=0.5))
    assert d.admitted and d.plan is not None
    assert d.min_yield == pytest.approx(0.5, abs=1e-6)
    assert d.plan.per_vm["web-0"].host == "h1"


def floored(name: str, host: str, cluster: str, need: float, floor: float, cap: float | None = None) -> VmState:
    v = managed(name, host, cluster, need, cap)
    assert v.meta is not None
    return VmState(v.name, v.host, v.vcpus, v.memory_bytes, True,
                   VmMeta(cluster, need, v.memory_bytes, v.vcpus, floor), cap)


def test_a_request_that_would_squeeze_an_earlier_cluster_below_its_floor_is_refused() -> None:
    # gold was admitted with min_yield 0.9 on two 1-core hosts; a request for two more whole cores
    # would leave everyone half, so it is refused naming gold and both numbers.
    inv = inventory_of([floored("gold-0", "h0", "gold", 1.0, 0.9, cap=1.0),
                        floored("gold-1", "h1", "gold", 1.0, 0.9, cap=1.0)])
    d = admit(cluster_of(), inv, request(vms=2, need=1.0))
    assert not d.admitted and d.plan is None
    assert d.reason == ("virtual cluster 'gold' would get a yield of 0.5000, below the min_yield 0.9 "
                        "it was admitted with")
    # without a recorded floor the same request is admitted
    plain = inventory_of([managed("gold-0", "h0", "gold", 1.0, cap=1.0), managed("gold-1", "h1", "gold", 1.0, cap=1.0)])
    assert admit(cluster_of(), plain, request(vms=2, need=1.0)).admitted


def test_a_floor_that_still_holds_admits_and_the_new_vms_carry_their_own() -> None:
    inv = inventory_of([floored("gold-0", "h0", "gold", 1.0, 0.4, cap=1.0)])
    d = admit(cluster_of(n_hosts=1), inv, request(vms=1, need=1.0, min_yield=0.3))
    assert d.admitted and d.plan is not None
    creates = [s for s in d.plan.steps if isinstance(s, CreateStep)]
    assert [c.min_yield for c in creates] == [0.3]
