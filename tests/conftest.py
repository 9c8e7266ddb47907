"""Shared fixtures and builders for the test suite."""

from __future__ import annotations

import pytest

from tests.etcd_support import etcd  # noqa: F401  (a real etcd on loopback, see tests/etcd_support.py)
from tests.lab_support import lab2  # noqa: F401  (the real-libvirt lab fixture, see tests/lab_support.py)
from vcsched.model import Host, Instance, Job


def make_instance(jobs: list[tuple[float, float] | tuple[float, float, int]], n_hosts: int = 2) -> Instance:
    """Identical unit hosts and jobs given as (cpu_need, memory[, tasks])."""
    hosts = tuple(Host(f"h{i}") for i in range(n_hosts))
    js = tuple(Job(f"j{i}", j[0], j[1], j[2] if len(j) > 2 else 1) for i, j in enumerate(jobs))  # type: ignore[misc]
    return Instance(hosts=hosts, jobs=js)


@pytest.fixture
def two_host_instance() -> Instance:
    return make_instance([(0.8, 0.3), (0.9, 0.5, 2)], n_hosts=2)
