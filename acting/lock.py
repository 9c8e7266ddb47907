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
  operators and controllers on several machines (docs/plans.md).

Who holds the lock (member ``user@host:pid``, since when) is written next to
it (a file beside the lock; a key on the lock's lease in etcd), so a refused
command can name the holder.

**Leases and fencing (etcd).**  The lock is a key on an etcd lease of
``ttl`` seconds (default :data:`DEFAULT_TTL`): if its holder dies, etcd frees
it within the TTL.  The holder renews the lease from a thread every third of
the TTL.  ``guard()``, called before every step, renews it once more and
checks that the last successful renewal is younger than the TTL less a margin;
a holder that cannot renew (etcd unreachable, lease expired) starts no
further step — it stops before its lease could have expired, so no step ever
runs without a valid lease.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

from hypervisor.files import STATE_DIR_ENV, state_dir, write_atomic  # noqa: F401  (STATE_DIR_ENV re-exported)
from vcsched.errors import InputError, VcschedError
from vcsched.formats.cluster import check_coordination_url

COORDINATION_ENV = "VCSCHED_COORDINATION"
DEFAULT_TTL = 10.0  # seconds a dead holder keeps an etcd lock
#: A holder stops starting steps once its last renewal is this much of the TTL old: it must stop *before*
#: the lease can expire and someone else take the lock.
FENCE_FRACTION = 0.6
HOLDERS_PREFIX = "/vcsched/holders/"


class LockBusy(VcschedError):
    """Another command holds the cluster's lock (exit 1: nothing was changed; wait, or retry later)."""

    exit_code = 1


class CoordinationDown(VcschedError):
    """The coordination service cannot be reached: no host is touched (exit 1)."""

    exit_code = 1


class LockLost(VcschedError):
    """The lock's lease ran out while a plan was running: no further step starts."""

    exit_code = 1




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


def check_ttl(where: str, ttl: Any) -> float:
    """A lease TTL in seconds: a finite number of at least 1 (etcd leases are whole seconds)."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl < 1:
        raise InputError(f"{where}: {ttl!r} is not a lease time of at least 1 second")
    return float(ttl)


def _etcd(url: str) -> bool:
    return urlparse(url).scheme.startswith("etcd3")


def with_ttl(url: str, ttl: float) -> str:
    """The tooz URL with the lock's lease TTL (and the client timeout) set, unless the URL sets them itself."""
    if not _etcd(url):
        return url
    parsed = urlparse(url)
    query = dict(parse_qsl(parsed.query))
    query.setdefault("lock_timeout", str(math.ceil(ttl)))
    # The client's socket timeout bounds each call: a hung etcd must fail a renewal well within the TTL.
    query.setdefault("timeout", str(max(1, math.ceil(ttl / 3))))
    return urlunparse(parsed._replace(query=urlencode(query)))


def member_id() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"


def leader_lock_name(key: str) -> str:
    """The lock whose holder is the active ``vcsched run`` of the cluster of lock key ``key`` (its leader; the
    others stand by)."""
    return f"vcsched-leader-{key}"


def cluster_lock_name(key: str) -> str:
    """The cluster lock of key ``key``: the key its hosts are claimed by (acting/lock_names.py)."""
    return f"vcsched-cluster-{key}"


@dataclass(frozen=True)
class Holder:
    member: str
    since: float

    def describe(self) -> str:
        ago = max(time.time() - self.since, 0.0)
        return f"{self.member} since {time.strftime('%H:%M:%S', time.localtime(self.since))} ({ago:.0f} s ago)"


class ClusterLock:
    """The lock of one cluster on one coordination backend (see the module docstring)."""

    def __init__(self, url: str, cluster: str, member: str | None = None, ttl: float = DEFAULT_TTL, *,
                 name: str | None = None, key: str | None = None) -> None:
        self.ttl = check_ttl("lock_ttl", ttl)
        self.url = with_ttl(url, self.ttl)
        self.cluster = cluster
        self.member = member or member_id()
        #: The lock's name on the backend: the cluster lock of ``key``, the key the hosts are claimed by
        #: (acting/lock_names.py; a bare cluster name only in tests of the lock itself); ``vcsched run``'s
        #: leadership is a second lock of the same kind (:func:`leader_lock_name`).
        self.name = name or cluster_lock_name(key or cluster)
        self._coordinator: Any = None
        self._lock: Any = None
        self._renewed = 0.0  # time.monotonic() of the last successful renewal
        self._expired = False
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    # ------------------------------------------------------------- holder record

    def _holder_path(self) -> Path | None:
        parsed = urlparse(self.url)
        return Path(parsed.path) / f"{self.name}.holder" if parsed.scheme == "file" else None

    def holder(self) -> Holder | None:
        """Who holds the lock, as recorded by the holder (None if unknown)."""
        try:
            path = self._holder_path()
            if path is not None:
                text = path.read_text()
            elif self._coordinator is not None and _etcd(self.url):
                values = self._coordinator.client.get(HOLDERS_PREFIX + self.name)
                if not values:
                    return None
                text = values[0].decode() if isinstance(values[0], bytes) else str(values[0])
            else:
                return None
            doc = json.loads(text)
            return Holder(str(doc["member"]), float(doc["since"]))
        except Exception:  # a record being rewritten, or etcd not answering: the holder is just unknown
            return None

    def _record(self) -> None:
        doc = json.dumps({"member": self.member, "since": time.time()})
        path = self._holder_path()
        if path is not None:
            write_atomic(path, doc)
        elif _etcd(self.url):  # on the lock's own lease: it disappears with the lock
            self._coordinator.client.put(HOLDERS_PREFIX + self.name, doc, lease=self._lock._lease)

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
            self._coordinator.start()
            self._lock = self._coordinator.get_lock(self.name.encode())
            got = self._lock.acquire(blocking=wait if wait > 0 else False)
            if got:
                self._renewed = time.monotonic()
                self._record()
        except Exception as exc:  # tooz's own errors and the backend's (an etcd that does not answer)
            if self._lock is not None and getattr(self._lock, "acquired", False):
                with contextlib.suppress(Exception):
                    self._lock.release()
            self._lock = None
            self._shutdown()
            raise CoordinationDown(f"coordination service {self.url} unreachable: {exc}; nothing changed") from None
        if not got:
            held = self.holder()
            self._lock = None
            self._shutdown()
            who = held.describe() if held is not None else "another command"
            waited = f" after waiting {wait:g} s" if wait > 0 else ""
            raise LockBusy(f"cluster {self.cluster!r} is locked by {who}{waited}; nothing changed "
                           "(retry later, or wait for it with --wait SECONDS)")
        if _etcd(self.url):
            self._heart = threading.Thread(target=self._beat, name="vcsched-lock-heart", daemon=True)
            self._heart.start()

    def _renew(self) -> bool:
        """Renew the lease now; False when etcd does not answer.  A lease found expired is never renewed again."""
        if self._expired:
            return False
        try:
            self._coordinator.heartbeat()
            if self._lock._lease.ttl() <= 0:  # it ran out while we could not reach etcd: someone may hold it
                self._expired = True
                return False
        except Exception:
            return False
        self._renewed = time.monotonic()
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self._renew()

    def guard(self) -> None:
        """Raise :class:`LockLost` unless the lock is still ours (called before every step)."""
        if self._lock is None:
            raise LockLost(f"cluster {self.cluster!r}: the lock is not held")
        if not _etcd(self.url):
            return  # a file lock is the kernel's: held until this process ends or releases it
        if not self._renew() and (self._expired or time.monotonic() - self._renewed > FENCE_FRACTION * self.ttl):
            raise LockLost(f"cluster {self.cluster!r}: cannot renew the lock's lease at {self.url} for "
                           f"{time.monotonic() - self._renewed:.1f} s (TTL {self.ttl:g} s); no further step "
                           "is started")

    def held(self) -> bool:
        """Whether the lock is still ours, without asking the backend (never blocks; :meth:`guard` renews).

        On etcd: the last renewal (the heartbeat thread's or a guard's) is younger than the fence
        (:data:`FENCE_FRACTION` of the TTL) and the lease was not found expired.  A holder that sees False
        must stop acting: its lease may run out before it could renew again.
        """
        if self._lock is None:
            return False
        if not _etcd(self.url):
            return True
        return not self._expired and time.monotonic() - self._renewed <= FENCE_FRACTION * self.ttl

    def release(self) -> None:
        self._stop.set()
        if self._lock is not None:
            self._unrecord()
            with contextlib.suppress(Exception):
                self._lock.release()
            self._lock = None
        self._shutdown()

    def _shutdown(self) -> None:
        self._stop.set()
        if self._coordinator is not None:
            with contextlib.suppress(Exception):
                self._coordinator.stop()
            self._coordinator = None


class LockSet:
    """Several locks of one kind held as one (acting/lock_names.py: a command holds the lock of every key its
    hosts are claimed by; usually one).  Taken in the order of their names, so two commands that need some of
    the same ones never hold one each waiting for the other; a refusal of any releases those already taken."""

    def __init__(self, url: str, cluster: str, names: Sequence[str], member: str | None = None,
                 ttl: float = DEFAULT_TTL) -> None:
        if not names:
            raise ValueError("a lock set needs at least one lock")
        member = member or member_id()
        self.locks = [ClusterLock(url, cluster, member, ttl, name=n) for n in sorted(set(names))]
        self.member = member
        self.cluster = cluster
        self.url = self.locks[0].url
        self.ttl = self.locks[0].ttl

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(lock.name for lock in self.locks)

    def acquire(self, wait: float = 0.0) -> None:
        """Take every lock, all within ``wait`` seconds; :class:`LockBusy` (naming the holder) otherwise."""
        deadline = time.monotonic() + wait
        taken: list[ClusterLock] = []
        try:
            for lock in self.locks:
                lock.acquire(max(deadline - time.monotonic(), 0.0) if wait > 0 else 0.0)
                taken.append(lock)
        except BaseException:
            for lock in reversed(taken):
                lock.release()
            raise

    def guard(self) -> None:
        for lock in self.locks:
            lock.guard()

    def held(self) -> bool:
        return all(lock.held() for lock in self.locks)

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()


@contextlib.contextmanager
def holding(url: str, cluster: str, wait: float = 0.0, ttl: float = DEFAULT_TTL, *,
            key: str | None = None) -> Iterator[ClusterLock]:
    """The cluster's lock (of its hosts' ``key``) for the duration of a ``with`` block."""
    lock = ClusterLock(url, cluster, ttl=ttl, key=key)
    lock.acquire(wait)
    try:
        yield lock
    finally:
        lock.release()
