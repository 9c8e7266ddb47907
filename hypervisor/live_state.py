"""Reading live state from one libvirt connection: a host's :class:`HostState`, its domains' :class:`VmState`
(one ``getAllDomainStats`` call plus one XML read per domain), a domain's caps, and one copy's state.

Functions of a connection (or a domain) and the host's :class:`hypervisor.drivers.Driver`: no cache, no
decision.  The backend (:mod:`hypervisor.libvirt_backend`) owns the connections and what is cached.

A failure of vcsched's *own* parsing of an answer (``ET.ParseError``, ``KeyError``, ``ValueError`` ...) is
raised as :class:`hypervisor.base.HostReadBug`, never as a host failure: a host is down when it does not
answer, not when vcsched misreads it.
"""

from __future__ import annotations

import functools
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import libvirt

from hypervisor.base import HostReadBug, HypervisorError
from hypervisor.domain_xml import parse_domains, vm_from_element, vm_from_xml
from hypervisor.drivers import Driver
from hypervisor.libvirt_calls import as_host_error, retrying
from hypervisor.throttle import io_caps_of
from vcsched.caps import cores_from_quota
from vcsched.formats.cluster import ClusterHost
from vcsched.inventory import HostState, VmState
from vcsched.iocaps import IoCaps, VmDevices

#: libvirt domain states that count as a copy that is not executing (paused: e.g. a migration's arrival).
PAUSED_STATES = frozenset(getattr(libvirt, n) for n in ("VIR_DOMAIN_PAUSED", "VIR_DOMAIN_PMSUSPENDED")
                          if hasattr(libvirt, n))
#: libvirt domain states of a domain that is not active (defined only).
INACTIVE_STATES = frozenset((libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_NOSTATE))

#: What vcsched's own reading code raises when it misreads an answer: a bug (:class:`HostReadBug`).
PARSE_ERRORS = (ET.ParseError, KeyError, ValueError, TypeError, IndexError, AttributeError)


def read_bug(host: str, what: str, exc: BaseException) -> HostReadBug:
    """The error for a failure of vcsched's own parsing of ``host``'s answer."""
    return HostReadBug(f"host {host}: vcsched could not read {what} ({type(exc).__name__}: {exc}): this is a bug "
                       "in vcsched, not a host failure; nothing was changed — please report it with this message")


def host_state(conn: Any, h: ClusterHost, driver: Driver, uuid: str | None) -> HostState:
    """The host's cores and memory (``getInfo``; the cluster file may override cores and reserve memory)."""
    info = conn.getInfo()  # [model, memory MiB, cpus, mhz, nodes, sockets, cores, threads]
    try:
        cores = h.cores if h.cores is not None else int(info[2])
        memory = int(info[1]) << 20
    except PARSE_ERRORS as exc:
        raise read_bug(h.name, "its getInfo answer", exc) from None
    return HostState(h.name, cores, memory, h.memory_reserved, disk_bps=h.disk_bps, net_bps=h.net_bps,
                     cannot_cap=driver.cannot_cap(h.uri), storage=h.storage_name, uuid=uuid)


def domain_state(dom: Any) -> int:
    """libvirt's state of ``dom`` (fakes of the tests that only know ``isActive``: running or shut off)."""
    if hasattr(dom, "state"):
        return int(dom.state(0)[0])
    return libvirt.VIR_DOMAIN_RUNNING if dom.isActive() else libvirt.VIR_DOMAIN_SHUTOFF


def vm_state(host: str, dom: Any, driver: Driver) -> VmState:
    """One domain read on its own (a step's check): its live XML and its state."""
    state = domain_state(dom)
    active = state not in INACTIVE_STATES
    xml = dom.XMLDesc(0)
    try:
        vm = vm_from_xml(host, xml, active, state in PAUSED_STATES, driver=driver.name)
    except PARSE_ERRORS as exc:
        raise read_bug(host, "a domain's XML", exc) from None
    if active and not driver.cap_in_xml:
        vm = replace(vm, cap_cores=read_cap(host, dom, vm.vcpus, driver))
    return vm


def host_vms(host: str, conn: Any, driver: Driver,
             sleep: Callable[[float], None] = time.sleep) -> tuple[list[VmState], dict[str, Any]]:
    """Every domain of ``host`` with its state, in one bulk call (``getAllDomainStats``) + its XML per domain;
    and the domain objects by name (the backend's per-inventory list).

    A domain that vanishes while being read (destroyed meanwhile) is skipped.
    """
    stats = libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_BLOCK
    try:
        try:
            found = retrying(lambda: conn.getAllDomainStats(stats, _NOWAIT), sleep)
        except libvirt.libvirtError as exc:  # a libvirtd before 4.5 does not know NOWAIT: ask as it can answer
            if not _NOWAIT or exc.get_error_code() not in (libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT):
                raise
            found = retrying(lambda: conn.getAllDomainStats(stats, 0), sleep)
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"host {host}: cannot list domains: {exc.get_error_message()}") from None
    read, xmls = [], []
    for dom, stats in found:
        try:
            xmls.append(retrying(functools.partial(dom.XMLDesc, 0), sleep))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                continue
            raise HypervisorError(f"host {host}: cannot read domain: {exc.get_error_message()}") from None
        read.append((dom, stats))
    out, doms = [], {}
    try:
        roots = parse_domains(xmls)
        parsed = []
        for (dom, stats), root in zip(read, roots, strict=True):
            state = int(stats.get("state.state", libvirt.VIR_DOMAIN_NOSTATE))
            active = state not in INACTIVE_STATES
            vm = vm_from_element(host, root, active, state in PAUSED_STATES, driver=driver.name)
            if vm.devices.disks:
                if "block.count" not in stats and not vm.paused:  # busy in a job a moment: ask it alone
                    stats = _block_stats(conn, dom, sleep) or stats
                vm = replace(vm, disk_bytes=disk_bytes_of(stats, vm.devices.disks))
            parsed.append((dom, vm))
    except PARSE_ERRORS as exc:
        raise read_bug(host, "its domains' XML and stats", exc) from None
    for dom, vm in parsed:
        if vm.active and not driver.cap_in_xml:
            vm = replace(vm, cap_cores=read_cap(host, dom, vm.vcpus, driver))
        doms[vm.name] = dom
        out.append(vm)
    return out, doms


#: ``getAllDomainStats`` without waiting for a domain's job: an arriving migration holds its job for the whole
#: migration, and a bulk read that waited for it stalled `status`, `top` and every inventory of the destination
#: as long (seen on the lab: 4.9 s, the whole aborted migration), or counted the host down past host_timeout.
#: Such a domain's BLOCK fields are then missing: a paused arrival is in doubt and never planned, any other
#: domain is asked alone (:func:`_block_stats`).
_NOWAIT = getattr(libvirt, "VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT", 0)


def _block_stats(conn: Any, dom: Any, sleep: Callable[[float], None]) -> dict[str, Any] | None:
    try:
        got = retrying(lambda: conn.domainListGetStats([dom], libvirt.VIR_DOMAIN_STATS_STATE
                                                        | libvirt.VIR_DOMAIN_STATS_BLOCK), sleep)
    except libvirt.libvirtError:
        return None
    return dict(got[0][1]) if got else None


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


def read_cap(host: str, dom: Any, vcpus: int, driver: Driver) -> float | None:
    """The VM's CPU cap in cores as the driver holds it (None: uncapped)."""
    try:
        if not driver.scheduler_flags:
            params = dom.schedulerParameters()  # the test driver knows only 'weight': never a cap
        else:
            params = dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"host {host}: cannot read the cap of {dom.name()!r}: "
                              f"{exc.get_error_message()}") from None
    if driver.cpu_cap == "credit" or "cap" in params:
        cap = int(params.get("cap", 0))
        return cap / 100 if cap > 0 else None
    quota, period = params.get("vcpu_quota"), params.get("vcpu_period")
    # -1 means no quota; so does anything above the period (libvirt's maximum, 17592186044415,
    # is what some versions report): a quota longer than the period cannot slow one vCPU thread.
    if quota is None or not period or quota <= 0 or quota > period:
        return None
    return cores_from_quota(int(quota), int(period), vcpus)


def read_io_caps(host: str, dom: Any, devices: VmDevices, driver: Driver) -> IoCaps:
    """Disk and network caps of a running domain: ``blockIoTune`` of its disks, ``interfaceParameters`` of its
    interfaces (a driver without them: none)."""
    if not driver.io_caps or not (devices.disks or devices.nics):
        return IoCaps()
    flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
    try:
        tunes = [dom.blockIoTune(d, flags) for d in devices.disks]
        nets = [dom.interfaceParameters(n, flags) for n in devices.nics]
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"host {host}: cannot read the disk/network caps of {dom.name()!r}: "
                              f"{exc.get_error_message()}") from None
    return io_caps_of(tunes, nets)


def copy_state(conn: Any, host: str, uuid: str) -> str:
    """``"gone"``, ``"running"``, ``"paused"`` or ``"stopped"`` for the copy with ``uuid`` on ``host``.

    Raises HypervisorError when the host cannot tell (down, hung): the caller must not assume either way.
    """
    with as_host_error(host, "check a copy of a migrating VM"):
        try:
            dom = conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return "gone"
            raise
        state = int(dom.state(0)[0])
    if state in INACTIVE_STATES:
        return "stopped"
    return "paused" if state in PAUSED_STATES else "running"


def paused_for_migration(conn: Any, host: str, uuid: str) -> bool:
    """Whether the copy with ``uuid`` on ``host`` is paused because a migration stopped it
    (``VIR_DOMAIN_PAUSED_MIGRATION``), not by someone's ``suspend`` (``VIR_DOMAIN_PAUSED_USER``).

    libvirt leaves a migration's source so when the client that drove the migration went away after the
    copy completed and before Confirm (its ``PERFORM3_DONE`` clean-up clears the job and keeps the domain
    paused: "we don't know if the domain was successfully started on destination or not").
    """
    with as_host_error(host, "read why a copy is paused"):
        state, reason = (int(x) for x in conn.lookupByUUIDString(uuid).state(0)[:2])
    return state == libvirt.VIR_DOMAIN_PAUSED and reason == libvirt.VIR_DOMAIN_PAUSED_MIGRATION


def has_job(conn: Any, host: str, uuid: str) -> bool:
    """Whether the copy with ``uuid`` on ``host`` has a libvirt job (a migration holds one on both sides until
    its source is confirmed gone).  A driver without jobs (libvirt's test driver) has none."""
    with as_host_error(host, "read a migrating VM's job"):
        try:
            job = int(conn.lookupByUUIDString(uuid).jobInfo()[0])
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
                return False
            raise
    return job != libvirt.VIR_DOMAIN_JOB_NONE


#: ``jobStats``'s ``operation`` values of a live migration's two sides (libvirt >= 3.3; older: unknown).
_MIGRATION_OPS = {getattr(libvirt, "VIR_DOMAIN_JOB_OPERATION_MIGRATION_OUT", 5): "out",
                  getattr(libvirt, "VIR_DOMAIN_JOB_OPERATION_MIGRATION_IN", 4): "in"}


def migration_job(dom: Any, host: str) -> dict[str, Any] | None:
    """The live migration ``dom`` takes part in on ``host`` (its libvirt job: ``jobStats``), None when it has none.

    ``direction`` is ``out`` on the source and ``in`` on the destination; the byte counts are QEMU's
    (``data_total`` grows while a guest dirties pages again).  A driver without jobs (the test driver) has none.
    """
    with as_host_error(host, "read a VM's job"):
        try:
            stats = dom.jobStats(0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_NO_DOMAIN,
                                        libvirt.VIR_ERR_OPERATION_INVALID):
                return None
            raise
    if int(stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE)) == libvirt.VIR_DOMAIN_JOB_NONE:
        return None
    direction = _MIGRATION_OPS.get(int(stats.get("operation", -1)))
    if direction is None:
        return None
    return {"direction": direction, "elapsed_s": int(stats.get("time_elapsed", 0)) / 1000,
            "processed_bytes": int(stats.get("data_processed", 0)),
            "remaining_bytes": int(stats.get("data_remaining", 0)), "total_bytes": int(stats.get("data_total", 0)),
            "bandwidth_bps": int(stats.get("memory_bps", 0))}
