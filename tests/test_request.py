"""A virtual-cluster request: what it accepts, and that every refusal names the field and the value."""

from __future__ import annotations

from typing import Any

import pytest

from vcsched.errors import InputError
from vcsched.formats.request import request_from_dict


def web(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": "web", "vms": 2, "vcpus": 1, "memory": "128MiB", "cpu_need": 0.5}
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def test_a_request_parses_with_sizes_and_names_its_vms() -> None:
    r = request_from_dict(web(min_yield=0.3))
    assert r.memory_bytes == 128 << 20 and r.cpu_need == 0.5 and r.min_yield == 0.3
    assert r.vm_names() == ("web-0", "web-1")


def test_cpu_need_is_a_fraction_of_the_reference_host() -> None:
    assert request_from_dict(web(cpu_need=0.25)).need_cores(4) == 1.0


def test_cpu_cores_is_taken_as_is() -> None:
    r = request_from_dict(web(cpu_need=None, cpu_cores=0.75))
    assert r.need_cores(4) == 0.75


def test_cpu_need_and_cpu_cores_together_are_refused() -> None:
    with pytest.raises(InputError, match="give exactly one"):
        request_from_dict(web(cpu_cores=0.5))


def test_a_request_without_cpu_need_is_refused() -> None:
    with pytest.raises(InputError, match="give exactly one"):
        request_from_dict(web(cpu_need=None))


def test_more_cores_than_vcpus_is_refused_naming_both_numbers() -> None:
    with pytest.raises(InputError, match="cpu_cores: 3 cores is more than the 2 vCPUs"):
        request_from_dict(web(cpu_need=None, cpu_cores=3, vcpus=2))


@pytest.mark.parametrize("field,value", [("vms", 0), ("vms", 1.5), ("vcpus", 0), ("cpu_need", 1.5),
                                         ("cpu_need", 0), ("memory", "big"), ("name", "has space"),
                                         ("min_yield", 2)])
def test_out_of_range_fields_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InputError, match=f"^{field}: "):
        request_from_dict(web(**{field: value}))


def test_template_and_image_together_are_refused() -> None:
    with pytest.raises(InputError, match="template/image"):
        request_from_dict(web(template="t.xml", image="d.qcow2"))


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(InputError, match="unknown field 'cpus'"):
        request_from_dict(web(cpus=2))
