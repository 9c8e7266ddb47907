"""The libvirt implementation of :class:`hypervisor.base.Hypervisor`: one connection per host URI.

What it reads: each host's cores and memory (``getInfo``; the cluster file may
override cores and reserve memory), every domain with its vCPUs, memory,
state, vcsched metadata and cap.  What it writes, and only to managed domains:
new domains (with metadata and cap in their XML, so a VM never runs
uncapped) and caps.  Reading never acts: in-doubt VMs are reported by
:meth:`LibvirtHypervisor.inventory` and settled only by
:meth:`LibvirtHypervisor.repair`, under the cluster lock.

The backend is made of modules named by what they hold; this class owns the
connections (and what is cached per command) and puts them together:

* :mod:`hypervisor.domain_xml` — building, parsing and rewriting domain XML and vcsched's metadata;
* :mod:`hypervisor.live_state` — reading HostState / VmState and caps from a connection;
* :mod:`hypervisor.throttle` — disk and network caps;
* :mod:`hypervisor.drivers` — the one table of what each driver (qemu, xen/libxl, test) can do;
* :mod:`hypervisor.pool` — the bounded pool hosts are read with;
* :mod:`hypervisor.migration` — live migration that never runs a VM twice;
* :mod:`hypervisor.settlement` — settling in-doubt VMs (``vcsched repair``);
* :mod:`hypervisor.libvirt_calls` — host errors, retries of transient errors.

Caps (the project's contract, docs/caps.md):

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

**Connections are made by a factory** passed in: ``LibvirtHypervisor(cluster, connect=...)`` where
``connect(uri: str) -> connection`` returns an object with libvirt-python's ``virConnect`` API (raising
``libvirt.libvirtError`` or :class:`HypervisorError` when the host cannot be reached).  The default opens a
real connection (``libvirt.open`` in a thread bounded by ``host_timeout``, with keepalive:
:func:`hypervisor.connections.open_bounded`).  Tests and the fault simulation pass their own, with
``workers=1`` (everything in the caller's thread: hosts read inline, in cluster order, connections closed
inline), ``clock`` (wall time stamped on migrations) and
``sleep`` (pauses between retries) so that a run is deterministic.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import libvirt

from hypervisor import cpu_signals, down_hosts, hazards
from hypervisor.base import CpuCounters, HostReadBug, HypervisorError, IoCounters, VmInDoubt
from hypervisor.bootcheck import boot_problems, files_local, validation_xml
from hypervisor.connections import CallCounter, Counted, close_quietly, open_bounded, unwrap
from hypervisor.devices import boot_devices
from hypervisor.domain_xml import domain_xml, metadata_xml, parse_metadata
from hypervisor.drivers import Driver, driver_of
from hypervisor.identity import Identities, check_distinct, identity, remember, remembered, uuid_from_capabilities
from hypervisor.libvirt_calls import as_host_error, one_line, quiet, retrying
from hypervisor.live_state import (
    PARSE_ERRORS,
    host_state,
    host_vms,
    migration_job,
    read_bug,
    read_cap,
    read_io_caps,
    vm_state,
)
from hypervisor.migration import migrate
from hypervisor.pool import inventory_workers, run_bounded
from hypervisor.settlement import settle
from hypervisor.throttle import apply_io_caps, live_devices
from vcsched.caps import CAP_TOLERANCE, MIN_QUOTA_US, PERIOD_US, quota_for, realisable_cap
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster, ClusterHost
from vcsched.formats.throttles import MigrationThrottles
from vcsched.formats.units import format_size
from vcsched.inventory import (
    METADATA_NS,
    METADATA_PREFIX,
    HostState,
    Inventory,
    VmMeta,
    VmState,
    find_in_doubt,
    mark_in_doubt,
)
from vcsched.iocaps import DISK, NET, IoCaps, VmDevices, io_problem, realisable
from vcsched.plans.repair import RepairReport
from vcsched.plans.steps import CreateStep

T = TypeVar("T")

#: ``connect(uri) -> connection``: how the backend reaches a host (module docstring).
Connect = Callable[[str], Any]


def _copy_kind(v: VmState) -> str:
    if v.paused:
        return "paused arrival" if v.arriving_from is not None else "paused"
    return "running"


def _affected(persistent: bool) -> list[int]:
    """The flags to change a running domain with, one call each: the running domain (``AFFECT_LIVE``) and, for a
    persistent one, its definition (``AFFECT_CONFIG``).  libvirt's QEMU driver refuses both in one
    ``setMetadata`` or ``setSchedulerParametersFlags`` call ("Flags 'VIR_DOMAIN_AFFECT_LIVE' and
    'VIR_DOMAIN_AFFECT_CONFIG' are mutually exclusive", measured on the lab capping a persistent domain:
    vcsched's own are transient, an adopted one is not)."""
    return [libvirt.VIR_DOMAIN_AFFECT_LIVE, *([libvirt.VIR_DOMAIN_AFFECT_CONFIG] if persistent else [])]


def _set_metadata(dom: Any, element: str | None, persistent: bool) -> None:
    """Write (``None``: remove) vcsched's ``<vcsched:vm>`` element, live and in the definition (:func:`_affected`)."""
    prefix = METADATA_PREFIX if element is not None else None
    for flag in _affected(persistent):
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, element, prefix, METADATA_NS, flag)


class LibvirtHypervisor:
    """All hosts of one cluster file; connections open on first use and are closed by :meth:`close`.

    A host that does not answer within the cluster's ``host_timeout``
    (or refuses us, e.g. our certificate) is *down* for the rest of the
    command: every later call on it fails at once, naming the reason.  The
    next :meth:`inventory` asks it again.

    ``connect``: the connection factory (module docstring; None: real libvirt connections).  ``workers``:
    hosts read at once (None: :func:`hypervisor.pool.inventory_workers`; 1: inline, in order).  ``clock``:
    wall time (stamped on migrated VMs).  ``sleep``: the pause between retries of a transient error.
    """

    def __init__(self, cluster: Cluster, *, connect: Connect | None = None, workers: int | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 on_notice: Callable[[str], None] | None = None) -> None:
        quiet()
        self.cluster = cluster
        self._connect = connect
        self._workers = workers
        self.clock = clock
        self.sleep = sleep
        self._conns: dict[str, Any] = {}
        self._down: dict[str, str] = {}  # host -> why it is down for this command
        self._doms: dict[str, dict[str, Any]] = {}  # host -> domain name -> virDomain, listed once per inventory
        #: (host, VM, domain id) -> its cgroup in the cpu controller (None: not found), looked for once per start
        self._cgroups: dict[tuple[str, str, int], Path | None] = {}
        self._drivers: dict[str, str] = {}
        self._uuids: dict[str, str | None] = {}  # host -> its libvirt UUID, as first read in this command
        self._lock = threading.Lock()  # a plan's wave of migrations uses the connections from several threads
        self.calls = CallCounter()
        #: Whether the cluster lock is still ours (set by whoever holds it): a migration that would outlive the
        #: lock's lease is aborted (:func:`hypervisor.migration.lease_watch`).  None: no lock to watch.
        self.lease: Callable[[], bool] | None = None
        #: Lines worth telling the operator (one each), for the CLI to show; ``on_notice`` hears each as it happens.
        self.notices: list[str] = []
        self._on_notice = on_notice
        #: The hosts the cluster lock was named for, and the check of a newcomer (:meth:`act_only_as`).
        self._named: dict[str, str] | None = None
        self._admit: Callable[[str], bool] | None = None

    def _notice(self, line: str) -> None:
        self.notices.append(line)
        if self._on_notice is not None:
            self._on_notice(line)

    def __enter__(self) -> LibvirtHypervisor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _retry(self, fn: Callable[[], T]) -> T:
        return retrying(fn, self.sleep)

    def _workers_for(self, hosts: Iterable[ClusterHost]) -> int:
        return self._workers if self._workers is not None else inventory_workers(h.uri for h in hosts)

    def _open(self, host: str) -> Any:
        uri = self.cluster.connect_uri(host)
        if self._connect is None and uri.startswith("sim:"):  # the simulated libvirt: tests and benchmarks only
            from hypervisor.simlibvirt import open_uri

            return self._open_with(host, uri, open_uri)
        if self._connect is None:
            return open_bounded(host, uri, self.cluster.host_timeout)
        return self._open_with(host, uri, self._connect)

    @staticmethod
    def _open_with(host: str, uri: str, connect: Connect) -> Any:
        try:
            return connect(uri)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot connect to {uri}: {one_line(exc)}") from None

    def conn(self, host: str) -> Any:
        """The connection to ``host`` (opened on first use); HypervisorError if it is down for this command."""
        with self._lock:
            if host in self._down:
                raise HypervisorError(self._down[host])
            if host in self._conns:
                return self._conns[host]
        try:
            conn = self._open(host)
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

    def _driver_name(self, host: str) -> str:
        if host not in self._drivers:
            with as_host_error(host, "ask the driver type"):
                self._drivers[host] = str(self.conn(host).getType()).lower()  # "qemu", "xen", "test", ...
        return self._drivers[host]

    def driver(self, host: str) -> Driver:
        """What ``host``'s libvirt driver can do (:mod:`hypervisor.drivers`)."""
        return driver_of(self._driver_name(host))

    def _lookup(self, host: str, vm: str) -> Any | None:
        """The domain named ``vm`` on ``host``, from the host's list read once per inventory (a miss asks by name)."""
        cached = self._doms.get(host)
        if cached is not None and vm in cached:
            return cached[vm]
        with as_host_error(host, "list domains"):
            conn = self.conn(host)
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

    def drop(self, host: str, vm: str) -> None:
        """Forget a cached domain that was removed or moved away."""
        self._doms.get(host, {}).pop(vm, None)

    def domain(self, host: str, vm: str) -> Any:
        """The domain named ``vm`` on ``host``; HypervisorError if there is none."""
        dom = self._lookup(host, vm)
        if dom is None:
            raise HypervisorError(f"host {host}: no domain {vm!r}")
        return dom

    def forget(self, host: str) -> None:
        """Drop a host's connection (and the UUID read through it) after a failure, so the next call reconnects
        (the daemon may be back) and reads who answers.

        Closed in the background: closing a connection to a hung host blocks.
        """
        with self._lock:
            conn = self._conns.pop(host, None)
            self._doms.pop(host, None)
            self._uuids.pop(host, None)  # a host that comes back may be another machine (a wake checks it)
        if conn is None:
            return
        if self._workers == 1:  # deterministic mode: nothing leaves the caller's thread
            with contextlib.suppress(libvirt.libvirtError):
                unwrap(conn).close()
        else:
            close_quietly(unwrap(conn))

    # ----------------------------------------------------------- reading

    def host_state(self, h: ClusterHost) -> HostState:
        return host_state(self.conn(h.name), h, self.driver(h.name), self.host_uuid(h.name))

    def host_uuid(self, host: str) -> str | None:
        """The host's libvirt UUID (capabilities ``<host><uuid>``; None: its driver reports none), read once per
        command and host (one libvirt call)."""
        with self._lock:
            if host in self._uuids:
                return self._uuids[host]
        with as_host_error(host, "read its capabilities"):
            got = uuid_from_capabilities(self.conn(host).getCapabilities())
        with self._lock:
            return self._uuids.setdefault(host, got)

    def identities(self) -> Identities:
        """Every host's identity for the cluster lock (:mod:`hypervisor.identity`): its UUID as the cluster file
        declares it, else as the host answers (all asked at once, within ``host_timeout``; a host known down gets
        one probe), else as a command here last read it; a host with none is ``unknown``, with the reason.

        Raises :class:`InputError` for two entries that are one host.
        """
        from hypervisor.files import state_dir

        hosts = self.cluster.hosts
        asked = {h.name: functools.partial(self.host_uuid, h.name) for h in hosts if h.uuid is None}
        limits, _ = down_hosts.probe_timeouts(state_dir(), {n: self.cluster.connect_uri(n) for n in asked},
                                              self.cluster.host_timeout)  # a host known down: one probe
        got = run_bounded(asked, self._workers_for(hosts), limits)
        known = remembered(state_dir())
        uuids: dict[str, str | None] = {}
        out: dict[str, str] = {}
        unknown: dict[str, str] = {}
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
                unknown[h.name] = (f"host {h.name} does not answer ({why}), the cluster file declares no uuid for "
                                   "it and no command here has read it")
                continue
            uuids[h.name] = answer
            out[h.name] = identity(answer, uri)
        check_distinct(self.cluster, uuids)
        remember(state_dir(), {self.cluster.connect_uri(n): u for n, u in uuids.items() if u is not None})
        return Identities(out, unknown)

    def act_only_as(self, named: Mapping[str, str], admit: Callable[[str], bool] | None = None) -> None:
        """Read only the hosts the cluster lock was named for, as who they were then (``named``: host name ->
        identity, :meth:`identities`' ``known``); every later :meth:`inventory` shows any other host — one that had
        no identity then, or that now answers as another host — as down, so no plan acts on a host the lock does
        not cover (docs/hosts-down.md, "Which lock").  ``admit(identity)``: whether the lock the caller holds
        covers a host that has since answered (it claims the host under that lock when nothing else has)."""
        self._named = dict(named)
        self._admit = admit

    def _unnamed_reason(self, state: HostState) -> str | None:
        """Why an answering host is left out of this command (None: the lock covers it; :meth:`act_only_as`)."""
        if self._named is None:
            return None
        declared = self.cluster.host(state.name).uuid  # as :meth:`identities` names it (a mismatch is refused)
        now = identity(declared if declared is not None else state.uuid, self.cluster.connect_uri(state.name))
        then = self._named.get(state.name)
        if then == now:
            return None
        if self._admit is not None and self._admit(now):
            self._named[state.name] = now
            return None
        if then is None:
            return (f"host {state.name}: had no identity when this command named the cluster lock (it did not "
                    "answer) and the lock it holds does not cover it; not acted on (run the command again)")
        return (f"host {state.name}: answers as {now}, the cluster lock was named with it as {then}; not acted on "
                "(run the command again)")

    def _read_host(self, h: ClusterHost) -> tuple[HostState, list[VmState]]:
        state = self._retry(functools.partial(self.host_state, h))
        found, doms = host_vms(h.name, self.conn(h.name), self.driver(h.name), self.sleep)
        self._doms[h.name] = doms
        return state, found

    def inventory(self, hosts: Iterable[str] | None = None) -> Inventory:
        """Every wanted host read at once (a bounded pool); a host that fails or takes longer than
        ``host_timeout`` is down for this command.  VMs in doubt (active on two hosts, or a paused arrival) are
        reported and marked so that no plan acts on them; reading never settles them (:meth:`repair` does).

        A failure of vcsched's own reading code on a host's answer is :class:`HostReadBug` (a bug, exit 70),
        never a down host.
        """
        # In the cluster file's order whatever ``hosts`` is (a set's order changes with every process's hash seed):
        # which host is read first decides what the reads see when one stops answering meanwhile, so a fault
        # simulation schedule replays the same only in a fixed order (docs/faultsim.md).
        picked = set() if hosts is None else {self.cluster.host(h).name for h in hosts}
        wanted = self.cluster.hosts if hosts is None else tuple(h for h in self.cluster.hosts if h.name in picked)
        with self._lock:
            for h in wanted:
                self._down.pop(h.name, None)
                self._doms.pop(h.name, None)
        from hypervisor.files import state_dir

        timeout = self.cluster.host_timeout
        uris = {h.name: self.cluster.connect_uri(h.name) for h in wanted}
        limits, known = down_hosts.probe_timeouts(state_dir(), uris, timeout)
        tasks = {h.name: functools.partial(self._read_host, h) for h in wanted}
        results = run_bounded(tasks, self._workers_for(wanted), limits)
        states, vms = [], []
        found_down: dict[str, str] = {}
        for h in wanted:
            got = results.get(h.name)
            if got is None or isinstance(got, Exception):
                if isinstance(got, InputError | HostReadBug):
                    raise got
                if h.name in known and got is None:  # one probe, no answer: named as known down, record kept
                    reason = f"host {h.name}: {known[h.name].describe(limits[h.name])}"
                elif got is None:
                    reason = f"host {h.name}: did not answer within {timeout:g} s (host_timeout)"
                elif isinstance(got, libvirt.libvirtError):
                    reason = f"host {h.name}: {one_line(got)}"
                elif isinstance(got, HypervisorError):
                    reason = str(got)
                else:  # neither the host nor libvirt said so: vcsched's own code failed on the answer
                    raise HostReadBug(f"host {h.name}: vcsched failed reading it ({type(got).__name__}: {got}): "
                                      "this is a bug in vcsched, not a host failure; nothing was changed — please "
                                      "report it with this message") from got
                if h.name not in known:
                    found_down[uris[h.name]] = reason.removeprefix(f"host {h.name}: ")
                with self._lock:
                    self._down[h.name] = reason
                states.append(HostState(h.name, h.cores or 0, 0, h.memory_reserved, down=reason))
                self.forget(h.name)
                continue
            state, found = got
            if state.memory_reserved >= state.memory_bytes:
                raise InputError(f"cluster file: host {h.name}: memory_reserved {format_size(h.memory_reserved)} "
                                 f"is not below the host's {format_size(state.memory_bytes)} of memory")
            states.append(state)
            vms += found
        down_hosts.update(state_dir(), found_down, [uris[st.name] for st in states if st.down is None])
        # Before anything is made of the VMs: two entries reaching one host would show its VMs on "two hosts".
        check_distinct(self.cluster, {st.name: st.uuid for st in states if st.down is None})
        left_out = {st.name: why for st in states if st.down is None
                    and (why := self._unnamed_reason(st)) is not None}
        if left_out:  # answering, but not covered by the lock this command holds: down for it
            with self._lock:
                self._down.update(left_out)
            states = [HostState(st.name, self.cluster.host(st.name).cores or 0, 0, st.memory_reserved,
                                down=left_out[st.name]) if st.name in left_out else st for st in states]
            vms = [v for v in vms if v.host not in left_out]
        all_vms = tuple(sorted(vms, key=lambda v: (v.host, v.name)))
        doubts = find_in_doubt(all_vms)
        if hazards.on(hazards.IN_DOUBT_PLANNABLE):  # mutation switch (tests/test_faultsim.py)
            inventory = Inventory(self.cluster.name, tuple(states), all_vms, doubts)
        else:
            inventory = Inventory(self.cluster.name, tuple(states), mark_in_doubt(all_vms, doubts), doubts)
        if hazards.on(hazards.SETTLE_WITHOUT_LOCK) and hosts is None:  # mutation switch (tests/test_faultsim.py)
            settle(self, lambda: None, inventory=inventory)
        return inventory

    def repair(self, guard: Callable[[], None], *, apply: bool = True, fenced: frozenset[str] = frozenset(),
               inventory: Inventory | None = None) -> RepairReport:
        """Settle in-doubt VMs (:func:`hypervisor.settlement.settle`): only under the cluster lock (``guard`` is
        its check, called before every action), each once every host that may hold another copy of it answered
        (or was ``fenced``); each action is one notice.  ``apply=False``: what it would do, changing nothing."""
        report = settle(self, guard, apply=apply, inventory=inventory, fenced=fenced)
        if report.applied:
            for line in report.lines():
                self._notice(line)
        return report

    def find_vm(self, name: str) -> VmState | None:
        """The one copy of ``name`` (None: on no answering host).

        Every answering host is asked: a VM with copies on several hosts, or whose only copy is a paused
        arrival, is :class:`VmInDoubt` — never "the first copy found", which would let a step act on the
        wrong one.
        """
        copies: list[VmState] = []
        for h in self.cluster.hosts:
            if h.name in self._down:
                continue
            dom = self._lookup(h.name, name)
            if dom is None:
                continue
            try:
                with as_host_error(h.name, f"read {name!r}"):
                    copies.append(vm_state(h.name, dom, self.driver(h.name)))
            except HypervisorError:
                if not self._gone(h.name, name):
                    raise
        active = [c for c in copies if c.active]
        if hazards.on(hazards.FIRST_COPY_LOOKUP):  # mutation switch (tests/test_faultsim.py)
            return active[0] if active else (copies[0] if copies else None)
        if len(active) > 1 or any(c.paused and c.arriving_from is not None for c in active):
            where = ", ".join(f"{c.host} ({_copy_kind(c)})" for c in active)
            raise VmInDoubt(f"{name} is in doubt: copies on {where}; no step acts on it until `vcsched repair` "
                            "settles it (docs/repair.md, \"A VM never runs twice\")")
        return active[0] if active else (copies[0] if copies else None)

    def _gone(self, host: str, vm: str) -> bool:
        """After a failed read of a domain from the host's list: True (and forgotten) if it no longer exists there
        (destroyed since the list was read), so a stale entry reads as absent, not as an error."""
        self.drop(host, vm)
        return self._lookup(host, vm) is None

    def read_cap(self, host: str, vm: str) -> float | None:
        def read() -> float | None:
            dom = self.domain(host, vm)
            return read_cap(host, dom, int(dom.info()[3]), self.driver(host))

        with as_host_error(host, f"read the cap of {vm!r}"):
            return self._retry(read)

    def realised_cap(self, host: str, vcpus: int, cap_cores: float) -> float:
        """The CFS grid point, rounded down; on Xen, whole percent of one CPU, rounded down."""
        if self.driver(host).cpu_cap == "credit":
            return max(1, int(cap_cores * 100 + 1e-9)) / 100
        return realisable_cap(cap_cores, vcpus)

    def cpu_time_ns(self, host: str, vm: str) -> int | None:
        """The whole domain's CPU time (vCPUs + emulator), i.e. what the host really spends on it."""
        if not self.driver(host).measures:
            return None  # the test driver returns constants (docs/lab.md): nothing to measure
        try:
            return int(self.domain(host, vm).getCPUStats(True)[0]["cpu_time"])
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot read CPU time of {vm!r}: {exc.get_error_message()}") from None

    def cpu_counters(self, host: str, vm: str) -> CpuCounters | None:
        """Used, delayed and waiting time from one ``domainListGetStats`` (CPU_TOTAL + VCPU), throttling from the
        vCPU cgroups' ``cpu.stat`` on a host of this machine (:mod:`hypervisor.cpu_signals`)."""
        if not self.driver(host).measures:
            return None
        try:
            dom = self.domain(host, vm)
            got = self.conn(host).domainListGetStats(  # a list is not unwrapped by the call counter: unwrap here
                [unwrap(dom)], libvirt.VIR_DOMAIN_STATS_CPU_TOTAL | libvirt.VIR_DOMAIN_STATS_VCPU)
            stats = dict(got[0][1]) if got else {}
            if "cpu.time" not in stats:
                return None
            throttling = None
            if cpu_signals.local_uri(self.cluster.connect_uri(host)) and dom.ID() > 0:
                key = (host, vm, int(dom.ID()))
                if key not in self._cgroups:
                    self._cgroups[key] = cpu_signals.domain_cgroup(cpu_signals.partition_of(dom.XMLDesc(0)),
                                                                   key[2], vm)
                directory = self._cgroups[key]
                throttling = None if directory is None else cpu_signals.read_throttling(directory)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {host}: cannot read CPU counters of {vm!r}: {exc.get_error_message()}") \
                from None
        except PARSE_ERRORS as exc:
            raise read_bug(host, f"the CPU counters of {vm!r}", exc) from None
        return cpu_signals.counters(int(stats["cpu.time"]), stats, throttling)

    def read_io_caps(self, host: str, vm: str) -> IoCaps:
        """The VM's disk and network caps: ``blockIoTune`` of its disks, ``interfaceParameters`` of its interfaces.

        Reported as a cap only if every disk (every interface) has one: a VM
        with one unthrottled disk can write without limit, so it reads as
        uncapped on disk.
        """
        def read() -> IoCaps:
            dom = self.domain(host, vm)
            return read_io_caps(host, dom, live_devices(dom), self.driver(host))

        with as_host_error(host, f"read the disk/network caps of {vm!r}"):
            return self._retry(read)

    def realised_io_caps(self, host: str, devices: VmDevices, caps: IoCaps) -> IoCaps:
        """Whole bytes (and operations) per second for disks; 1000 B/s units per interface for the network."""
        return realisable(caps, devices)

    def planned_devices(self, step: CreateStep) -> VmDevices:
        return boot_devices(step.boot)

    def io_counters(self, host: str, vm: str) -> IoCounters | None:
        """Bytes read + written on every disk (``blockStats``) and received / sent on every interface
        (``interfaceStats``, the guest's view) since the domain started."""
        if not self.driver(host).measures:
            return None  # the test driver returns made-up constants
        try:
            dom = self.domain(host, vm)
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
        if self.driver(host).cpu_cap is None:
            raise HypervisorError(f"host {host}: the libvirt test driver ({self.cluster.host(host).uri}) "
                                  "cannot set CPU caps")

    def create_problems(self, step: CreateStep, where: str, *, define: bool = True) -> list[str]:
        """What would stop ``step`` from creating its VM, checked before a plan's first step
        (:mod:`hypervisor.bootcheck`): its boot files (on a host of this machine), then its domain XML as
        libvirt's own define-time validation on the target host's driver sees it.  That validation defines the
        XML under a throw-away name (:func:`hypervisor.bootcheck.validation_xml`) and undefines it at once: a
        change on the host, so a dry run (``define=False``: it holds no lock, and reading never acts) checks the
        XML only as vcsched parses it, and ``--apply`` has libvirt validate it before its first step."""
        h = self.cluster.host(step.host)
        problems = boot_problems(where, step.boot, step.memory_bytes, local=files_local(h.uri))
        if problems:
            return problems
        try:
            xml = validation_xml(domain_xml(step, h.partition), os.urandom(6).hex())
        except (InputError, ET.ParseError) as exc:
            return [f"{where}.boot: {exc}"]
        if not define:
            return []
        self.fence(step.host, f"check the domain XML of {step.vm!r}")
        try:
            dom = self.conn(step.host).defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
        except libvirt.libvirtError as exc:
            return [f"{where}.boot: host {step.host} (libvirt {self._driver_name(step.host)} driver) refuses the "
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
        self.fence(step.host, f"create {step.vm!r}")
        try:
            self.conn(step.host).createXML(xml, 0)
        except libvirt.libvirtError as exc:
            said = one_line(exc)  # e.g. tc's multi-line error for a <bandwidth>
            raise HypervisorError(f"host {step.host}: cannot create {step.vm!r}: {said}") from None

    def set_cap(self, host: str, vm: str, cap_cores: float) -> None:
        self._refuse_uncappable(host)
        with as_host_error(host, f"cap {vm!r}"):
            dom = self.domain(host, vm)
            vcpus = int(dom.info()[3])
            persistent = bool(dom.isPersistent())
        if cap_cores > vcpus + CAP_TOLERANCE:
            raise HypervisorError(f"host {host}: cap {cap_cores:g} cores for {vm!r} is more than its {vcpus} vCPUs "
                                  "(it would run uncapped); nothing changed")
        if self.driver(host).cpu_cap == "credit":
            params: dict[str, int] = {"cap": round(self.realised_cap(host, vcpus, cap_cores) * 100)}
        else:
            quota = quota_for(cap_cores, vcpus)
            if quota < MIN_QUOTA_US:
                raise HypervisorError(f"host {host}: cap {cap_cores:.4f} cores for {vm!r} is below libvirt's "
                                      f"minimum vcpu_quota ({MIN_QUOTA_US} µs per {PERIOD_US} µs per vCPU)")
            params = {"vcpu_period": PERIOD_US, "vcpu_quota": quota}
        with as_host_error(host, f"cap {vm!r}"):
            self.fence(host, f"cap {vm!r}")
            for flag in _affected(persistent):
                self._retry(functools.partial(dom.setSchedulerParametersFlags, params, flag))

    def _refuse_io(self, host: str, vm: str, caps: IoCaps) -> None:
        """A driver that cannot cap a resource ``caps`` asks for: refused naming host, VM and value."""
        for resource, why in self.driver(host).cannot_cap(self.cluster.host(host).uri):
            if resource not in (DISK, NET):
                continue
            wanted = caps.net_bytes_sec if resource == NET else (caps.disk_bytes_sec or caps.disk_iops_sec)
            if wanted is not None:
                raise HypervisorError(f"host {host}: cannot cap {resource} of {vm!r} at {wanted}: {why}; "
                                      "nothing changed")

    def set_io_caps(self, host: str, vm: str, caps: IoCaps) -> None:
        """Throttle the VM's disks (one group) and shape its interfaces (:mod:`hypervisor.throttle`).

        The disks are all set before the interfaces.  A failure on an
        interface puts back the parameters that interface had (libvirt leaves
        half of a failed tc set-up in place) and is reported with libvirt's
        message; a re-run of the plan sets what is still missing.
        """
        if not caps:
            return
        self._refuse_io(host, vm, caps)
        with as_host_error(host, f"cap the disk/network of {vm!r}"):
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
        self.fence(host, f"cap the disk/network of {vm!r}")
        apply_io_caps(host, dom, devices, caps, flags)

    def _managed_domain(self, host: str, vm: str, action: str) -> tuple[Any, VmMeta]:
        """The domain and its vcsched metadata; an unmanaged domain is refused, naming ``action``."""
        dom = self.domain(host, vm)
        try:
            meta = parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0))
        except libvirt.libvirtError:
            meta = None  # no vcsched metadata: unmanaged
        if meta is None:
            raise HypervisorError(f"host {host}: refusing to {action} unmanaged domain {vm!r}")
        return dom, meta

    def set_need(self, host: str, vm: str, cpu_need_cores: float) -> None:
        """Rewrite the ``<vcsched:vm>`` element with the new need (the other fields as they are)."""
        with as_host_error(host, f"record the need of {vm!r}"):
            dom, meta = self._managed_domain(host, vm, "write metadata of")
            persistent = bool(dom.isPersistent())
            element = metadata_xml(replace(meta, cpu_need_cores=cpu_need_cores), bare=True)
            self.fence(host, f"record the need of {vm!r}")
            _set_metadata(dom, element, persistent)

    def adopt_vm(self, host: str, vm: str, meta: VmMeta, cap_cores: float) -> None:
        """Write vcsched's metadata into running unmanaged ``vm`` (live, and persistent if defined), then cap it.

        The metadata first: a cap that fails after it leaves a managed VM whose cap a re-run sets (the executor's
        adopt runner), never a capped domain vcsched does not know as its own."""
        self._refuse_uncappable(host)
        with as_host_error(host, f"adopt {vm!r}"):
            dom = self.domain(host, vm)
            try:
                found = parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0))
            except libvirt.libvirtError:
                found = None  # no vcsched metadata: unmanaged
            if found is not None:
                raise HypervisorError(f"host {host}: domain {vm!r} is already managed (virtual cluster "
                                      f"{found.cluster!r})")
            if not dom.isActive():
                raise HypervisorError(f"host {host}: domain {vm!r} is not running")
            persistent = bool(dom.isPersistent())
            self.fence(host, f"adopt {vm!r}")
            _set_metadata(dom, metadata_xml(meta, bare=True), persistent)
        self.set_cap(host, vm, cap_cores)

    def release_vm(self, host: str, vm: str) -> None:
        """Lift ``vm``'s CPU cap (no quota; no credit cap on Xen), then remove vcsched's metadata (live and
        persistent): the domain keeps running, unmanaged.  The cap first, so a failure in between leaves a
        managed VM (a re-run finishes), never a capped domain nobody manages."""
        with as_host_error(host, f"release {vm!r}"):
            dom, _meta = self._managed_domain(host, vm, "release")
            persistent = bool(dom.isPersistent())
            self.fence(host, f"release {vm!r}")
            kind = self.driver(host).cpu_cap
            if kind is not None:
                params = {"cap": 0} if kind == "credit" else {"vcpu_period": PERIOD_US, "vcpu_quota": -1}
                for flag in _affected(persistent):
                    self._retry(functools.partial(dom.setSchedulerParametersFlags, params, flag))
            _set_metadata(dom, None, persistent)

    def domain_definition(self, host: str, vm: str) -> str:
        with as_host_error(host, f"read the definition of {vm!r}"):
            dom = self.domain(host, vm)
            flags = libvirt.VIR_DOMAIN_XML_INACTIVE if dom.isPersistent() else 0
            return str(dom.XMLDesc(flags))

    def remove_vm(self, host: str, vm: str) -> None:
        """Destroy (hard stop: the cluster departed, its guests' state is not kept) and undefine if persistent."""
        with as_host_error(host, f"remove {vm!r}"):
            dom, _meta = self._managed_domain(host, vm, "remove")
            persistent = bool(dom.isPersistent())  # a transient domain is gone once destroyed: ask first
            self.fence(host, f"remove {vm!r}")
            if dom.isActive():
                dom.destroy()
            if persistent:
                dom.undefine()
        self.drop(host, vm)

    def migrate_vm(self, vm: str, source: str, target: str, cap_cores: float, *,
                   timeout_s: float | None = None) -> None:
        """Live-migrate ``vm`` so that it never runs on two hosts at once (:mod:`hypervisor.migration`)."""
        migrate(self, vm, source, target, cap_cores, timeout_s=timeout_s)

    @property
    def throttles(self) -> MigrationThrottles:
        return self.cluster.throttles

    def migrations(self, inventory: Inventory) -> list[dict[str, Any]]:
        """Live migrations in flight, from libvirt's job of every active VM of ``inventory`` (one ``jobStats``
        call each): ``{"vm", "source", "target", ...}`` per migration, its progress as its source reports it.
        The destination is the host of the VM's other copy (QEMU's arriving side reports no job of its own
        there); None when that copy was not seen.  A host that did not answer is left out.

        libvirt has no bulk call for jobs, so the hosts are asked at once, in the pool the inventory reads them
        with: 1,000 hosts of 10 VMs cost the slowest host's 10 round trips, not 10,000 one after the other; a
        host that takes longer than ``host_timeout`` is left out like one that does not answer."""
        active: dict[str, list[str]] = {}
        for v in inventory.vms:
            if v.active:
                active.setdefault(v.host, []).append(v.name)
        tasks = {host: functools.partial(self._migrations_out, host, names) for host, names in active.items()}
        got = run_bounded(tasks, self._workers_for(self.cluster.host(h) for h in active), self.cluster.host_timeout)
        sides: dict[str, dict[str, Any]] = {}
        for host in active:
            out = got.get(host)
            if isinstance(out, HypervisorError) or out is None:
                continue
            if isinstance(out, Exception):  # vcsched's own code failed: a bug, not a host failure
                raise out
            for m in out:
                others = [o.host for o in inventory.vms if o.name == m["vm"] and o.host != host]
                sides[m["vm"]] = {**m, "target": others[0] if others else None}
        return sorted(sides.values(), key=lambda m: m["vm"])

    def _migrations_out(self, host: str, names: list[str]) -> list[dict[str, Any]]:
        """The outgoing migrations among ``host``'s VMs ``names`` (their jobs' progress); a VM whose job cannot
        be read is passed over."""
        out = []
        for name in names:
            try:
                job = migration_job(self.domain(host, name), host)
            except HypervisorError:
                continue
            if job is not None and job.pop("direction") == "out":
                out.append({"vm": name, "source": host, "target": None, **job})
        return out

    def fence(self, host: str, what: str) -> None:
        """Refuse to change ``host`` once the cluster lock's lease may run out (``lease`` says so).

        The guard runs before each step, but one step makes several calls and a host that hangs makes each
        wait up to ``host_timeout``: the lease can run out inside a step, and another command take the lock
        and act beside it (found by the fault simulation, docs/faultsim.md).  So every call that changes a
        host is preceded by this check, which raises naming the host and what was not done.  (A call already
        sent is not recalled: what a host does after the lease ran out is bounded by this check's distance to
        the call, one libvirt round trip.)
        """
        if self.lease is not None and not self.lease():
            raise HypervisorError(f"host {host}: not done ({what}): the cluster lock's lease may run out (its "
                                  "renewals failed); no further change is made")

    def lists(self, host: str, vm: str) -> bool:
        return self._lookup(host, vm) is not None

    def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()
        self._conns.clear()
