"""Where a lab keeps its files, what its hosts are called, and the cluster file it writes.

Everything here is pure (paths, names, text): the parts of ``vcsched lab`` that
must be right on every machine, so they are unit-tested without libvirt.

A lab lives in one *state directory* (default ``/var/tmp/vcsched-lab``)::

    <dir>/lab.json              what `lab up` started (ids, hosts), read by `down`/`status`
    <dir>/cluster.toml          the cluster file other commands read (--cluster)
    <dir>/image/                guest kernel + initramfs (kept by `lab down`)
    <dir>/h0/etc|run|lib|cache|log   bind-mounted over /etc/libvirt, /run/libvirt, ...
    <dir>/h0/libvirtd.pid, virtlogd.pid

Paths stay short on purpose: libvirt's unix sockets must fit in 108 bytes.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hypervisor.guest import GUEST_CMDLINE, GuestImage
from vcsched.errors import InputError

DEFAULT_LAB_DIR = Path("/var/tmp/vcsched-lab")
LAB_DIR_ENV = "VCSCHED_LAB_DIR"
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL



def clock_options(cpuinfo: str | None = None) -> str:
    """Kernel options that let a TCG guest keep time by the host's TSC, or "" where the host cannot promise one.

    A lab guest boots by its PVH entry, without ACPI: it finds no PIT, HPET or
    PM timer to calibrate its TSC against, marks the TSC unstable and keeps time
    by counting timer ticks (``refined-jiffies``).  Under a CPU cap ticks are
    lost, so its clock drifts from the host's either way: measured under a 0.1
    cap, a 10 s idle phase of the load pattern lasted 5.2 s and a 5 s busy one
    15.5 s, which made every phase of a test timed by the guest a guess.
    QEMU's TCG TSC is the host's TSC, so giving the guest the host's TSC rate
    (``tsc_early_khz``) and trusting it (``tsc=reliable``) makes its clock the
    host's: the same phases then lasted 10.2, 5.2 and 10.7 s.  Only offered
    when the host's TSC is constant and non-stop (``constant_tsc`` and
    ``nonstop_tsc`` in /proc/cpuinfo), whose rate is the "cpu MHz" it reports.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ""
    flags: set[str] = set()
    mhz = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and not flags:
            flags = set(value.split())
        elif key.strip() == "cpu MHz" and mhz is None:
            try:
                mhz = float(value)
            except ValueError:
                return ""
    if not {"constant_tsc", "nonstop_tsc"} <= flags or mhz is None or mhz <= 0:
        return ""
    return f"tsc_early_khz={round(mhz * 1000)} tsc=reliable clocksource=tsc"


def guest_cmdline() -> str:
    """:data:`GUEST_CMDLINE` with this host's :func:`clock_options`."""
    return " ".join(part for part in (GUEST_CMDLINE, clock_options()) if part)

#: Namespace for the hosts' libvirt ``host_uuid``: libvirt refuses to migrate
#: between two daemons with the same host UUID ("same host"), so each lab host
#: needs its own, and it must be stable across restarts of the same lab.
_HOST_UUID_NS = uuid.UUID("6d1b8a52-3f0e-4c59-9a52-8c0f1e0b7a11")

#: The bind mounts that make one libvirtd a separate "host": its configuration,
#: sockets, state, cache and logs, each replaced by a directory of the lab host.
HOST_MOUNTS: tuple[tuple[str, str], ...] = (
    ("etc", "/etc/libvirt"),
    ("run", "/run/libvirt"),
    ("lib", "/var/lib/libvirt"),
    ("cache", "/var/cache/libvirt"),
    ("log", "/var/log/libvirt"),
)


def default_lab_dir() -> Path:
    """The state directory used when none is given: ``$VCSCHED_LAB_DIR`` or ``/var/tmp/vcsched-lab``."""
    env = os.environ.get(LAB_DIR_ENV)
    return Path(env) if env else DEFAULT_LAB_DIR


def lab_id(root: Path) -> str:
    """A short id derived from the (absolute) state directory.

    It goes into cgroup partition names and host names, so two labs in two
    directories never share a partition, and a lab restarted in the same
    directory finds (and cleans) what its crashed predecessor left.
    """
    return hashlib.sha256(str(root.absolute()).encode()).hexdigest()[:6]


def partition_name(lid: str, index: int) -> str:
    """The libvirt ``<resource><partition>`` of lab host ``index``, e.g. ``/vcl3fa2c1h0``.

    libvirt places a guest of that partition under ``vcl3fa2c1h0.partition`` in
    every cgroup controller; without a per-host partition two daemons would both
    use ``/machine/qemu-1-name`` and collide (docs/lab.md).
    """
    if index < 0:
        raise InputError(f"host index: {index} is negative")
    return f"/vcl{lid}h{index}"


def partition_dir_name(partition: str) -> str:
    """The cgroup directory libvirt uses for a partition: ``/vclXh0`` -> ``vclXh0.partition``."""
    if not partition.startswith("/") or "/" in partition[1:] or len(partition) < 2:
        raise InputError(f"partition: {partition!r} is not of the form /name")
    return partition[1:] + ".partition"


def loopback_address(lid: str, index: int) -> str:
    """``127.0.K.(2 + index)`` with K in [1, 250] from the lab id (see :meth:`LabLayout.address`)."""
    if not 0 <= index < 250:
        raise InputError(f"host index: {index} is outside [0, 250)")
    return f"127.0.{1 + int(lid, 16) % 250}.{2 + index}"


def host_uuid(lid: str, index: int) -> str:
    """The stable, per-lab-host libvirt ``host_uuid``."""
    return str(uuid.uuid5(_HOST_UUID_NS, f"{lid}/h{index}"))


@dataclass(frozen=True)
class LabLayout:
    """The file layout of one lab state directory (no I/O)."""

    root: Path

    @property
    def id(self) -> str:
        return lab_id(self.root)

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.toml"

    @property
    def image_dir(self) -> Path:
        return self.root / "image"

    def host_name(self, index: int) -> str:
        return f"h{index}"

    def host_dir(self, index: int) -> Path:
        return self.root / self.host_name(index)

    def socket(self, index: int) -> Path:
        """The daemon's socket as seen from outside its namespace (``/run/libvirt`` is bound here)."""
        return self.host_dir(index) / "run" / "libvirt-sock"

    def uri(self, index: int) -> str:
        return f"qemu+unix:///system?socket={self.socket(index)}"

    def pid_file(self, index: int, daemon: str) -> Path:
        return self.host_dir(index) / f"{daemon}.pid"

    def hostname(self, index: int) -> str:
        """The UTS host name inside the host's namespace (libvirt compares host names on migration)."""
        return f"vcl{self.id}h{index}"

    def partition(self, index: int) -> str:
        return partition_name(self.id, index)

    @property
    def pki_dir(self) -> Path:
        """The client certificates of a TLS lab (the cluster file's ``pki``)."""
        return self.root / "pki"

    @property
    def lockspace_dir(self) -> Path:
        """virtlockd's lockspace, the same directory for every host (lab/daemons.py, lockd_conf)."""
        return self.root / "lockspace"

    @property
    def shared_dir(self) -> Path:
        """The directory ``--shared-storage`` binds over every host's ``/var/lib/libvirt/images``."""
        return self.root / "shared"

    def address(self, index: int) -> str:
        """Host ``index``'s own loopback address: ``127.0.K.(2 + index)``, K from the lab id.

        Loopback by construction (all of 127.0.0.0/8 is this machine, nothing is
        routed elsewhere); K differs between lab directories so two TLS labs on
        one machine do not fight over port 16514 of one address.
        """
        return loopback_address(self.id, index)

    def tls_uri(self, index: int) -> str:
        return f"qemu+tls://{self.address(index)}/system"

    def check_paths(self, n_hosts: int) -> None:
        """Refuse a state directory whose sockets would not fit in a unix socket address."""
        if not self.root.is_absolute():
            raise InputError(f"--dir: {self.root} is not an absolute path")
        longest = len(str(self.socket(max(n_hosts - 1, 0)))) + len("/virtlogd-admin-sock") - len("/libvirt-sock")
        if longest > SOCKET_PATH_MAX:
            raise InputError(f"--dir: {self.root} is too long ({longest} > {SOCKET_PATH_MAX} bytes for its sockets)")


@dataclass(frozen=True)
class LabHost:
    """One lab host as recorded in ``lab.json`` and written to ``cluster.toml``."""

    name: str
    uri: str
    partition: str
    cores: int = 1
    memory_reserved: str = "64MiB"
    storage: str | None = None  # the cluster file's storage name (None: the host's own)
    pki: str | None = None  # a TLS lab's client certificate directory
    uuid: str | None = None  # its libvirt host_uuid, declared in the cluster file (a lab from before: None)

    @property
    def connect_uri(self) -> str:
        """The URI to open this host with: ``uri``, plus ``pkipath`` on a TLS lab (the cluster file says ``pki``)."""
        return f"{self.uri}?pkipath={self.pki}" if self.pki and self.uri.startswith("qemu+tls") else self.uri


def memory_reserved_for(total_mib: int, n_hosts: int, floor_mib: int = 64) -> str:
    """The ``memory_reserved`` that leaves each of ``n_hosts`` lab hosts 1/n of the machine's memory.

    Every lab host's libvirt reports the whole machine's memory; reserving the
    rest keeps the hosts together from promising more than the machine has
    (the memory analogue of ``cores = 1``).  At least ``floor_mib`` stays
    reserved for the host itself.
    """
    if n_hosts < 1 or total_mib < 1:
        raise InputError(f"memory split: {total_mib} MiB over {n_hosts} hosts")
    return f"{max(floor_mib, total_mib - total_mib // n_hosts)}MiB"


def toml_string(value: str) -> str:
    """A TOML basic string: quote, backslash and every control character (incl. DEL) escaped."""
    out = []
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def render_cluster_toml(name: str, hosts: Iterable[LabHost], guest: GuestImage | None, min_yield: float = 0.0,
                        pki: Path | None = None, migration_tls: bool = False, fence_agent: Path | None = None,
                        lab_dir: Path | None = None) -> str:
    """The cluster file in the format the libvirt-side developers agreed on (docs/lab.md).

    ``fence_agent`` (with ``lab_dir``): the lab's fence agent (:mod:`lab.fence_agent`), named in
    every host's ``fence`` table with the host as its ``plug``.
    """
    hosts = list(hosts)
    if not hosts:
        raise InputError("hosts: a cluster needs at least one host")
    if not 0.0 <= min_yield <= 1.0:
        raise InputError(f"min_yield: {min_yield} is not in [0, 1]")
    lines = [
        "# Written by `vcsched lab up`; removed by `vcsched lab down`.",
        f"name = {toml_string(name)}",
        f"min_yield = {min_yield!r}",
    ]
    if pki is not None:
        lines.append(f"pki = {toml_string(str(pki))}")
    if migration_tls:
        lines.append("migration_tls = true")
    if guest is not None:
        lines += [
            "",
            "[guest]",
            f"kernel = {toml_string(str(guest.kernel))}",
            f"initrd = {toml_string(str(guest.initrd))}",
            f"cmdline = {toml_string(guest.cmdline)}",
            f"domain_type = {toml_string(guest.domain_type)}",
        ]
    for h in hosts:
        lines += [
            "",
            "[[hosts]]",
            f"name = {toml_string(h.name)}",
            f"uri = {toml_string(h.uri)}",
            f"cores = {h.cores}",
            f"memory_reserved = {toml_string(h.memory_reserved)}",
            f"partition = {toml_string(h.partition)}",
        ]
        if h.storage is not None:
            lines.append(f"storage = {toml_string(h.storage)}")
        if h.uuid is not None:
            lines.append(f"uuid = {toml_string(h.uuid)}")
        if fence_agent is not None and lab_dir is not None:
            lines.append(f"fence = {{agent = {toml_string(str(fence_agent))}, lab_dir = {toml_string(str(lab_dir))}, "
                         f"plug = {toml_string(h.name)}}}")
    return "\n".join(lines) + "\n"


def read_pid_file(path: Path) -> int | None:
    """The pid in a daemon's pid file, or None when the file is missing, empty or garbage."""
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def pid_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs: absent, or a zombie.

    A guest whose libvirtd was killed is re-parented to the machine's init,
    which may reap it late; until then its ``/proc`` entry stays although
    nothing runs.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def pid_matches(pid: int, marker: str, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is alive *and* its command line contains ``marker``.

    Pid files outlive crashes and pids are reused, so a bare ``kill(pid)``
    could hit an unrelated process; the lab's daemons are started with their
    pid file path on the command line, which is the marker checked here.
    """
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return False
    return marker.encode() in cmdline.replace(b"\0", b" ")
