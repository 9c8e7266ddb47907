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

import contextlib
import functools
import math
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar
from xml.sax.saxutils import escape, quoteattr

import libvirt

from hypervisor.base import HypervisorError, IoCounters
from hypervisor.devices import boot_devices, devices_of, read_template
from vcsched.caps import CAP_TOLERANCE, MIN_QUOTA_US, PERIOD_US, cores_from_quota, quota_for, realisable_cap
from vcsched.control.inventory import METADATA_NS, METADATA_PREFIX, HostState, Inventory, VmMeta, VmState
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster, ClusterHost
from vcsched.formats.units import format_size
from vcsched.iocaps import DISK, NET, NET_UNIT, IoCaps, VmDevices, io_problem, net_units, realisable
from vcsched.plans.steps import CreateStep

#: Where migration streams go (``VIR_MIGRATE_PARAM_URI``): the lab's hosts all live on this machine.
MIGRATION_URI = "tcp://127.0.0.1"

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
    """``(resource, why not)`` for each of disk and network the driver cannot cap (``HostState.cannot_cap``)."""
    if driver == "test":
        return ((DISK, f"the libvirt test driver ({uri}) cannot throttle disks"),
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
        el = ET.fromstring(xml)
        floor = float(el.attrib["min_yield"]) if "min_yield" in el.attrib else None
        io = {k: int(el.attrib[k]) if k in el.attrib else None for k in ("disk_bps", "net_bps")}
        weight = float(el.attrib.get("weight", "1.0"))
        if not (weight > 0 and math.isfinite(weight)) or any(v is not None and v < 0 for v in io.values()):
            return None
        rules = {k: el.attrib.get(k) for k in ("spread", "together")}
        if any(v not in (None, "required", "preferred") for v in rules.values()):
            return None
        moved = float(el.attrib["migrated_at"]) if "migrated_at" in el.attrib else None
        return VmMeta(el.attrib["cluster"], float(el.attrib["cpu_need_cores"]), int(el.attrib["memory_bytes"]),
                      int(el.attrib["vcpus"]), floor, io["disk_bps"], io["net_bps"], weight, el.attrib.get("tenant"),
                      rules["spread"], rules["together"], el.attrib.get("pinned") == "true", migrated_at=moved)
    except (ET.ParseError, KeyError, ValueError):
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


def stamp_migrated_at(xml: str, when: float) -> str:
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


class LibvirtHypervisor:
    """All hosts of one cluster file; connections open on first use and are closed by :meth:`close`."""

    def __init__(self, cluster: Cluster) -> None:
        _quiet()
        self.cluster = cluster
        self._conns: dict[str, Any] = {}
        self._lock = threading.Lock()  # a plan's wave of migrations uses the connections from several threads

    def __enter__(self) -> LibvirtHypervisor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _conn(self, host: str) -> Any:
        with self._lock:
            if host not in self._conns:
                h = self.cluster.host(host)
                try:
                    self._conns[host] = libvirt.open(h.uri)
                except libvirt.libvirtError as exc:
                    raise HypervisorError(f"host {host}: cannot connect to {h.uri}: "
                                          f"{exc.get_error_message()}") from None
            return self._conns[host]

    def _driver(self, host: str) -> str:
        with _as_host_error(host, "ask the driver type"):
            return str(self._conn(host).getType()).lower()  # "qemu", "xen", "test", ...

    def _lookup(self, host: str, vm: str) -> Any | None:
        # Listing instead of lookupByName: a miss is normal here and not an error.
        with _as_host_error(host, "list domains"):
            doms = self._conn(host).listAllDomains(0)
        return next((dom for dom in doms if dom.name() == vm), None)

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
                         net_bps=h.net_bps, cannot_cap=io_support(self._driver(h.name), h.uri))

    def _vm_state(self, host: str, dom: Any) -> VmState:
        _state, max_kib, _cur_kib, vcpus, _cpu = dom.info()
        active = bool(dom.isActive())
        try:
            meta = parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0))
        except libvirt.libvirtError:
            meta = None  # no vcsched metadata: unmanaged
        cap = None
        devices = live_devices(dom)
        io = IoCaps()
        if active:
            try:
                cap = self._read_cap(host, dom, int(vcpus))
                io = self._read_io_caps(host, dom, devices)
            except HypervisorError:
                if meta is not None:
                    raise
                # An unmanaged domain whose cap cannot be read is still reported, just without a cap.
        return VmState(dom.name(), host, int(vcpus), int(max_kib) * 1024, active, meta, cap, devices, io)

    def _host_vms(self, host: str) -> list[VmState]:
        """Every domain of ``host``; one that vanishes while being read (destroyed meanwhile) is skipped."""
        out = []
        try:
            doms = _retrying(lambda: self._conn(host).listAllDomains(0))
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot list domains: {exc.get_error_message()}") from None
        for dom in doms:
            try:
                out.append(_retrying(functools.partial(self._vm_state, host, dom)))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue
                raise HypervisorError(f"host {host}: cannot read domain: {exc.get_error_message()}") from None
        return out

    def inventory(self, hosts: Iterable[str] | None = None) -> Inventory:
        wanted = self.cluster.hosts if hosts is None else tuple(self.cluster.host(h) for h in hosts)
        states, vms = [], []
        for h in wanted:
            try:
                state = _retrying(functools.partial(self.host_state, h))
                found = self._host_vms(h.name)
            except (libvirt.libvirtError, HypervisorError) as exc:
                reason = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else str(exc)
                states.append(HostState(h.name, h.cores or 0, 0, h.memory_reserved, down=reason))
                self._forget(h.name)
                continue
            if state.memory_reserved >= state.memory_bytes:
                raise InputError(f"cluster file: host {h.name}: memory_reserved {format_size(h.memory_reserved)} "
                                 f"is not below the host's {format_size(state.memory_bytes)} of memory")
            states.append(state)
            vms += found
        return Inventory(self.cluster.name, tuple(states), tuple(sorted(vms, key=lambda v: (v.host, v.name))))

    def _forget(self, host: str) -> None:
        """Drop a host's connection after a failure, so the next call reconnects (the daemon may be back)."""
        with self._lock:
            conn = self._conns.pop(host, None)
        if conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()

    def find_vm(self, name: str) -> VmState | None:
        for h in self.cluster.hosts:
            for v in self._host_vms(h.name):
                if v.name == name:
                    return v
        return None

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
        meta = self._vm_state(host, dom).meta
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

    def migrate_vm(self, vm: str, source: str, target: str, cap_cores: float) -> None:
        """Live-migrate ``vm`` (docs/lab.md's recipe): ``migrate3`` from the source connection, LIVE.

        The destination XML (``VIR_MIGRATE_PARAM_DEST_XML``) carries the
        destination's cgroup partition and the VM's cap there (``<cputune>``),
        so it never runs on the destination with its source cap.  vcsched creates its VMs transient; a
        persistent one also gets ``PERSIST_DEST | UNDEFINE_SOURCE`` with the
        same XML.  libvirt undefines the source only once the VM runs on the
        destination, and a failed migration leaves it running on its source.
        """
        src_host, dst_host = self.cluster.host(source), self.cluster.host(target)
        dom = self._domain(source, vm)
        dst = self._conn(target)
        try:
            vcpus = int(dom.info()[3])
            if cap_cores > vcpus + CAP_TOLERANCE or quota_for(cap_cores, vcpus) < MIN_QUOTA_US:
                raise HypervisorError(f"host {target}: arrival cap {cap_cores:g} cores for {vm!r} is outside "
                                      f"[minimum quota, {vcpus} vCPUs]; it keeps running on {source}")
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
            xml = rewrite_partition(xml, src_host.partition, dst_host.partition)
            if self._driver(target) not in ("xen", "libxl"):
                xml = set_cputune(xml, quota_for(cap_cores, vcpus))
            xml = stamp_migrated_at(xml, time.time())
            params: dict[str, Any] = {libvirt.VIR_MIGRATE_PARAM_URI: MIGRATION_URI,
                                      libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml}
            flags = libvirt.VIR_MIGRATE_LIVE
            if dom.isPersistent():
                params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = xml
                flags |= libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
            dom.migrate3(dst, params, flags)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {source}: cannot migrate {vm!r} to {target}: {exc.get_error_message()} "
                                  f"(it keeps running on {source})") from None

    def lists(self, host: str, vm: str) -> bool:
        return self._lookup(host, vm) is not None

    def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()
        self._conns.clear()
