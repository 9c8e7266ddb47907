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
from pathlib import Path
from typing import Any, TypeVar
from xml.sax.saxutils import escape, quoteattr

import libvirt

from hypervisor.base import HypervisorError
from vcsched.caps import CAP_TOLERANCE, MIN_QUOTA_US, PERIOD_US, cores_from_quota, quota_for, realisable_cap
from vcsched.control.inventory import METADATA_NS, METADATA_PREFIX, HostState, Inventory, VmMeta, VmState
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster, ClusterHost
from vcsched.formats.units import format_size
from vcsched.plans.steps import CreateStep

#: Where migration streams go (``VIR_MIGRATE_PARAM_URI``): the lab's hosts all live on this machine.
MIGRATION_URI = "tcp://127.0.0.1"


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
        return VmMeta(el.attrib["cluster"], float(el.attrib["cpu_need_cores"]), int(el.attrib["memory_bytes"]),
                      int(el.attrib["vcpus"]), floor, io["disk_bps"], io["net_bps"], weight, el.attrib.get("tenant"),
                      rules["spread"], rules["together"], el.attrib.get("pinned") == "true")
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
    """The request's template with name, size, metadata, cap and partition set by vcsched (uuid dropped)."""
    path = step.boot.path or ""
    try:
        root = ET.fromstring(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"template {path}: cannot read ({exc.strerror})") from None
    except ET.ParseError as exc:
        raise InputError(f"template {path}: malformed XML ({exc})") from None
    if root.tag != "domain":
        raise InputError(f"template {path}: root element is <{root.tag}>, expected <domain>")
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
        return HostState(h.name, cores, int(info[1]) << 20, h.memory_reserved)

    def _vm_state(self, host: str, dom: Any) -> VmState:
        _state, max_kib, _cur_kib, vcpus, _cpu = dom.info()
        active = bool(dom.isActive())
        try:
            meta = parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0))
        except libvirt.libvirtError:
            meta = None  # no vcsched metadata: unmanaged
        cap = None
        if active:
            try:
                cap = self._read_cap(host, dom, int(vcpus))
            except HypervisorError:
                if meta is not None:
                    raise
                # An unmanaged domain whose cap cannot be read is still reported, just without a cap.
        return VmState(dom.name(), host, int(vcpus), int(max_kib) * 1024, active, meta, cap)

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
            raise HypervisorError(f"host {step.host}: cannot create {step.vm!r}: {exc.get_error_message()}") from None

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
