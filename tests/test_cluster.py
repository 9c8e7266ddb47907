"""The cluster file: what it accepts, and that every refusal names the field and the value."""

from __future__ import annotations

from typing import Any

import pytest

from vcsched.errors import InputError
from vcsched.formats.cluster import cluster_from_dict
from vcsched.formats.units import format_size, parse_size


def lab_like() -> dict[str, Any]:
    return {
        "name": "lab",
        "min_yield": 0.0,
        "guest": {"kernel": "/k", "initrd": "/i", "cmdline": "quiet", "domain_type": "qemu"},
        "hosts": [
            {"name": "h0", "uri": "qemu+unix:///system?socket=/s0", "cores": 1, "memory_reserved": "64MiB",
             "partition": "/vcl1h0"},
            {"name": "h1", "uri": "qemu+unix:///system?socket=/s1", "cores": 1, "memory_reserved": "64MiB",
             "partition": "/vcl1h1"},
        ],
    }


def test_the_lab_cluster_file_parses() -> None:
    c = cluster_from_dict(lab_like())
    assert c.host_names == ("h0", "h1")
    assert c.hosts[0].memory_reserved == 64 << 20
    assert c.hosts[1].partition == "/vcl1h1"
    assert c.guest is not None and c.guest.kernel == "/k"


def test_guest_and_optional_host_fields_may_be_left_out() -> None:
    c = cluster_from_dict({"name": "c", "hosts": [{"name": "a", "uri": "test:///default"}]})
    assert c.guest is None and c.min_yield == 0.0
    assert c.hosts[0].cores is None and c.hosts[0].memory_reserved == 0


def test_unknown_uri_scheme_is_refused_naming_the_uri() -> None:
    d = lab_like()
    d["hosts"][1]["uri"] = "vmware://esx1/"
    with pytest.raises(InputError, match=r"hosts\[1\]\.uri: 'vmware://esx1/' has unknown scheme 'vmware'"):
        cluster_from_dict(d)


def test_duplicate_host_names_are_refused() -> None:
    d = lab_like()
    d["hosts"][1]["name"] = "h0"
    with pytest.raises(InputError, match=r"hosts\[1\]\.name: duplicate host name 'h0'"):
        cluster_from_dict(d)


def test_unknown_fields_are_refused_so_typos_do_not_pass() -> None:
    d = lab_like()
    d["hosts"][0]["memory_reserverd"] = "1GiB"
    with pytest.raises(InputError, match=r"hosts\[0\]: unknown field 'memory_reserverd'"):
        cluster_from_dict(d)


def test_a_cluster_without_hosts_is_refused() -> None:
    with pytest.raises(InputError, match="hosts: a cluster needs at least one"):
        cluster_from_dict({"name": "c", "hosts": []})


@pytest.mark.parametrize("value", [1.5, -0.1, "high"])
def test_min_yield_must_be_a_fraction(value: Any) -> None:
    d = lab_like()
    d["min_yield"] = value
    with pytest.raises(InputError, match="min_yield"):
        cluster_from_dict(d)


def test_guest_domain_type_must_be_known() -> None:
    d = lab_like()
    d["guest"]["domain_type"] = "lxc"
    with pytest.raises(InputError, match=r"guest\.domain_type: 'lxc'"):
        cluster_from_dict(d)


@pytest.mark.parametrize("text,expected", [(4096, 4096), ("128MiB", 128 << 20), ("2GiB", 2 << 30),
                                           ("1.5KiB", 1536), ("10B", 10), ("77", 77), ("128MB", 128 * 10**6),
                                           ("1gb", 10**9), ("64k", 65536)])
def test_sizes_are_bytes_or_binary_or_decimal_units(text: Any, expected: int) -> None:
    assert parse_size("memory", text) == expected


@pytest.mark.parametrize("text", ["lots", -1, 0, True, 1.5, "unlimited", "2XB"])
def test_bad_sizes_are_refused_naming_the_field(text: Any) -> None:
    with pytest.raises(InputError, match=r"^memory: "):
        parse_size("memory", text)


def test_sizes_format_in_the_largest_readable_unit() -> None:
    assert format_size(128 << 20) == "128 MiB"
    assert format_size(3 << 30) == "3 GiB"
