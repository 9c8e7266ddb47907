"""The allocation validator catches every broken constraint of the model."""

from __future__ import annotations

import pytest

from tests.conftest import make_instance
from vcsched.errors import AllocationError
from vcsched.model import Allocation, Host, Instance, Job
from vcsched.validate import allocation_problems, check_allocation, check_yields, yield_problems


def test_valid_allocation_has_no_problems() -> None:
    inst = make_instance([(0.5, 0.5), (0.5, 0.5)])
    assert allocation_problems(inst, Allocation((0, 1), (0.5, 0.5)), min_yield=1.0, avg_yield=1.0) == []


def test_cpu_over_capacity_is_reported() -> None:
    inst = make_instance([(0.8, 0.1), (0.8, 0.1)])
    probs = allocation_problems(inst, Allocation((0, 0), (0.8, 0.8)))
    assert any("host 'h0': CPU 1.6" in p for p in probs)


def test_memory_over_capacity_is_reported() -> None:
    inst = make_instance([(0.1, 0.6), (0.1, 0.6)])
    probs = allocation_problems(inst, Allocation((1, 1), (0.1, 0.1)))
    assert any("host 'h1': memory 1.2" in p for p in probs)


def test_cpu_above_need_is_reported() -> None:
    inst = make_instance([(0.3, 0.1)])
    assert any("outside [0, cpu_need=0.3]" in p for p in allocation_problems(inst, Allocation((0,), (0.4,))))


def test_task_count_mismatch_is_reported() -> None:
    inst = make_instance([(0.3, 0.1, 3)])
    assert allocation_problems(inst, Allocation((0, 1), (0.3,))) == ["2 task placements for 3 tasks"]


def test_host_index_out_of_range_is_reported() -> None:
    inst = make_instance([(0.3, 0.1)])
    assert "out of range" in allocation_problems(inst, Allocation((5,), (0.3,)))[0]


def test_wrong_reported_yield_is_reported() -> None:
    inst = make_instance([(0.5, 0.1)])
    probs = allocation_problems(inst, Allocation((0,), (0.25,)), min_yield=0.9)
    assert probs == ["reported min_yield 0.9 but allocation gives 0.5"]


def test_check_allocation_raises_with_all_problems() -> None:
    inst = make_instance([(0.8, 0.6), (0.8, 0.6)])
    with pytest.raises(AllocationError) as exc:
        check_allocation(inst, Allocation((0, 0), (0.8, 0.8)))
    assert len(exc.value.problems) == 2


# --- extra fluid resources and yields (the sharing policies' view) ----------------------------------------------

def disk_instance() -> Instance:
    hosts = (Host("h0", 1.0, 1.0, (("disk", 0.5),)), Host("h1", 1.0, 1.0))
    return Instance(hosts, (Job("a", 0.5, 0.1, 1, (("disk", 0.4),)), Job("b", 0.5, 0.1, 1, (("disk", 0.4),))))


def test_an_extra_resource_over_capacity_is_reported_for_an_allocation() -> None:
    probs = allocation_problems(disk_instance(), Allocation((0, 0), (0.5, 0.5)))
    assert probs == ["host 'h0': disk 0.800000 exceeds capacity 0.5"]


def test_a_resource_a_host_lacks_has_capacity_0() -> None:
    probs = yield_problems(disk_instance(), [0, 1], [0.5, 0.5])
    assert probs == ["host 'h1': disk 0.200000 exceeds capacity 0"]


def test_yields_within_every_capacity_have_no_problems() -> None:
    assert yield_problems(disk_instance(), [0, 0], [0.625, 0.625]) == []


@pytest.mark.parametrize(("yields", "message"), [
    ([1.2, 0.1], "job 'a': yield 1.2 outside [0, 1]"),
    ([-0.5, 0.1], "job 'a': yield -0.5 outside [0, 1]"),
    ([float("nan"), 0.1], "job 'a': yield nan outside [0, 1]"),
])
def test_a_yield_outside_0_1_is_reported(yields: list[float], message: str) -> None:
    assert yield_problems(disk_instance(), [0, 0], yields) == [message]


def test_one_yield_per_job_and_one_host_per_task() -> None:
    assert yield_problems(disk_instance(), [0, 0], [0.5]) == ["1 yields for 2 jobs"]
    assert yield_problems(disk_instance(), [0], [0.5, 0.5]) == ["1 task placements for 2 tasks"]
    assert "out of range" in yield_problems(disk_instance(), [0, 7], [0.5, 0.5])[0]


def test_memory_and_cpu_are_checked_with_yields_too() -> None:
    inst = make_instance([(0.8, 0.6), (0.8, 0.6)])
    probs = yield_problems(inst, [0, 0], [1.0, 1.0])
    assert probs == ["host 'h0': CPU 1.600000 exceeds capacity 1.0", "host 'h0': memory 1.200000 exceeds capacity 1.0"]


def test_check_yields_raises_with_every_problem() -> None:
    with pytest.raises(AllocationError) as exc:
        check_yields(disk_instance(), [0, 1], [1.0, 1.0])
    assert exc.value.problems == ["host 'h1': disk 0.400000 exceeds capacity 0"]
