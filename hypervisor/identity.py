"""Who a host is: its libvirt host UUID, not the spelling of its URI.

One libvirtd can be reached by many URIs — ``/./`` or ``//`` in a socket
path, a symlink, ``%2F``, ``qemu://`` without ``+unix``, a trailing slash, an
extra query parameter — and a cluster file that lists one host twice made
vcsched count its VMs twice (``status`` showed them in doubt) and plan onto
"both" hosts (``place`` created one VM and stopped when the second would
have doubled the host's caps).  A string comparison of URIs cannot catch
that; libvirt can: every host has a UUID, in its capabilities
(``virConnectGetCapabilities``: ``<host><uuid>``; libvirtd takes it from
``host_uuid`` in libvirtd.conf, else from the machine's SMBIOS or
/etc/machine-id).  So:

* every inventory reads each host's UUID (once per command and host) and
  refuses a cluster file in which two entries reach the same host (exit 2,
  naming both entries and the UUID), whatever their URIs look like;
* a host the cluster file declares a ``uuid`` for must answer with that UUID
  (a file pointing at the wrong machine is refused the same way);
* the cluster lock is named after the hosts' identities, so two files for the
  same hosts share one lock whatever they are called, and unrelated clusters —
  every lab is named "lab" — never do (docs/hosts-down.md, "Which lock").  A
  host that does not answer is named by the ``uuid`` the cluster file declares,
  else by the one a changing command on this machine last read for its URI
  (:data:`KNOWN_HOSTS`, like ssh's known_hosts); with neither it has no
  identity for this command (:class:`Identities`): it is down, and the lock is
  named by the hosts that have one, through their *claims*
  (:func:`claim`, acting/lock_names.py).

libvirt's test driver reports no host UUID (its capabilities have no
``<uuid>``); a test-driver host is identified by its URI, the only name it
has (each connection parses its file into a host of its own).  vcsched does
not fall back to ``getSysinfo`` or the host name: SMBIOS data is often
absent or the same on cloned machines, and a host name is a name, which is
what this module replaces.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hypervisor.files import write_atomic
from vcsched.errors import InputError, VcschedError
from vcsched.formats.cluster import Cluster


class LockUnnamed(VcschedError):
    """The cluster's lock cannot be named: no host has an identity, or a host has none and the coordination
    backend keeps no claims (exit 1: nothing changed)."""

    exit_code = 1


def uuid_from_capabilities(xml: str) -> str | None:
    """``<capabilities><host><uuid>`` of a host's capabilities XML, normalised; None when absent."""
    try:
        text = ET.fromstring(xml).findtext("host/uuid")
    except ET.ParseError:
        return None
    if not text or not text.strip():
        return None
    try:
        return str(uuidlib.UUID(text.strip()))
    except ValueError:
        return text.strip().lower()


def identity(uuid: str | None, uri: str) -> str:
    """A host's identity: its UUID, or for a driver that reports none its URI (see the module docstring)."""
    return f"uuid:{uuid}" if uuid is not None else f"uri:{uri}"


@dataclass(frozen=True)
class Identities:
    """The hosts' identities as a command found them: ``known`` (host name -> identity: declared, answered, or
    remembered for a host that does not answer) and ``unknown`` (host name -> why it has none: it does not
    answer, and neither the cluster file nor a command here says who it is)."""

    known: Mapping[str, str]
    unknown: Mapping[str, str] = field(default_factory=dict)


def check_distinct(cluster: Cluster, uuids: Mapping[str, str | None]) -> None:
    """Refuse (:class:`InputError`, exit 2) a cluster file two of whose entries reached the same host, and a host
    that answered with another UUID than the file declares for it."""
    index = {h.name: i for i, h in enumerate(cluster.hosts)}
    seen: dict[str, str] = {}
    for name, got in uuids.items():
        if got is None:
            continue
        h = cluster.host(name)
        if h.uuid is not None and h.uuid != got:
            raise InputError(f"hosts[{index[name]}].uuid: host {name} ({h.uri}) answers as host {got}, the cluster "
                             f"file declares {h.uuid}: the URI reaches another machine than the file says")
        other = seen.get(got)
        if other is not None:
            a, b = sorted((other, name), key=index.__getitem__)
            raise InputError(f"hosts[{index[b]}]: {b} ({cluster.host(b).uri}) and hosts[{index[a]}]: {a} "
                             f"({cluster.host(a).uri}) reach the same host, libvirt host UUID {got}: list each host "
                             "once")
        seen[got] = name


#: Where the UUIDs a changing command has read are remembered, by URI, in vcsched's state directory: like ssh's
#: known_hosts, so that a host that later stops answering still names the lock it shares with the others.
KNOWN_HOSTS = "known-hosts.json"


def remembered(state: Path) -> dict[str, str]:
    """URI -> host UUID, as changing commands on this machine last read them ({} if none or unreadable)."""
    try:
        doc = json.loads((state / KNOWN_HOSTS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def remember(state: Path, uuids: Mapping[str, str]) -> None:
    """Add ``uuids`` (URI -> host UUID) to what is remembered (written atomically; a failure to write is not fatal:
    the file only spares a later command a refusal)."""
    known = remembered(state)
    if all(known.get(uri) == u for uri, u in uuids.items()):
        return
    known.update(uuids)
    with contextlib.suppress(OSError):
        state.mkdir(parents=True, exist_ok=True)
        write_atomic(state / KNOWN_HOSTS, json.dumps(known, indent=1, sort_keys=True) + "\n")


def lock_key(identities: Iterable[str]) -> str:
    """The cluster lock's key: a digest of the set of its hosts' identities (order and repeats do not matter)."""
    text = "\n".join(sorted(set(identities)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def claim(claims: Mapping[str, str], known: Iterable[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The claims after a command that knows the identities ``known`` names its lock, and the lock keys it holds.

    ``claims`` maps a host identity to the key of the lock that protects it; an entry, once written, never
    changes.  The unclaimed identities of ``known`` are claimed under the smallest key its claimed ones already
    have, else under :func:`lock_key` of ``known`` (what the lock of a cluster whose hosts all answer was always
    named, so a cluster's first claims keep its lock and its shared documents where they were).  The command
    holds the lock of every key its identities are claimed under: usually one, more when ``known`` spans hosts
    first claimed apart (two files with host lists that overlap).  So two commands that could act on a host —
    each knows its identity, or it would be down for it — both hold the lock of that host's claim, whatever
    else each knows (docs/hosts-down.md, "Which lock").
    """
    known = sorted(set(known))
    held = sorted({claims[i] for i in known if i in claims})
    key = held[0] if held else lock_key(known)
    after = dict(claims)
    after.update({i: key for i in known if i not in claims})
    return after, tuple(sorted({after[i] for i in known}))
