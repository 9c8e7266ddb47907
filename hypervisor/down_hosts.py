"""Hosts known to be down: a dead host costs the first command ``host_timeout``, the next ones one short probe.

A host that does not answer holds every command that reads it for up to
``host_timeout`` (15 s by default: a hung libvirtd, a dead machine or network
path).  Paid once, that is the price of finding out; paid by every ``status``,
``place`` and ``recover`` after it, it is a tax for knowing nothing.  So when a
read of a host gives up on it (a timeout, a refused connection), the host's URI
is recorded in the state directory (``hosts-down.json`` beside the lock's
files, :func:`hypervisor.files.state_dir`) with the time and the reason; a
later command within :data:`DOWN_MEMORY_S` of that record gives the host one
short probe (:data:`PROBE_S`) instead of the full ``host_timeout``, and names it
as known down when the probe gets no answer (a probe answered with an error, a
refused connection, is named by that error).  The record is dropped as soon as
the host answers.

A probe that gets no answer does not renew the record: once
:data:`DOWN_MEMORY_S` has passed since a full wait found the host down, one
command waits the full ``host_timeout`` again.  So a slow host (one that
answers in more than a probe but within ``host_timeout``) is read in full at
least once per :data:`DOWN_MEMORY_S`, and is never kept down by probes alone.

A host vcsched's power saving powered off (acting/power.py) is recorded the same way, marked ``asleep``
(:func:`asleep`): that record does not age — a sleeping host costs every command one short probe however long
it sleeps, never a full ``host_timeout`` — and is dropped, like any, once the host answers.

The record is a hint, never a decision: a host is down for a command only
because that command's own read (probe or full) got no answer.  An unreadable
or unwritable record is ignored (the commands then wait as they did without it).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hypervisor.files import exclusive, write_atomic

#: The record's file name in the state directory.
FILE = "hosts-down.json"
#: How long a full wait's finding is trusted: within it, a host found down is given one probe.
DOWN_MEMORY_S = 600.0
#: How long the probe of a host known to be down may take (at most ``host_timeout``).
PROBE_S = 1.0


@dataclass(frozen=True)
class KnownDown:
    """A host a full wait found down at ``since`` (seconds since the epoch), for ``reason``."""

    since: float
    reason: str
    #: Powered off by vcsched's power saving: the record does not age (module docstring).
    asleep: bool = False

    def describe(self, probe_s: float) -> str:
        """How a host known to be down is named when its probe gets no answer either."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"known down since {when} ({self.reason}); one probe of {probe_s:g} s got no answer"


def _read(state: Path) -> dict[str, KnownDown]:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
        doc = json.loads((state / FILE).read_text())
        return {str(uri): KnownDown(float(r["since"]), str(r["reason"]), bool(r.get("asleep", False)))
                for uri, r in doc.items()}
    return {}


def known_down(state: Path, now: float | None = None) -> dict[str, KnownDown]:
    """The URIs a full wait found down within :data:`DOWN_MEMORY_S` of ``now``, and those recorded asleep."""
    now = time.time() if now is None else now
    return {uri: k for uri, k in _read(state).items() if k.asleep or 0 <= now - k.since <= DOWN_MEMORY_S}


def probe_timeouts(state: Path, uris: Mapping[str, str], host_timeout: float,
                   now: float | None = None) -> tuple[dict[str, float], dict[str, KnownDown]]:
    """Per host (``uris``: host name -> URI) the time its read may take: :data:`PROBE_S` for a host known to be
    down, else ``host_timeout``; and the known-down hosts by name."""
    down = known_down(state, now)
    probe = min(PROBE_S, host_timeout)
    known = {name: down[uri] for name, uri in uris.items() if uri in down}
    return {name: probe if name in known else host_timeout for name in uris}, known


def update(state: Path, found_down: Mapping[str, str], answered: Iterable[str], now: float | None = None) -> None:
    """Record the URIs a full wait found down (``found_down``: URI -> reason) and drop those that ``answered``.

    A probed host that stayed down is in neither: its record keeps its time (module docstring).  Written only
    when something changed; a state directory that cannot be written is ignored.
    """
    now = time.time() if now is None else now
    with _changing(state):
        before = _read(state)
        after = {uri: k for uri, k in before.items() if uri not in set(answered)}
        after.update({uri: KnownDown(now, reason) for uri, reason in found_down.items()})
        if after != before:
            _write(state, after)


def asleep(state: Path, uri: str, reason: str, now: float | None = None) -> None:
    """Record the host of ``uri`` powered off by vcsched's power saving: one short probe per command from now on,
    until it answers (module docstring)."""
    with _changing(state):
        records = _read(state)
        records[uri] = KnownDown(time.time() if now is None else now, reason, asleep=True)
        _write(state, records)


@contextlib.contextmanager
def _changing(state: Path) -> Iterator[None]:
    """The record's read-modify-write, one process at a time (every command and the controller change it: without
    this, two that found different hosts down at once would each write their own view, and one finding — an
    asleep mark among them — would be lost).  A lock that cannot be taken is ignored, like the record itself."""
    with contextlib.ExitStack() as held:
        with contextlib.suppress(OSError):
            state.mkdir(parents=True, exist_ok=True)
            held.enter_context(exclusive(state / (FILE + ".lock")))
        yield


def _write(state: Path, records: Mapping[str, KnownDown]) -> None:
    doc = {uri: {"since": k.since, "reason": k.reason, **({"asleep": True} if k.asleep else {})}
           for uri, k in sorted(records.items())}
    with contextlib.suppress(OSError):
        state.mkdir(parents=True, exist_ok=True)
        write_atomic(state / FILE, json.dumps(doc, indent=1) + "\n")
