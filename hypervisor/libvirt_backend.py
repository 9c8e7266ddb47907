"""The libvirt implementation of :class:`hypervisor.base.Hypervisor`: one connection per host URI.

What it reads: each host's cores and memory (``getInfo``; the cluster file may
override cores and reserve memory), every domain with its vCPUs, memory,
state, vcsched metadata and cap.  What it writes, and only to managed domains:
new domains (with metadata and cap in their XML, so a VM never runs
uncapped) and caps.

Caps (the project's contract, docs/operations.md):

* QEMU/KVM: ``vcpu_period`` = 100000 µs and ``vcpu_quota`` =
  round(cores / vcpus * period) µs *per vCPU thread* (libvirt applies the
  quota to each vCPU), set with AFFECT_LIVE (| AFFECT_CONFIG when the domain
  is persistent), read back with ``schedulerParametersFlags``;
* Xen: the credit scheduler's ``cap`` = round(cores * 100), percent of one
  physical CPU; ``weight`` is left alone;
* the libvirt test driver cannot cap at all: refused naming the host rather
  than pretending (docs/lab.md).

Disk and network caps (:mod:`vcsched.iocaps`):

* disk: ``virDomainSetBlockIoTune`` on every disk of the VM with
  ``total_bytes_sec`` (and ``total_iops_sec``) and one ``group_name``
  (:data:`IO_GROUP`), so QEMU throttles the VM's disks *together*; read back
  with ``blockIoTune``; new VMs carry ``<iotune>`` on each disk;
* network: ``virDomainSetInterfaceParameters`` on every interface with the
  same ``inbound.average`` and ``outbound.average`` (the VM's cap split
  evenly over its interfaces, in libvirt's 1000 B/s units as tc applies them);
  read back with ``interfaceParameters``; new VMs carry ``<bandwidth>``.
  libvirt shapes with ``tc`` on the tap (inbound: an HTB class with an SFQ
  leaf and an ``fw`` filter; outbound: ingress policing, which *drops* what
  exceeds the cap); a host whose kernel lacks those fails with tc's message,
  and a failed call leaves half of its tc set-up behind, so the previous
  parameters are put back before the error is reported;
* Xen (libxl): neither — see :data:`LIBXL_CANNOT`;
* the test driver: neither.

VMs are created *transient* (``createXML``): a vcsched VM lives where the
scheduler put it, and a host restart is an adaptation event for the
controller, not something the host should replay from a stale config.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar
from xml.sax.saxutils import escape, quoteattr

import libvirt

from hypervisor.base import HypervisorError, IoCounters
from hypervisor.bootcheck import boot_problems, files_local, validation_xml
from hypervisor.connections import (
    CallCounter,
    Counted,
    close_quietly,
    mark_bounded,
    note_abandoned,
    open_bounded,
    unwrap,
)
from hypervisor.devices import boot_devices, devices_of, read_template
from hypervisor.identity import LockUnnamed, check_distinct, identity, remember, remembered, uuid_from_capabilities
from vcsched.caps import CAP_TOLERANCE, MIN_QUOTA_US, PERIOD_US, cores_from_quota, quota_for, realisable_cap
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster, ClusterHost, migration_uri
from vcsched.formats.units import format_size
from vcsched.inventory import (
    METADATA_NS,
    METADATA_PREFIX,
    HostState,
    InDoubt,
    Inventory,
    VmMeta,
    VmState,
    find_in_doubt,
    mark_in_doubt,
)
from vcsched.iocaps import DISK, NET, NET_UNIT, IoCaps, VmDevices, io_problem, net_units, realisable
from vcsched.plans.steps import CreateStep

#: The ``interfaceParameters`` a failed ``setInterfaceParameters`` is undone with (``floor`` is for networks).
SHAPING_KEYS = ("inbound.average", "inbound.peak", "inbound.burst", "outbound.average", "outbound.peak",
                "outbound.burst")

#: The QEMU throttle group all disks of one VM share (groups are per QEMU process, i.e. per VM).
IO_GROUP = "vcsched"

#: What libvirt's libxl driver (Xen) can do with disk and network caps, as of libvirt 9.0: why vcsched
#: refuses them on a Xen host instead of writing XML that would be ignored.
LIBXL_CANNOT = {
    DISK: ("libvirt's libxl driver implements neither virDomainSetBlockIoTune nor virDomainGetBlockIoTune and "
           "does not translate <iotune> for libxl, so a Xen VM would run with unlimited disk I/O"),
    NET: ("libvirt's libxl driver has no virDomainSetInterfaceParameters: it applies only <bandwidth><outbound "
          "average> when a domain starts (as the netback rate, average x 1024 bytes per 50 ms), cannot change or "
          "read it on a running domain, and never limits inbound traffic"),
}


def io_support(driver: str, uri: str) -> tuple[tuple[str, str], ...]:
    """``(resource, why not)`` for each of CPU, disk and network the driver cannot cap (``HostState.cannot_cap``):
    a plan capping it there is refused before its first step (:mod:`vcsched.plans.check`)."""
    if driver == "test":
        return (("cpu", f"the libvirt test driver ({uri}) cannot set CPU caps"),
                (DISK, f"the libvirt test driver ({uri}) cannot throttle disks"),
                (NET, f"the libvirt test driver ({uri}) cannot shape network interfaces"))
    if driver in ("xen", "libxl"):
        return tuple(LIBXL_CANNOT.items())
    return ()


def iotune_element(caps: IoCaps) -> ET.Element:
    """``<iotune>`` for a disk of a VM capped at ``caps`` (its disk fields), in the VM's throttle group."""
    el = ET.Element("iotune")
    if caps.disk_bytes_sec is not None:
        ET.SubElement(el, "total_bytes_sec").text = str(int(caps.disk_bytes_sec))
    if caps.disk_iops_sec is not None:
        ET.SubElement(el, "total_iops_sec").text = str(int(caps.disk_iops_sec))
    ET.SubElement(el, "group_name").text = IO_GROUP
    return el


def bandwidth_element(average: int) -> ET.Element:
    """``<bandwidth>`` with the same average (libvirt units, :data:`vcsched.iocaps.NET_UNIT`) both ways.

    Peak and burst are left to libvirt: inbound, HTB's ceiling defaults to the
    rate (no borrowing) and its burst to one packet; outbound, libvirt polices
    with a burst of ``average`` kilobytes, i.e. one second of traffic.
    """
    el = ET.Element("bandwidth")
    ET.SubElement(el, "inbound", average=str(average))
    ET.SubElement(el, "outbound", average=str(average))
    return el


def add_io_caps(root: ET.Element, caps: IoCaps) -> None:
    """Put ``caps`` into a ``<domain>``: ``<iotune>`` on each disk, ``<bandwidth>`` on each shaped interface."""
    devices = root.find("devices")
    if devices is None or not caps:
        return
    found = devices_of(root)
    if caps.disk_bytes_sec is not None or caps.disk_iops_sec is not None:
        for disk in devices.findall("disk"):
            target = disk.find("target")
            if target is None or target.get("dev") not in found.disks:
                continue
            for old in disk.findall("iotune"):
                disk.remove(old)
            disk.append(iotune_element(caps))
    if caps.net_bytes_sec is not None:
        average = net_units(caps.net_bytes_sec, len(found.nics))
        for nic in devices.findall("interface"):
            if nic.get("type") not in ("network", "bridge", "direct", "ethernet"):
                continue
            for old in nic.findall("bandwidth"):
                nic.remove(old)
            nic.append(bandwidth_element(average))


def _quiet() -> None:
    """libvirt prints every error on stderr by default; ours are reported once, by the CLI."""
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def metadata_xml(meta: VmMeta, *, bare: bool = False) -> str:
    """The ``<vcsched:vm>`` element for a domain's XML; ``bare``: without the namespace, for ``setMetadata``.

    ``setMetadata`` puts the element in the namespace itself and refuses one
    that already declares it ("failed to create a new XML namespace").
    """
    tag = "vm" if bare else f'{METADATA_PREFIX}:vm xmlns:{METADATA_PREFIX}="{METADATA_NS}"'
    floor = "" if meta.min_yield is None else f' min_yield="{meta.min_yield!r}"'
    # The multi-resource attributes only when set, so a CPU-only VM's metadata reads as it always did.
    extra = "".join(f' {k}="{v}"' for k, v in (("disk_bps", meta.disk_bps), ("net_bps", meta.net_bps))
                    if v is not None)
    if meta.weight != 1.0:
        extra += f' weight="{meta.weight!r}"'
    if meta.tenant is not None:
        extra += f" tenant={quoteattr(meta.tenant)}"
    if meta.migrated_at is not None:
        extra += f' migrated_at="{meta.migrated_at!r}"'
    # The placement rules (docs/rules.md) only when set, likewise.
    for k in ("spread", "together"):
        if getattr(meta, k) is not None:
            extra += f' {k}="{getattr(meta, k)}"'
    if meta.pinned:
        extra += ' pinned="true"'
    return (f'<{tag} cluster={quoteattr(meta.cluster)} cpu_need_cores="{meta.cpu_need_cores!r}" '
            f'memory_bytes="{meta.memory_bytes}" vcpus="{meta.vcpus}"{floor}{extra}/>')


def parse_metadata(xml: str) -> VmMeta | None:
    """The ``<vcsched:vm>`` element libvirt hands back (namespace prefix dropped); None if unusable.

    A domain with broken vcsched metadata is treated as unmanaged: never touching
    it is the safe reading of "we cannot tell what it needs".
    """
    try:
        return parse_metadata_element(ET.fromstring(xml))
    except ET.ParseError:
        return None


def replace_doubt(doubt: InDoubt, resolved: str) -> InDoubt:
    from dataclasses import replace

    return replace(doubt, resolved=resolved)


_RULE_VALUES = (None, "required", "preferred")


def parse_metadata_element(el: ET.Element) -> VmMeta | None:
    """:func:`parse_metadata` of an element already parsed (from a whole domain XML)."""
    a = el.attrib
    try:
        floor = float(a["min_yield"]) if "min_yield" in a else None
        disk = int(a["disk_bps"]) if "disk_bps" in a else None
        net = int(a["net_bps"]) if "net_bps" in a else None
        weight = float(a.get("weight", "1.0"))
        if not (weight > 0 and math.isfinite(weight)) or (disk is not None and disk < 0) \
                or (net is not None and net < 0):
            return None
        spread, together = a.get("spread"), a.get("together")
        if spread not in _RULE_VALUES or together not in _RULE_VALUES:
            return None
        moved = float(a["migrated_at"]) if "migrated_at" in a else None
        return VmMeta(a["cluster"], float(a["cpu_need_cores"]), int(a["memory_bytes"]), int(a["vcpus"]), floor,
                      disk, net, weight, a.get("tenant"), spread, together, a.get("pinned") == "true",
                      migrated_at=moved)
    except (KeyError, ValueError):
        return None


def domain_xml(step: CreateStep, partition: str | None) -> str:
    """The XML of a VM to create: from the request's template, or built for a kernel or disk-image boot.

    The serial console is a pty (``virsh console``), not a log file: a file
    serial fails on a host whose /var/log/libvirt/qemu does not exist yet
    (measured on a fresh lab host), and libvirt offers no way to create it.
    """
    meta = metadata_xml(step.meta())
    quota = quota_for(step.cap_cores, step.vcpus)
    if step.boot.kind == "template":
        return _from_template(step, partition, meta, quota)
    xml = _built(step, partition, meta, quota)
    if not step.io_caps:
        return xml
    root = ET.fromstring(xml)
    add_io_caps(root, step.io_caps)
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    return ET.tostring(root, encoding="unicode")


def _built(step: CreateStep, partition: str | None, meta: str, quota: int) -> str:
    """The XML of a kernel or disk-image boot."""
    resource = f"<resource><partition>{escape(partition)}</partition></resource>" if partition else ""
    if step.boot.kind == "kernel":
        os_xml = (f"<type arch='x86_64'>hvm</type><kernel>{escape(step.boot.kernel or '')}</kernel>"
                  f"<initrd>{escape(step.boot.initrd or '')}</initrd><cmdline>{escape(step.boot.cmdline)}</cmdline>")
        disk = ""
    else:
        os_xml = "<type arch='x86_64'>hvm</type><boot dev='hd'/>"
        fmt = "qcow2" if (step.boot.path or "").endswith(".qcow2") else "raw"
        disk = (f"<disk type='file' device='disk'><driver name='qemu' type='{fmt}'/>"
                f"<source file={quoteattr(step.boot.path or '')}/><target dev='vda' bus='virtio'/></disk>")
    return f"""<domain type={quoteattr(step.boot.domain_type)}>
  <name>{escape(step.vm)}</name>
  <memory unit='b'>{step.memory_bytes}</memory>
  <vcpu>{step.vcpus}</vcpu>
  <metadata>{meta}</metadata>
  <cputune><period>{PERIOD_US}</period><quota>{quota}</quota></cputune>
  {resource}
  <os>{os_xml}</os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    {disk}
    <serial type='pty'><target port='0'/></serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
"""


def _from_template(step: CreateStep, partition: str | None, meta: str, quota: int) -> str:
    """The request's template with name, size, metadata, caps and partition set by vcsched (uuid dropped)."""
    root = read_template(step.boot.path or "")
    for tag in ("uuid", "name", "memory", "currentMemory", "vcpu", "metadata", "cputune"):
        for el in root.findall(tag):
            root.remove(el)
    ET.SubElement(root, "name").text = step.vm
    mem = ET.SubElement(root, "memory", unit="b")
    mem.text = str(step.memory_bytes)
    ET.SubElement(root, "vcpu").text = str(step.vcpus)
    md = ET.SubElement(root, "metadata")
    md.append(ET.fromstring(meta))
    tune = ET.SubElement(root, "cputune")
    ET.SubElement(tune, "period").text = str(PERIOD_US)
    ET.SubElement(tune, "quota").text = str(quota)
    if partition and root.find("resource") is None:
        res = ET.SubElement(root, "resource")
        ET.SubElement(res, "partition").text = partition
    add_io_caps(root, step.io_caps)
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    return ET.tostring(root, encoding="unicode")


def rewrite_partition(xml: str, source_partition: str | None, target_partition: str | None) -> str:
    """The domain XML with the source host's cgroup partition replaced by the destination's.

    Each lab host keeps its VMs in its own partition (docs/lab.md), so a VM
    arriving on another host must name that host's.  Edited as XML, not as
    text, so it does not depend on how libvirt indents the document.
    """
    if source_partition == target_partition:
        return xml
    root = ET.fromstring(xml)
    resource = root.find("resource")
    partition = resource.find("partition") if resource is not None else None
    if target_partition is None:
        if resource is not None and partition is not None:
            resource.remove(partition)
            if not len(resource):
                root.remove(resource)
    else:
        if resource is None:
            resource = ET.SubElement(root, "resource")
        if partition is None:
            partition = ET.SubElement(resource, "partition")
        partition.text = target_partition
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    return ET.tostring(root, encoding="unicode")


@contextlib.contextmanager
def _as_host_error(host: str, what: str) -> Iterator[None]:
    """Any libvirt failure becomes a HypervisorError naming the host: the executor reports those as step failures."""
    try:
        yield
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"host {host}: cannot {what}: {exc.get_error_message()}") from None


#: libvirt errors that a moment later may not recur: a cgroup being set up while another domain starts
#: ("Failed to create v2 cgroup"), a daemon busy or briefly unreachable.  Retried; anything else is final.
TRANSIENT_ERRORS = frozenset(code for code in (
    getattr(libvirt, "VIR_ERR_INTERNAL_ERROR", None), getattr(libvirt, "VIR_ERR_OPERATION_FAILED", None),
    getattr(libvirt, "VIR_ERR_SYSTEM_ERROR", None), getattr(libvirt, "VIR_ERR_OPERATION_TIMEOUT", None),
    getattr(libvirt, "VIR_ERR_RPC", None)) if code is not None)
RETRIES = 3
RETRY_PAUSE_S = 0.2

T = TypeVar("T")


def _retrying(fn: Callable[[], T]) -> T:
    """``fn()``, again up to :data:`RETRIES` times while it fails with a transient libvirt error."""
    for attempt in range(RETRIES + 1):
        try:
            return fn()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in TRANSIENT_ERRORS or attempt == RETRIES:
                raise
            time.sleep(RETRY_PAUSE_S * (attempt + 1))
    raise AssertionError("unreachable")


def migration_flags(cluster: Cluster, source: str, target: str) -> int:
    """LIVE | PAUSED always (the destination is resumed by vcsched); TLS and NON_SHARED_DISK as the cluster says."""
    flags = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PAUSED
    if cluster.migration_tls:
        flags |= libvirt.VIR_MIGRATE_TLS
    if not cluster.shares_storage(source, target):
        flags |= libvirt.VIR_MIGRATE_NON_SHARED_DISK
    return flags


def stamp_migrated_at(xml: str, when: float, arriving_from: str | None = None) -> str:
    """The domain XML with ``migrated_at`` set on its vcsched metadata (a domain without it is left as is).

    The VM arrives carrying the time of its move, so whichever controller runs
    next knows it was just moved (the cool-down of `vcsched run`) without a
    database of its own.
    """
    root = ET.fromstring(xml)
    el = root.find(f"metadata/{{{METADATA_NS}}}vm")
    if el is None:
        return xml
    el.set("migrated_at", repr(float(when)))
    if arriving_from is not None:  # paused on arrival until vcsched resumes it (and drops this mark)
        el.set("arriving_from", arriving_from)
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    return ET.tostring(root, encoding="unicode")


def set_cputune(xml: str, quota_us: int) -> str:
    """The domain XML with its ``<cputune>`` period and quota set (so a migrated VM arrives capped)."""
    root = ET.fromstring(xml)
    tune = root.find("cputune")
    if tune is None:
        tune = ET.SubElement(root, "cputune")
    for tag, value in (("period", PERIOD_US), ("quota", quota_us)):
        el = tune.find(tag)
        if el is None:
            el = ET.SubElement(tune, tag)
        el.text = str(value)
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    return ET.tostring(root, encoding="unicode")


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
            with _as_host_error(host, f"throttle disk {d} of {vm!r} to {tune}"):
                _retrying(functools.partial(dom.setBlockIoTune, d, tune, flags))
    if caps.net_bytes_sec is not None:
        average = net_units(caps.net_bytes_sec, len(devices.nics))
        for n in devices.nics:
            shape_interface(host, dom, n, average, flags, caps.net_bytes_sec)


def one_line(exc: Exception) -> str:
    """libvirt's message for ``exc`` on one line (tc's errors, passed through by libvirt, span several)."""
    said = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else None
    return " ".join((said or str(exc)).split())


def shape_interface(host: str, dom: Any, nic: str, average: int, flags: int, asked: int) -> None:
    """One interface to ``average`` units both ways (0: unshaped); on failure its previous parameters are put back.

    Not retried: a tc command that fails (a qdisc or action the host's
    kernel lacks) fails the same way again.
    """
    vm = dom.name()
    live = libvirt.VIR_DOMAIN_AFFECT_LIVE
    with _as_host_error(host, f"read the shaping of interface {nic} of {vm!r}"):
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


#: Inventory threads reading hosts at once (each mostly waits on its host's answer).
INVENTORY_WORKERS = 32


def inventory_workers(uris: Iterable[str]) -> int:
    """How many threads read these hosts at once: INVENTORY_WORKERS, or one per core when every host is served by
    libvirt's test driver.

    The test driver answers inside this process (the scale benchmark's fake
    hosts), so reading it is CPU work: threads beyond the cores only queue for
    the interpreter's lock (measured at 1,000 hosts on 2 cores: 32 threads
    used about 1 s more CPU than 2 and finished later).  Real hosts answer over
    a socket, and their threads mostly wait.
    """
    if all(u.startswith("test:") for u in uris):
        return max(1, min(INVENTORY_WORKERS, len(os.sched_getaffinity(0))))
    return INVENTORY_WORKERS

#: libvirt domain states that count as running a copy of the VM (paused = a copy that is not executing).
_PAUSED_STATES = frozenset(getattr(libvirt, n) for n in ("VIR_DOMAIN_PAUSED", "VIR_DOMAIN_PMSUSPENDED")
                           if hasattr(libvirt, n))
_INACTIVE_STATES = frozenset((libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_NOSTATE))


def _size_bytes(el: ET.Element | None) -> int:
    """A libvirt ``<memory unit='KiB'>N</memory>``-style element in bytes (0 when absent)."""
    if el is None or not (el.text or "").strip():
        return 0
    units = {"b": 1, "bytes": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
             "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}
    return int(el.text or 0) * units.get(el.get("unit", "KiB").lower(), 1024)


def cap_from_xml(root: ET.Element, vcpus: int) -> float | None:
    """The CFS cap a live domain XML carries (``<cputune><quota>``, per vCPU), like :meth:`_read_cap`."""
    return _cap_from_cputune(root.find("cputune"), vcpus)


def _cap_from_cputune(tune: ET.Element | None, vcpus: int) -> float | None:
    if tune is None:
        return None
    quota_el, period_el = tune.find("quota"), tune.find("period")
    try:
        quota = int(quota_el.text or 0) if quota_el is not None else 0
        period = int(period_el.text or 0) if period_el is not None else PERIOD_US
    except ValueError:
        return None
    if quota <= 0 or not period or quota > period:
        return None
    return cores_from_quota(quota, period, vcpus)


def io_caps_from_xml(root: ET.Element, devices: VmDevices) -> IoCaps:
    """A live domain's disk and network caps from its ``<iotune>`` and ``<bandwidth>`` (as libvirt applied them)."""
    tunes, nets = [], []
    for disk in root.findall("devices/disk"):
        target = disk.find("target")
        if target is None or target.get("dev") not in devices.disks:
            continue
        tune = disk.find("iotune")
        tunes.append({k: int(tune.findtext(k) or "0") for k in ("total_bytes_sec", "total_iops_sec")}
                     if tune is not None else {})
    for nic in root.findall("devices/interface"):
        target = nic.find("target")
        if nic.get("type") not in ("network", "bridge", "direct", "ethernet"):
            continue
        bw = nic.find("bandwidth")
        entry = {}
        for way in ("inbound", "outbound"):
            el = bw.find(way) if bw is not None else None
            entry[f"{way}.average"] = int(el.get("average", "0")) if el is not None else 0
        if target is not None or bw is not None:
            nets.append(entry)
    return io_caps_of(tunes, nets[:len(devices.nics)])


_META_TAG = f"{{{METADATA_NS}}}vm"
_NO_DEVICES = VmDevices()


def vm_from_xml(host: str, xml: str, active: bool, paused: bool, *, driver: str) -> VmState:
    """One domain as the inventory reports it, from its live XML (one libvirt call per VM).

    The live XML carries everything the per-VM calls used to ask one by one:
    vCPUs, memory, vcsched metadata, the CFS quota libvirt applied, disks,
    interfaces and their ``<iotune>``/``<bandwidth>``.  The domain's children
    are visited once (the first of each tag, as ``find`` would pick) and the
    device walk is skipped when ``<devices>`` has no disk and no interface:
    at 10,000 VMs every path lookup per VM costs about 0.1 s.
    """
    return vm_from_element(host, ET.fromstring(xml), active, paused, driver=driver)


def vm_from_element(host: str, root: ET.Element, active: bool, paused: bool, *, driver: str) -> VmState:
    """:func:`vm_from_xml` of a ``<domain>`` already parsed (:func:`parse_domains`)."""
    first: dict[str, ET.Element] = {}
    for child in root:
        first.setdefault(child.tag, child)
    vcpu_el = first.get("vcpu")
    vcpus = int(vcpu_el.get("current") or vcpu_el.text or 1) if vcpu_el is not None else 1
    meta_parent = first.get("metadata")
    meta_el = meta_parent.find(_META_TAG) if meta_parent is not None else None
    meta = parse_metadata_element(meta_el) if meta_el is not None else None
    devs = first.get("devices")
    devices = devices_of(root) if devs is not None and (devs.find("disk") is not None
                                                         or devs.find("interface") is not None) else _NO_DEVICES
    cap = None
    io = IoCaps()
    if active and driver not in ("xen", "libxl"):  # Xen: the credit scheduler's cap, read apart
        # (libvirt's test driver keeps the <cputune> its domain file gives: the scale benchmark's caps.)
        cap = _cap_from_cputune(first.get("cputune"), vcpus)
        if devices is not _NO_DEVICES:
            io = io_caps_from_xml(root, devices)
    name_el, uuid_el = first.get("name"), first.get("uuid")
    return VmState(name_el.text or "" if name_el is not None else "", host, vcpus, _size_bytes(first.get("memory")),
                   active, meta, cap, devices, io, uuid=uuid_el.text or "" if uuid_el is not None else None,
                   paused=paused, arriving_from=meta_el.get("arriving_from") if meta_el is not None else None)


def parse_domains(xmls: list[str]) -> list[ET.Element]:
    """The ``<domain>`` elements of a host's domain XMLs, parsed in one go (one parser, not one per domain:
    ~6 us less per VM); one by one when that fails, so a broken XML fails as it would alone."""
    if len(xmls) > 1:
        try:
            together = list(ET.fromstring("<domains>" + "".join(xmls) + "</domains>"))
        except ET.ParseError:
            pass
        else:
            if len(together) == len(xmls) and all(d.tag == "domain" for d in together):
                return together
    return [ET.fromstring(x) for x in xmls]


def disk_bytes_of(stats: Mapping[str, Any], disks: Iterable[str]) -> int:
    """Bytes a VM's disks occupy, from ``getAllDomainStats`` BLOCK fields: what copying them moves.

    Per disk the larger of ``allocation`` (QEMU: the highest offset written)
    and ``physical`` (the image's size on the host), so neither an idle
    guest nor a sparse image hides what a copy transfers.  CD-ROMs and
    floppies (not in ``disks``) are not counted.  Only a disk's first entry
    counts: its top image.  (``backingIndex`` does not tell the layers apart:
    with -blockdev QEMU numbers the top image too, e.g. ``backingIndex = 1``;
    backing layers are listed after it, under the same name, only when the
    caller asks for them.)
    """
    wanted = set(disks)
    seen: set[str] = set()
    total = 0
    for i in range(int(stats.get("block.count", 0))):
        name = stats.get(f"block.{i}.name")
        if name not in wanted or name in seen:
            continue
        seen.add(str(name))
        total += max(int(stats.get(f"block.{i}.allocation", 0)), int(stats.get(f"block.{i}.physical", 0)))
    return total


def _run_bounded(tasks: Mapping[str, Callable[[], T]], workers: int, timeout_s: float) -> dict[str, T | Exception]:
    """Run ``tasks`` on at most ``workers`` daemon threads; a task running longer than ``timeout_s`` is abandoned.

    The answer has an entry for each task that finished in time (its value or
    its exception); an abandoned task's thread is replaced, so hung hosts
    cannot starve the others, and being a daemon it cannot hold the process at
    exit.  The caller's thread sleeps until every task is done or the oldest
    running one reaches its deadline, and each wake-up costs O(1) plus the
    tasks it abandons: with 1,000 hosts, re-scanning every task at each
    finished one cost a quadratic 0.2-0.4 s of the interpreter's lock.
    """
    pending = collections.deque(tasks.items())
    results: dict[str, T | Exception] = {}
    running: dict[str, float] = {}  # started, not finished, not abandoned: key -> start, oldest first
    cond = threading.Condition()

    def worker() -> None:
        mark_bounded()
        while True:
            with cond:
                if not pending:
                    return
                key, fn = pending.popleft()
                running[key] = time.monotonic()
            try:
                value: T | Exception = fn()
            except Exception as exc:
                value = exc
            with cond:
                if running.pop(key, None) is not None:  # else: abandoned at its deadline, the host is down
                    results[key] = value
                if not pending and not running:
                    cond.notify_all()

    def spawn() -> None:
        threading.Thread(target=worker, name="inventory", daemon=True).start()

    with cond:
        for _ in range(max(1, min(workers, len(pending))) if pending else 0):
            spawn()
        while pending or running:
            now = time.monotonic()
            late = []
            for key, began in running.items():  # oldest first: stop at the first one still in time
                if now - began <= timeout_s:
                    break
                late.append(key)
            for key in late:  # each late task holds a thread: give the queue a fresh one
                del running[key]
                if pending:
                    spawn()
            if late:
                note_abandoned(len(late))
            if running:
                cond.wait(max(next(iter(running.values())) + timeout_s - now, 0.005))
            elif pending:  # workers starting (or replacements): they pick the queue up at once
                cond.wait(0.05)
        return dict(results)


class LibvirtHypervisor:
    """All hosts of one cluster file; connections open on first use and are closed by :meth:`close`.

    A host that does not answer within the cluster's ``host_timeout``
    (or refuses us, e.g. our certificate) is *down* for the rest of the
    command: every later call on it fails at once, naming the reason.  The
    next :meth:`inventory` asks it again.
    """

    def __init__(self, cluster: Cluster, *, settle: bool = True,
                 on_notice: Callable[[str], None] | None = None) -> None:
        _quiet()
        self.cluster = cluster
        self._conns: dict[str, Any] = {}
        self._down: dict[str, str] = {}  # host -> why it is down for this command
        self._doms: dict[str, dict[str, Any]] = {}  # host -> domain name -> virDomain, listed once per inventory
        self._drivers: dict[str, str] = {}
        self._uuids: dict[str, str | None] = {}  # host -> its libvirt UUID, as first read in this command
        self._lock = threading.Lock()  # a plan's wave of migrations uses the connections from several threads
        self.calls = CallCounter()
        #: Whether :meth:`inventory` removes paused copies of VMs whose other copy runs (False: only report).
        self.settle = settle
        #: What inventories settled on their own (one line each), for the CLI to show; ``on_notice`` hears each
        #: as it happens.
        self.notices: list[str] = []
        self._on_notice = on_notice

    def _notice(self, line: str) -> None:
        self.notices.append(line)
        if self._on_notice is not None:
            self._on_notice(line)

    def __enter__(self) -> LibvirtHypervisor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _conn(self, host: str) -> Any:
        with self._lock:
            if host in self._down:
                raise HypervisorError(self._down[host])
            if host in self._conns:
                return self._conns[host]
        try:
            conn = open_bounded(host, self.cluster.connect_uri(host), self.cluster.host_timeout)
        except HypervisorError as exc:
            with self._lock:
                self._down[host] = str(exc)
            raise
        with self._lock:
            if host in self._conns:  # another thread opened it meanwhile
                close_quietly(conn)
            else:
                self._conns[host] = Counted(conn, host, self.calls)
                self.calls.add(host)  # the open itself
            return self._conns[host]

    def _driver(self, host: str) -> str:
        if host not in self._drivers:
            with _as_host_error(host, "ask the driver type"):
                self._drivers[host] = str(self._conn(host).getType()).lower()  # "qemu", "xen", "test", ...
        return self._drivers[host]

    def _lookup(self, host: str, vm: str) -> Any | None:
        """The domain named ``vm`` on ``host``, from the host's list read once per inventory (a miss asks by name)."""
        cached = self._doms.get(host)
        if cached is not None and vm in cached:
            return cached[vm]
        with _as_host_error(host, "list domains"):
            conn = self._conn(host)
            if cached is None and not hasattr(conn, "lookupByName"):  # test fakes only list
                return next((d for d in conn.listAllDomains(0) if d.name() == vm), None)
            try:
                dom = conn.lookupByName(vm)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return None
                raise
        self._doms.setdefault(host, {})[vm] = dom
        return dom

    def _drop(self, host: str, vm: str) -> None:
        """Forget a cached domain that was removed or moved away."""
        self._doms.get(host, {}).pop(vm, None)

    def _domain(self, host: str, vm: str) -> Any:
        dom = self._lookup(host, vm)
        if dom is None:
            raise HypervisorError(f"host {host}: no domain {vm!r}")
        return dom

    # ----------------------------------------------------------- reading

    def host_state(self, h: ClusterHost) -> HostState:
        info = self._conn(h.name).getInfo()  # [model, memory MiB, cpus, mhz, nodes, sockets, cores, threads]
        cores = h.cores if h.cores is not None else int(info[2])
        return HostState(h.name, cores, int(info[1]) << 20, h.memory_reserved, disk_bps=h.disk_bps,
                         net_bps=h.net_bps, cannot_cap=io_support(self._driver(h.name), h.uri),
                         storage=h.storage_name, uuid=self.host_uuid(h.name))

    def host_uuid(self, host: str) -> str | None:
        """The host's libvirt UUID (capabilities ``<host><uuid>``; None: its driver reports none), read once per
        command and host (one libvirt call)."""
        with self._lock:
            if host in self._uuids:
                return self._uuids[host]
        with _as_host_error(host, "read its capabilities"):
            got = uuid_from_capabilities(self._conn(host).getCapabilities())
        with self._lock:
            return self._uuids.setdefault(host, got)

    def identities(self) -> dict[str, str]:
        """Every host's identity for the cluster lock (:mod:`hypervisor.identity`): its UUID as the cluster file
        declares it, else as the host answers (all asked at once, within ``host_timeout``).

        Raises :class:`hypervisor.identity.LockUnnamed` for a host that neither answers nor has a declared UUID,
        and :class:`InputError` for two entries that are one host.
        """
        from hypervisor.lock import state_dir

        hosts = self.cluster.hosts
        asked = {h.name: functools.partial(self.host_uuid, h.name) for h in hosts if h.uuid is None}
        got = _run_bounded(asked, inventory_workers(h.uri for h in hosts), self.cluster.host_timeout)
        known = remembered(state_dir())
        uuids: dict[str, str | None] = {}
        out: dict[str, str] = {}
        for h in hosts:
            uri = self.cluster.connect_uri(h.name)
            if h.uuid is not None:
                out[h.name] = identity(h.uuid, uri)
                continue
            answer = got.get(h.name)
            if h.name not in got or isinstance(answer, Exception):
                if uri in known:  # down now; its UUID as a changing command here last read it
                    out[h.name] = identity(known[uri], uri)
                    continue
                why = one_line(answer) if isinstance(answer, Exception) else "it did not answer in time"
                raise LockUnnamed(f"cannot name the lock of cluster {self.cluster.name!r}: host {h.name} does not "
                                  f"answer ({why}), the cluster file declares no uuid for it and no command here "
                                  "has read it; nothing changed (declare its libvirt host UUID as `uuid = \"...\"` "
                                  "in its [[hosts]] table — `vcsched status --json` shows it while the host "
                                  "answers — or retry)")
            uuids[h.name] = answer
            out[h.name] = identity(answer, uri)
        check_distinct(self.cluster, uuids)
        remember(state_dir(), {self.cluster.connect_uri(n): u for n, u in uuids.items() if u is not None})
        return out

    def _vm_state(self, host: str, dom: Any) -> VmState:
        """One domain read on its own (a step's check): its live XML and its state."""
        state = int(dom.state(0)[0]) if hasattr(dom, "state") else (
            libvirt.VIR_DOMAIN_RUNNING if dom.isActive() else libvirt.VIR_DOMAIN_SHUTOFF)
        active = state not in _INACTIVE_STATES
        driver = self._driver(host)
        vm = vm_from_xml(host, dom.XMLDesc(0), active, state in _PAUSED_STATES, driver=driver)
        if active and driver in ("xen", "libxl"):
            from dataclasses import replace

            vm = replace(vm, cap_cores=self._read_cap(host, dom, vm.vcpus))
        return vm

    def _host_vms(self, host: str) -> list[VmState]:
        """Every domain of ``host`` with its state, in one bulk call (``getAllDomainStats``) + its XML per domain.

        A domain that vanishes while being read (destroyed meanwhile) is skipped.
        """
        conn = self._conn(host)
        driver = self._driver(host)
        try:
            found = _retrying(lambda: conn.getAllDomainStats(libvirt.VIR_DOMAIN_STATS_STATE
                                                             | libvirt.VIR_DOMAIN_STATS_BLOCK))
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot list domains: {exc.get_error_message()}") from None
        read, xmls = [], []
        for dom, stats in found:
            try:
                xmls.append(_retrying(functools.partial(dom.XMLDesc, 0)))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue
                raise HypervisorError(f"host {host}: cannot read domain: {exc.get_error_message()}") from None
            read.append((dom, stats))
        out, doms = [], {}
        for (dom, stats), root in zip(read, parse_domains(xmls), strict=True):
            state = int(stats.get("state.state", libvirt.VIR_DOMAIN_NOSTATE))
            active = state not in _INACTIVE_STATES
            vm = vm_from_element(host, root, active, state in _PAUSED_STATES, driver=driver)
            if active and driver in ("xen", "libxl"):
                from dataclasses import replace

                vm = replace(vm, cap_cores=self._read_cap(host, dom, vm.vcpus))
            if vm.devices.disks:
                from dataclasses import replace

                vm = replace(vm, disk_bytes=disk_bytes_of(stats, vm.devices.disks))
            doms[vm.name] = dom
            out.append(vm)
        self._doms[host] = doms
        return out

    def _read_host(self, h: ClusterHost) -> tuple[HostState, list[VmState]]:
        state = _retrying(functools.partial(self.host_state, h))
        return state, self._host_vms(h.name)

    def inventory(self, hosts: Iterable[str] | None = None) -> Inventory:
        """Every wanted host read at once (a bounded pool); a host that fails or takes longer than
        ``host_timeout`` is down for this command.  VMs active on two hosts are reported (and settled when safe)."""
        wanted = self.cluster.hosts if hosts is None else tuple(self.cluster.host(h) for h in hosts)
        with self._lock:
            for h in wanted:
                self._down.pop(h.name, None)
                self._doms.pop(h.name, None)
        timeout = self.cluster.host_timeout
        tasks = {h.name: functools.partial(self._read_host, h) for h in wanted}
        results = _run_bounded(tasks, inventory_workers(h.uri for h in wanted), timeout)
        states, vms = [], []
        for h in wanted:
            got = results.get(h.name)
            if got is None or isinstance(got, Exception):
                if got is None:
                    reason = f"host {h.name}: did not answer within {timeout:g} s (host_timeout)"
                elif isinstance(got, libvirt.libvirtError):
                    reason = f"host {h.name}: {one_line(got)}"
                else:
                    reason = str(got)
                if isinstance(got, InputError):
                    raise got
                with self._lock:
                    self._down[h.name] = reason
                states.append(HostState(h.name, h.cores or 0, 0, h.memory_reserved, down=reason))
                self._forget(h.name)
                continue
            state, found = got
            if state.memory_reserved >= state.memory_bytes:
                raise InputError(f"cluster file: host {h.name}: memory_reserved {format_size(h.memory_reserved)} "
                                 f"is not below the host's {format_size(state.memory_bytes)} of memory")
            states.append(state)
            vms += found
        # Before anything is made of the VMs: two entries reaching one host would show its VMs on "two hosts".
        check_distinct(self.cluster, {st.name: st.uuid for st in states if st.down is None})
        all_vms = tuple(sorted(vms, key=lambda v: (v.host, v.name)))
        doubts = find_in_doubt(all_vms)
        if doubts and self.settle:
            doubts = tuple(self._settle(d, all_vms) for d in doubts)
            removed = {(h, d.vm) for d in doubts if d.resolved for h, st in zip(d.hosts, d.states, strict=True)
                       if st == "paused"}
            all_vms = tuple(v for v in all_vms if (v.host, v.name) not in removed)
        if self.settle and not any(st.down for st in states):
            all_vms = self._settle_arrivals(all_vms, {d.uuid for d in doubts})
        return Inventory(self.cluster.name, tuple(states), mark_in_doubt(all_vms, doubts), doubts)

    def _settle_arrivals(self, vms: tuple[VmState, ...], doubtful: set[str]) -> tuple[VmState, ...]:
        """Resume paused arrivals whose migration was interrupted after it completed (e.g. vcsched crashed).

        Only when every host answered and no other copy exists anywhere: the
        source copy is then verified gone.
        """
        from dataclasses import replace

        out = []
        for v in vms:
            if v.arriving_from is not None and v.paused and v.uuid is not None and v.uuid not in doubtful:
                try:
                    self._resume_marked(v.host, v.name, v.uuid)
                except HypervisorError as exc:
                    self._notice(f"{v.name}: paused arrival on {v.host} could not be resumed ({exc})")
                else:
                    self._notice(f"{v.name}: resumed on {v.host}: its migration from {v.arriving_from} had "
                                        "completed but it was left paused (the source copy is gone)")
                    v = replace(v, paused=False, arriving_from=None)
            out.append(v)
        return tuple(out)

    def _settle(self, doubt: InDoubt, vms: tuple[VmState, ...]) -> InDoubt:
        """Remove the paused copies of a VM that runs on exactly one host (vcsched's own VMs only).

        Safe by construction: the running copy was just seen running, and a
        paused copy of the same UUID never executed since the migration began
        (vcsched resumes a destination only after its source is gone).  Two
        running copies are left to the operator.

        The inventory's states are a snapshot, and a migration that was in
        progress when it was read may have completed since: its source gone
        and its destination resumed (seen: another process's inventory during
        `vcsched run`'s migration destroyed the only copy left).  So right
        before anything is removed, every copy is read again and must still be
        in the same state with no libvirt job (a migration holds one on both
        sides until its source is confirmed gone): paused copies first, then
        the running one.  A running copy with no job cannot start losing its
        source role while its paused twin exists (a new migration to that host
        would collide with the twin's UUID), so the removal is then safe.
        """
        if doubt.states.count("running") != 1:
            return doubt
        runs = doubt.hosts[doubt.states.index("running")]
        ordered = [(h, st) for h, st in zip(doubt.hosts, doubt.states, strict=True) if st == "paused"]
        for host, st in [*ordered, (runs, "running")]:
            if not self._still(host, doubt.uuid, st):
                self._notice(f"{doubt.vm}: on {', '.join(doubt.hosts)}: its copy on {host} is no longer {st} "
                             "without a job (a migration in progress or just completed): left alone")
                return doubt
        copies = {v.host: v for v in vms if v.uuid == doubt.uuid and v.active}
        done = []
        for host, st in zip(doubt.hosts, doubt.states, strict=True):
            if st == "paused" and copies[host].meta is None:
                self._notice(f"{doubt.vm}: in doubt on {', '.join(doubt.hosts)}: its paused copy on {host} "
                                    "has no vcsched metadata: left to the operator")
                return doubt
        for host, st in zip(doubt.hosts, doubt.states, strict=True):
            if st == "paused":
                try:
                    self._destroy_copy(host, doubt.vm, doubt.uuid)
                except HypervisorError as exc:
                    self._notice(f"{doubt.vm}: in doubt on {', '.join(doubt.hosts)}: removing its paused "
                                        f"copy failed ({exc}); the next inventory tries again")
                    return doubt
                done.append(host)
        settled = replace_doubt(doubt, f"removed the paused copy on {', '.join(done)}; it runs on {runs}")
        self._notice(f"{doubt.vm}: in doubt on {', '.join(doubt.hosts)}: {settled.resolved}")
        return settled

    def _still(self, host: str, uuid: str, state: str) -> bool:
        """Whether the copy with ``uuid`` on ``host`` is in ``state`` now and has no libvirt job (False if unsure)."""
        try:
            if self._copy_state(host, uuid) != state:
                return False
            with _as_host_error(host, "read a migrating VM's job"):
                try:
                    job = int(self._conn(host).lookupByUUIDString(uuid).jobInfo()[0])
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
                        return True  # a driver without jobs (libvirt's test driver) has none running
                    raise
        except HypervisorError:
            return False
        return job == libvirt.VIR_DOMAIN_JOB_NONE

    def _destroy_copy(self, host: str, vm: str, uuid: str) -> None:
        """Destroy the copy of ``vm`` with ``uuid`` on ``host`` (and undefine it if persistent)."""
        with _as_host_error(host, f"remove the paused copy of {vm!r}"):
            dom = self._conn(host).lookupByUUIDString(uuid)
            persistent = bool(dom.isPersistent())
            if dom.isActive():
                _retrying(dom.destroy)  # the destination's own migration job may hold it a moment longer
            if persistent:
                dom.undefine()
        self._drop(host, vm)

    def _forget(self, host: str) -> None:
        """Drop a host's connection after a failure, so the next call reconnects (the daemon may be back).

        Closed in the background: closing a connection to a hung host blocks.
        """
        with self._lock:
            conn = self._conns.pop(host, None)
            self._doms.pop(host, None)
        if conn is not None:
            close_quietly(unwrap(conn))

    def find_vm(self, name: str) -> VmState | None:
        for h in self.cluster.hosts:
            if h.name in self._down:
                continue
            dom = self._lookup(h.name, name)
            if dom is None:
                continue
            try:
                with _as_host_error(h.name, f"read {name!r}"):
                    return self._vm_state(h.name, dom)
            except HypervisorError:
                if not self._gone(h.name, name):
                    raise
        return None

    def _gone(self, host: str, vm: str) -> bool:
        """After a failed read of a domain from the host's list: True (and forgotten) if it no longer exists there
        (destroyed since the list was read), so a stale entry reads as absent, not as an error."""
        self._drop(host, vm)
        return self._lookup(host, vm) is None

    def _read_cap(self, host: str, dom: Any, vcpus: int) -> float | None:
        driver = self._driver(host)
        try:
            if driver == "test":
                params = dom.schedulerParameters()  # the test driver knows only 'weight': never a cap
            else:
                params = dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot read the cap of {dom.name()!r}: "
                                  f"{exc.get_error_message()}") from None
        if driver in ("xen", "libxl") or "cap" in params:
            cap = int(params.get("cap", 0))
            return cap / 100 if cap > 0 else None
        quota, period = params.get("vcpu_quota"), params.get("vcpu_period")
        # -1 means no quota; so does anything above the period (libvirt's maximum, 17592186044415,
        # is what some versions report): a quota longer than the period cannot slow one vCPU thread.
        if quota is None or not period or quota <= 0 or quota > period:
            return None
        return cores_from_quota(int(quota), int(period), vcpus)

    def read_cap(self, host: str, vm: str) -> float | None:
        def read() -> float | None:
            dom = self._domain(host, vm)
            return self._read_cap(host, dom, int(dom.info()[3]))

        with _as_host_error(host, f"read the cap of {vm!r}"):
            return _retrying(read)

    def realised_cap(self, host: str, vcpus: int, cap_cores: float) -> float:
        """The CFS grid point, rounded down; on Xen, whole percent of one CPU, rounded down."""
        if self._driver(host) in ("xen", "libxl"):
            return max(1, int(cap_cores * 100 + 1e-9)) / 100
        return realisable_cap(cap_cores, vcpus)

    def cpu_time_ns(self, host: str, vm: str) -> int | None:
        """The whole domain's CPU time (vCPUs + emulator), i.e. what the host really spends on it."""
        if self._driver(host) == "test":
            return None  # the test driver returns constants (docs/lab.md): nothing to measure
        try:
            return int(self._domain(host, vm).getCPUStats(True)[0]["cpu_time"])
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot read CPU time of {vm!r}: {exc.get_error_message()}") from None

    def _read_io_caps(self, host: str, dom: Any, devices: VmDevices) -> IoCaps:
        """Disk and network caps of a running domain (see :meth:`read_io_caps`)."""
        if self._driver(host) in ("test", "xen", "libxl") or not (devices.disks or devices.nics):
            return IoCaps()  # these drivers have no blockIoTune/interfaceParameters to ask
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
        try:
            tunes = [dom.blockIoTune(d, flags) for d in devices.disks]
            nets = [dom.interfaceParameters(n, flags) for n in devices.nics]
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot read the disk/network caps of {dom.name()!r}: "
                                  f"{exc.get_error_message()}") from None
        return io_caps_of(tunes, nets)

    def read_io_caps(self, host: str, vm: str) -> IoCaps:
        """The VM's disk and network caps: ``blockIoTune`` of its disks, ``interfaceParameters`` of its interfaces.

        Reported as a cap only if every disk (every interface) has one: a VM
        with one unthrottled disk can write without limit, so it reads as
        uncapped on disk.
        """
        def read() -> IoCaps:
            dom = self._domain(host, vm)
            return self._read_io_caps(host, dom, live_devices(dom))

        with _as_host_error(host, f"read the disk/network caps of {vm!r}"):
            return _retrying(read)

    def realised_io_caps(self, host: str, devices: VmDevices, caps: IoCaps) -> IoCaps:
        """Whole bytes (and operations) per second for disks; 1000 B/s units per interface for the network."""
        return realisable(caps, devices)

    def planned_devices(self, step: CreateStep) -> VmDevices:
        return boot_devices(step.boot)

    def io_counters(self, host: str, vm: str) -> IoCounters | None:
        """Bytes read + written on every disk (``blockStats``) and received / sent on every interface
        (``interfaceStats``, the guest's view) since the domain started."""
        if self._driver(host) == "test":
            return None  # the test driver returns made-up constants
        try:
            dom = self._domain(host, vm)
            if not dom.isActive():
                return None
            devices = live_devices(dom)
            disk = 0
            for d in devices.disks:
                _rd_req, rd_bytes, _wr_req, wr_bytes, _errs = dom.blockStats(d)
                disk += max(rd_bytes, 0) + max(wr_bytes, 0)
            rx = tx = 0
            for n in devices.nics:
                stats = dom.interfaceStats(n)
                rx += max(stats[0], 0)
                tx += max(stats[4], 0)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot read the disk/network counters of {vm!r}: "
                                  f"{exc.get_error_message()}") from None
        return IoCounters(disk, rx, tx)

    # ----------------------------------------------------------- writing

    def _refuse_uncappable(self, host: str) -> None:
        if self._driver(host) == "test":
            raise HypervisorError(f"host {host}: the libvirt test driver ({self.cluster.host(host).uri}) "
                                  "cannot set CPU caps")

    def create_problems(self, step: CreateStep, where: str) -> list[str]:
        """What would stop ``step`` from creating its VM, checked before a plan's first step
        (:mod:`hypervisor.bootcheck`): its boot files (on a host of this machine), then its domain XML as
        libvirt's own define-time validation on the target host's driver sees it.  That validation defines the
        XML under a throw-away name (:func:`hypervisor.bootcheck.validation_xml`) and undefines it at once."""
        h = self.cluster.host(step.host)
        problems = boot_problems(where, step.boot, step.memory_bytes, local=files_local(h.uri))
        if problems:
            return problems
        try:
            xml = validation_xml(domain_xml(step, h.partition), os.urandom(6).hex())
        except (InputError, ET.ParseError) as exc:
            return [f"{where}.boot: {exc}"]
        try:
            dom = self._conn(step.host).defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
        except libvirt.libvirtError as exc:
            return [f"{where}.boot: host {step.host} (libvirt {self._driver(step.host)} driver) refuses the "
                    f"domain XML of {step.vm!r}: {one_line(exc)}"]
        try:
            dom.undefine()
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {step.host}: cannot undefine the checked domain {dom.name()!r}: "
                                  f"{one_line(exc)} (undefine it with virsh)") from None
        return []

    def create_vm(self, step: CreateStep) -> None:
        self._refuse_uncappable(step.host)
        quota = quota_for(step.cap_cores, step.vcpus)
        if step.cap_cores > step.vcpus + CAP_TOLERANCE:
            raise HypervisorError(f"host {step.host}: cap {step.cap_cores:g} cores for {step.vm!r} is more than its "
                                  f"{step.vcpus} vCPUs (it would run uncapped)")
        if quota < MIN_QUOTA_US:
            raise HypervisorError(f"host {step.host}: cap {step.cap_cores:.4f} cores for {step.vm!r} is below "
                                  f"libvirt's minimum vcpu_quota ({MIN_QUOTA_US} µs per {PERIOD_US} µs per vCPU)")
        xml = domain_xml(step, self.cluster.host(step.host).partition)
        try:
            self._conn(step.host).createXML(xml, 0)
        except libvirt.libvirtError as exc:
            said = one_line(exc)  # e.g. tc's multi-line error for a <bandwidth>
            raise HypervisorError(f"host {step.host}: cannot create {step.vm!r}: {said}") from None

    def set_cap(self, host: str, vm: str, cap_cores: float) -> None:
        self._refuse_uncappable(host)
        with _as_host_error(host, f"cap {vm!r}"):
            dom = self._domain(host, vm)
            vcpus = int(dom.info()[3])
            persistent = bool(dom.isPersistent())
        if cap_cores > vcpus + CAP_TOLERANCE:
            raise HypervisorError(f"host {host}: cap {cap_cores:g} cores for {vm!r} is more than its {vcpus} vCPUs "
                                  "(it would run uncapped); nothing changed")
        if self._driver(host) in ("xen", "libxl"):
            params: dict[str, int] = {"cap": round(self.realised_cap(host, vcpus, cap_cores) * 100)}
        else:
            quota = quota_for(cap_cores, vcpus)
            if quota < MIN_QUOTA_US:
                raise HypervisorError(f"host {host}: cap {cap_cores:.4f} cores for {vm!r} is below libvirt's "
                                      f"minimum vcpu_quota ({MIN_QUOTA_US} µs per {PERIOD_US} µs per vCPU)")
            params = {"vcpu_period": PERIOD_US, "vcpu_quota": quota}
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
        if persistent:
            flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
        with _as_host_error(host, f"cap {vm!r}"):
            _retrying(lambda: dom.setSchedulerParametersFlags(params, flags))

    def _refuse_io(self, host: str, vm: str, caps: IoCaps) -> None:
        """A driver that cannot cap a resource ``caps`` asks for: refused naming host, VM and value."""
        driver = self._driver(host)
        for resource, why in io_support(driver, self.cluster.host(host).uri):
            if resource not in (DISK, NET):
                continue
            wanted = caps.net_bytes_sec if resource == NET else (caps.disk_bytes_sec or caps.disk_iops_sec)
            if wanted is not None:
                raise HypervisorError(f"host {host}: cannot cap {resource} of {vm!r} at {wanted}: {why}; "
                                      "nothing changed")

    def set_io_caps(self, host: str, vm: str, caps: IoCaps) -> None:
        """Throttle the VM's disks (one group) and shape its interfaces; see the module docstring.

        The disks are all set before the interfaces.  A failure on an
        interface puts back the parameters that interface had (libvirt leaves
        half of a failed tc set-up in place) and is reported with libvirt's
        message; a re-run of the plan sets what is still missing.
        """
        if not caps:
            return
        self._refuse_io(host, vm, caps)
        with _as_host_error(host, f"cap the disk/network of {vm!r}"):
            dom, _meta = self._managed_domain(host, vm, "cap")
            if not dom.isActive():
                raise HypervisorError(f"host {host}: domain {vm!r} is not running")
            devices = live_devices(dom)
            persistent = bool(dom.isPersistent())
        problem = io_problem(caps, devices)
        if problem is not None:
            raise HypervisorError(f"host {host}: cannot cap {vm!r}: {problem}; nothing changed")
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
        if persistent:
            flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
        apply_io_caps(host, dom, devices, caps, flags)

    def _managed_domain(self, host: str, vm: str, action: str) -> tuple[Any, VmMeta]:
        """The domain and its vcsched metadata; an unmanaged domain is refused, naming ``action``."""
        dom = self._domain(host, vm)
        try:
            meta = parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0))
        except libvirt.libvirtError:
            meta = None  # no vcsched metadata: unmanaged
        if meta is None:
            raise HypervisorError(f"host {host}: refusing to {action} unmanaged domain {vm!r}")
        return dom, meta

    def set_need(self, host: str, vm: str, cpu_need_cores: float) -> None:
        """Rewrite the ``<vcsched:vm>`` element with the new need (the other fields as they are)."""
        from dataclasses import replace

        with _as_host_error(host, f"record the need of {vm!r}"):
            dom, meta = self._managed_domain(host, vm, "write metadata of")
            flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
            if dom.isPersistent():
                flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
            element = metadata_xml(replace(meta, cpu_need_cores=cpu_need_cores), bare=True)
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, element, METADATA_PREFIX, METADATA_NS, flags)

    def remove_vm(self, host: str, vm: str) -> None:
        """Destroy (hard stop: the cluster departed, its guests' state is not kept) and undefine if persistent."""
        with _as_host_error(host, f"remove {vm!r}"):
            dom, _meta = self._managed_domain(host, vm, "remove")
            persistent = bool(dom.isPersistent())  # a transient domain is gone once destroyed: ask first
            if dom.isActive():
                dom.destroy()
            if persistent:
                dom.undefine()
        self._drop(host, vm)

    def migrate_vm(self, vm: str, source: str, target: str, cap_cores: float) -> None:
        """Live-migrate ``vm`` so that it never runs on two hosts at once (docs/operations.md).

        ``migrate3`` from the source connection, LIVE | PAUSED, to the
        destination's ``address`` (``tcp://ADDRESS``; ``migration_tls`` adds
        VIR_MIGRATE_TLS; hosts with different ``storage`` add
        VIR_MIGRATE_NON_SHARED_DISK, which copies the disks).  The destination
        copy arrives *paused*, marked ``arriving_from`` in its metadata; it is
        resumed only once the source copy is verified gone.  After a failure
        the source copy is checked, and a paused destination copy is removed
        once the source is verified running.  Anything that cannot be verified
        (a host that does not answer) is reported, left alone, and settled by a
        later inventory (:meth:`_settle`, :meth:`_settle_arrival`).

        The destination XML (``VIR_MIGRATE_PARAM_DEST_XML``) carries the
        destination's cgroup partition and the VM's cap there (``<cputune>``).
        vcsched creates its VMs transient; a persistent one also gets
        ``PERSIST_DEST | UNDEFINE_SOURCE`` with the same XML.
        """
        src_host, dst_host = self.cluster.host(source), self.cluster.host(target)
        dom = self._domain(source, vm)
        dst = self._conn(target)
        uuid = ""
        try:
            uuid = str(dom.UUIDString())
            vcpus = int(dom.info()[3])
            if cap_cores > vcpus + CAP_TOLERANCE or quota_for(cap_cores, vcpus) < MIN_QUOTA_US:
                raise HypervisorError(f"host {target}: arrival cap {cap_cores:g} cores for {vm!r} is outside "
                                      f"[minimum quota, {vcpus} vCPUs]; it keeps running on {source}")
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
            xml = rewrite_partition(xml, src_host.partition, dst_host.partition)
            if self._driver(target) not in ("xen", "libxl"):
                xml = set_cputune(xml, quota_for(cap_cores, vcpus))
            xml = stamp_migrated_at(xml, time.time(), arriving_from=source)
            params: dict[str, Any] = {libvirt.VIR_MIGRATE_PARAM_URI: migration_uri(dst_host.migration_address),
                                      libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml}
            flags = migration_flags(self.cluster, source, target)
            if dom.isPersistent():
                params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = xml
                flags |= libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
            dom.migrate3(dst, params, flags)
        except libvirt.libvirtError as exc:
            after = self._after_failed_migration(vm, uuid, source, target) if uuid else f"it keeps running on {source}"
            raise HypervisorError(f"host {source}: cannot migrate {vm!r} to {target}: {one_line(exc)} ({after})") \
                from None
        self._drop(source, vm)
        self._resume_arrival(vm, uuid, source, target)

    def _copy_state(self, host: str, uuid: str) -> str:
        """``"gone"``, ``"running"``, ``"paused"`` or ``"stopped"`` for the copy with ``uuid`` on ``host``.

        Raises HypervisorError when the host cannot tell (down, hung): the caller must not assume either way.
        """
        with _as_host_error(host, "check a copy of a migrating VM"):
            try:
                dom = self._conn(host).lookupByUUIDString(uuid)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return "gone"
                raise
            state = int(dom.state(0)[0])
        if state in _INACTIVE_STATES:
            return "stopped"
        return "paused" if state in _PAUSED_STATES else "running"

    def _resume_arrival(self, vm: str, uuid: str, source: str, target: str) -> None:
        """Resume the paused destination copy once the source copy is verified gone, and clear its mark."""
        try:
            left = self._copy_state(source, uuid)
        except HypervisorError as exc:
            raise HypervisorError(f"host {target}: {vm!r} arrived but stays paused: cannot verify that its copy on "
                                  f"{source} is gone ({exc}); the next inventory that sees only this copy resumes "
                                  "it") from None
        if left in ("running", "paused"):
            raise HypervisorError(f"host {target}: {vm!r} arrived but stays paused: its copy on {source} is still "
                                  f"{left} (in doubt: reported until resolved)")
        self._resume_marked(target, vm, uuid)

    def _resume_marked(self, host: str, vm: str, uuid: str) -> None:
        """Resume a paused arrival on ``host`` and drop its ``arriving_from`` mark."""
        with _as_host_error(host, f"resume {vm!r} after its migration"):
            dom = self._conn(host).lookupByUUIDString(uuid)
            if int(dom.state(0)[0]) in _PAUSED_STATES:
                dom.resume()
            raw = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0)
            meta = parse_metadata(raw)
            if meta is not None and "arriving_from" in raw:
                flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
                if dom.isPersistent():
                    flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
                dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata_xml(meta, bare=True), METADATA_PREFIX,
                                METADATA_NS, flags)

    def _after_failed_migration(self, vm: str, uuid: str, source: str, target: str) -> str:
        """After a failed ``migrate3``: make sure at most one copy runs, and say what was found and done."""
        try:
            here = self._copy_state(source, uuid)
        except HypervisorError as exc:
            return (f"in doubt: its copy on {source} cannot be checked ({exc}); nothing is removed, and "
                    "inventories report it until one copy is left")
        if here != "running":
            return f"in doubt: its copy on {source} is {here}; nothing is removed"
        try:
            there = self._copy_state(target, uuid)
        except HypervisorError:
            self._forget(target)
            return (f"it keeps running on {source}; {target} did not answer, so a paused copy may be left "
                    "there: the next inventory removes it")
        if there == "gone":
            return f"it keeps running on {source}"
        if there in ("paused", "stopped"):
            try:
                self._destroy_copy(target, vm, uuid)
            except HypervisorError as exc:
                return f"it keeps running on {source}; removing its {there} copy on {target} failed ({exc})"
            return f"it keeps running on {source}; its {there} copy on {target} was removed"
        return f"in doubt: it runs on both {source} and {target}; nothing is removed (reported until resolved)"

    def lists(self, host: str, vm: str) -> bool:
        return self._lookup(host, vm) is not None

    def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()
        self._conns.clear()
