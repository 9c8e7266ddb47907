"""Safe order for the live migrations and cap changes of an adaptation (section 6.1, made executable).

The adaptation (:mod:`vcsched.adaptation`) says where every VM should end up and
with which CPU cap; this module says in which order to get there without a
host ever running out of memory on the way.

Memory is the hard constraint.  A live migration reserves the VM's memory on
the destination from its first byte and frees it on the source only once the
VM runs on the destination, so while it runs the VM occupies both hosts.
Migrations are grouped into *waves*: a wave only starts migrations whose
destinations have room for everything arriving in that wave, counting the VMs
still to leave them as present; at most ``parallel`` migrations run at once
between one pair of hosts.  The executor runs a wave's migrations at once
(:mod:`acting.executor`); running them one after another is just as safe
(each finished migration only frees memory).

When no pending migration fits (a cycle: A must go to B's host while B must
go to A's, both full), one VM is *relayed* through a third host with room,
which costs its bytes a second time.  If no host has room, the order cannot
be made safe and :class:`MigrationBlocked` says how much room is missing.

CPU caps (the allocation of section 2.3) never over-commit a host by more
than a step can avoid: caps that go down are lowered first; migrating VMs
carry the lower of their old and new caps and *arrive with it* (the
destination XML carries the cap, so the VM never runs uncapped there); caps
that go up are raised last, when the final placement is in place, so their
sum stays within each host's cores.  A migration whose cap does not fit on
its destination yet — the destination still holds a VM that leaves in the
same wave — waits for a later wave.  Only when no migration can start that
way (a swap of two VMs between two full hosts) does one arrive *squeezed*,
with the destination's free cores (at least its minimum cap); its step says
so (``squeezed``), and the cap is raised to its final value once the swap is
done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from vcsched.caps import min_cap, realisable_cap
from vcsched.errors import VcschedError
from vcsched.plans.steps import MigrateStep, SetCapStep
from vcsched.units import CAP_TOLERANCE


class MigrationBlocked(VcschedError):
    """No safe order exists: some host lacks the memory for the VMs that must pass through it."""

    exit_code = 1


@dataclass(frozen=True)
class HostRoom:
    """A host as the ordering sees it: memory capacity and use in bytes, cores and caps in use."""

    name: str
    memory_bytes: int
    memory_used: int
    cores: float
    caps_used: float


@dataclass(frozen=True)
class VmChange:
    """One managed VM: where it runs now and with which cap, where it should run and with which cap."""

    vm: str
    source: str
    target: str
    memory_bytes: int  # memory it occupies on a host
    cap_now: float
    cap_final: float
    migrate_bytes: int | None = None  # bytes a migration moves (default: its memory)
    vcpus: int = 1  # caps are realised on this VM's quota grid

    @property
    def moves(self) -> bool:
        return self.source != self.target

    @property
    def cost(self) -> int:
        return self.memory_bytes if self.migrate_bytes is None else self.migrate_bytes


@dataclass(frozen=True)
class CapChange:
    vm: str
    host: str
    cap_cores: float
    phase: str  # "lower" (before any migration) or "raise" (after all)


@dataclass(frozen=True)
class Move:
    vm: str
    source: str
    target: str
    bytes: int
    cap_cores: float  # the cap it has on arrival
    wave: int
    relay: bool = False  # a hop through a third host to break a cycle
    squeezed: bool = False  # arrives below its cap: no wave order leaves room for it on the destination


OrderedStep = CapChange | Move


@dataclass(frozen=True)
class MigrationOrder:
    steps: tuple[OrderedStep, ...]
    total_bytes: int
    waves: int
    relays: int

    @property
    def moves(self) -> tuple[Move, ...]:
        return tuple(s for s in self.steps if isinstance(s, Move))


def order_changes(hosts: Iterable[HostRoom], changes: Iterable[VmChange], *, parallel: int = 1,
                  move_bytes: Callable[[VmChange, str, str], int] | None = None) -> MigrationOrder:
    """Order the cap changes and migrations of ``changes`` safely (see the module docstring).

    ``move_bytes(change, source, target)``: what one hop costs when that
    depends on the hosts (disks copied between storage groups); default the
    change's :attr:`VmChange.cost` for every hop.

    ``hosts`` must account for everything on them now in ``memory_used``
    (unmanaged VMs too) and ``caps_used`` (the managed VMs' caps).  Raises
    :class:`MigrationBlocked` when some migration can never start.
    """
    if parallel < 1:
        raise ValueError("parallel must be at least 1")
    rooms = {h.name: h for h in hosts}
    changes = list(changes)
    for c in changes:
        for h in (c.source, c.target):
            if h not in rooms:
                raise MigrationBlocked(f"vm {c.vm}: unknown host {h!r}")
    mem = {h: r.memory_used for h, r in rooms.items()}
    caps = {h: r.caps_used for h, r in rooms.items()}
    cap_of = {c.vm: c.cap_now for c in changes}
    steps: list[OrderedStep] = []

    # 1. Lower every cap that goes down, on the host the VM runs on now.
    for c in sorted(changes, key=lambda c: c.vm):
        if c.cap_final < c.cap_now - CAP_TOLERANCE:
            steps.append(CapChange(c.vm, c.source, c.cap_final, "lower"))
            caps[c.source] -= c.cap_now - c.cap_final
            cap_of[c.vm] = c.cap_final

    # 2. Migrations in memory-safe waves; cycles broken by relays.
    pending: list[tuple[VmChange, str, str, bool]] = [(c, c.source, c.target, False) for c in changes if c.moves]
    pending.sort(key=lambda p: (-p[0].memory_bytes, p[0].vm))  # big VMs first, while room is plentiful
    wave, relays, total = 0, 0, 0
    while pending:
        wave += 1
        incoming = dict.fromkeys(rooms, 0)
        incoming_caps = dict.fromkeys(rooms, 0.0)
        pairs: dict[tuple[str, str], int] = {}
        started: list[tuple[VmChange, str, str, bool]] = []
        rest: list[tuple[VmChange, str, str, bool]] = []
        cap_blocked: list[int] = []  # indexes into rest: would fit in memory, not yet in cores
        for p in pending:
            c, src, dst, relay = p
            fits = mem[dst] + incoming[dst] + c.memory_bytes <= rooms[dst].memory_bytes
            room = rooms[dst].cores - caps[dst] - incoming_caps[dst]
            if fits and pairs.get((src, dst), 0) < parallel and cap_of[c.vm] <= room + CAP_TOLERANCE:
                started.append(p)
                incoming[dst] += c.memory_bytes
                incoming_caps[dst] += cap_of[c.vm]
                pairs[(src, dst)] = pairs.get((src, dst), 0) + 1
            else:
                if fits and pairs.get((src, dst), 0) < parallel:
                    cap_blocked.append(len(rest))
                rest.append(p)
        if not started and cap_blocked:
            # Every migration that fits in memory waits for cores a VM leaving its destination holds: a cycle.
            # Start the one that is squeezed least.
            i = max(cap_blocked, key=lambda k: (rooms[rest[k][2]].cores - caps[rest[k][2]]) / cap_of[rest[k][0].vm])
            started = [rest.pop(i)]
        if not started:
            hop = _relay(rooms, mem, rest) if relays < 2 * len(changes) else None
            if hop is None:
                raise MigrationBlocked(_blocked_message(rooms, mem, rest))
            i, via = hop
            c, src, dst, _ = rest[i]
            started = [(c, src, via, True)]
            rest[i] = (c, via, dst, True)
            relays += 1
        leaving = []
        for c, src, dst, relay in started:
            mem[dst] += c.memory_bytes
            # The wave's migrations may run at once: a VM leaving dst in this wave still holds its cap there.
            room = rooms[dst].cores - caps[dst]
            squeezed = cap_of[c.vm] > room + CAP_TOLERANCE
            arrival = realisable_cap(max(room, min_cap(c.vcpus)), c.vcpus) if squeezed else cap_of[c.vm]
            leaving.append((src, cap_of[c.vm]))
            caps[dst] += arrival
            cap_of[c.vm] = arrival
            hop_cost = c.cost if move_bytes is None else move_bytes(c, src, dst)
            steps.append(Move(c.vm, src, dst, hop_cost, arrival, wave, relay, squeezed))
            total += hop_cost
        for c, src, _, _ in started:  # the sources are freed once the VMs run on their destinations
            mem[src] -= c.memory_bytes
        for src, cap in leaving:
            caps[src] -= cap
        pending = rest

    # 3. Raise every cap that must go up, now that every VM is where it belongs.
    for c in sorted(changes, key=lambda c: c.vm):
        if c.cap_final > cap_of[c.vm] + CAP_TOLERANCE:
            steps.append(CapChange(c.vm, c.target, c.cap_final, "raise"))
    return MigrationOrder(tuple(steps), total, wave, relays)


def _relay(rooms: Mapping[str, HostRoom], mem: Mapping[str, int],
           pending: Sequence[tuple[VmChange, str, str, bool]]) -> tuple[int, str] | None:
    """The pending migration to send through a third host, and that host: the smallest VM, the roomiest host."""
    for i in sorted(range(len(pending)), key=lambda i: (pending[i][0].memory_bytes, pending[i][0].vm)):
        c, src, dst, _ = pending[i]
        free = [(rooms[h].memory_bytes - mem[h], h) for h in rooms if h not in (src, dst)]
        fitting = [(room, h) for room, h in free if room >= c.memory_bytes]
        if fitting:
            return i, max(fitting)[1]
    return None


def _blocked_message(rooms: Mapping[str, HostRoom], mem: Mapping[str, int],
                     pending: Sequence[tuple[VmChange, str, str, bool]]) -> str:
    c, src, dst, _ = min(pending, key=lambda p: p[0].memory_bytes)
    short = c.memory_bytes - (rooms[dst].memory_bytes - mem[dst])
    return (f"no safe migration order: vm {c.vm} ({c.memory_bytes} bytes) cannot move from {src} to {dst} "
            f"({short} bytes short there) and no other host has room to relay it; "
            f"{len(pending)} migrations blocked; free memory on a host or allow a plan with fewer moves")


def memory_trace(hosts: Iterable[HostRoom], order: MigrationOrder,
                 memory_of: Mapping[str, int]) -> list[dict[str, int]]:
    """Each host's memory use at the peak of every wave (a migrating VM counted on both hosts).

    For checking an order independently of how it was built (tests, plan review).
    """
    mem = {h.name: h.memory_used for h in hosts}
    trace = []
    moves = order.moves
    for w in sorted({m.wave for m in moves}):
        in_wave = [m for m in moves if m.wave == w]
        for m in in_wave:
            mem[m.target] += memory_of[m.vm]
        trace.append(dict(mem))
        for m in in_wave:
            mem[m.source] -= memory_of[m.vm]
    return trace


def plan_steps(order: MigrationOrder) -> tuple[SetCapStep | MigrateStep, ...]:
    """The ordered changes as plan steps, in the same order."""
    out: list[SetCapStep | MigrateStep] = []
    final = {s.vm: s.target for s in order.steps if isinstance(s, Move)}  # the last hop of each VM wins
    for s in order.steps:
        if isinstance(s, Move):
            out.append(MigrateStep(s.vm, s.source, s.target, s.bytes, s.cap_cores,
                                   final[s.vm] if s.relay and final[s.vm] != s.target else None, s.wave,
                                   s.squeezed))
        else:
            out.append(SetCapStep(s.vm, s.host, s.cap_cores))
    return tuple(out)

