"""SIGTERM and SIGINT as an orderly stop, for commands that change hosts for a while (`observe --probe`, `run`).

Python's defaults end such a command in the middle of what it does: SIGTERM
kills it outright (no ``finally`` runs: a probe's raised caps stayed raised),
SIGINT raises ``KeyboardInterrupt`` wherever the main thread happens to be.
Instead, while :func:`stopping_on_signals` is in force, either signal only
sets a :class:`threading.Event` that the command's loops wait on: the command
stops what it is doing at the next point where that is safe, puts back what
it changed, and then ends — `run` with exit 0 (systemd's clean stop),
`observe` with :class:`Interrupted` (exit 128 + the signal, as a shell
reports it).  A further signal changes nothing; SIGKILL remains the way to
end it at once, and then the journal (:mod:`hypervisor.journal`) lets the
next command put things back.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from vcsched.errors import VcschedError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(VcschedError):
    """The command was stopped by a signal after putting back what it had changed (exit 128 + the signal)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


@contextlib.contextmanager
def stopping_on_signals(stop: threading.Event) -> Iterator[list[int]]:
    """SIGTERM and SIGINT set ``stop`` during the block (module docstring); yields the signals received, in order.

    Only in the main thread (where Python runs signal handlers); elsewhere the block runs with the handlers as
    they are.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
