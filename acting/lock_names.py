"""Which lock a changing command takes: the lock of every host it could act on, named through host *claims*.

The cluster lock is named after its hosts' identities (hypervisor/identity.py), so two files for the same hosts
share it and two clusters that share only a name ("lab") do not.  A host that does not answer, has no declared
``uuid`` and was never read on this machine has no identity for the command: it cannot be part of the name.
Naming the lock by the hosts that *do* have one is not safe by itself: a command that sees that host would name
another lock than one that does not, and both would act on the other hosts at once.

So the identities are tied to lock keys once, on the coordination backend, beside the locks: the *claims*
(``file://DIR``: ``DIR/hosts-claims.json``; etcd: the key ``/vcsched/hosts/claims``; one document updated
atomically, :class:`acting.recommendations.SharedDocument`).  A command claims every identity it knows that is
not claimed yet, under the key its other hosts are already claimed by (or, for a cluster never claimed, the
digest of the identities it knows — the key its lock always had), and holds the lock of every key its hosts are
claimed by (:func:`hypervisor.identity.claim`).  A claim never changes.  So any two commands that could act on one
host both know that host's identity (a host without one is down for a command, and a host that answers later is
used only once claimed under a lock the command holds), both hold the lock of its one claim, and one waits for
the other — whatever else each of them knows.  The rule, for operators: docs/hosts-down.md, "Which lock".

A backend that keeps no documents (tooz drivers other than file and etcd) keeps no claims either: there, as
before, a changing command on a cluster one of whose hosts has no identity refuses (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from acting.lock import DEFAULT_TTL, LockSet, cluster_lock_name, leader_lock_name
from acting.recommendations import SharedDocument
from hypervisor.identity import Identities, LockUnnamed, claim, lock_key


def _load(doc: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


class HostClaims(SharedDocument[dict[str, str]]):
    """Host identity -> the key of the lock that protects it, for every cluster on the backend ``url``."""

    def __init__(self, url: str, *, timeout: float = 5.0) -> None:
        super().__init__(url, "claims", "hosts", _load, dict, dict, timeout=timeout)


def lock_keys(url: str, cluster: str, ids: Identities, *, record: bool = True, timeout: float = 5.0) \
        -> tuple[str, ...]:
    """The keys of the locks a command on ``cluster`` whose hosts have the identities ``ids`` holds (usually
    one); ``record``: claim its unclaimed hosts (a changing command; a reader only looks).

    Raises :class:`LockUnnamed` when no host has an identity, or when one has none and the backend keeps no
    claims (module docstring)."""
    known = list(ids.known.values())
    if not known:
        raise LockUnnamed(f"cannot name the lock of cluster {cluster!r}: no host has an identity "
                          f"({'; '.join(ids.unknown.values())}); nothing changed")
    if not HostClaims.supports(url):
        if ids.unknown:
            why = next(iter(ids.unknown.values()))
            raise LockUnnamed(f"cannot name the lock of cluster {cluster!r}: {why}, and the coordination backend "
                              f"{url} keeps no host claims; nothing changed (declare its libvirt host UUID as "
                              "`uuid = \"...\"` in its [[hosts]] table — `vcsched status --json` shows it while "
                              "the host answers — or retry)")
        return (lock_key(known),)
    store = HostClaims(url, timeout=timeout)
    claims = store.read()
    if not record or all(i in claims for i in known):
        return claim(claims, known)[1]
    return store.update(lambda now: claim(now, known))


def admission(url: str, keys: Sequence[str], *, timeout: float = 5.0) -> Callable[[str], bool] | None:
    """For :meth:`hypervisor.libvirt_backend.LibvirtHypervisor.act_only_as`: whether a host that answers after the
    lock was named (``identity``) is covered by the locks of ``keys`` — claimed under one of them already, or
    claimed now under the first.  None on a backend that keeps no claims (such a host is left out)."""
    if not HostClaims.supports(url):
        return None
    store = HostClaims(url, timeout=timeout)

    def admit(identity: str) -> bool:
        def change(claims: dict[str, str]) -> tuple[dict[str, str], bool]:
            if identity in claims:
                return claims, claims[identity] in keys
            return {**claims, identity: keys[0]}, True
        return store.update(change)

    return admit


def cluster_locks(url: str, cluster: str, keys: Sequence[str], member: str | None = None,
                  ttl: float = DEFAULT_TTL) -> LockSet:
    """The cluster locks of ``keys``, taken together."""
    return LockSet(url, cluster, [cluster_lock_name(k) for k in keys], member, ttl)


def leader_locks(url: str, cluster: str, keys: Sequence[str], member: str | None = None,
                 ttl: float = DEFAULT_TTL) -> LockSet:
    """``vcsched run``'s leadership of the hosts of ``keys``: the leader locks of all of them."""
    return LockSet(url, cluster, [leader_lock_name(k) for k in keys], member, ttl)
