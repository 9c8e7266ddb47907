"""The controller's event log: one JSON object per line, for people (``jq``), for `vcsched top` and for tests.

Every line has ``"event"`` (what happened), ``"time"`` (Unix seconds) and
``"member"`` (which controller: ``user@host:pid``, the name it holds locks
under), plus the event's own fields.  The events `vcsched run` writes are
listed in docs/controller.md.  :class:`EventLog` writes it; :class:`EventTail`
follows it as it grows.
"""

from __future__ import annotations

import collections
import json
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars as numbers, non-finite floats as null (JSON has no NaN)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return value


class EventLog:
    def __init__(self, stream: TextIO, member: str, clock: Callable[[], float]) -> None:
        self.stream = stream
        self.member = member
        self.clock = clock
        self._lock = threading.Lock()
        self.failed: str | None = None  # the first write error (the log stays best-effort: the daemon goes on)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        doc = {"event": event, "time": round(self.clock(), 6), "member": self.member, **_plain(fields)}
        line = json.dumps(doc, separators=(",", ":"), default=str)
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError) as exc:
                self.failed = self.failed or str(exc)
        return doc


class EventTail:
    """Follows an event log as `vcsched run` appends to it (``tail -F``), keeping its last ``keep`` events.

    The first :meth:`poll` reads at most the last ``start_bytes`` of the file
    (a long-running controller's log can be large; what `vcsched top` shows is
    recent).  Each later one reads the complete lines added since (a line being
    written is read once it ends).  A file that shrank or was replaced
    (logrotate's ``copytruncate``, or a new file) is read again from its start.
    Lines that are not JSON objects are skipped.
    """

    def __init__(self, path: Path, keep: int = 10_000, start_bytes: int = 2 << 20) -> None:
        self.path = path
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._start_bytes = start_bytes
        self._offset: int | None = None  # None: not read yet
        self._inode: int | None = None
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        """Read what was appended; returns the new events (all kept ones are in :attr:`events`).
        OSError if the file cannot be read."""
        st = os.stat(self.path)
        if self._offset is not None and (st.st_ino != self._inode or st.st_size < self._offset):
            self._offset, self._partial = 0, b""  # rotated or truncated: the new file from its start
        with self.path.open("rb") as f:
            if self._offset is None:
                self._offset = max(0, st.st_size - self._start_bytes)
                if self._offset:
                    f.seek(self._offset - 1)
                    if f.read(1) != b"\n":
                        f.readline()  # the first line is cut: skip to the next whole one
                        self._offset = f.tell()
            f.seek(self._offset)
            data = f.read()
            self._offset = f.tell()
        self._inode = st.st_ino
        *lines, self._partial = (self._partial + data).split(b"\n")
        new = []
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "event" in doc:
                new.append(doc)
        self.events.extend(new)
        return new
