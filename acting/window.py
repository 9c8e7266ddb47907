"""The controller's last sample window, published for ``vcsched status`` to read instead of sampling again.

``status`` used to sample every VM for 2 s on each call (4.5–7 s per call on a busy 3-host lab).  When a
controller (``vcsched run``) watches the cluster it samples every VM all the time already; so after each
interval the leader writes what each managed VM used over its last sample (cores) to a small file in the state
directory, and ``status`` without ``--sample`` shows that, saying how old it is.  Without a fresh window (no
controller runs on this machine, or it stopped) ``status`` does not sample unless asked (``--sample S``).

The file is named after the cluster's name and its hosts' URIs (every lab is named "lab": two labs on one
machine must not read each other's window), written atomically; a window older than :data:`STALE_INTERVALS`
of its controller's intervals is not shown (the controller stopped, or lost the lead).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hypervisor.files import write_atomic
from vcsched.formats.cluster import Cluster

#: A window this many of its controller's intervals old is stale: not shown.
STALE_INTERVALS = 2.0


@dataclass(frozen=True)
class Window:
    """What each managed VM used (cores; None: not measured) over the sample ending at ``written`` (epoch
    seconds), published by a controller running every ``interval_s``."""

    written: float
    interval_s: float
    used: dict[str, float | None]

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.written


def path_for(state: Path, cluster: Cluster) -> Path:
    """The window file of ``cluster``: its name and a digest of its hosts' URIs."""
    uris = "\n".join(sorted(cluster.connect_uri(h.name) for h in cluster.hosts))
    return state / f"window-{cluster.name}-{hashlib.sha256(uris.encode()).hexdigest()[:12]}.json"


def publish(state: Path, cluster: Cluster, interval_s: float, used: Mapping[str, float | None],
            now: float | None = None) -> None:
    """Write the window (a state directory that cannot be written is ignored: status then samples on request)."""
    doc = {"written": time.time() if now is None else now, "interval_s": interval_s, "used": dict(used)}
    with contextlib.suppress(OSError):
        state.mkdir(parents=True, exist_ok=True)
        write_atomic(path_for(state, cluster), json.dumps(doc) + "\n")


def last_window(state: Path, cluster: Cluster, now: float | None = None) -> Window | None:
    """The controller's last window of ``cluster`` if fresh (module docstring), else None."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
        doc = json.loads(path_for(state, cluster).read_text())
        w = Window(float(doc["written"]), float(doc["interval_s"]),
                   {str(k): None if v is None else float(v) for k, v in doc["used"].items()})
        if 0 <= w.age(now) <= STALE_INTERVALS * max(w.interval_s, 1.0):
            return w
    return None
