"""``status``'s migrations in flight (:meth:`LibvirtHypervisor.migrations`): one ``jobStats`` per active VM, the
hosts asked at once, a host that does not answer in time left out."""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET

import pytest

from hypervisor import connections
from hypervisor.libvirt_backend import LibvirtHypervisor
from hypervisor.simlibvirt import JOB_UNBOUNDED, PAUSED, RUNNING, Call, Migration, SimDomain, SimWorld
from vcsched.formats.cluster import Cluster, ClusterHost
from vcsched.inventory import VmMeta

MIB = 1 << 20
HOSTS = 8
#: Each jobStats answer takes this long (a host's round trip): asked one after the other, HOSTS x 2 VMs of them.
ROUND_TRIP_S = 0.1


def world_with_one_migration() -> SimWorld:
    """h0..h7, two managed VMs each; h0's vm0-0 is migrating to h1 (its paused copy there, both with a job)."""
    from hypervisor.domain_xml import metadata_xml

    world = SimWorld()
    meta = dict(ET.fromstring(metadata_xml(VmMeta("vc", 0.5, 256 * MIB, 1), bare=True)).attrib)
    for h in range(HOSTS):
        world.add_host(f"h{h}", 4, 8192 * MIB)
        for k in range(2):
            world.add_domain(f"h{h}", SimDomain(f"vm{h}-{k}", world.new_uuid(), 1, 256 * MIB, RUNNING, True,
                                                meta=meta))
    src = next(d for d in world.hosts["h0"].domains.values() if d.name == "vm0-0")
    m = Migration(src.name, src.uuid, "h0", "h1", 1, "prepared")
    src.job, src.migration = JOB_UNBOUNDED, m
    world.add_domain("h1", SimDomain(src.name, src.uuid, 1, 256 * MIB, PAUSED, False, meta=meta,
                                     job=JOB_UNBOUNDED, incoming=True, migration=m))
    return world


def hypervisor(world: SimWorld, workers: int, host_timeout: float = 15.0) -> LibvirtHypervisor:
    cluster = Cluster("sim", tuple(ClusterHost(f"h{h}", f"sim://h{h}") for h in range(HOSTS)),
                      host_timeout=host_timeout)
    return LibvirtHypervisor(cluster, connect=lambda uri: world.open(1, uri), workers=workers)


def test_the_outgoing_side_is_listed_with_the_host_of_the_other_copy() -> None:
    world = world_with_one_migration()
    hv = hypervisor(world, workers=1)
    got = hv.migrations(hv.inventory())
    assert [(m["vm"], m["source"], m["target"]) for m in got] == [("vm0-0", "h0", "h1")]


def test_the_hosts_jobs_are_read_at_once_not_one_host_after_the_other() -> None:
    world = world_with_one_migration()
    hv = hypervisor(world, workers=HOSTS)
    inv = hv.inventory()

    def slow(call: Call) -> None:
        if call.method == "jobStats":
            time.sleep(ROUND_TRIP_S)

    world.hook = slow
    start = time.monotonic()
    got = hv.migrations(inv)
    took = time.monotonic() - start
    assert [(m["vm"], m["source"], m["target"]) for m in got] == [("vm0-0", "h0", "h1")]
    one_after_the_other = len([v for v in inv.vms if v.active]) * ROUND_TRIP_S  # 1.7 s
    assert took < one_after_the_other / 2, took  # at once: about 3 round trips (h1 has 3 VMs), 0.3 s


def test_a_host_that_does_not_answer_in_time_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # The thread left blocked on the hung host is counted for this test only: the CLI's main() ends a process
    # that has such threads at once (cli/main.py), which would end the test session if it ran in-process later.
    monkeypatch.setattr(connections, "_abandoned", [0])
    world = world_with_one_migration()
    hv = hypervisor(world, workers=HOSTS, host_timeout=0.5)
    inv = hv.inventory()
    released = threading.Event()

    def h0_hangs(call: Call) -> None:
        if call.method == "jobStats" and call.host == "h0":
            released.wait(5.0)

    world.hook = h0_hangs
    start = time.monotonic()
    try:
        assert hv.migrations(inv) == []
        assert time.monotonic() - start < 1.8  # host_timeout (0.5 s), not the hung host's 5 s per VM
        assert connections.abandoned_threads() == 1
    finally:
        released.set()
