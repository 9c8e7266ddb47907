"""One lab host = one ``libvirtd`` + ``virtlogd`` pair in a private mount and UTS namespace.

libvirt has no notion of "several hosts per machine": its daemons find their
configuration, sockets and state at fixed paths.  Each lab host therefore runs
its daemons under ``unshare -m -u --propagation private`` with its own
directories bind-mounted over ``/etc/libvirt``, ``/run/libvirt``,
``/var/lib/libvirt``, ``/var/cache/libvirt`` and ``/var/log/libvirt``, its own
host name and ``host_uuid`` (libvirt refuses to migrate to "the same host"),
and pid files given with ``-p`` (two ``virtlogd`` would otherwise fight over
one).  The machine's own ``/etc/libvirt`` is never read or written: each host
gets fresh, minimal configuration files.  The namespace lives as long as its
daemons do, so stopping them also drops the bind mounts.

The daemons run under a small reaper of the host's own (:mod:`lab.reaper`, a
child subreaper): libvirtd starts each QEMU as a daemon, so a QEMU that exits
is an orphan, and libvirt's ``destroy`` waits until its process is gone from
``/proc``, zombie included.  Where the machine's init reaps orphans late (a
sandbox's init was measured reaping every ~1.7 s), every destroy and every
migration's end waited that long; the reaper reaps at once.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypervisor.files import write_atomic
from lab.ports import migration_ports
from lab.state import (
    HOST_MOUNTS,
    LabLayout,
    host_uuid,
    pid_gone,
    pid_matches,
    read_pid_file,
)
from vcsched.errors import VcschedError

#: Stopped in this order (libvirtd first: it holds connections to the other two).
DAEMONS = ("libvirtd", "virtlogd", "virtlockd")


class DaemonError(VcschedError):
    """A lab daemon did not start or answer."""


#: Where a TLS lab host's certificates are, inside its namespace (``<host>/etc/pki`` bound under /etc/libvirt).
PKI_IN_NS = "/etc/libvirt/pki"


def qemu_conf(address: str | None = None, ports: tuple[int, int] | None = None) -> str:
    """Guests run as root without a security driver: there is no AppArmor/SELinux
    set-up for the lab's directories, and the guest files live in /var/tmp.

    Every host runs ``virtlockd`` (``lock_manager = "lockd"``): QEMU starts a
    guest only once virtlockd holds a lease on each of its disks, in a lockspace
    directory all lab hosts share (:func:`lockd_conf`), so a second copy of a
    VM whose disk another host still leases is refused by libvirt itself — the
    second line of defence beside fencing (docs/failures.md).

    ``ports``: the host's own incoming-migration port range (:func:`lab.ports.migration_ports`).

    A TLS host (``address``) also receives migrations only on its own address
    (``migration_address``: without it QEMU listens on every address, and a
    wrong address in the cluster file would still work on one machine) and
    has the certificates QEMU uses for VIR_MIGRATE_TLS.
    """
    text = 'user = "root"\ngroup = "root"\nsecurity_driver = "none"\nlock_manager = "lockd"\n'
    if ports is not None:
        text += f"migration_port_min = {ports[0]}\nmigration_port_max = {ports[1]}\n"
    if address is not None:
        text += (f'migration_address = "{address}"\n'
                 f'default_tls_x509_cert_dir = "{PKI_IN_NS}/qemu"\n'
                 'default_tls_x509_verify = 1\n')
    return text


def lockd_conf(lockspace: Path) -> str:
    """``qemu-lockd.conf``: a lease per disk (by its path's hash) in the lockspace every host shares, and none
    without (a guest without disks holds no lease)."""
    return f'auto_disk_leases = 1\nrequire_lease_for_disks = 1\nfile_lockspace_dir = "{lockspace}"\n'


def libvirtd_conf(uuid: str, address: str | None = None) -> str:
    """A distinct host UUID; the unix socket always (the lab manages its hosts through it), and with
    ``address`` a TLS listener on that loopback address only (never TCP, never any other address)."""
    text = (
        f'host_uuid = "{uuid}"\n'
        'unix_sock_rw_perms = "0700"\n'
        'log_outputs = "3:file:/var/log/libvirt/libvirtd.log"\n'
    )
    if address is not None:
        if not address.startswith("127."):
            raise DaemonError(f"lab address {address} is not a loopback address: refused")
        text += (
            "listen_tls = 1\nlisten_tcp = 0\n"
            f'listen_addr = "{address}"\n'
            f'ca_file = "{PKI_IN_NS}/cacert.pem"\n'
            f'cert_file = "{PKI_IN_NS}/servercert.pem"\n'
            f'key_file = "{PKI_IN_NS}/serverkey.pem"\n'
            "tls_no_verify_certificate = 0\n"
        )
    return text


def prepare_host(layout: LabLayout, index: int, *, block: int, tls: bool = False) -> None:
    """Create the host's directories and configuration (idempotent); a TLS host gets its certificates.

    ``block``: the lab's migration port block (:mod:`lab.ports`)."""
    hd = layout.host_dir(index)
    for sub, _target in HOST_MOUNTS:
        (hd / sub).mkdir(parents=True, exist_ok=True)
    (hd / "console").mkdir(exist_ok=True)
    (hd / "lib" / "images").mkdir(exist_ok=True)
    etc = hd / "etc"
    (etc / "qemu").mkdir(exist_ok=True)
    address = layout.address(index) if tls else None
    if address is not None:
        from lab import certs

        certs.make_ca(layout.pki_dir, layout.id)
        certs.make_client(layout.pki_dir, layout.id)
        if not (etc / "pki" / "servercert.pem").is_file():
            certs.make_host(layout.pki_dir, etc, address, layout.id)
    write_atomic(etc / "libvirtd.conf", libvirtd_conf(host_uuid(layout.id, index), address))
    write_qemu_conf(layout, index, block, tls=tls)
    layout.lockspace_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(etc / "qemu-lockd.conf", lockd_conf(layout.lockspace_dir))
    write_atomic(etc / "virtlogd.conf", "")
    write_atomic(etc / "virtlockd.conf", "")


def write_qemu_conf(layout: LabLayout, index: int, block: int, *, tls: bool = False) -> None:
    """The host's ``qemu.conf`` with the migration ports of ``block`` (libvirtd reads it when it starts)."""
    write_atomic(layout.host_dir(index) / "etc" / "qemu.conf",
                 qemu_conf(layout.address(index) if tls else None, migration_ports(block, index)))


def start_script(layout: LabLayout, index: int, *, mounts: bool = True, virtlogd: bool = True, tls: bool = False,
                 shared: bool = False, virtlockd: bool = True) -> str:
    """The shell run inside the host's namespace: bind mounts and host name (a new namespace), then the daemons.

    ``mounts=False`` runs in the host's existing namespace (a repair, entered
    with ``nsenter``); ``virtlogd=False`` (``virtlockd=False``) leaves a running virtlogd (virtlockd) alone.
    """
    hd = layout.host_dir(index)
    q = shlex.quote
    lines = ["set -e"]
    if mounts:
        for sub, target in HOST_MOUNTS:
            # The mount point may be missing on the machine (e.g. /run/libvirt without
            # a running system libvirtd); an empty directory is all that is created.
            lines.append(f"mkdir -p {q(target)}")
            lines.append(f"mount --bind {q(str(hd / sub))} {q(target)}")
        if shared:  # one images directory for every host: what "shared storage" means in the lab
            lines.append(f"mkdir -p /var/lib/libvirt/images {q(str(layout.shared_dir))}")
            lines.append(f"mount --bind {q(str(layout.shared_dir))} /var/lib/libvirt/images")
        lines.append(f"hostname {q(layout.hostname(index))}")
    if virtlogd:
        lines.append(f"virtlogd -d -p {q(str(layout.pid_file(index, 'virtlogd')))}")
    if virtlockd:
        lines.append(f"virtlockd -d -p {q(str(layout.pid_file(index, 'virtlockd')))}")
    # libvirtd connects to virtlogd's and virtlockd's sockets when it starts a guest; wait for them.
    for sock in ("virtlogd-sock", "virtlockd-sock"):
        lines.append(f"i=0; while [ ! -S /run/libvirt/{sock} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done")
    listen = "--listen " if tls else ""
    lines.append(f"libvirtd -d {listen}-p {q(str(layout.pid_file(index, 'libvirtd')))}")
    return "\n".join(lines) + "\n"


#: What runs a host's start script: under :mod:`lab.reaper`, the host's own init, which reaps its
#: QEMU processes as they end (libvirt waits for that before a destroy or a migration returns).
REAPED = (sys.executable, "-I", str(Path(__file__).with_name("reaper.py")))


def start_host(layout: LabLayout, index: int, timeout_s: float = 60.0, *, block: int, tls: bool = False,
               shared: bool = False) -> None:
    """Start the host's daemons and wait until its socket (and TLS listener) accepts a libvirt connection."""
    prepare_host(layout, index, block=block, tls=tls)
    if tls:
        port_free(layout.address(index), TLS_PORT, f"host h{index}")
    log = layout.host_dir(index) / "start.log"
    with log.open("wb") as out:
        proc = subprocess.run(["unshare", "-m", "-u", "--propagation", "private", *REAPED, "sh", "-c",
                               start_script(layout, index, tls=tls, shared=shared)], stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise DaemonError(f"host h{index}: starting its daemons failed (exit {proc.returncode}): "
                          f"{_tail(log)}")
    wait_answers(layout.uri(index), timeout_s, f"host h{index}")
    ensure_pool(layout.uri(index))
    if tls:
        wait_answers(f"{layout.tls_uri(index)}?pkipath={layout.pki_dir}", timeout_s, f"host h{index} over TLS")


TLS_PORT = 16514


def port_free(address: str, port: int, what: str) -> None:
    """Refuse to start a listener on ``address:port`` that something else already holds."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            raise DaemonError(f"{what}: {address}:{port} is taken ({exc.strerror}); another lab or libvirtd "
                              "listens there") from None


POOL_XML = ("<pool type='dir'><name>default</name><target><path>/var/lib/libvirt/images</path></target></pool>")


def ensure_pool(uri: str) -> None:
    """A ``default`` directory pool on ``/var/lib/libvirt/images`` (running, autostarted).

    libvirt pre-creates a migrating VM's disk on the destination
    (VIR_MIGRATE_NON_SHARED_DISK) only for a path inside a storage pool; the
    lab's guests keep their disks there.
    """
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    conn = libvirt.open(uri)
    try:
        try:
            pool = conn.storagePoolLookupByName("default")
        except libvirt.libvirtError:
            pool = conn.storagePoolDefineXML(POOL_XML, 0)
        if not pool.isActive():
            pool.create(0)
        pool.setAutostart(1)
    finally:
        conn.close()


def repair_host(layout: LabLayout, index: int, timeout_s: float = 60.0, *, block: int, tls: bool = False,
                shared: bool = False) -> bool:
    """Bring a lab host whose libvirtd died (or hangs) back, keeping its running guests; True if it needed it.

    The guests' QEMU processes outlive libvirtd and keep the host's mount
    namespace alive: libvirtd is restarted *inside* that namespace (entered
    with ``nsenter`` through one of them), where it finds their state and
    monitor sockets and takes them over again.  A host with nothing left in
    its namespace is started afresh, as ``up`` does.
    """
    lpid = daemon_pid(layout, index, "libvirtd")
    if lpid is not None and answers(layout.uri(index)):
        return False
    if lpid is not None:  # running but not answering (stopped, hung): replace it, keep the guests
        _terminate(lpid, str(layout.pid_file(index, "libvirtd")), 15.0)
    layout.pid_file(index, "libvirtd").unlink(missing_ok=True)
    holders = [p for p in namespace_holders(layout, index) if not pid_gone(p)]
    if not holders:
        stop_host(layout, index)
        start_host(layout, index, timeout_s, block=block, tls=tls, shared=shared)
        return True
    write_qemu_conf(layout, index, block, tls=tls)  # the block the lab holds now, read by the new libvirtd
    virtlogd = daemon_pid(layout, index, "virtlogd") is None
    virtlockd = daemon_pid(layout, index, "virtlockd") is None
    log = layout.host_dir(index) / "repair.log"
    with log.open("wb") as out:
        proc = subprocess.run(["nsenter", "-t", str(holders[0]), "-m", "-u", *REAPED, "sh", "-c",
                               start_script(layout, index, mounts=False, virtlogd=virtlogd, tls=tls,
                                            virtlockd=virtlockd)],
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise DaemonError(f"host h{index}: restarting its libvirtd failed (exit {proc.returncode}): {_tail(log)}")
    wait_answers(layout.uri(index), timeout_s, f"host h{index}")
    return True


def answers(uri: str, timeout_s: float = 5.0) -> bool:
    """Whether ``uri`` answers ``getInfo`` now (a stopped daemon would block libvirt.open: bounded by a thread)."""
    import threading

    import libvirt

    result: list[bool] = []

    def probe() -> None:
        try:
            conn = libvirt.open(uri)
            try:
                conn.getInfo()
                result.append(True)
            finally:
                conn.close()
        except libvirt.libvirtError:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout_s)
    return bool(result and result[0])


def wait_answers(uri: str, timeout_s: float, what: str) -> None:
    """Poll ``uri`` until ``getInfo()`` answers (libvirtd -d returns before it listens)."""
    import libvirt  # the only layer allowed to import it; deferred so pure parts import without it

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            conn = libvirt.open(uri)
            try:
                conn.getInfo()
                return
            finally:
                conn.close()
        except libvirt.libvirtError as exc:
            last = str(exc).splitlines()[0] if str(exc) else "libvirt error"
        time.sleep(0.2)
    raise DaemonError(f"{what}: {uri} did not answer within {timeout_s:g} s ({last})")


def memory_mib(uri: str) -> int:
    """The host memory libvirt reports for ``uri`` (``getInfo()[1]``, MiB)."""
    import libvirt

    conn = libvirt.open(uri)
    try:
        return int(conn.getInfo()[1])
    finally:
        conn.close()


def daemon_pid(layout: LabLayout, index: int, daemon: str) -> int | None:
    """The pid of the lab's running daemon, or None (stale or foreign pid files count as not running)."""
    pf = layout.pid_file(index, daemon)
    pid = read_pid_file(pf)
    return pid if pid is not None and pid_matches(pid, str(pf)) else None


def stop_host(layout: LabLayout, index: int, timeout_s: float = 15.0) -> list[int]:
    """Stop the host's daemons (TERM, then KILL), by pid file only; returns the pids stopped."""
    stopped: list[int] = []
    for daemon in DAEMONS:  # libvirtd first: it holds a connection to virtlogd
        pid = daemon_pid(layout, index, daemon)
        if pid is not None:
            _terminate(pid, str(layout.pid_file(index, daemon)), timeout_s)
            stopped.append(pid)
        layout.pid_file(index, daemon).unlink(missing_ok=True)
    return stopped


def parse_mountinfo_binds(text: str) -> list[tuple[str, str]]:
    """(root within its filesystem, mount point) of every line of a ``/proc/PID/mountinfo``."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 5:
            out.append((f[3].replace("\\040", " "), f[4].replace("\\040", " ")))
    return out


def holds_host_namespace(binds: list[tuple[str, str]], layout: LabLayout, index: int) -> bool:
    """Whether a mount table has the host's ``etc`` bind-mounted on ``/etc/libvirt``: the host's namespace.

    The root field is relative to its filesystem, so it is matched as a
    suffix of the host directory's path (``/var/tmp`` may be its own mount).
    """
    etc = str(layout.host_dir(index) / "etc")
    tail = f"/{layout.root.name}/{layout.host_name(index)}/etc"
    return any(point == "/etc/libvirt" and root.endswith(tail) and etc.endswith(root) for root, point in binds)


def namespace_holders(layout: LabLayout, index: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids still living in the host's mount namespace (its daemons, guests, or strays after a crash).

    Every process in that namespace was started by this lab host, so this is
    the last sweep of ``lab down``: once it is empty the bind mounts are gone.
    """
    by_ns: dict[str, bool] = {}
    pids: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.readlink(entry / "ns" / "mnt")
            if ns not in by_ns:
                by_ns[ns] = holds_host_namespace(parse_mountinfo_binds((entry / "mountinfo").read_text()),
                                                 layout, index)
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if by_ns[ns]:
            pids.append(int(entry.name))
    return pids


def kill_namespace(layout: LabLayout, index: int, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process left in the host's namespace; returns their pids."""
    victims = namespace_holders(layout, index)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(not pid_gone(p) for p in victims):
        time.sleep(0.05)
    return victims


def _terminate(pid: int, marker: str, timeout_s: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_matches(pid, marker) or pid_gone(pid):
                return
            time.sleep(0.05)
    raise DaemonError(f"pid {pid} ({marker}) survived SIGKILL")


def _tail(path: Path, lines: int = 2) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    return " | ".join(text[-lines:]) or "no output"
