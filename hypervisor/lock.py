"""The cluster lock: one command at a time changes a cluster's hosts, whoever runs it and from wherever.

Two ``place --apply`` run at once used to both put their VMs on the same
host (each planned on the state before the other's VMs existed).  Every
command that changes hosts now holds the cluster's lock from the moment it
reads the inventory it plans on until its last step; read-only commands take
no lock and keep working when the coordination service is down.

The lock is a `tooz <https://docs.openstack.org/tooz/>`_ lock, the
coordination library OpenStack services use for the same job, so one
mechanism covers one machine and several:

* ``file://DIR`` (the default, under vcsched's state directory): an
  ``fcntl`` lock on a file, which the kernel releases when the holder dies
  (even by SIGKILL).  It protects only commands started on this machine.
* ``etcd3+http://HOST:2379`` (or ``etcd3+https``): a lease in etcd, for
  operators and controllers on several machines (docs/operations.md).

Who holds the lock (member ``user@host:pid``, since when) is written next to
it, so a refused command can name the holder.  ``guard()`` is called before
every step: a holder that lost its lock (its lease expired) starts no further
step.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vcsched.errors import VcschedError
from vcsched.formats.cluster import check_coordination_url

COORDINATION_ENV = "VCSCHED_COORDINATION"
STATE_DIR_ENV = "VCSCHED_STATE_DIR"


class LockBusy(VcschedError):
    """Another command holds the cluster's lock (exit 1: nothing was changed; wait, or retry later)."""

    exit_code = 1


class CoordinationDown(VcschedError):
    """The coordination service cannot be reached: no host is touched (exit 1)."""

    exit_code = 1


class LockLost(VcschedError):
    """The lock's lease ran out while a plan was running: no further step starts."""

    exit_code = 1


def state_dir() -> Path:
    """vcsched's own state: ``$VCSCHED_STATE_DIR``, else /var/lib/vcsched for root, else ~/.local/state/vcsched."""
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/vcsched")
    return Path.home() / ".local" / "state" / "vcsched"


def default_url() -> str:
    return f"file://{state_dir() / 'coordination'}"


def resolve_url(flag: str | None, cluster_value: str | None) -> str:
    """The coordination URL in force: ``--coordination``, else ``$VCSCHED_COORDINATION``, else the cluster
    file's ``coordination``, else the file backend under the state directory."""
    url = flag or os.environ.get(COORDINATION_ENV) or cluster_value or default_url()
    check_url("--coordination" if flag else COORDINATION_ENV if os.environ.get(COORDINATION_ENV)
              else "coordination", url)
    return url


def check_url(where: str, url: str) -> str:
    """A tooz backend URL; an unknown scheme is bad input naming it (the cluster file's check)."""
    return check_coordination_url(where, url)


def member_id() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Holder:
    member: str
    since: float

    def describe(self) -> str:
        ago = max(time.time() - self.since, 0.0)
        return f"{self.member} since {time.strftime('%H:%M:%S', time.localtime(self.since))} ({ago:.0f} s ago)"


class ClusterLock:
    """The lock of one cluster on one coordination backend (see the module docstring)."""

    def __init__(self, url: str, cluster: str, member: str | None = None) -> None:
        self.url = url
        self.cluster = cluster
        self.member = member or member_id()
        self.name = f"vcsched-cluster-{cluster}"
        self._coordinator: Any = None
        self._lock: Any = None

    # ------------------------------------------------------------- holder record

    def _holder_path(self) -> Path | None:
        parsed = urlparse(self.url)
        return Path(parsed.path) / f"{self.name}.holder" if parsed.scheme == "file" else None

    def holder(self) -> Holder | None:
        """Who holds the lock, as recorded by the holder (None if unknown)."""
        path = self._holder_path()
        if path is None:
            return None
        try:
            doc = json.loads(path.read_text())
            return Holder(str(doc["member"]), float(doc["since"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _record(self) -> None:
        path = self._holder_path()
        if path is not None:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"member": self.member, "since": time.time()}))
            tmp.replace(path)

    def _unrecord(self) -> None:
        path = self._holder_path()
        if path is not None:
            held = self.holder()
            if held is not None and held.member == self.member:
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------- acquire / release

    def acquire(self, wait: float = 0.0) -> None:
        """Take the lock, waiting up to ``wait`` seconds; :class:`LockBusy` names the holder otherwise."""
        from tooz import coordination

        parsed = urlparse(self.url)
        if parsed.scheme == "file":
            Path(parsed.path).mkdir(parents=True, exist_ok=True)
        try:
            self._coordinator = coordination.get_coordinator(self.url, self.member.encode())
            self._coordinator.start(start_heart=True)
            self._lock = self._coordinator.get_lock(self.name.encode())
            got = self._lock.acquire(blocking=wait if wait > 0 else False)
        except coordination.ToozError as exc:
            self._stop()
            raise CoordinationDown(f"coordination service {self.url} unreachable: {exc}; nothing changed") from None
        if not got:
            self._stop()
            held = self.holder()
            who = held.describe() if held is not None else "another command"
            waited = f" after waiting {wait:g} s" if wait > 0 else ""
            raise LockBusy(f"cluster {self.cluster!r} is locked by {who}{waited}; nothing changed "
                           "(retry later, or wait for it with --wait SECONDS)")
        self._record()

    def guard(self) -> None:
        """Raise :class:`LockLost` unless the lock is still ours (called before every step)."""
        if self._lock is None:
            raise LockLost(f"cluster {self.cluster!r}: the lock is not held")
        try:
            self._coordinator.heartbeat()
        except Exception as exc:  # tooz raises its own errors, and the backend's (e.g. etcd unreachable)
            raise LockLost(f"cluster {self.cluster!r}: cannot renew the lock at {self.url} ({exc}); "
                           "no further step is started") from None

    def release(self) -> None:
        if self._lock is not None:
            self._unrecord()
            with contextlib.suppress(Exception):
                self._lock.release()
            self._lock = None
        self._stop()

    def _stop(self) -> None:
        if self._coordinator is not None:
            with contextlib.suppress(Exception):
                self._coordinator.stop()
            self._coordinator = None


@contextlib.contextmanager
def holding(url: str, cluster: str, wait: float = 0.0) -> Iterator[ClusterLock]:
    """The cluster's lock for the duration of a ``with`` block."""
    lock = ClusterLock(url, cluster)
    lock.acquire(wait)
    try:
        yield lock
    finally:
        lock.release()
