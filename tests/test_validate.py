"""The allocation validator catches every broken constraint of the model."""

from __future__ import annotations

import pytest

from tests.conftest import make_instance
from vcsched.errors import AllocationError
from vcsched.model import Allocation
from vcsched.validate import allocation_problems, check_allocation


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
