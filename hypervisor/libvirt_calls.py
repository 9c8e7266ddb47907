"""How vcsched makes one libvirt call: a failure names the host, transient errors are retried, messages fit
on one line, and libvirt's own printing is off.

Shared by every module of the libvirt backend (:mod:`hypervisor.libvirt_backend` and the modules it is made
of), so that one host error reads the same whichever job raised it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import libvirt

from hypervisor.base import HypervisorError

T = TypeVar("T")

#: libvirt errors that a moment later may not recur: a cgroup being set up while another domain starts
#: ("Failed to create v2 cgroup"), a daemon busy or briefly unreachable.  Retried; anything else is final.
TRANSIENT_ERRORS = frozenset(code for code in (
    getattr(libvirt, "VIR_ERR_INTERNAL_ERROR", None), getattr(libvirt, "VIR_ERR_OPERATION_FAILED", None),
    getattr(libvirt, "VIR_ERR_SYSTEM_ERROR", None), getattr(libvirt, "VIR_ERR_OPERATION_TIMEOUT", None),
    getattr(libvirt, "VIR_ERR_RPC", None)) if code is not None)
RETRIES = 3
RETRY_PAUSE_S = 0.2


def quiet() -> None:
    """libvirt prints every error on stderr by default; ours are reported once, by the CLI."""
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


@contextlib.contextmanager
def as_host_error(host: str, what: str) -> Iterator[None]:
    """Any libvirt failure becomes a HypervisorError naming the host: the executor reports those as step failures."""
    try:
        yield
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"host {host}: cannot {what}: {exc.get_error_message()}") from None


def retrying(fn: Callable[[], T], sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, again up to :data:`RETRIES` times while it fails with a transient libvirt error.

    ``sleep`` waits between attempts (a simulation passes its own clock's).
    """
    for attempt in range(RETRIES + 1):
        try:
            return fn()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in TRANSIENT_ERRORS or attempt == RETRIES:
                raise
            sleep(RETRY_PAUSE_S * (attempt + 1))
    raise AssertionError("unreachable")


def one_line(exc: Exception) -> str:
    """libvirt's message for ``exc`` on one line (tc's errors, passed through by libvirt, span several)."""
    said = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else None
    return " ".join((said or str(exc)).split())
