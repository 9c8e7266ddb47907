"""Which disks and interfaces a domain has, or will have: what its disk and network caps apply to.

Pure XML reading (no libvirt import), shared by the libvirt backend, which
reads a running domain's XML, and the in-memory one, and used for the VMs a
plan creates, whose devices come from their boot: a disk-image boot has one
disk (``vda``) and no interface, a template has what its ``<devices>`` hold,
a kernel boot (the cluster's ``[guest]``) has neither.

Only devices a cap can act on count: ``<disk device='disk'>`` (not CD-ROMs
or floppies) with a target, and interfaces of the types libvirt's
``<bandwidth>`` shapes (network, bridge, direct, ethernet: it refuses user,
vhostuser, hostdev, ...).  A running interface is named by its host-side tap
(``<target dev='vnet0'/>``), which is what ``interfaceStats`` and
``setInterfaceParameters`` take; one that has none yet by its MAC address,
else by its position.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from vcsched.errors import InputError
from vcsched.iocaps import VmDevices
from vcsched.plans.steps import Boot

#: Interface types whose ``<bandwidth>`` libvirt applies (virNetDevSupportsBandwidth).
SHAPED_INTERFACE_TYPES = ("network", "bridge", "direct", "ethernet")


def devices_of(root: ET.Element) -> VmDevices:
    """The cappable disks and interfaces of a parsed ``<domain>``."""
    devices = root.find("devices")
    if devices is None:
        return VmDevices()
    disks = []
    for d in devices.findall("disk"):
        target = d.find("target")
        if d.get("device", "disk") == "disk" and target is not None and target.get("dev"):
            disks.append(str(target.get("dev")))
    nics = []
    for i, n in enumerate(devices.findall("interface")):
        if n.get("type") not in SHAPED_INTERFACE_TYPES:
            continue
        target, mac = n.find("target"), n.find("mac")
        if target is not None and target.get("dev"):
            nics.append(str(target.get("dev")))
        elif mac is not None and mac.get("address"):
            nics.append(str(mac.get("address")))
        else:
            nics.append(f"interface {i}")
    return VmDevices(tuple(disks), tuple(nics))


def domain_devices(xml: str) -> VmDevices:
    return devices_of(ET.fromstring(xml))


def read_template(path: str) -> ET.Element:
    """A request's domain XML template, parsed; unreadable or malformed is bad input naming the file."""
    try:
        root = ET.fromstring(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"template {path}: cannot read ({exc.strerror})") from None
    except ET.ParseError as exc:
        raise InputError(f"template {path}: malformed XML ({exc})") from None
    if root.tag != "domain":
        raise InputError(f"template {path}: root element is <{root.tag}>, expected <domain>")
    return root


def boot_root(boot: Boot) -> ET.Element:
    """The domain XML a ``template`` or ``domain`` boot starts from (a file, or an adopted domain's own XML)."""
    if boot.kind == "domain":
        try:
            root = ET.fromstring(boot.xml or "")
        except ET.ParseError as exc:
            raise InputError(f"boot.xml: malformed domain XML ({exc})") from None
        if root.tag != "domain":
            raise InputError(f"boot.xml: root element is <{root.tag}>, expected <domain>")
        return root
    return read_template(boot.path or "")


def boot_devices(boot: Boot) -> VmDevices:
    """The devices a VM created with ``boot`` will have (see the module docstring)."""
    if boot.kind == "image":
        return VmDevices(disks=("vda",))
    if boot.kind in ("template", "domain"):
        return devices_of(boot_root(boot))
    return VmDevices()


#: Devices vcsched cannot live-migrate with a domain (libvirt refuses, or the device is bound to this host), each
#: with what an operator reads: ``(XPath below <devices>, what it is)``.
UNMIGRATABLE = (
    ("hostdev", "a host device passed through (<hostdev>)"),
    ("interface[@type='hostdev']", "a host network device passed through (<interface type='hostdev'>)"),
    ("filesystem", "a host directory shared into the guest (<filesystem>: virtiofs or 9p)"),
    ("redirdev", "a redirected USB device (<redirdev>)"),
    ("smartcard[@mode='host']", "the host's smartcard (<smartcard mode='host'>)"),
    ("shmem", "host shared memory (<shmem>)"),
)


def unmigratable_devices(xml: str) -> list[str]:
    """What in a domain's XML vcsched cannot live-migrate or restart elsewhere (empty: nothing): ``vcsched adopt``
    refuses such a domain (docs/introducing.md).  Disks are not among them: a disk on storage another host
    shares moves with the memory, one on a host's own storage is copied (the cluster file's ``storage``)."""
    root = ET.fromstring(xml)
    devices = root.find("devices")
    if devices is None:
        return []
    return [what for path, what in UNMIGRATABLE if devices.find(path) is not None]
