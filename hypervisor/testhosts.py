"""Fake hosts for libvirt's test driver: many independent hosts on one machine, for the scale benchmark.

Each ``test:///DIR/hN.xml`` URI is a host of its own: libvirt's test driver
parses the file when the connection opens and then answers every call
(``getInfo``, ``getAllDomainStats``, ``XMLDesc``, ...) from memory, with no
daemon and no network.  So a cluster of 1,000 such hosts measures what
vcsched itself costs per host and per VM — parsing, planning, rendering and
the number of libvirt calls — apart from the network, which a real cluster
adds.  Every domain runs, carries vcsched's metadata (a managed VM of a
virtual cluster of ``VMS_PER_CLUSTER``) and a CPU cap (``<cputune>``), as
``vcsched place --apply`` leaves it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from hypervisor.domain_xml import metadata_xml
from hypervisor.files import write_atomic
from vcsched.inventory import VmMeta

MIB = 1 << 20
VMS_PER_CLUSTER = 8
CORES = 8
HOST_MEMORY_MIB = 32 * 1024
VM_MEMORY_MIB = 512
VM_NEED_CORES = 0.5


@dataclass(frozen=True)
class ScaleCluster:
    """What :func:`write_scale_cluster` wrote: the cluster file, a request to place, and the sizes."""

    cluster_file: Path
    request_file: Path
    hosts: int
    vms: int


def node_xml(host: int, vms_per_host: int, cores: int = CORES) -> str:
    """The test driver's ``<node>`` file of host ``host``: ``cores`` cores, HOST_MEMORY_MIB, ``vms_per_host`` VMs."""
    doms = []
    for k in range(vms_per_host):
        i = host * vms_per_host + k
        meta = metadata_xml(VmMeta(f"vc{i // VMS_PER_CLUSTER}", VM_NEED_CORES, VM_MEMORY_MIB * MIB, 1))
        doms.append(
            f"<domain type='test'><name>vm{i}</name><uuid>{uuid.UUID(int=i + 1)}</uuid>"
            f"<metadata>{meta}</metadata><memory unit='MiB'>{VM_MEMORY_MIB}</memory>"
            f"<currentMemory unit='MiB'>{VM_MEMORY_MIB}</currentMemory><vcpu>1</vcpu>"
            "<cputune><period>100000</period><quota>50000</quota></cputune>"
            "<os><type>hvm</type></os><devices/></domain>")
    return (f"<node><cpu><mhz>2000</mhz><model>vcsched-scale</model><active>{cores}</active><nodes>1</nodes>"
            f"<sockets>1</sockets><cores>{cores}</cores><threads>1</threads></cpu>"
            f"<memory>{HOST_MEMORY_MIB * 1024}</memory>{''.join(doms)}</node>\n")


def write_scale_cluster(directory: Path, hosts: int, vms_per_host: int, scheme: str = "test") -> ScaleCluster:
    """``hosts`` test-driver hosts in ``directory`` (``hN.xml``), a cluster file naming them and a request of one
    virtual cluster of VMS_PER_CLUSTER VMs; a fake kernel and initrd make the request placeable (nothing boots).

    ``scheme="sim"``: the same node files served by the simulated libvirt (:mod:`hypervisor.simlibvirt`,
    ``sim:///DIR/hN.xml``) instead of libvirt's test driver, whose opens cost more than vcsched itself."""
    directory.mkdir(parents=True, exist_ok=True)
    # A kernel's boot header is checked before a plan's first step (hypervisor/bootcheck.py): the fake one carries
    # a bzImage's "HdrS" at 0x202 and nothing else.
    (directory / "vmlinuz").write_bytes(bytes(0x202) + b"HdrS")
    (directory / "initrd.gz").write_bytes(b"")
    lines = ['name = "scale"', "", "[guest]", f'kernel = "{directory / "vmlinuz"}"',
             f'initrd = "{directory / "initrd.gz"}"', ""]
    for h in range(hosts):
        path = directory / f"h{h}.xml"
        write_atomic(path, node_xml(h, vms_per_host))
        lines += ["[[hosts]]", f'name = "h{h}"', f'uri = "{scheme}://{path}"', ""]
    cluster = directory / "cluster.toml"
    write_atomic(cluster, "\n".join(lines))
    request = directory / "request.toml"
    write_atomic(request, f'name = "arrival"\nvms = {VMS_PER_CLUSTER}\nvcpus = 1\nmemory = "{VM_MEMORY_MIB}MiB"\n'
                       f"cpu_cores = {VM_NEED_CORES}\n")
    return ScaleCluster(cluster, request, hosts, hosts * vms_per_host)
