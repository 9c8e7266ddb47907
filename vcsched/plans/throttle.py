"""Which migrations of a wave may start now, under the cluster's migration throttles.

A wave (:mod:`vcsched.plans.migration`) is a set of migrations planned to fit
in memory *together*, so any subset of it may run at once and in any order:
each finished migration only frees memory, and a VM leaving a host keeps its
cap there until the wave ends.  The throttles
(:class:`vcsched.formats.throttles.MigrationThrottles`) then only decide how
many run at once: the executor starts what :func:`admit` allows, waits for
one to finish, and asks again, until the wave is done.

Greedy in plan order: a migration that would exceed a limit waits, and a later
one whose hosts are free may start before it (so one busy host does not hold
up migrations between other hosts).  Nothing starves: a waiting migration
starts as soon as a migration on its hosts ends, unless an earlier waiting one
takes the slot first, and there are finitely many earlier ones.

Pure: host names in, indexes out.
"""

from __future__ import annotations

from collections.abc import Sequence

from vcsched.formats.throttles import MigrationThrottles

Ends = tuple[str, str]  # (source host, destination host)


def admit(pending: Sequence[Ends], running: Sequence[Ends], throttles: MigrationThrottles) -> list[int]:
    """Indexes into ``pending`` (plan order) that may start now beside ``running``, within ``throttles``.

    A migration counts on its source and on its destination (each host's limit
    caps arrivals and departures together).  Every limit is at least 1, so
    when nothing runs the first pending migration is admitted: a wave always
    makes progress.
    """
    per_host: dict[str, int] = {}
    for src, dst in running:
        per_host[src] = per_host.get(src, 0) + 1
        per_host[dst] = per_host.get(dst, 0) + 1
    in_flight = len(running)
    out: list[int] = []
    for i, (src, dst) in enumerate(pending):
        if throttles.max_migrations is not None and in_flight >= throttles.max_migrations:
            break
        cap = throttles.max_migrations_per_host
        if cap is not None and (per_host.get(src, 0) >= cap or per_host.get(dst, 0) >= cap):
            continue
        out.append(i)
        in_flight += 1
        per_host[src] = per_host.get(src, 0) + 1
        per_host[dst] = per_host.get(dst, 0) + 1
    return out


def schedule(ends: Sequence[Ends], seconds: Sequence[float], throttles: MigrationThrottles) -> list[tuple[float, int]]:
    """When each migration of a wave starts if migration ``i`` takes ``seconds[i]``: ``(start, i)`` in start order.

    The executor's loop (:func:`admit`, wait for the first to end, admit again)
    on a simulated clock, for reviewing a throttled plan and for tests.
    """
    pending = list(range(len(ends)))
    running: list[tuple[float, int]] = []  # (end time, index)
    now = 0.0
    out: list[tuple[float, int]] = []
    while pending or running:
        for k in sorted(admit([ends[i] for i in pending], [ends[i] for _, i in running], throttles), reverse=True):
            i = pending.pop(k)
            running.append((now + seconds[i], i))
            out.append((now, i))
        running.sort()
        now, _ = running.pop(0)
    return sorted(out)
