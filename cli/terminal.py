"""Keys from a terminal, one at a time, for `vcsched top`; the terminal put back however the program ends.

``cbreak`` mode (termios, through the standard ``tty`` module) delivers each
key as it is pressed, without echo, while Ctrl-C still interrupts.  The
terminal's previous settings are restored when the ``with`` block ends — on
return, on an exception, and on SIGTERM or SIGHUP, which :func:`signals_exit`
turns into ``SystemExit`` in the main thread so that every ``finally`` runs
(a process killed by an unhandled SIGTERM would leave the shell without echo).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import termios
import tty
from collections.abc import Iterator
from types import FrameType

#: Exit code after SIGTERM / SIGHUP: 128 + the signal's number, as a shell reports a process the signal ended.
SIGNAL_EXIT = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGHUP: 128 + signal.SIGHUP}


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Terminal ``fd`` in cbreak mode for the block, its settings restored after (module docstring)."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def read_key(fd: int, timeout: float) -> str | None:
    """The next key pressed within ``timeout`` seconds (None if none); escape sequences (arrows) come whole."""
    ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
    if not ready:
        return None
    data = os.read(fd, 32)
    if not data:
        return None
    return data.decode("utf-8", "replace")


def keys_in(data: str) -> list[str]:
    """The keys in what one read returned (several when typed fast, or sent together by tmux), each escape
    sequence (an arrow, a function key: ESC [ ... letter) as one key."""
    keys, i = [], 0
    while i < len(data):
        if data[i] == "\x1b" and i + 1 < len(data) and data[i + 1] in "[O":
            j = i + 2
            while j < len(data) and not data[j].isalpha() and data[j] != "~":
                j += 1
            keys.append(data[i:j + 1])
            i = j + 1
        else:
            keys.append(data[i])
            i += 1
    return keys


@contextlib.contextmanager
def signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` in the main thread during the block."""
    def handler(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(SIGNAL_EXIT[signal.Signals(signum)])

    previous = {s: signal.signal(s, handler) for s in SIGNAL_EXIT}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
