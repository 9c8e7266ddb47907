"""Small builders of model values for tests: clusters, inventories, VMs, requests, in-memory hypervisors.

One place, so that a change to a dataclass changes one builder, and tests
read as the situation they set up ("two full hosts", "a managed VM capped at
0.5") rather than as constructor calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypervisor.memory import MemoryHypervisor
from vcsched.formats.cluster import Cluster, ClusterHost, GuestDefaults
from vcsched.formats.request import Request
from vcsched.inventory import HostState, Inventory, VmMeta, VmState

MiB = 1 << 20
GiB = 1 << 30


def cluster_of(n_hosts: int = 2, min_yield: float = 0.0) -> Cluster:
    """A cluster file of ``n_hosts`` hosts h0, h1, ... (test-driver URIs) with a default guest."""
    hosts = tuple(ClusterHost(f"h{i}", f"test:///h{i}.xml") for i in range(n_hosts))
    return Cluster("lab", hosts, min_yield, GuestDefaults("/k", "/i"))


def managed(name: str, host: str, cluster: str, need: float, cap: float | None = None, mem: int = 128 * MiB,
            vcpus: int = 1) -> VmState:
    """A running VM vcsched manages: virtual cluster, CPU need in cores, cap (None: uncapped)."""
    return VmState(name, host, vcpus, mem, True, VmMeta(cluster, need, mem, vcpus), cap)


def vm(name: str, host: str, need: float, cap: float, cluster: str | None = None, mem: int = GiB) -> VmState:
    """A managed one-vCPU VM of 1 GiB by default, its own virtual cluster unless ``cluster`` is given."""
    return managed(name, host, cluster or name, need, cap, mem)


def inventory_of(vms: Iterable[VmState] = (), n_hosts: int = 2, cores: int = 1, memory: int = 1024 * MiB) -> Inventory:
    """Cluster "lab": ``n_hosts`` equal hosts h0, h1, ... and ``vms`` on them."""
    return Inventory("lab", tuple(HostState(f"h{i}", cores, memory) for i in range(n_hosts)), tuple(vms))


def request(name: str = "web", vms: int = 2, need: float = 0.5, mem: int = 128 * MiB, **kw: Any) -> Request:
    """A request of ``vms`` one-vCPU VMs needing ``need`` of the reference host each."""
    return Request(name, vms, kw.pop("vcpus", 1), mem, cpu_need=need, **kw)


def memory_hypervisor(inv: Inventory) -> MemoryHypervisor:
    """An in-memory hypervisor holding ``inv``."""
    return MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)


def test_driver_node(vms: list[tuple[str, VmMeta]], cores: int, first: int) -> str:
    """A libvirt test-driver host file (``test:///PATH``) of ``cores`` cores and 32 GiB running ``vms`` (name,
    vcsched metadata) of 512 MiB and one vCPU each, capped at their need; UUIDs numbered from ``first`` + 1."""
    import uuid

    from hypervisor.domain_xml import metadata_xml

    doms = "".join(
        f"<domain type='test'><name>{name}</name><uuid>{uuid.UUID(int=first + k + 1)}</uuid>"
        f"<metadata>{metadata_xml(meta)}</metadata><memory unit='MiB'>512</memory>"
        f"<currentMemory unit='MiB'>512</currentMemory><vcpu>1</vcpu>"
        f"<cputune><period>100000</period><quota>{int(meta.cpu_need_cores * 100000)}</quota></cputune>"
        "<os><type>hvm</type></os><devices/></domain>" for k, (name, meta) in enumerate(vms))
    return (f"<node><cpu><mhz>2000</mhz><model>t</model><active>{cores}</active><nodes>1</nodes><sockets>1</sockets>"
            f"<cores>{cores}</cores><threads>1</threads></cpu><memory>{32 << 20}</memory>{doms}</node>\n")
