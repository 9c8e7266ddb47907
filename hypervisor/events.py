"""The controller's event log: one JSON object per line, for people (``jq``) and for tests.

Every line has ``"event"`` (what happened), ``"time"`` (Unix seconds) and
``"member"`` (which controller: ``user@host:pid``, the name it holds locks
under), plus the event's own fields.  The events `vcsched run` writes are
listed in docs/operations.md.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
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
