"""Connections to many hosts that a hung host cannot block: an event loop, keepalive, bounded opens.

Measured with libvirt 9.0 (docs/across-machines.md):
a stopped ``libvirtd`` (SIGSTOP, a hung machine, a dead network path) blocks
``libvirt.open`` and every call on an open connection for as long as it is
stopped.  Two things bound that:

* libvirt's own event loop, run in a daemon thread
  (``virEventRegisterDefaultImpl`` + a thread looping
  ``virEventRunDefaultImpl``), makes ``setKeepAlive(interval, count)`` work:
  a call on a connection whose peer stops answering then fails after about
  ``interval * (count + 1)`` s with "connection closed due to keepalive
  timeout";
* keepalive does not cover ``open`` itself, so every open runs in a daemon
  thread that the caller waits for at most ``timeout_s``; a late success is
  closed in that thread.

:class:`Counted` wraps a connection and counts libvirt calls per host, so the
scale benchmark can report calls per host per command.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import libvirt

from hypervisor.base import HypervisorError

T = TypeVar("T")

_loop_lock = threading.Lock()
_loop_started = False
_abandoned = [0]  # threads left blocked on a host that did not answer
_here = threading.local()  # .bounded: this thread is itself given up on at a timeout (an inventory worker)


def mark_bounded() -> None:
    """Say that the calling thread is abandoned by its caller after a timeout (a worker of a bounded pool):
    :func:`open_bounded` then opens in this thread instead of starting one more (1,000 hosts: 1,000 threads)."""
    _here.bounded = True


def note_abandoned(n: int = 1) -> None:
    """Record ``n`` threads given up on (still blocked on a hung host)."""
    with _loop_lock:
        _abandoned[0] += n


def abandoned_threads() -> int:
    """How many threads this process left blocked on hosts that did not answer.

    The CLI then ends with ``os._exit`` once its output is flushed: the
    interpreter's clean-up would otherwise spend time on (or wait for) them.
    """
    return _abandoned[0]


def ensure_event_loop() -> None:
    """Register libvirt's default event loop and run it in a daemon thread (once per process).

    It must exist before a connection is opened for that connection's
    keepalive to run.
    """
    global _loop_started
    with _loop_lock:
        if _loop_started:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-event-loop", daemon=True).start()
        _loop_started = True


def keepalive_for(timeout_s: float) -> tuple[int, int]:
    """``(interval, count)`` with ``interval * (count + 1)`` about ``timeout_s`` (whole seconds, at least 1 each)."""
    interval = max(1, int(timeout_s // 3))
    count = max(1, round(timeout_s / interval) - 1)
    return interval, count


def open_bounded(host: str, uri: str, timeout_s: float) -> Any:
    """``libvirt.open(uri)`` that gives up after ``timeout_s`` (HypervisorError naming the host), with keepalive.

    libvirt's reason is kept in the error (a refused certificate reads
    "Failed to verify peer's certificate"), so the host is shown down with it.
    """
    ensure_event_loop()
    if getattr(_here, "bounded", False):
        try:
            return _with_keepalive(libvirt.open(uri), timeout_s)
        except libvirt.libvirtError as exc:
            why = " ".join((exc.get_error_message() or str(exc)).split())
            raise HypervisorError(f"host {host}: cannot connect to {uri}: {why}") from None
    box: dict[str, Any] = {}
    done = threading.Event()
    abandoned = threading.Event()

    def opener() -> None:
        try:
            conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            box["error"] = " ".join((exc.get_error_message() or str(exc)).split())
        else:
            if abandoned.is_set():  # the caller gave up: nobody will close it
                with contextlib.suppress(libvirt.libvirtError):
                    conn.close()
                return
            box["conn"] = conn
        done.set()

    threading.Thread(target=opener, name=f"open-{host}", daemon=True).start()
    if not done.wait(timeout_s):
        abandoned.set()
        note_abandoned()
        if "conn" in box:  # it finished between the wait and the flag
            return _with_keepalive(box["conn"], timeout_s)
        raise HypervisorError(f"host {host}: did not answer within {timeout_s:g} s (host_timeout) at {uri}")
    if "error" in box:
        raise HypervisorError(f"host {host}: cannot connect to {uri}: {box['error']}")
    return _with_keepalive(box["conn"], timeout_s)


def _with_keepalive(conn: Any, timeout_s: float) -> Any:
    interval, count = keepalive_for(timeout_s)
    with contextlib.suppress(libvirt.libvirtError):  # local drivers (test:///) have no keepalive: nothing to bound
        conn.setKeepAlive(interval, count)
    return conn


def close_quietly(conn: Any) -> None:
    """Close ``conn`` in a daemon thread: closing a connection to a hung host blocks like any other call."""
    def close() -> None:
        with contextlib.suppress(libvirt.libvirtError, AttributeError):
            conn.close()

    threading.Thread(target=close, name="libvirt-close", daemon=True).start()


#: Every libvirt call this process made, per host, over all connections (the scale benchmark reads it around a
#: command run in-process; :func:`calls_made`).
_all_calls: collections.Counter[str] = collections.Counter()


def calls_made() -> collections.Counter[str]:
    """A copy of the per-host count of every libvirt call made so far in this process."""
    with _loop_lock:
        return collections.Counter(_all_calls)


class CallCounter:
    """libvirt calls per host, thread-safe (the inventory reads hosts concurrently)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_host: collections.Counter[str] = collections.Counter()

    def add(self, host: str, n: int = 1) -> None:
        with self._lock:
            self.by_host[host] += n
        with _loop_lock:
            _all_calls[host] += n


class Counted:
    """A libvirt object (connection or domain) whose method calls are counted for ``host``.

    Domains it returns are wrapped too; wrapped objects passed back into libvirt
    (``migrate3``'s destination connection) are unwrapped first.
    """

    __slots__ = ("_counter", "_host", "_obj")

    def __init__(self, obj: Any, host: str, counter: CallCounter) -> None:
        self._obj, self._host, self._counter = obj, host, counter

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        if not callable(attr):
            return attr
        return self._wrap(attr)

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._counter.add(self._host)
            if args:
                args = tuple(a._obj if type(a) is Counted else a for a in args)
            out = fn(*args, **kwargs)
            return out if type(out) in _PLAIN else self._rewrap(out)
        return call

    def _rewrap(self, out: Any) -> Any:
        if _is_domain(out):
            return Counted(out, self._host, self._counter)
        if isinstance(out, list) and out and _is_domain(out[0]):
            return [Counted(d, self._host, self._counter) for d in out]
        if isinstance(out, list) and out and isinstance(out[0], tuple) and out[0] \
                and _is_domain(out[0][0]):  # getAllDomainStats: [(dom, stats)]
            return [(Counted(d, self._host, self._counter), st) for d, st in out]
        return out


#: What most calls return (XML, stats, numbers): never a domain, returned as it is without looking further
#: (26,000 calls in a `status` of 1,000 hosts).
_PLAIN = frozenset({str, dict, int, float, bool, type(None), bytes})


def _is_domain(obj: Any) -> bool:
    """A libvirt domain, or the simulated libvirt's (:class:`hypervisor.simlibvirt.SimDomainHandle`)."""
    return isinstance(obj, libvirt.virDomain) or getattr(type(obj), "is_domain", False)


def unwrap(obj: Any) -> Any:
    return obj._obj if isinstance(obj, Counted) else obj


def in_background(fn: Callable[[], T]) -> Callable[[], T]:
    """Start ``fn()`` in a daemon thread now; the returned function waits for it and returns (or raises) its result.

    For a command that can read its hosts while it loads the rest of itself:
    waiting on a hung host costs no CPU, importing the solvers does.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=run, name="background", daemon=True)
    t.start()

    def result() -> T:
        t.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result
