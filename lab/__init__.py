"""The local lab: N real libvirt "hosts" on this one machine, for integration tests and demos.

``up`` starts N namespaced ``libvirtd`` + ``virtlogd`` pairs (one per host,
:mod:`lab.daemons`), each with its own cgroup partition
(:mod:`lab.cgroups`), builds the TCG guest image
(:mod:`lab.image`) and writes ``cluster.toml`` for the rest of
vcsched.  ``up`` on a lab that already runs *repairs* it — restarts the
daemons of hosts that died, keeping every guest — and replaces it (destroying
its guests) only when asked to (``recreate``).  ``down`` undoes all of it and is safe to run any number of times,
including after a crash: it finds what to stop from the state directory alone
(pid files, partition names derived from the directory), never by process name,
so daemons and guests it did not start are never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hypervisor.files import write_atomic
from hypervisor.guest import GuestImage
from lab import cgroups, daemons, fence_agent, ports, qemucaps
from lab.guest import boot_directly
from lab.image import BUSYBOX, ensure_image, initramfs_recipe
from lab.state import (
    LabHost,
    LabLayout,
    default_lab_dir,
    host_uuid,
    memory_reserved_for,
    render_cluster_toml,
)
from vcsched.errors import InputError, VcschedError

__all__ = [
    "DownReport",
    "Lab",
    "LabError",
    "LabShape",
    "LabStatus",
    "default_cluster_file",
    "down",
    "guest_boot_check",
    "prerequisites_problem",
    "recorded_shape",
    "root_problem",
    "status",
    "up",
]

MAX_HOSTS = 8
TRANSPORTS = ("unix", "tls")
#: The storage name every host of a ``--shared-storage`` lab declares.
SHARED_STORAGE = "lab-shared"
REQUIRED_PROGRAMS = ("libvirtd", "virtlogd", "virtlockd", "qemu-system-x86_64", "unshare", "nsenter", "mount",
                     "apt-get", "dpkg-deb")

Progress = Callable[[str], None]


class LabError(VcschedError):
    """The lab cannot be brought up here (a missing prerequisite); the CLI exits 2."""


@dataclass(frozen=True)
class Lab:
    """A running lab: where it lives, its hosts and its default guest image.

    ``repaired``: hosts whose daemons ``up`` had to restart (an existing lab);
    ``warnings``: what the operator should know (e.g. the lab promises more
    cores or memory than this machine has).
    """

    dir: Path
    id: str
    hosts: tuple[LabHost, ...]
    guest: GuestImage
    cluster_file: Path
    repaired: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: The machine memory libvirt reported when the hosts' memory was split (it drifts later: libvirt reads
    #: what the machine reports now, which moved by hundreds of MiB within minutes on a shared machine).
    machine_memory_mib: int = 0
    transport: str = "unix"  # how the cluster file reaches the hosts: "unix" sockets or "tls" on loopback addresses
    shared_storage: bool = False
    port_block: int | None = None  # the migration port block the lab holds (lab/ports.py)


@dataclass(frozen=True)
class HostStatus:
    """One lab host as found now: its daemons' pids (None = not running), whether it answers, its guests."""

    name: str
    uri: str
    partition: str
    libvirtd_pid: int | None
    virtlogd_pid: int | None
    answers: bool
    domains: tuple[str, ...] = ()
    cpus: int | None = None
    memory_mib: int | None = None


@dataclass(frozen=True)
class LabStatus:
    """A lab directory as found now; ``running`` = it has hosts and every one answers."""

    dir: Path
    id: str
    running: bool
    hosts: tuple[HostStatus, ...] = field(default=())
    partitions: tuple[str, ...] = field(default=())


def root_problem() -> str | None:
    """The one prerequisite even ``down`` needs (signals to root's daemons, cgroup removal)."""
    return None if os.geteuid() == 0 else "the lab needs root (namespaces, bind mounts, cgroups)"


def prerequisites_problem() -> str | None:
    """None when a lab can run here, else the first missing prerequisite as one line."""
    problem = root_problem()
    if problem:
        return problem
    for prog in REQUIRED_PROGRAMS:
        if shutil.which(prog) is None:
            return f"{prog} is not installed (run scripts/install-system-deps, or 'make test')"
    if not BUSYBOX.is_file():
        return f"{BUSYBOX} is missing (install busybox-static; it is the guest's userland)"
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return "the libvirt Python binding is missing (pip install libvirt-python)"
    return cgroups.writable_problem()


def _layout(dir: Path | None) -> LabLayout:
    root = Path(dir) if dir is not None else default_lab_dir()
    return LabLayout(root.absolute())


def _noop(_: str) -> None:
    pass


def up(n_hosts: int, dir: Path | None = None, progress: Progress = _noop, *, cores: int = 1,
       memory_mib: int | None = None, recreate: bool = False, transport: str = "unix",
       shared_storage: bool = False, resize: bool = False) -> Lab:
    """Bring up an ``n_hosts`` lab in ``dir`` (default: the default lab dir).

    ``transport="tls"``: every host also listens for TLS on its own loopback
    address (:meth:`LabLayout.address`) with certificates the lab makes, and
    the cluster file uses ``qemu+tls://ADDRESS/system`` URIs and the lab's
    ``pki``.  Hosts keep their disks in their own ``/var/lib/libvirt/images``
    unless ``shared_storage``, which binds one directory there on every host.

    Each host declares ``cores`` cores and ``memory_mib`` MiB (default: an
    equal share of the machine's memory).  If a lab already runs there with
    the same shape it is repaired, guests kept; a different shape — host
    count, cores, memory, transport, storage — is refused unless
    ``recreate``, which replaces the lab and destroys its guests, or, for the
    memory alone, ``resize``: the hosts then declare ``memory_mib`` if every
    host's guests still fit in it (:func:`_resized`).  ``up`` never changes
    a running lab's shape silently.
    """
    if not 1 <= n_hosts <= MAX_HOSTS:
        raise InputError(f"--hosts: {n_hosts} is not in [1, {MAX_HOSTS}]")
    if cores < 1:
        raise InputError(f"--cores: {cores} must be at least 1")
    if memory_mib is not None and memory_mib < 64:
        raise InputError(f"--memory: {memory_mib} MiB is less than the 64 MiB a lab host needs")
    if transport not in TRANSPORTS:
        raise InputError(f"--transport: {transport!r} is not one of {', '.join(TRANSPORTS)}")
    layout = _layout(dir)
    layout.check_paths(n_hosts)
    problem = prerequisites_problem()
    if problem:
        raise LabError(problem)
    layout.root.mkdir(parents=True, exist_ok=True)
    with _exclusive(layout):
        existing = _recorded(layout)
        if existing is not None and not recreate:
            return _repair(layout, existing, n_hosts, cores, memory_mib, progress, transport, shared_storage,
                           resize)
        return _up(layout, n_hosts, cores, memory_mib, progress, transport, shared_storage)


def _recorded_shape(layout: LabLayout) -> tuple[str, bool]:
    """The transport and shared-storage choice recorded in lab.json (a lab from before them: unix, local)."""
    try:
        doc = json.loads(layout.state_file.read_text())
        return str(doc.get("transport", "unix")), bool(doc.get("shared_storage", False))
    except (OSError, ValueError, AttributeError):
        return "unix", False


def _recorded_block(layout: LabLayout) -> int | None:
    """The migration port block recorded in lab.json (None: no lab, or one from before blocks were claimed)."""
    try:
        block = json.loads(layout.state_file.read_text()).get("port_block")
    except (OSError, ValueError, AttributeError):
        return None
    return block if isinstance(block, int) and 0 <= block < ports.BLOCKS else None


def _claim_live(claim: ports.Claim) -> bool:
    """Whether a port block claim still belongs to a lab: its directory is there and its claiming process (an
    ``up`` under way, a test session) or one of its libvirtds still runs."""
    layout = LabLayout(Path(claim.dir))
    if not layout.root.is_dir():
        return False
    if ports.claimer_alive(claim):
        return True
    return any(daemons.daemon_pid(layout, i, "libvirtd") is not None for i in _host_indexes(layout))


def _recorded(layout: LabLayout) -> tuple[list[LabHost], GuestImage, int] | None:
    """The hosts, guest and split machine memory of the lab recorded in this directory, if one was brought up."""
    try:
        doc = json.loads(layout.state_file.read_text())
        hosts = [LabHost(**h) for h in doc["hosts"]]
        guest = GuestImage(Path(doc["guest"]["kernel"]), Path(doc["guest"]["initrd"]), doc["guest"]["cmdline"],
                           doc["guest"]["domain_type"])
        machine_mib = int(doc.get("machine_memory_mib", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (hosts, guest, machine_mib) if hosts and layout.cluster_file.is_file() else None


def _shape_warnings(n_hosts: int, cores: int, memory_mib: int | None, machine_mib: int) -> tuple[str, ...]:
    out = []
    machine_cores = os.cpu_count() or 1
    if n_hosts * cores > machine_cores:
        out.append(f"the lab declares {n_hosts} x {cores} = {n_hosts * cores} cores on a machine with "
                   f"{machine_cores}: caps will promise CPU this machine does not have")
    if memory_mib is not None and n_hosts * memory_mib > machine_mib:
        out.append(f"the lab declares {n_hosts} x {memory_mib} MiB = {n_hosts * memory_mib} MiB on a machine with "
                   f"{machine_mib} MiB: guests may not all fit")
    return tuple(out)


def _reserved(machine_mib: int, n_hosts: int, memory_mib: int | None) -> str:
    if memory_mib is None:
        return memory_reserved_for(machine_mib, n_hosts)
    return f"{max(machine_mib - memory_mib, 0)}MiB"


def recorded_shape(dir: Path | None = None) -> LabShape | None:
    """The shape of the lab recorded in ``dir`` (default: the default lab dir), None when none is: what a plain
    ``vcsched lab up`` repairs, and what its flags default to."""
    layout = _layout(dir)
    existing = _recorded(layout)
    if existing is None:
        return None
    hosts, _guest, machine_mib = existing
    transport, shared = _recorded_shape(layout)
    return LabShape(len(hosts), hosts[0].cores, _declared_mib(hosts[0], machine_mib), transport, shared)


@dataclass(frozen=True)
class LabShape:
    """What ``lab up`` was asked for: hosts, cores and memory (MiB) each host declares, transport, storage."""

    hosts: int
    cores: int
    memory_mib: int | None
    transport: str
    shared_storage: bool

    def describe(self) -> str:
        memory = f", {self.memory_mib} MiB" if self.memory_mib is not None else ""
        return (f"{self.hosts} host(s) of {self.cores} core(s){memory} each (transport {self.transport}"
                f"{', shared storage' if self.shared_storage else ''})")


def _declared_mib(host: LabHost, machine_mib: int) -> int | None:
    """The memory a lab host declares: the machine's at the split, less its ``memory_reserved``."""
    from vcsched.formats.units import parse_size

    if not machine_mib:
        return None
    return machine_mib - (parse_size("memory_reserved", host.memory_reserved, allow_zero=True) >> 20)


def _repair(layout: LabLayout, existing: tuple[list[LabHost], GuestImage, int], n_hosts: int, cores: int,
            memory_mib: int | None, progress: Progress, transport: str, shared: bool, resize: bool = False) -> Lab:
    hosts, guest, split_mib = existing
    was = _recorded_shape(layout)
    have = LabShape(len(hosts), hosts[0].cores, _declared_mib(hosts[0], split_mib), *was)
    machine_mib = split_mib or daemons.memory_mib(layout.uri(0))
    new_reserved = None if memory_mib is None else _reserved(machine_mib, n_hosts, memory_mib)
    memory_differs = new_reserved is not None and any(h.memory_reserved != new_reserved for h in hosts)
    if len(hosts) != n_hosts or any(h.cores != cores for h in hosts) or was != (transport, shared) or (
            memory_differs and not resize):
        asked = LabShape(n_hosts, cores, memory_mib if memory_mib is not None else have.memory_mib, transport, shared)
        only_memory = (len(hosts), hosts[0].cores, was) == (n_hosts, cores, (transport, shared))
        resize_hint = (f"; 'vcsched lab up --memory {memory_mib}MiB --resize' changes only the memory, if every "
                       "host's guests still fit") if only_memory else ""
        raise LabError(f"a lab of {have.describe()} already runs in {layout.root}, this asks for "
                       f"{asked.describe()}: nothing changed; 'vcsched lab up --recreate' replaces it (destroying "
                       f"its guests){resize_hint}; 'vcsched lab down' removes it")
    tls = transport == "tls"
    if memory_differs:
        assert memory_mib is not None
        _check_guests_fit(layout, hosts, memory_mib)
    configured = _recorded_block(layout)
    configured = ports.preferred_block(layout.id) if configured is None else configured  # a lab from before claims
    block = ports.claim_block(layout.root, configured, _claim_live)  # asks for what its hosts were set up with
    running = [h.name for i, h in enumerate(hosts) if daemons.daemon_pid(layout, i, "libvirtd") is not None]
    warnings = _shape_warnings(n_hosts, cores, memory_mib, machine_mib)
    if block != configured and running:
        warnings += (f"another lab holds this lab's migration ports (block {configured}): hosts "
                     f"{', '.join(running)} keep them until 'vcsched lab up --recreate' (migrations into them "
                     "may fail while that lab migrates too)",)
    repaired = []
    for i, h in enumerate(hosts):
        progress(f"checking host {h.name}")
        cgroups.create_partition(layout.partition(i))  # idempotent: a reboot may have removed it
        if daemons.repair_host(layout, i, block=block, tls=tls, shared=shared):
            repaired.append(h.name)
    # A lab from before host UUIDs were declared gets them now (its daemons have had them all along).
    hosts = [dataclasses.replace(h, uuid=h.uuid or host_uuid(layout.id, i)) for i, h in enumerate(hosts)]
    if memory_differs:
        assert new_reserved is not None
        hosts = [dataclasses.replace(h, memory_reserved=new_reserved) for h in hosts]
    _write_state(layout, hosts, guest, machine_mib, transport, shared, block)
    _keep_or_write(layout.cluster_file, render_cluster_toml("lab", hosts, guest, pki=layout.pki_dir if tls else None,
                                                       migration_tls=tls, fence_agent=fence_agent.install(layout.root),
                                                       lab_dir=layout.root))
    return Lab(layout.root, layout.id, tuple(hosts), guest, layout.cluster_file, tuple(repaired), warnings,
               machine_mib, transport, shared, block)


def _check_guests_fit(layout: LabLayout, hosts: list[LabHost], memory_mib: int) -> None:
    """Refuse a resize to ``memory_mib`` per host when some host's guests together need more."""
    import libvirt

    for i, h in enumerate(hosts):
        try:
            conn = libvirt.open(layout.uri(i))
        except libvirt.libvirtError as exc:
            raise LabError(f"--resize: host {h.name} does not answer ({exc.get_error_message()}); nothing "
                           "changed (run 'vcsched lab up' to repair it first)") from None
        try:
            used = sum(int(d.maxMemory()) for d in conn.listAllDomains(0) if d.isActive()) >> 10  # KiB -> MiB
            names = sorted(d.name() for d in conn.listAllDomains(0) if d.isActive())
        finally:
            conn.close()
        if used > memory_mib:
            raise LabError(f"--resize: host {h.name}'s guests ({', '.join(names)}) use {used} MiB, more than "
                           f"--memory {memory_mib} MiB; nothing changed (stop some, or choose more memory)")


def _up(layout: LabLayout, n_hosts: int, cores: int, memory_mib: int | None, progress: Progress,
        transport: str = "unix", shared: bool = False) -> Lab:
    progress("cleaning up a previous lab in this directory")
    _down(layout)
    progress("preparing the guest image")
    guest = ensure_image(layout.image_dir)
    hosts: list[LabHost] = []
    machine_mib = 0
    tls = transport == "tls"
    caps_sources = list(dict.fromkeys([layout.image_dir, default_lab_dir() / "image"]))
    # Freed by _down, also when a host fails to start below.
    block = ports.claim_block(layout.root, ports.preferred_block(layout.id), _claim_live)
    try:
        for i in range(n_hosts):
            progress(f"starting host {layout.host_name(i)}" + (f" on {layout.address(i)}" if tls else ""))
            cgroups.create_partition(layout.partition(i))
            qemucaps.seed(layout.host_dir(i), caps_sources)
            daemons.start_host(layout, i, block=block, tls=tls, shared=shared)
            if i == 0:  # probe QEMU once (or check the seeded copy) and let the other hosts start from it
                progress("reading what QEMU can do (a few seconds the first time on a machine)")
                qemucaps.warm(layout.uri(0))
                qemucaps.keep(layout.host_dir(0), caps_sources)
            else:  # its seeded copy checked now, not by the first command (every command reads capabilities)
                qemucaps.warm(layout.uri(i))
            machine_mib = machine_mib or daemons.memory_mib(layout.uri(i))  # one split for every host
            hosts.append(LabHost(layout.host_name(i), layout.tls_uri(i) if tls else layout.uri(i), layout.partition(i),
                                 cores=cores, memory_reserved=_reserved(machine_mib, n_hosts, memory_mib),
                                 storage=SHARED_STORAGE if shared else None,
                                 pki=str(layout.pki_dir) if tls else None, uuid=host_uuid(layout.id, i)))
            _write_state(layout, hosts, guest, machine_mib, transport, shared, block)
    except BaseException:
        _down(layout)  # the half-started host's directory is enough for down to find it
        raise
    write_atomic(layout.cluster_file, render_cluster_toml("lab", hosts, guest, pki=layout.pki_dir if tls else None,
                                                     migration_tls=tls, fence_agent=fence_agent.install(layout.root),
                                                     lab_dir=layout.root))
    return Lab(layout.root, layout.id, tuple(hosts), guest, layout.cluster_file,
               warnings=_shape_warnings(n_hosts, cores, memory_mib, machine_mib), machine_memory_mib=machine_mib,
               transport=transport, shared_storage=shared, port_block=block)


def _write_state(layout: LabLayout, hosts: list[LabHost], guest: GuestImage, machine_mib: int,
                 transport: str, shared: bool, block: int) -> None:
    doc = {
        "id": layout.id,
        "port_block": block,
        "transport": transport,
        "shared_storage": shared,
        "n_hosts": len(hosts),
        "machine_memory_mib": machine_mib,
        "hosts": [asdict(h) for h in hosts],
        "guest": {k: str(v) for k, v in asdict(guest).items()},
        "started": time.time(),
    }
    write_atomic(layout.state_file, json.dumps(doc, indent=1) + "\n")


def _host_indexes(layout: LabLayout) -> list[int]:
    """Every host index this directory may hold state for: from lab.json and from the h<N> dirs."""
    found: set[int] = set()
    try:
        doc = json.loads(layout.state_file.read_text())
        found.update(range(int(doc.get("n_hosts", 0))))
    except (OSError, ValueError):
        pass
    if layout.root.is_dir():
        for p in layout.root.iterdir():
            if p.is_dir() and p.name.startswith("h") and p.name[1:].isdigit():
                found.add(int(p.name[1:]))
    return sorted(found)


@dataclass(frozen=True)
class DownReport:
    """What ``down`` stopped: daemon pids, guests destroyed through libvirt, processes killed in partitions."""

    daemons: tuple[int, ...]
    guests: tuple[str, ...]
    killed: tuple[int, ...]
    partitions: tuple[str, ...]


def down(dir: Path | None = None, purge: bool = False) -> DownReport:
    """Stop everything the lab in ``dir`` started and remove its state.

    The image cache (``<dir>/image``) stays unless ``purge``, which removes the
    whole directory (what a test's throw-away lab dir wants).  Order matters:
    guests first through libvirt (a clean ``destroy``), then the daemons, then
    whatever still runs in the lab's partitions or namespaces (guests of a lab
    whose daemons crashed), then the partitions themselves.
    """
    layout = _layout(dir)
    if not layout.root.is_dir():
        return _down(layout)  # nothing to lock; a crashed lab's partitions may still exist
    with _exclusive(layout):
        report = _down(layout)
    if purge:
        shutil.rmtree(layout.root)
    return report


@contextlib.contextmanager
def _exclusive(layout: LabLayout) -> Iterator[None]:
    """Hold an exclusive lock on the state directory: two `up`/`down` on one lab must not interleave."""
    fd = os.open(layout.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabError(f"another 'vcsched lab' command is working on {layout.root}") from None
        yield
    finally:
        os.close(fd)


def _down(layout: LabLayout) -> DownReport:
    guests: list[str] = []
    stopped: list[int] = []
    killed: list[int] = []
    removed: list[str] = []
    indexes = _host_indexes(layout)
    for i in indexes:
        if daemons.daemon_pid(layout, i, "libvirtd") is not None:
            guests += _destroy_guests(layout.uri(i))
    for i in indexes:
        stopped += daemons.stop_host(layout, i)
    for i in indexes:
        killed += daemons.kill_namespace(layout, i)  # strays, e.g. a guest started outside its partition
    for i in _partition_indexes(layout, indexes):
        part = layout.partition(i)
        if cgroups.partition_dirs(part):
            killed += cgroups.remove_partition(part)
            removed.append(part)
    for i in indexes:
        shutil.rmtree(layout.host_dir(i), ignore_errors=True)
    # The image cache (<dir>/image) is kept on purpose: a later `up` reuses it.
    layout.cluster_file.unlink(missing_ok=True)
    layout.state_file.unlink(missing_ok=True)
    (layout.root / fence_agent.AGENT_NAME).unlink(missing_ok=True)
    shutil.rmtree(layout.pki_dir, ignore_errors=True)
    shutil.rmtree(layout.shared_dir, ignore_errors=True)
    shutil.rmtree(layout.lockspace_dir, ignore_errors=True)
    ports.release_block(layout.root)  # last: its ports are free once nothing of the lab runs
    return DownReport(tuple(stopped), tuple(guests), tuple(killed), tuple(removed))


def _partition_indexes(layout: LabLayout, indexes: list[int]) -> list[int]:
    """Host indexes whose partitions exist: the recorded ones plus any other ``vcl<id>h<N>`` left behind."""
    found = set(indexes)
    prefix = f"vcl{layout.id}h"
    for h in cgroups.hierarchies():
        try:
            names = [p.name for p in h.mount.iterdir()]
        except OSError:
            continue
        for n in names:
            stem = n.removesuffix(".partition")
            if n.endswith(".partition") and stem.startswith(prefix) and stem[len(prefix):].isdigit():
                found.add(int(stem[len(prefix):]))
    return sorted(found)


def _destroy_guests(uri: str) -> list[str]:
    """Destroy and undefine every guest on a lab host (all of them are the lab's: the daemon is)."""
    import libvirt

    names: list[str] = []
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError:
        return names
    try:
        for dom in conn.listAllDomains(0):
            names.append(dom.name())
            try:
                persistent = dom.isPersistent()  # a transient domain is gone once destroyed
                if dom.isActive():
                    dom.destroy()
                if persistent:
                    dom.undefine()
            except libvirt.libvirtError:
                pass  # the partition sweep below still ends its process
    finally:
        conn.close()
    return names


def status(dir: Path | None = None) -> LabStatus:
    """What the lab in ``dir`` is running: per host its daemons, whether it answers, its guests."""
    layout = _layout(dir)
    indexes = _host_indexes(layout)
    hosts: list[HostStatus] = []
    for i in indexes:
        lpid = daemons.daemon_pid(layout, i, "libvirtd")
        vpid = daemons.daemon_pid(layout, i, "virtlogd")
        answers: bool = False
        doms: tuple[str, ...] = ()
        cpus: int | None = None
        mem: int | None = None
        if lpid is not None:
            answers, doms, cpus, mem = _probe(layout.uri(i))
        hosts.append(HostStatus(layout.host_name(i), layout.uri(i), layout.partition(i), lpid, vpid, answers,
                                doms, cpus, mem))
    parts = tuple(layout.partition(i) for i in _partition_indexes(layout, [])
                      if cgroups.partition_dirs(layout.partition(i)))
    running = bool(hosts) and all(h.answers for h in hosts)
    return LabStatus(layout.root, layout.id, running, tuple(hosts), parts)


def _probe(uri: str) -> tuple[bool, tuple[str, ...], int | None, int | None]:
    import libvirt

    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError:
        return False, (), None, None
    try:
        info = conn.getInfo()
        doms = tuple(sorted(d.name() for d in conn.listAllDomains(0)))
        return True, doms, int(info[2]), int(info[1])
    except libvirt.libvirtError:
        return False, (), None, None
    finally:
        conn.close()


def _keep_or_write(path: Path, text: str) -> None:
    """Write the running lab's cluster file ``text``, unless the file there already says all that ``text`` says:
    what an operator added to it — `vcsched cordon`'s ``maintenance = true``, power settings, throttles — survives
    `lab up` repairing the lab (it was silently dropped: a cordoned host took VMs again)."""
    with contextlib.suppress(OSError, ValueError):
        if says_all(tomllib.loads(path.read_text()), tomllib.loads(text)):
            return
    write_atomic(path, text)


def says_all(old: object, new: object) -> bool:
    """Whether the parsed TOML ``old`` has every key of ``new`` with the same value (tables recursively, arrays of
    tables element by element, of the same length): ``old`` is ``new`` with additions only."""
    if isinstance(new, dict):
        return isinstance(old, dict) and all(k in old and says_all(old[k], v) for k, v in new.items())
    if isinstance(new, list):
        return isinstance(old, list) and len(old) == len(new) and all(
            says_all(o, n) for o, n in zip(old, new, strict=True))
    return old == new


def default_cluster_file() -> Path | None:
    """The default lab's ``cluster.toml`` while that lab exists, or None.

    A lab with some hosts dead still counts: commands then show those hosts
    as down and go on with the others (``lab up`` repairs them).
    """
    layout = _layout(None)
    if not layout.cluster_file.is_file():
        return None
    indexes = _host_indexes(layout)
    if not indexes or all(daemons.daemon_pid(layout, i, "libvirtd") is None for i in indexes):
        return None
    return layout.cluster_file


def guest_boot_check(timeout_s: float = 120.0) -> str | None:
    """None if a TCG guest boots on this machine, else the reason to skip (for tests' skip messages).

    It builds the image in the default lab's cache if needed and boots it once
    under bare QEMU; a success is remembered (keyed by the image and QEMU binary)
    so a test session pays the ~11 s boot at most once per machine.
    """
    problem = prerequisites_problem()
    if problem:
        return problem
    layout = _layout(None)
    try:
        image = ensure_image(layout.image_dir)
    except VcschedError as exc:
        return f"no guest image: {exc}"
    qemu = shutil.which("qemu-system-x86_64") or ""
    recipe = initramfs_recipe(modules=image.initrd.parent / "modules")
    key = json.dumps([image.kernel.stat().st_size, image.kernel.stat().st_mtime_ns, recipe,
                      qemu, os.stat(qemu).st_mtime_ns])
    stamp = layout.image_dir / "canary.ok"
    if stamp.is_file() and stamp.read_text() == key:
        return None
    try:
        boot_directly(image, timeout_s)
    except (VcschedError, OSError) as exc:
        return f"a TCG guest does not boot here: {exc}"
    write_atomic(stamp, key)
    return None
