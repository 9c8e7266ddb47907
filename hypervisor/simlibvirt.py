"""A simulated libvirt: the daemons of many hosts in one process, for the fault simulation and the scale benchmark.

A test and benchmark facility, never a way to run VMs.  It stands in for
libvirt (which is why it lives in ``hypervisor/``): it answers the subset of
the libvirt-python API that vcsched's backend calls on connections and
domains, raises libvirt's own :class:`libvirt.libvirtError` with libvirt's
error codes, and keeps, per host, what a libvirt daemon keeps:

* domains by name and by UUID, each running, paused or shut off, transient or
  persistent, with its vCPUs, memory, ``<cputune>`` quota/period, vcsched's
  metadata element (``<vcsched:vm>``) and a job (none, or one side of a
  migration);
* migration as libvirt's protocol v3 runs it for a client that holds
  connections to both hosts (``virDomainMigrate3`` without PEER2PEER):
  Begin (source), Prepare (destination: the incoming domain is created,
  paused, with a job), Perform (the copy; the source ends paused), Finish
  (destination: with VIR_MIGRATE_PAUSED the domain stays paused, its job
  ends), Confirm (source: its copy is removed on success, resumed on
  failure).  Each phase is a point where :attr:`SimWorld.hook` may inject a
  fault, and a failed phase is cleaned up as libvirt does: the destination
  cancels an incoming migration (also when the client's connection closes or
  the destination comes back after being down), the source resumes unless
  the copy had completed (``PERFORM3_DONE``: it stays paused, job cleared);
* a second domain with a UUID already active on the same host is refused;
  nothing stops the same UUID running on two hosts (libvirt without a lock
  manager does not either).

Determinism: no thread, no wall clock.  :class:`SimWorld` has a simulated
clock (:attr:`SimWorld.now`) that advances a little at every call and by the
host timeout when a call hangs; UUIDs come from a counter.

Measured behaviour this follows is in docs/faultsim.md (and the lab notes it
cites); what it does not model is listed there too.
"""

from __future__ import annotations

import itertools
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import libvirt

from hypervisor.xmltext import escape, quoteattr
from vcsched.inventory import METADATA_NS, METADATA_PREFIX

#: The URI scheme of a simulated host: ``sim://NAME`` (the cluster file's ``uri``), resolved by a
#: :class:`SimWorld` given to the backend's connection factory.
SIM_SCHEME = "sim://"

RUNNING, PAUSED, SHUTOFF = libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_PAUSED, libvirt.VIR_DOMAIN_SHUTOFF
JOB_NONE = libvirt.VIR_DOMAIN_JOB_NONE
JOB_UNBOUNDED = libvirt.VIR_DOMAIN_JOB_UNBOUNDED
#: Simulated seconds one libvirt call takes (the clock must move for leases and timeouts to mean anything).
CALL_S = 0.001
#: Simulated seconds a migration's memory copy takes.
COPY_S = 2.0
_META_TAG = f"{{{METADATA_NS}}}vm"


def sim_error(code: int, message: str) -> libvirt.libvirtError:
    """A :class:`libvirt.libvirtError` carrying ``code`` and ``message``, as the binding builds them."""
    exc = libvirt.libvirtError.__new__(libvirt.libvirtError)
    Exception.__init__(exc, message)
    exc.err = (code, libvirt.VIR_FROM_QEMU, message, libvirt.VIR_ERR_ERROR, None, None, None, 0, 0)
    return exc


class ProcessKilled(BaseException):
    """The vcsched process was killed at this call (SIGKILL): nothing of it may run on.

    A BaseException, so no ``except Exception`` in the code under test can swallow it.
    """


@dataclass
class SimDomain:
    """One domain as one host's daemon holds it."""

    name: str
    uuid: str
    vcpus: int
    memory_bytes: int
    state: int
    persistent: bool
    quota: int = -1  # vcpu_quota in µs per vCPU thread; -1: none
    period: int = 100000
    meta: dict[str, str] | None = None  # the <vcsched:vm> attributes; None: no vcsched metadata
    job: int = JOB_NONE
    incoming: bool = False  # a migration's destination side before Finish: cancelled if its client goes
    migration: Migration | None = None  # the migration this domain is a side of
    cpu_ns: int = 0
    #: Summed ``vcpu.N.delay`` (ns runnable but queued for a host CPU), reported as vCPU 0's: the contention fakes.
    delay_ns: int = 0
    #: libvirt's reason for a paused state: VIR_DOMAIN_PAUSED_MIGRATION when a migration stopped it (its
    #: source at the switch-over, an incoming domain), VIR_DOMAIN_PAUSED_USER after ``suspend`` or an arrival
    #: kept paused by VIR_MIGRATE_PAUSED (per libvirt's qemu driver source; not observed in the lab yet).
    reason: int = 0
    #: Which guest state this copy holds: a new number each time it starts executing guest code, its source's
    #: number when a migration copies the state into it (:meth:`SimWorld.started`: resuming a stale copy).
    version: int = 0
    _xml: str | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.state != SHUTOFF

    def changed(self) -> None:
        self._xml = None

    def xml(self) -> str:
        if self._xml is None:
            meta = ""
            if self.meta is not None:
                attrs = "".join(f" {k}={quoteattr(v)}" for k, v in self.meta.items())
                meta = (f"<metadata><{METADATA_PREFIX}:vm xmlns:{METADATA_PREFIX}=\"{METADATA_NS}\"{attrs}/>"
                        "</metadata>")
            tune = f"<cputune><period>{self.period}</period><quota>{self.quota}</quota></cputune>" \
                if self.quota > 0 else ""
            self._xml = (f"<domain type='kvm'><name>{escape(self.name)}</name><uuid>{self.uuid}</uuid>"
                         f"<memory unit='KiB'>{self.memory_bytes // 1024}</memory><vcpu>{self.vcpus}</vcpu>"
                         f"{meta}{tune}<os><type>hvm</type></os><devices/></domain>")
        return self._xml

    def cap_cores(self) -> float:
        """The CPU this domain may use, in cores (its vCPUs when uncapped)."""
        if self.quota <= 0 or self.quota > self.period:
            return float(self.vcpus)
        return self.quota * self.vcpus / self.period


@dataclass
class Migration:
    """One migration between two hosts, driven by the client ``process`` (see the module docstring)."""

    vm: str
    uuid: str
    source: str
    target: str
    process: int
    phase: str = "begin"  # begin, prepared, performed (PERFORM3_DONE), finished, confirmed, cancelled


@dataclass
class SimHost:
    """One host's daemon: its capacity, its domains, whether it answers."""

    name: str
    cores: int
    memory_bytes: int
    uuid: str
    driver: str = "QEMU"
    domains: dict[str, SimDomain] = field(default_factory=dict)  # by UUID
    up: bool = True

    def by_name(self, name: str) -> SimDomain | None:
        return next((d for d in self.domains.values() if d.name == name), None)


@dataclass(frozen=True)
class Call:
    """One libvirt call as the fault injector sees it."""

    process: int
    host: str
    method: str
    vm: str | None = None


class SimWorld:
    """Every simulated host, the simulated clock, and the hook a fault injector sets.

    ``hook(call)`` runs at every call before its effect; it may raise (an
    error, :class:`ProcessKilled`), change hosts (one goes down, one comes
    back), or run another process's work.  ``after(call)`` runs after every
    call's effect (the invariant checks).
    """

    def __init__(self, hosts: Iterable[SimHost] = (), *, host_timeout: float = 5.0) -> None:
        self.hosts: dict[str, SimHost] = {h.name: h for h in hosts}
        self.now = 0.0
        self.host_timeout = host_timeout
        self.hook: Callable[[Call], None] | None = None
        self.after: Callable[[Call], None] | None = None
        self._uuids = itertools.count(1)
        self.migrations: list[Migration] = []
        self.open_conns: dict[int, list[SimConnection]] = {}
        self.calls = 0
        #: Processes killed (SIGKILL): any call they still attempt raises :class:`ProcessKilled`.
        self.dead: set[int] = set()
        #: Whether the client ``process``'s lease watch would abort its migration now (the simulation's stand-in
        #: for the watch thread of :func:`hypervisor.migration.lease_watch`, polled at every migration phase).
        self.abort_wanted: Callable[[int], bool] = lambda _process: False
        #: Per UUID, the newest guest state (a :attr:`SimDomain.version`): the one a copy last executed from.
        self.latest: dict[str, int] = {}
        self._versions = itertools.count(1)
        #: Copies that started executing from a state older than their VM's newest (the guest lost what
        #: another copy executed since): the simulation's "resumed the wrong copy" check reads this.
        self.stale: list[str] = []

    # ---------------------------------------------------------------- set-up

    def add_host(self, name: str, cores: int, memory_bytes: int) -> SimHost:
        h = SimHost(name, cores, memory_bytes, self.new_uuid())
        self.hosts[name] = h
        return h

    def new_uuid(self) -> str:
        n = next(self._uuids)
        return f"{n:08x}-0000-4000-8000-{n:012x}"

    def add_domain(self, host: str, dom: SimDomain) -> SimDomain:
        self.hosts[host].domains[dom.uuid] = dom
        if dom.state == RUNNING:
            self.started(host, dom)
        return dom

    def started(self, host: str, d: SimDomain) -> None:
        """``d`` starts executing guest code (created, resumed): it must hold its VM's newest state, and from
        now on it holds a newer one than any copy taken before."""
        newest = self.latest.get(d.uuid)
        if newest is not None and d.version != newest:
            self.stale.append(f"{d.name} resumed on {host} from a stale state (another copy executed after this "
                              "one's state was taken: the guest lost what it did)")
        d.version = next(self._versions)
        self.latest[d.uuid] = d.version

    # ---------------------------------------------------------------- calls

    def host_of_uri(self, uri: str) -> SimHost:
        name = uri[len(SIM_SCHEME):].split("?")[0].strip("/") if uri.startswith(SIM_SCHEME) else uri
        host = self.hosts.get(name)
        if host is None:
            raise sim_error(libvirt.VIR_ERR_NO_CONNECT, f"Failed to connect socket to '{uri}': No such file or "
                            "directory")
        return host

    def call(self, process: int, host: SimHost, method: str, vm: str | None = None) -> None:
        """Before a call's effect: the clock, the fault hook, then whether the host answers."""
        if process in self.dead:  # a killed process runs nothing more: not its ``finally`` blocks either
            raise ProcessKilled(process)
        self.calls += 1
        self.now += CALL_S
        if self.hook is not None:
            self.hook(Call(process, host.name, method, vm))
        if not host.up:
            self.now += self.host_timeout
            raise sim_error(libvirt.VIR_ERR_INTERNAL_ERROR, "internal error: connection closed due to keepalive "
                            "timeout")

    def done(self, process: int, host: SimHost, method: str, vm: str | None = None) -> None:
        if self.after is not None:
            self.after(Call(process, host.name, method, vm))

    def open(self, process: int, uri: str) -> SimConnection:
        """``libvirt.open(uri)`` for ``process``: the caller bounds it by the host timeout (a down host raises)."""
        host = self.host_of_uri(uri)
        self.call(process, host, "open")
        conn = SimConnection(self, host, process)
        self.open_conns.setdefault(process, []).append(conn)
        return conn

    # ---------------------------------------------------------------- host events

    def set_up(self, name: str, up: bool) -> None:
        """A host stops answering (its daemon stopped, its guests keep running) or answers again."""
        host = self.hosts[name]
        if host.up == up:
            return
        host.up = up
        if up:
            self._resolve_pending(host)

    def power_off(self, name: str) -> None:
        """A fence agent switched host ``name`` off: every guest on it is gone (a running or paused guest dies with
        its host; a migration's job with it), and it does not answer until powered on again, then with no guest
        (the simulated domains are transient, as vcsched's are; none autostarts)."""
        host = self.hosts[name]
        host.domains.clear()
        host.up = False

    def process_died(self, process: int) -> None:
        """The client ``process`` is gone: its connections close, and libvirt cleans up its migrations."""
        self.dead.add(process)
        for conn in self.open_conns.pop(process, []):
            conn.closed = True
        for m in self.migrations:
            if m.process == process and m.phase not in ("confirmed", "cancelled", "abandoned"):
                self._abort(m)

    def _abort(self, m: Migration) -> None:
        """What each daemon does with a migration whose client gave up or vanished (libvirt's clean-up).

        Destination: an incoming domain (Prepare done, Finish not) is
        cancelled; a finished one stays as it is (paused).  Source: before
        the copy completed, its copy resumes; after (PERFORM3_DONE), it stays
        paused and only the job is cleared.  A daemon that is down does this
        when it answers again (:meth:`_resolve_pending`).
        """
        performed = m.phase in ("performed", "finished")
        m.phase = "abandoned-performed" if performed else "abandoned"
        self._resolve_pending(self.hosts[m.target])
        self._resolve_pending(self.hosts[m.source])

    def _resolve_pending(self, host: SimHost) -> None:
        if not host.up:
            return
        for m in self.migrations:
            if not m.phase.startswith("abandoned"):
                continue
            d = host.domains.get(m.uuid)
            if d is None or d.migration is not m:
                continue
            if host.name == m.target and d.incoming:
                del host.domains[m.uuid]
            elif host.name == m.target:
                d.job, d.migration = JOB_NONE, None
            elif host.name == m.source:
                d.job, d.migration = JOB_NONE, None
                if m.phase == "abandoned" and d.state == PAUSED:
                    d.state = RUNNING
                    self.started(host.name, d)
                d.changed()

    def copies(self, uuid: str) -> list[tuple[str, SimDomain]]:
        return [(h.name, h.domains[uuid]) for h in self.hosts.values() if uuid in h.domains]


def _parse_domain(world: SimWorld, xml: str, state: int, persistent: bool) -> SimDomain:
    return _domain_of(world, ET.fromstring(xml), state, persistent)


_UNITS = {"b": 1, "bytes": 1, "kib": 1024, "k": 1024, "mib": 1 << 20, "m": 1 << 20, "gib": 1 << 30, "g": 1 << 30}


def _domain_of(world: SimWorld, root: ET.Element, state: int, persistent: bool) -> SimDomain:
    first: dict[str, ET.Element] = {}  # the domain's children visited once (a path lookup each: 0.1 s at 10,000)
    for child in root:
        first.setdefault(child.tag, child)
    name_el, uuid_el = first.get("name"), first.get("uuid")
    name = (name_el.text or "") if name_el is not None else ""
    uuid = ((uuid_el.text or "") if uuid_el is not None else "").strip() or world.new_uuid()
    mem_el = first.get("memory")
    memory = int(mem_el.text or 0) * _UNITS.get((mem_el.get("unit") or "KiB").lower(), 1024) \
        if mem_el is not None else 0
    vcpu_el = first.get("vcpu")
    vcpus = int(vcpu_el.text or 1) if vcpu_el is not None else 1
    meta_parent = first.get("metadata")
    meta_el = meta_parent.find(_META_TAG) if meta_parent is not None else None
    meta = dict(meta_el.attrib) if meta_el is not None else None
    quota, period = -1, 100000
    tune = first.get("cputune")
    if tune is not None:
        quota = int(tune.findtext("quota") or -1)
        period = int(tune.findtext("period") or 100000)
    return SimDomain(name, uuid, vcpus, memory, state, persistent, quota, period, meta)


class SimConnection:
    """A ``virConnect`` to one simulated host, opened by one process."""

    def __init__(self, world: SimWorld, host: SimHost, process: int) -> None:
        self.world, self.host, self.process = world, host, process
        self.closed = False

    def _call(self, method: str, vm: str | None = None) -> None:
        if self.closed:
            raise sim_error(libvirt.VIR_ERR_INTERNAL_ERROR, "internal error: client socket is closed")
        self.world.call(self.process, self.host, method, vm)

    def _done(self, method: str, vm: str | None = None) -> None:
        self.world.done(self.process, self.host, method, vm)

    def _handle(self, d: SimDomain) -> SimDomainHandle:
        return SimDomainHandle(self, d.uuid, d.name)

    # -------------------------------------------------------------- host

    def getType(self) -> str:
        self._call("getType")
        return self.host.driver

    def getInfo(self) -> list[Any]:
        self._call("getInfo")
        h = self.host
        return ["x86_64", h.memory_bytes >> 20, h.cores, 2000, 1, 1, h.cores, 1]

    def getCapabilities(self) -> str:
        self._call("getCapabilities")
        return f"<capabilities><host><uuid>{self.host.uuid}</uuid></host></capabilities>"

    def getHostname(self) -> str:
        self._call("getHostname")
        return self.host.name

    def setKeepAlive(self, interval: int, count: int) -> int:
        return 0

    def close(self) -> int:
        if not self.closed:
            self.closed = True
            conns = self.world.open_conns.get(self.process, [])
            if self in conns:
                conns.remove(self)
        return 0

    # -------------------------------------------------------------- domains

    def listAllDomains(self, flags: int = 0) -> list[SimDomainHandle]:
        self._call("listAllDomains")
        return [self._handle(d) for d in self.host.domains.values()]

    def getAllDomainStats(self, stats: int = 0, flags: int = 0) -> list[tuple[SimDomainHandle, dict[str, Any]]]:
        self._call("getAllDomainStats")
        return [(self._handle(d), {"state.state": d.state, "state.reason": d.reason if d.state == PAUSED else 1})
                for d in self.host.domains.values()]

    def domainListGetStats(self, doms: list[SimDomainHandle], stats: int = 0,
                           flags: int = 0) -> list[tuple[SimDomainHandle, dict[str, Any]]]:
        """CPU_TOTAL and VCPU fields as libvirt 9.0 reports them: ``cpu.time``, ``vcpu.N.time``/``delay``
        (the whole delay on vCPU 0), no ``vcpu.N.wait`` (QEMU reports it only for some guests)."""
        self._call("domainListGetStats")
        out = []
        for handle in doms:
            d = self.host.by_name(handle.name())
            if d is None:
                continue
            fields: dict[str, Any] = {"cpu.time": d.cpu_ns, "vcpu.current": d.vcpus, "vcpu.maximum": d.vcpus}
            for i in range(d.vcpus):
                fields[f"vcpu.{i}.time"] = d.cpu_ns // d.vcpus
                fields[f"vcpu.{i}.delay"] = d.delay_ns if i == 0 else 0
            out.append((self._handle(d), fields))
        return out

    def lookupByName(self, name: str) -> SimDomainHandle:
        self._call("lookupByName", name)
        d = self.host.by_name(name)
        if d is None:
            raise sim_error(libvirt.VIR_ERR_NO_DOMAIN, f"Domain not found: no domain with matching name '{name}'")
        return self._handle(d)

    def lookupByUUIDString(self, uuid: str) -> SimDomainHandle:
        self._call("lookupByUUIDString")
        d = self.host.domains.get(uuid)
        if d is None:
            raise sim_error(libvirt.VIR_ERR_NO_DOMAIN, f"Domain not found: no domain with matching uuid '{uuid}'")
        return self._handle(d)

    def _admit(self, d: SimDomain) -> None:
        """libvirt's refusals of a new domain on this host: a name or UUID already in use."""
        same = self.host.domains.get(d.uuid)
        if same is not None:
            raise sim_error(libvirt.VIR_ERR_OPERATION_FAILED, f"operation failed: domain '{same.name}' is already "
                            f"{'active' if same.active else 'defined'} with uuid {d.uuid}")
        if self.host.by_name(d.name) is not None:
            raise sim_error(libvirt.VIR_ERR_OPERATION_FAILED, f"operation failed: domain '{d.name}' already exists")

    def createXML(self, xml: str, flags: int = 0) -> SimDomainHandle:
        d = _parse_domain(self.world, xml, RUNNING, persistent=False)
        self._call("createXML", d.name)
        self._admit(d)
        self.host.domains[d.uuid] = d
        self.world.started(self.host.name, d)
        self._done("createXML", d.name)
        return self._handle(d)

    def defineXMLFlags(self, xml: str, flags: int = 0) -> SimDomainHandle:
        d = _parse_domain(self.world, xml, SHUTOFF, persistent=True)
        self._call("defineXMLFlags", d.name)
        self._admit(d)
        self.host.domains[d.uuid] = d
        self._done("defineXMLFlags", d.name)
        return self._handle(d)

    def defineXML(self, xml: str) -> SimDomainHandle:
        return self.defineXMLFlags(xml, 0)


class SimDomainHandle:
    """A ``virDomain``: a UUID on a connection (calls on a domain that is gone raise VIR_ERR_NO_DOMAIN)."""

    #: Counted like a libvirt domain (:class:`hypervisor.connections.Counted`).
    is_domain = True

    def __init__(self, conn: SimConnection, uuid: str, name: str) -> None:
        self.conn, self.uuid, self._name = conn, uuid, name

    def _dom(self, method: str) -> SimDomain:
        self.conn._call(method, self._name)
        d = self.conn.host.domains.get(self.uuid)
        if d is None:
            raise sim_error(libvirt.VIR_ERR_NO_DOMAIN, f"Domain not found: no domain with matching uuid '{self.uuid}' "
                            f"({self._name})")
        return d

    def _done(self, method: str) -> None:
        self.conn._done(method, self._name)

    def name(self) -> str:
        return self._name

    def UUIDString(self) -> str:
        return self.uuid

    def XMLDesc(self, flags: int = 0) -> str:
        return self._dom("XMLDesc").xml()

    def state(self, flags: int = 0) -> list[int]:
        d = self._dom("state")
        return [d.state, d.reason if d.state == PAUSED else 1]

    def info(self) -> list[int]:
        d = self._dom("info")
        return [d.state, d.memory_bytes // 1024, d.memory_bytes // 1024, d.vcpus, d.cpu_ns]

    def isActive(self) -> int:
        return int(self._dom("isActive").active)

    def isPersistent(self) -> int:
        return int(self._dom("isPersistent").persistent)

    def jobInfo(self) -> list[int]:
        return [self._dom("jobInfo").job] + [0] * 11

    def jobStats(self, flags: int = 0) -> dict[str, int]:
        """The job as ``virDomainGetJobStats`` gives it: a migration's side (``operation``: in on the destination,
        out on the source); the simulation keeps no byte counts, so they read 0."""
        d = self._dom("jobStats")
        if d.job == JOB_NONE or d.migration is None:
            return {"type": JOB_NONE}
        arriving = d.incoming or self.conn.host.name == d.migration.target
        operation = (libvirt.VIR_DOMAIN_JOB_OPERATION_MIGRATION_IN if arriving
                     else libvirt.VIR_DOMAIN_JOB_OPERATION_MIGRATION_OUT)
        return {"type": d.job, "operation": operation, "time_elapsed": 0, "data_processed": 0, "data_remaining": 0,
                "data_total": 0, "memory_bps": 0}

    def metadata(self, type: int, uri: str | None, flags: int = 0) -> str:
        d = self._dom("metadata")
        if d.meta is None or uri != METADATA_NS:
            raise sim_error(libvirt.VIR_ERR_NO_DOMAIN_METADATA, "metadata not found: Requested metadata element is "
                            "not present")
        return "<vm" + "".join(f" {k}={quoteattr(v)}" for k, v in d.meta.items()) + "/>"

    def setMetadata(self, type: int, metadata: str | None, key: str | None, uri: str | None, flags: int = 0) -> int:
        d = self._dom("setMetadata")
        if uri == METADATA_NS:
            d.meta = dict(ET.fromstring(metadata).attrib) if metadata else None
            d.changed()
        self._done("setMetadata")
        return 0

    def schedulerParametersFlags(self, flags: int = 0) -> dict[str, int]:
        d = self._dom("schedulerParametersFlags")
        return {"cpu_shares": 1024, "vcpu_period": d.period, "vcpu_quota": d.quota}

    def schedulerParameters(self) -> dict[str, int]:
        return self.schedulerParametersFlags(0)

    def setSchedulerParametersFlags(self, params: dict[str, int], flags: int = 0) -> int:
        d = self._dom("setSchedulerParametersFlags")
        if not d.active and flags & libvirt.VIR_DOMAIN_AFFECT_LIVE:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: domain is not "
                            "running")
        d.quota = int(params.get("vcpu_quota", d.quota))
        d.period = int(params.get("vcpu_period", d.period))
        d.changed()
        self._done("setSchedulerParametersFlags")
        return 0

    def getCPUStats(self, total: bool, flags: int = 0) -> list[dict[str, int]]:
        return [{"cpu_time": self._dom("getCPUStats").cpu_ns}]

    def resume(self) -> int:
        d = self._dom("resume")
        if d.state != PAUSED:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: domain is not "
                            "paused")
        if d.incoming:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: domain has an "
                            "incoming migration job")
        d.state = RUNNING
        self.conn.world.started(self.conn.host.name, d)
        self._done("resume")
        return 0

    def suspend(self) -> int:
        d = self._dom("suspend")
        if d.state != RUNNING:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: domain is not "
                            "running")
        d.state, d.reason = PAUSED, libvirt.VIR_DOMAIN_PAUSED_USER
        self._done("suspend")
        return 0

    def destroy(self) -> int:
        d = self._dom("destroy")
        if not d.active:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: domain is not "
                            "running")
        if d.migration is not None:
            self.conn.world._abort(d.migration)
        if d.persistent:
            d.state, d.job, d.migration, d.incoming = SHUTOFF, JOB_NONE, None, False
        else:
            self.conn.host.domains.pop(self.uuid, None)
        self._done("destroy")
        return 0

    def undefine(self) -> int:
        d = self._dom("undefine")
        if not d.persistent:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: cannot undefine "
                            "transient domain")
        if d.active:
            d.persistent = False
        else:
            self.conn.host.domains.pop(self.uuid, None)
        self._done("undefine")
        return 0

    def blockIoTune(self, disk: str, flags: int = 0) -> dict[str, int]:
        self._dom("blockIoTune")
        raise sim_error(libvirt.VIR_ERR_INVALID_ARG, f"invalid argument: disk '{disk}' was not found")

    def interfaceParameters(self, device: str, flags: int = 0) -> dict[str, int]:
        self._dom("interfaceParameters")
        raise sim_error(libvirt.VIR_ERR_INVALID_ARG, f"invalid argument: Can't find device {device}")

    # -------------------------------------------------------------- migration

    def migrate3(self, dconn: SimConnection, params: dict[str, Any], flags: int) -> SimDomainHandle:
        """libvirt's protocol v3 driven by this client (see the module docstring); each phase may fail."""
        world = self.conn.world
        src, dst = self.conn, dconn
        d = self._dom("migrate.begin")
        if not d.active or d.state != RUNNING:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: domain is not "
                            "running")
        if d.job != JOB_NONE:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Timed out during operation: cannot acquire state "
                            "change lock (held by monitor=remoteDispatchDomainMigrateBegin3Params)")
        m = Migration(d.name, d.uuid, src.host.name, dst.host.name, src.process)
        world.migrations.append(m)
        d.job, d.migration = JOB_UNBOUNDED, m
        self._done("migrate.begin")
        try:
            # Prepare: the destination creates the incoming domain, paused, with a job.
            self._poll_abort(m)
            dst._call("migrate.prepare", d.name)
            xml = params.get(libvirt.VIR_MIGRATE_PARAM_DEST_XML) or d.xml()
            new = _parse_domain(world, xml, PAUSED, bool(flags & libvirt.VIR_MIGRATE_PERSIST_DEST))
            new.uuid, new.cpu_ns = d.uuid, d.cpu_ns
            dst._admit(new)
            new.job, new.migration, new.incoming = JOB_UNBOUNDED, m, True
            new.reason = libvirt.VIR_DOMAIN_PAUSED_MIGRATION
            dst.host.domains[new.uuid] = new
            m.phase = "prepared"
            dst._done("migrate.prepare", d.name)
            # Perform: the copy; at the switch-over the source stops (paused).
            self._poll_abort(m)
            src._call("migrate.perform", d.name)
            world.now += COPY_S
            self._poll_abort(m)  # abortJob during the copy cancels it
            if not dst.host.up:
                raise sim_error(libvirt.VIR_ERR_OPERATION_FAILED, "operation failed: migration out job: "
                                "unexpectedly failed")
            d.state, d.reason = PAUSED, libvirt.VIR_DOMAIN_PAUSED_MIGRATION
            new.version = d.version  # the switch-over: the destination holds the state the source stopped at
            m.phase = "performed"
            src._done("migrate.perform", d.name)
            # Finish: the destination keeps it paused (VIR_MIGRATE_PAUSED) and ends its job.
            dst._call("migrate.finish", d.name)
            new.incoming, new.job, new.migration = False, JOB_NONE, None
            new.reason = libvirt.VIR_DOMAIN_PAUSED_USER
            if not flags & libvirt.VIR_MIGRATE_PAUSED:
                new.state = RUNNING
                world.started(dst.host.name, new)
            new.changed()
            m.phase = "finished"
            dst._done("migrate.finish", d.name)
            # The destination may stop answering right after Finish (its answer is then lost).
            dst._call("migrate.finish-reply", d.name)
            # Confirm: the source removes its copy.
            src._call("migrate.confirm", d.name)
        except libvirt.libvirtError:
            self._cancel(m, src, dst)
            raise
        except ProcessKilled:
            raise  # the world's process_died does libvirt's clean-up
        d.job, d.migration = JOB_NONE, None
        if d.persistent and flags & libvirt.VIR_MIGRATE_UNDEFINE_SOURCE:
            d.persistent = False
        src.host.domains.pop(d.uuid, None)
        m.phase = "confirmed"
        src._done("migrate.confirm", d.name)
        return SimDomainHandle(dst, new.uuid, new.name)

    def _poll_abort(self, m: Migration) -> None:
        """``abortJob`` from the client's lease watch: the migration is cancelled before its switch-over."""
        if self.conn.world.abort_wanted(m.process):
            raise sim_error(libvirt.VIR_ERR_OPERATION_ABORTED, "operation aborted: migration out job: canceled by "
                            "client")

    def abortJob(self) -> int:
        d = self._dom("abortJob")
        if d.job == JOB_NONE:
            raise sim_error(libvirt.VIR_ERR_OPERATION_INVALID, "Requested operation is not valid: no job is active "
                            "on the domain")
        return 0

    def _cancel(self, m: Migration, src: SimConnection, dst: SimConnection) -> None:
        """The client's clean-up after a failed phase (virDomainMigrateVersion3Full): Finish(cancelled) on the
        destination (its incoming domain is removed; a finished one stays, paused), then Confirm(cancelled) on
        the source (its copy resumes).  A daemon that does not answer cleans up on its own when it answers
        again: the destination cancels the incoming domain, the source keeps a copy that completed the copy
        paused (PERFORM3_DONE)."""
        finished = m.phase == "finished"
        performed = m.phase in ("performed", "finished")
        m.phase = "abandoned-performed" if performed else "abandoned"
        if not finished:
            dst.world._resolve_pending(dst.host)  # Finish(cancelled), or the destination's own clean-up later
        src_dom = src.host.domains.get(m.uuid)
        if src_dom is None or src_dom.migration is not m or not src.host.up:
            return  # the source cleans up when it answers again
        if src.closed:  # the client's connection is gone: the source's own clean-up
            src.world._resolve_pending(src.host)
        else:  # Confirm(cancelled)
            src_dom.job, src_dom.migration = JOB_NONE, None
            if src_dom.state != RUNNING:
                src_dom.state = RUNNING
                src.world.started(src.host.name, src_dom)
            src_dom.changed()
        src.world.done(src.process, src.host, "migrate.confirm-cancelled", m.vm)


# ---------------------------------------------------------------------------------------- from the CLI

#: The world of this process's ``sim:///PATH`` hosts (the scale benchmark's, read from their node files).
_FILE_WORLD = SimWorld()


def load_node(world: SimWorld, name: str, path: str) -> SimHost:
    """A host from a node file in the format of libvirt's test driver (:func:`hypervisor.testhosts.node_xml`):
    ``<node>`` with ``<cpu><active>``, ``<memory>`` (KiB) and running ``<domain>`` elements."""
    root = ET.parse(path).getroot()
    cores = int(root.findtext("cpu/active") or 1)
    uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, path))  # the same host UUID in every process
    host = SimHost(name, cores, int(root.findtext("memory") or 0) * 1024, uuid)
    for el in root.findall("domain"):
        d = _domain_of(world, el, RUNNING, persistent=False)
        d.reason = 1
        host.domains[d.uuid] = d
    world.hosts[name] = host
    return host


def open_uri(uri: str) -> SimConnection:
    """``libvirt.open`` of a ``sim:///ABSOLUTE/PATH.xml`` host: the node file is read on its first open in this
    process and kept (later opens see what earlier connections changed, as one daemon would).

    A test and benchmark facility: `vcsched` reaches it only for cluster files whose hosts say ``sim://``.
    """
    path = uri[len(SIM_SCHEME):].split("?")[0]
    if not path.startswith("/"):
        raise sim_error(libvirt.VIR_ERR_NO_CONNECT, f"Failed to connect to '{uri}': a sim:// host is "
                        "sim:///ABSOLUTE/PATH.xml")
    host = _FILE_WORLD.hosts.get(path)
    if host is None:
        try:
            host = load_node(_FILE_WORLD, path, path)
        except (OSError, ET.ParseError) as exc:
            raise sim_error(libvirt.VIR_ERR_NO_CONNECT, f"Failed to connect to '{uri}': {exc}") from None
    conn = SimConnection(_FILE_WORLD, host, 0)
    return conn
