"""Live migration so that a VM never runs on two hosts at once (docs/repair.md, "A VM never runs twice").

``migrate3`` from the source connection, LIVE | PAUSED, to the destination's ``address`` (``tcp://ADDRESS``;
``migration_tls`` adds VIR_MIGRATE_TLS; hosts with different ``storage`` add VIR_MIGRATE_NON_SHARED_DISK,
which copies the disks).  The destination copy arrives *paused*, marked ``arriving_from`` in its metadata;
it is resumed only once the source copy is verified gone.  After a failure the source copy is checked, and a
paused destination copy is removed once the source is verified running.  Anything that cannot be verified (a
host that does not answer) is reported and left alone: the VM is *in doubt* until ``vcsched repair``
(:mod:`hypervisor.settlement`) settles it under the cluster lock.

A migration that would outlive the cluster lock's lease, or that runs past the cluster's
``migration_timeout_per_gib``, is aborted (``abortJob`` on the source) by a watch that polls while ``migrate3``
runs; the failed migration is then handled like any other (the VM keeps running on its source, or is in doubt).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import libvirt

from hypervisor import hazards
from hypervisor.base import HypervisorError
from hypervisor.domain_xml import (
    metadata_of,
    metadata_xml,
    parse_metadata,
    rewrite_partition,
    set_cputune,
    stamp_migrated_at,
)
from hypervisor.libvirt_calls import as_host_error, one_line, retrying
from hypervisor.live_state import PAUSED_STATES, copy_state
from vcsched.caps import CAP_TOLERANCE, MIN_QUOTA_US, quota_for
from vcsched.formats.cluster import Cluster, migration_uri
from vcsched.inventory import METADATA_NS, METADATA_PREFIX, VmMeta

if TYPE_CHECKING:
    from hypervisor.libvirt_backend import LibvirtHypervisor

#: How often the lease watch looks at the lease while a migration runs (seconds).
LEASE_POLL_S = 0.2


def migration_flags(cluster: Cluster, source: str, target: str) -> int:
    """LIVE | PAUSED always (the destination is resumed by vcsched); TLS and NON_SHARED_DISK as the cluster says."""
    flags = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PAUSED
    if cluster.migration_tls:
        flags |= libvirt.VIR_MIGRATE_TLS
    if not cluster.shares_storage(source, target):
        flags |= libvirt.VIR_MIGRATE_NON_SHARED_DISK
    return flags


@contextlib.contextmanager
def lease_watch(lease: Callable[[], bool] | None, dom: Any, vm: str, lost: list[str],
                timeout_s: float | None = None) -> Iterator[None]:
    """While the block runs, abort the migration job of ``dom`` (``abortJob`` on the source) once ``lease()``
    says the lock may no longer be ours (its lease could expire before the migration ends), or once it has run
    ``timeout_s`` seconds (the cluster's ``migration_timeout_per_gib``); ``lost`` then holds why.  Neither: no
    watch."""
    if lease is None and timeout_s is None:
        yield
        return
    done = threading.Event()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def watch() -> None:
        while not done.wait(LEASE_POLL_S):
            if lease is not None and not lease():
                why = f"the cluster lock's lease could expire before the migration of {vm!r} ends: aborted it"
            elif deadline is not None and time.monotonic() >= deadline:
                why = (f"the migration of {vm!r} ran past its timeout of {timeout_s:.3g} s "
                       "(migration_timeout_per_gib): aborted it")
            else:
                continue
            lost.append(why)
            with contextlib.suppress(libvirt.libvirtError, AttributeError):
                dom.abortJob()
            return

    thread = threading.Thread(target=watch, name=f"migration-watch-{vm}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(LEASE_POLL_S * 5)


def migrate(hv: LibvirtHypervisor, vm: str, source: str, target: str, cap_cores: float, *,
            timeout_s: float | None = None) -> None:
    """Migrate ``vm`` from ``source`` to ``target`` (module docstring).

    The destination XML (``VIR_MIGRATE_PARAM_DEST_XML``) carries the
    destination's cgroup partition and the VM's cap there (``<cputune>``).
    vcsched creates its VMs transient; a persistent one also gets
    ``PERSIST_DEST | UNDEFINE_SOURCE`` with the same XML.  The cluster's
    ``migration_bandwidth`` is libvirt's ``VIR_MIGRATE_PARAM_BANDWIDTH`` (MiB/s);
    past ``timeout_s`` the migration is aborted (:func:`lease_watch`).
    """
    cluster = hv.cluster
    src_host, dst_host = cluster.host(source), cluster.host(target)
    dom = hv.domain(source, vm)
    dst = hv.conn(target)
    uuid = ""
    lost: list[str] = []
    try:
        uuid = str(dom.UUIDString())
        vcpus = int(dom.info()[3])
        if cap_cores > vcpus + CAP_TOLERANCE or quota_for(cap_cores, vcpus) < MIN_QUOTA_US:
            raise HypervisorError(f"host {target}: arrival cap {cap_cores:g} cores for {vm!r} is outside "
                                  f"[minimum quota, {vcpus} vCPUs]; it keeps running on {source}")
        xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
        xml = rewrite_partition(xml, src_host.partition, dst_host.partition)
        if hv.driver(target).cap_in_xml:
            xml = set_cputune(xml, quota_for(cap_cores, vcpus))
        generation = record_attempt(hv, dom, xml, vm, source, target)
        xml = stamp_migrated_at(xml, hv.clock(), arriving_from=source, generation=generation)
        params: dict[str, Any] = {libvirt.VIR_MIGRATE_PARAM_URI: migration_uri(dst_host.migration_address),
                                  libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml}
        bandwidth = cluster.throttles.bandwidth_mib
        if bandwidth is not None:
            params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = bandwidth
        flags = migration_flags(cluster, source, target)
        if dom.isPersistent():
            params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = xml
            flags |= libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
        hv.fence(source, f"migrate {vm!r} to {target}")
        with lease_watch(hv.lease, dom, vm, lost, timeout_s):
            dom.migrate3(dst, params, flags)
    except libvirt.libvirtError as exc:
        after = after_failure(hv, vm, uuid, source, target) if uuid else f"it keeps running on {source}"
        why = f"{lost[0]}; " if lost else ""
        raise HypervisorError(f"host {source}: cannot migrate {vm!r} to {target}: {why}{one_line(exc)} ({after})") \
            from None
    hv.drop(source, vm)
    mark_completed(hv, target, vm, uuid, source)
    resume_arrival(hv, vm, uuid, source, target)


def mark_completed(hv: LibvirtHypervisor, target: str, vm: str, uuid: str, source: str) -> None:
    """Record on the paused arrival that libvirt reported its migration complete (``completed``): Finish ran and the
    source was confirmed rather than cancelled, so libvirt never resumes the source (a Confirm that fails leaves it
    paused), and this copy holds the newest state.  Written before the source is read, which may fail: if the
    source's host then stops answering and is fenced, repair can still resume this copy, where an arrival without
    the mark — whose source libvirt may have resumed after a failed Finish, and which may have run since — must not
    be resumed (:data:`vcsched.plans.repair.SOURCE_FENCED`; found by the fault simulation, seed 7 schedule 4501).
    Best effort: an arrival left unmarked is only treated as one whose migration may have failed."""
    with contextlib.suppress(HypervisorError, libvirt.libvirtError):
        dom = hv.conn(target).lookupByUUIDString(uuid)
        meta = metadata_of(dom.XMLDesc(0))
        if meta is None:
            return
        hv.fence(target, f"record that the migration of {vm!r} completed")
        write_metadata(dom, replace(meta, completed=True), arriving_from=source)  # still an arrival: still marked
        hv.drop(target, vm)


def record_attempt(hv: LibvirtHypervisor, dom: Any, xml: str, vm: str, source: str, target: str) -> int | None:
    """Before a migration attempt: raise the source copy's generation (read from its domain XML ``xml``) and
    name ``target`` in its ``migrating_to`` mark (one ``setMetadata``); the new generation, which the
    destination's XML carries too (None: the domain has no vcsched metadata, nothing recorded).

    Why before: the attempt may be cut at any point (the client killed, a host stopping), and whoever repairs
    later must be able to order the copies by what they can have executed (:mod:`hypervisor.settlement`).  The
    number only grows along the path the guest's state takes: a destination starts with its source's number,
    and a source that libvirt resumes after a failed attempt (and that then runs past what its destination
    holds) can only be paused for a migration again by a new attempt, which raises its number first.  A failure
    here stops the migration before ``migrate3``: nothing moved.
    """
    # Mutation switches (tests/test_faultsim.py): each turns off what it names; both: no call at all.
    count = not hazards.on(hazards.RESUME_WITHOUT_GENERATION)
    mark = not hazards.on(hazards.MIGRATE_WHILE_HOLDER_DOWN)
    meta = metadata_of(xml)  # the domain XML just read: no second call
    if meta is None or not (count or mark):
        return None
    generation = meta.generation + 1 if count else None
    hv.fence(source, f"migrate {vm!r} to {target}")
    write_metadata(dom, replace(meta, generation=meta.generation if generation is None else generation,
                                migrating_to=target if mark else meta.migrating_to))
    hv.drop(source, vm)
    return generation


def clear_attempt(hv: LibvirtHypervisor, host: str, vm: str, uuid: str, holder: str) -> None:
    """Drop the ``migrating_to`` mark of the copy on ``host`` once its attempt's destination ``holder`` is
    verified to hold no copy (so that host stopping later does not hold the VM back); a mark naming another host
    is kept.  Best effort: a mark left behind only makes a later migration of the VM wait for that host."""
    if hazards.on(hazards.MIGRATE_WHILE_HOLDER_DOWN):  # no mark was recorded (:func:`record_attempt`)
        return
    with contextlib.suppress(HypervisorError, libvirt.libvirtError):
        dom = hv.conn(host).lookupByUUIDString(uuid)
        meta = metadata_of(dom.XMLDesc(0))
        if meta is None or meta.migrating_to != holder:
            return
        hv.fence(host, f"record that the migration of {vm!r} left no copy")
        write_metadata(dom, replace(meta, migrating_to=None))
        hv.drop(host, vm)


def resume_arrival(hv: LibvirtHypervisor, vm: str, uuid: str, source: str, target: str) -> None:
    """Resume the paused destination copy once the source copy is verified gone, and clear its mark."""
    try:
        left = copy_state(hv.conn(source), source, uuid)
    except HypervisorError as exc:
        raise HypervisorError(f"host {target}: {vm!r} arrived but stays paused: cannot verify that its copy on "
                              f"{source} is gone ({exc}); it is in doubt until `vcsched repair` (or the next "
                              "changing command) finds every host answering and no other copy") from None
    if left in ("running", "paused"):
        raise HypervisorError(f"host {target}: {vm!r} arrived but stays paused: its copy on {source} is still "
                              f"{left} (in doubt: reported until resolved)")
    resume_marked(hv, target, vm, uuid)


def resume_marked(hv: LibvirtHypervisor, host: str, vm: str, uuid: str) -> None:
    """Resume a paused arrival on ``host`` and drop its ``arriving_from`` mark."""
    with as_host_error(host, f"resume {vm!r} after its migration"):
        dom = hv.conn(host).lookupByUUIDString(uuid)
        if int(dom.state(0)[0]) in PAUSED_STATES:
            hv.fence(host, f"resume {vm!r}")
            dom.resume()
        raw = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0)
        meta = parse_metadata(raw)
        if meta is not None and "arriving_from" in raw:
            write_metadata(dom, replace(meta, completed=False))  # without the marks, with its generation


def write_metadata(dom: Any, meta: VmMeta, *, arriving_from: str | None = None) -> None:
    """Rewrite a domain's ``<vcsched:vm>`` element, live (and in its persistent definition, if it has one);
    ``arriving_from``: a paused arrival's mark, kept (else the rewrite drops it)."""
    flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
    if dom.isPersistent():
        flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata_xml(meta, bare=True, arriving_from=arriving_from),
                    METADATA_PREFIX, METADATA_NS, flags)


def after_failure(hv: LibvirtHypervisor, vm: str, uuid: str, source: str, target: str) -> str:
    """After a failed ``migrate3``: make sure at most one copy runs, and say what was found and done.

    libvirt resumes the source copy when the migration fails before its end; a failure *after* the
    destination took over (its resume failed, the source already gone) leaves the VM paused on the
    destination: in doubt, never resumed here (``vcsched repair`` does, once every host answers).
    """
    try:
        here = copy_state(hv.conn(source), source, uuid)
    except HypervisorError as exc:
        return (f"in doubt: its copy on {source} cannot be checked ({exc}); nothing is removed, and "
                "inventories report it until `vcsched repair` settles it")
    if here != "running":
        return (f"in doubt: its copy on {source} is {here}; nothing is removed (a paused copy may be left on "
                f"{target}: `vcsched repair` resumes it once every host answers and no other copy exists)")
    try:
        there = copy_state(hv.conn(target), target, uuid)
    except HypervisorError:
        hv.forget(target)
        return (f"it keeps running on {source}; {target} did not answer, so a paused copy may be left "
                "there: `vcsched repair` removes it")
    if there == "gone":
        clear_attempt(hv, source, vm, uuid, target)
        return f"it keeps running on {source}"
    if there in ("paused", "stopped"):
        try:
            destroy_copy(hv, target, vm, uuid)
        except HypervisorError as exc:
            return f"it keeps running on {source}; removing its {there} copy on {target} failed ({exc})"
        clear_attempt(hv, source, vm, uuid, target)
        return f"it keeps running on {source}; its {there} copy on {target} was removed"
    return f"in doubt: it runs on both {source} and {target}; nothing is removed (reported until resolved)"


def destroy_copy(hv: LibvirtHypervisor, host: str, vm: str, uuid: str) -> None:
    """Destroy the copy of ``vm`` with ``uuid`` on ``host`` (and undefine it if persistent)."""
    with as_host_error(host, f"remove the paused copy of {vm!r}"):
        dom = hv.conn(host).lookupByUUIDString(uuid)
        persistent = bool(dom.isPersistent())
        hv.fence(host, f"remove the paused copy of {vm!r}")
        if dom.isActive():
            retrying(dom.destroy, hv.sleep)  # the destination's own migration job may hold it a moment longer
        if persistent:
            dom.undefine()
    hv.drop(host, vm)
