"""Disk and network caps of a running domain (:mod:`vcsched.iocaps`): setting them, reading them back.

* disk: ``virDomainSetBlockIoTune`` on every disk of the VM with ``total_bytes_sec`` (and ``total_iops_sec``)
  and one ``group_name`` (:data:`IO_GROUP`), so QEMU throttles the VM's disks *together*; read back with
  ``blockIoTune``; new VMs carry ``<iotune>`` on each disk (:mod:`hypervisor.domain_xml`);
* network: ``virDomainSetInterfaceParameters`` on every interface with the same ``inbound.average`` and
  ``outbound.average`` (the VM's cap split evenly over its interfaces, in libvirt's 1000 B/s units as tc
  applies them); read back with ``interfaceParameters``; new VMs carry ``<bandwidth>``.  libvirt shapes with
  ``tc`` on the tap (inbound: an HTB class with an SFQ leaf and an ``fw`` filter; outbound: ingress policing,
  which *drops* what exceeds the cap); a host whose kernel lacks those fails with tc's message, and a failed
  call leaves half of its tc set-up behind, so the previous parameters are put back before the error is
  reported;
* Xen (libxl) and the test driver: neither (:mod:`hypervisor.drivers`).
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from typing import Any

import libvirt

from hypervisor.base import HypervisorError
from hypervisor.devices import devices_of
from hypervisor.libvirt_calls import as_host_error, one_line, retrying
from vcsched.iocaps import NET_UNIT, IoCaps, VmDevices, net_units

#: The ``interfaceParameters`` a failed ``setInterfaceParameters`` is undone with (``floor`` is for networks).
SHAPING_KEYS = ("inbound.average", "inbound.peak", "inbound.burst", "outbound.average", "outbound.peak",
                "outbound.burst")

#: The QEMU throttle group all disks of one VM share (groups are per QEMU process, i.e. per VM).
IO_GROUP = "vcsched"


def apply_io_caps(host: str, dom: Any, devices: VmDevices, caps: IoCaps, flags: int) -> None:
    """Set ``caps`` on a running domain: every disk (one throttle group), then every interface.

    ``caps`` fields that are None are left as they are; 0 removes a limit
    (calibration only: plans never uncap).  Errors name the host, the VM and
    the value.
    """
    vm = dom.name()
    tune: dict[str, Any] = {}
    if caps.disk_bytes_sec is not None:
        tune["total_bytes_sec"] = int(caps.disk_bytes_sec)
    if caps.disk_iops_sec is not None:
        tune["total_iops_sec"] = int(caps.disk_iops_sec)
    if tune:
        if any(tune.values()):
            tune["group_name"] = IO_GROUP
        for d in devices.disks:
            with as_host_error(host, f"throttle disk {d} of {vm!r} to {tune}"):
                retrying(functools.partial(dom.setBlockIoTune, d, tune, flags))
    if caps.net_bytes_sec is not None:
        average = net_units(caps.net_bytes_sec, len(devices.nics))
        for n in devices.nics:
            shape_interface(host, dom, n, average, flags, caps.net_bytes_sec)



def shape_interface(host: str, dom: Any, nic: str, average: int, flags: int, asked: int) -> None:
    """One interface to ``average`` units both ways (0: unshaped); on failure its previous parameters are put back.

    Not retried: a tc command that fails (a qdisc or action the host's
    kernel lacks) fails the same way again.
    """
    vm = dom.name()
    live = libvirt.VIR_DOMAIN_AFFECT_LIVE
    with as_host_error(host, f"read the shaping of interface {nic} of {vm!r}"):
        before = {k: v for k, v in dom.interfaceParameters(nic, live).items() if k in SHAPING_KEYS}
    try:
        dom.setInterfaceParameters(nic, {"inbound.average": average, "outbound.average": average}, flags)
    except libvirt.libvirtError as exc:
        try:
            dom.setInterfaceParameters(nic, before, live)
            restored = "its previous shaping was put back"
        except libvirt.libvirtError as again:
            restored = f"putting its previous shaping back failed too ({again.get_error_message()})"
        said = one_line(exc)
        raise HypervisorError(f"host {host}: cannot shape interface {nic} of {vm!r} to {asked} B/s "
                              f"({average} x {NET_UNIT} B/s): {said}; {restored}") from None


def live_devices(dom: Any) -> VmDevices:
    """The disks and shaped interfaces of a domain, from its live XML (interfaces named by their tap)."""
    return devices_of(ET.fromstring(dom.XMLDesc(0)))


def io_caps_of(tunes: list[dict[str, Any]], nets: list[dict[str, Any]]) -> IoCaps:
    """A VM's caps from ``blockIoTune`` of each disk and ``interfaceParameters`` of each interface.

    Disk: the group's ``total_bytes_sec`` / ``total_iops_sec`` (0 on any disk:
    uncapped; disks that disagree report the largest).  Network: the sum over
    interfaces of the larger of inbound and outbound average (0 on any:
    uncapped), in bytes per second.
    """
    def disk(key: str) -> int | None:
        values = [int(t.get(key, 0) or 0) for t in tunes]
        return None if not values or min(values) <= 0 else max(values)

    net: int | None = None
    if nets:
        per = [max(int(n.get("inbound.average", 0) or 0), int(n.get("outbound.average", 0) or 0)) for n in nets]
        ins = [int(n.get("inbound.average", 0) or 0) for n in nets]
        outs = [int(n.get("outbound.average", 0) or 0) for n in nets]
        net = None if min(ins) <= 0 or min(outs) <= 0 else sum(per) * NET_UNIT
    return IoCaps(disk("total_bytes_sec"), disk("total_iops_sec"), net)

