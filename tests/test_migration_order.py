"""Ordering live migrations and cap changes so that no host ever runs out of memory on the way."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcsched.caps import MIN_CAP_CORES
from vcsched.plans.migration import (
    CapChange,
    HostRoom,
    MigrationBlocked,
    MigrationOrder,
    Move,
    VmChange,
    memory_trace,
    order_changes,
)

G = 1 << 30


def rooms(*spec: tuple[str, int, int]) -> list[HostRoom]:
    """Hosts as (name, memory GiB, used GiB), one core each, caps in use filled in later by tests that need it."""
    return [HostRoom(n, m * G, u * G, 1.0, 0.0) for n, m, u in spec]


def vm(name: str, src: str, dst: str, gib: int = 1, cap_now: float = 0.5, cap_final: float = 0.5) -> VmChange:
    return VmChange(name, src, dst, gib * G, cap_now, cap_final)


def replay(order: MigrationOrder, changes: list[VmChange]) -> dict[str, str]:
    where = {c.vm: c.source for c in changes}
    for m in order.moves:
        assert where[m.vm] == m.source
        where[m.vm] = m.target
    return where


def test_a_migration_into_a_full_host_waits_for_the_one_leaving_it() -> None:
    hosts = rooms(("h0", 2, 2), ("h1", 2, 2), ("h2", 2, 1))
    changes = [vm("a", "h0", "h1"), vm("b", "h1", "h2")]
    order = order_changes(hosts, changes)
    assert [(m.vm, m.wave) for m in order.moves] == [("b", 1), ("a", 2)]


def test_a_swap_between_full_hosts_is_relayed_through_a_host_with_room() -> None:
    hosts = rooms(("h0", 2, 2), ("h1", 2, 2), ("h2", 2, 0))
    changes = [vm("a", "h0", "h1"), vm("b", "h1", "h0")]
    order = order_changes(hosts, changes)
    assert order.relays == 1
    assert order.total_bytes == 3 * G  # one VM moves twice
    assert replay(order, changes) == {"a": "h1", "b": "h0"}
    assert any(m.relay and m.target == "h2" for m in order.moves)


def test_a_swap_with_no_room_anywhere_is_reported_as_blocked() -> None:
    hosts = rooms(("h0", 2, 2), ("h1", 2, 2))
    with pytest.raises(MigrationBlocked, match=r"no safe migration order: vm a .* cannot move from h0 to h1"):
        order_changes(hosts, [vm("a", "h0", "h1"), vm("b", "h1", "h0")])


def test_every_wave_keeps_every_host_within_memory() -> None:
    hosts = rooms(("h0", 4, 4), ("h1", 4, 3), ("h2", 4, 2))
    changes = [vm("a", "h0", "h1", 2), vm("b", "h1", "h2", 1), vm("c", "h0", "h2", 1), vm("d", "h2", "h0", 2)]
    order = order_changes(hosts, changes)
    for peak in memory_trace(hosts, order, {c.vm: c.memory_bytes for c in changes}):
        assert all(peak[h.name] <= h.memory_bytes for h in hosts)
    assert replay(order, changes) == {c.vm: c.target for c in changes}


def test_at_most_parallel_migrations_run_at_once_between_two_hosts() -> None:
    hosts = rooms(("h0", 8, 4), ("h1", 8, 0))
    changes = [vm(f"v{i}", "h0", "h1", cap_now=0.25, cap_final=0.25) for i in range(4)]
    assert order_changes(hosts, changes, parallel=1).waves == 4
    assert order_changes(hosts, changes, parallel=2).waves == 2


def test_caps_are_lowered_before_any_migration_and_raised_after_all() -> None:
    hosts = [HostRoom("h0", 4 * G, 2 * G, 1.0, 1.0), HostRoom("h1", 4 * G, 1 * G, 1.0, 0.4)]
    changes = [vm("a", "h0", "h1", cap_now=0.6, cap_final=0.3),
               VmChange("b", "h0", "h0", G, 0.4, 0.7),
               VmChange("c", "h1", "h1", G, 0.4, 0.2)]
    order = order_changes(hosts, changes)
    kinds = ["lower" if isinstance(s, CapChange) and s.phase == "lower" else
             "raise" if isinstance(s, CapChange) else "move" for s in order.steps]
    assert kinds == ["lower", "lower", "move", "raise"]
    (move,) = order.moves
    assert move.cap_cores == pytest.approx(0.3)


def test_a_vm_arrives_with_no_more_cap_than_the_destination_has_free() -> None:
    hosts = [HostRoom("h0", 4 * G, 2 * G, 1.0, 1.0), HostRoom("h1", 4 * G, 1 * G, 1.0, 0.8)]
    changes = [vm("a", "h0", "h1", cap_now=0.5, cap_final=0.5), VmChange("b", "h1", "h1", G, 0.8, 0.5)]
    order = order_changes(hosts, changes)
    steps = list(order.steps)
    assert steps[0] == CapChange("b", "h1", 0.5, "lower")
    assert isinstance(steps[1], Move) and steps[1].cap_cores == pytest.approx(0.5)
    assert len(steps) == 2  # nothing to raise: it arrived with its final cap


def test_an_order_is_deterministic() -> None:
    hosts = rooms(("h0", 4, 4), ("h1", 4, 3), ("h2", 4, 2))
    changes = [vm("a", "h0", "h1", 2), vm("b", "h1", "h2", 1), vm("c", "h0", "h2", 1)]
    assert order_changes(hosts, changes) == order_changes(hosts, list(reversed(changes)))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[HostRoom], list[VmChange]]:
    """Random start and end placements that both fit in memory.

    Fit by construction: each VM goes to a drawn host among those with room for it, at both ends; a VM with no
    room at one end is left out (the tests count the cases that really ordered moves).
    """
    n_hosts = draw(st.integers(2, 5))
    cap = [draw(st.integers(2, 8)) for _ in range(n_hosts)]
    n_vms = draw(st.integers(1, 10))
    sizes = [draw(st.integers(1, 3)) for _ in range(n_vms)]
    used_start, used_end = [0] * n_hosts, [0] * n_hosts
    vms: list[tuple[int, int, int]] = []  # (size GiB, start host, end host)
    for size in sizes:
        starts = [h for h in range(n_hosts) if used_start[h] + size <= cap[h]]
        ends = [h for h in range(n_hosts) if used_end[h] + size <= cap[h]]
        if not starts or not ends:
            continue
        a, b = draw(st.sampled_from(starts)), draw(st.sampled_from(ends))
        used_start[a] += size
        used_end[b] += size
        vms.append((size, a, b))
    hosts = [HostRoom(f"h{h}", cap[h] * G, used_start[h] * G, 1.0, 0.0) for h in range(n_hosts)]
    changes = [VmChange(f"v{i}", f"h{a}", f"h{b}", size * G, 0.1, 0.1) for i, (size, a, b) in enumerate(vms)]
    return hosts, changes


# Both properties below hold vacuously when the order is blocked, so each counts the orders it really checked
# and fails if there were too few.


def test_any_order_found_keeps_memory_within_capacity_and_reaches_the_target() -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=200, deadline=None)
    @given(case=scenarios(), parallel=st.integers(1, 3))
    def check(case: tuple[list[HostRoom], list[VmChange]], parallel: int) -> None:
        hosts, changes = case
        try:
            order = order_changes(hosts, changes, parallel=parallel)
        except MigrationBlocked:
            seen["blocked"] += 1
            return
        seen["ordered"] += 1
        seen["moves"] += len(order.moves)
        for peak in memory_trace(hosts, order, {c.vm: c.memory_bytes for c in changes}):
            assert all(peak[h.name] <= h.memory_bytes for h in hosts)
        assert replay(order, changes) == {c.vm: c.target for c in changes}
        assert order.total_bytes == sum(m.bytes for m in order.moves)
        assert order.total_bytes >= sum(c.cost for c in changes if c.moves)

    check()
    assert seen["ordered"] >= 100 and seen["moves"] >= 200, seen


@st.composite
def capped_scenarios(draw: st.DrawFn) -> tuple[list[HostRoom], list[VmChange]]:
    """:func:`scenarios` with caps: each host's caps sum to at most its one core, before and after."""
    hosts, changes = draw(scenarios())
    on_start = {h.name: sum(1 for c in changes if c.source == h.name) for h in hosts}
    on_end = {h.name: sum(1 for c in changes if c.target == h.name) for h in hosts}
    capped = [VmChange(c.vm, c.source, c.target, c.memory_bytes,
                       draw(st.floats(0.02, 1.0)) / on_start[c.source], draw(st.floats(0.02, 1.0)) / on_end[c.target])
              for c in changes]
    used = {h.name: sum(c.cap_now for c in capped if c.source == h.name) for h in hosts}
    return [HostRoom(h.name, h.memory_bytes, h.memory_used, h.cores, used[h.name]) for h in hosts], capped


def wave_cap_problems(hosts: list[HostRoom], changes: list[VmChange], order: MigrationOrder) -> list[str]:
    """Replay ``order`` with every arrival of a wave capped before any of its departures left its source; the
    hosts whose caps then exceed their cores beyond what squeezed VMs at the floor cap may add."""
    caps: dict[str, dict[str, float]] = {h.name: {} for h in hosts}
    for c in changes:
        caps[c.source][c.vm] = c.cap_now
    cores = {h.name: h.cores for h in hosts}
    squeezed = {m.vm for m in order.moves if m.squeezed}
    problems: list[str] = []

    def check() -> None:
        for h, on in caps.items():
            over = sum(on.values()) - cores[h]
            if over > 1e-9:
                # Only VMs squeezed to the floor cap (no room at all: a swap of full hosts) may push a host over,
                # by that floor each, until the VM that holds the cores has left (possibly a wave later).
                at_floor = [vm for vm, cap in on.items() if cap == MIN_CAP_CORES and vm in squeezed]
                if not at_floor or over > len(at_floor) * MIN_CAP_CORES + 1e-9:
                    problems.append(f"{h}: {on}")

    steps = list(order.steps)
    i = 0
    while i < len(steps):
        s = steps[i]
        if isinstance(s, Move):
            wave = [m for m in steps[i:] if isinstance(m, Move) and m.wave == s.wave]
            for m in wave:
                caps[m.target][m.vm] = m.cap_cores
            check()
            for m in wave:
                caps[m.source].pop(m.vm, None)
            i += len(wave)
        else:
            for on in caps.values():
                on.pop(s.vm, None)
            caps[s.host][s.vm] = s.cap_cores
            check()
            i += 1
    return problems


def test_caps_stay_within_each_host_even_when_a_whole_wave_runs_at_once() -> None:
    """Worst case of a concurrent wave: every arrival capped before any departure has left its source."""
    seen: Counter[str] = Counter()

    @settings(max_examples=200, deadline=None)
    @given(case=capped_scenarios(), parallel=st.integers(1, 3))
    def check(case: tuple[list[HostRoom], list[VmChange]], parallel: int) -> None:
        hosts, changes = case
        try:
            order = order_changes(hosts, changes, parallel=parallel)
        except MigrationBlocked:
            seen["blocked"] += 1
            return
        seen["ordered"] += 1
        assert wave_cap_problems(hosts, changes, order) == []

    check()
    assert seen["ordered"] >= 100, seen


def test_a_swap_between_full_hosts_squeezes_one_vm_once_and_says_so() -> None:
    # x (0.8 cores) goes h0 -> h1 while y (0.8) goes h1 -> h0: memory has room for both at once, cores do not.
    # Run at once, x may land before y leaves, so one of them must arrive below its cap; the other waits
    # one wave, until the first has left its host, and arrives with its whole cap.
    hosts = [HostRoom("h0", 4 * G, G, 1.0, 0.8), HostRoom("h1", 4 * G, G, 1.0, 0.8)]
    order = order_changes(hosts, [VmChange("x", "h0", "h1", G, 0.8, 0.8), VmChange("y", "h1", "h0", G, 0.8, 0.8)])
    first, second = order.moves
    assert (first.wave, second.wave) == (1, 2)
    assert first.squeezed and first.cap_cores == pytest.approx(0.2)
    assert not second.squeezed and second.cap_cores == pytest.approx(0.8)
    raises = {s.vm: s.cap_cores for s in order.steps if isinstance(s, CapChange) and s.phase == "raise"}
    assert raises == {first.vm: 0.8}  # the squeezed one gets its cap back once the swap is over


def test_a_migration_waits_a_wave_rather_than_arrive_below_its_cap() -> None:
    # a leaves h1 for h2 while b comes from h0 to h1: b waits until a has gone, instead of arriving squeezed.
    hosts = [HostRoom("h0", 4 * G, G, 1.0, 0.9), HostRoom("h1", 4 * G, G, 1.0, 0.9), HostRoom("h2", 4 * G, 0, 1.0, 0)]
    order = order_changes(hosts, [VmChange("a", "h1", "h2", G, 0.9, 0.9), VmChange("b", "h0", "h1", G, 0.9, 0.9)])
    assert [(m.vm, m.wave, m.cap_cores, m.squeezed) for m in order.moves] == [("a", 1, 0.9, False),
                                                                           ("b", 2, 0.9, False)]
