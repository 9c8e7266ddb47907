"""Migration throttles: the cluster file's fields, which migrations of a wave may start (pure), and the executor
running a wave within them (in memory).  The lab half is tests/test_throttles_lab.py."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from acting.executor import DONE, NOT_RUN, apply_plan
from hypervisor.memory import MemoryHypervisor
from tests.builders import vm
from vcsched.control.live import adapt_inventory
from vcsched.errors import InputError, VcschedError
from vcsched.formats.cluster import cluster_from_dict
from vcsched.formats.throttles import MigrationThrottles
from vcsched.inventory import HostState
from vcsched.plans.steps import MigrateStep
from vcsched.plans.throttle import admit, schedule
from vcsched.units import GIB, MIB

HOSTS = [{"name": "h0", "uri": "test:///default"}]


def cluster(**fields: Any) -> Any:
    return cluster_from_dict({"name": "c", "hosts": HOSTS, **fields})


# ---------------------------------------------------------------- the cluster file


def test_the_throttles_are_read_from_the_cluster_file() -> None:
    c = cluster(max_migrations=4, max_migrations_per_host=1, migration_bandwidth="100MiB",
                migration_timeout_per_gib=30)
    assert c.throttles == MigrationThrottles(4, 1, 100 * MIB, 30.0)
    assert c.throttles.bandwidth_mib == 100
    assert c.throttles.timeout_for(512 * MIB) == pytest.approx(15.0)


def test_a_cluster_file_without_throttles_limits_nothing() -> None:
    t = cluster().throttles
    assert t == MigrationThrottles() and not t.limits_concurrency() and t.timeout_for(GIB) is None


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_migrations", 0, r"^max_migrations: 0 is not a whole number of migrations >= 1$"),
    ("max_migrations", -2, r"^max_migrations: -2 is not a whole number"),
    ("max_migrations", 1.5, r"^max_migrations: 1.5 is not a whole number"),
    ("max_migrations", True, r"^max_migrations: True is not a whole number"),
    ("max_migrations_per_host", -1, r"^max_migrations_per_host: -1 is not a whole number"),
    ("migration_bandwidth", "-5MiB", r"^migration_bandwidth: '-5MiB' is not a byte size"),
    ("migration_bandwidth", 0, r"^migration_bandwidth: 0 must be above 0$"),
    ("migration_bandwidth", "100MB", r"^migration_bandwidth: '100MB' is 100000000 bytes/s, not a whole number of "
                                     r"MiB/s.*e\.g\. \"95MiB\""),
    ("migration_bandwidth", "fast", r"^migration_bandwidth: 'fast' is not a byte size"),
    ("migration_timeout_per_gib", -1, r"^migration_timeout_per_gib: -1 must be above 0$"),
    ("migration_timeout_per_gib", 0, r"^migration_timeout_per_gib: 0 must be above 0$"),
    ("migration_timeout_per_gib", float("nan"), r"^migration_timeout_per_gib: nan is not a finite number$"),
    ("migration_timeout_per_gib", "30s", r"^migration_timeout_per_gib: expected a number, got '30s'$"),
])
def test_a_bad_throttle_is_one_line_naming_field_and_value(field: str, value: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        cluster(**{field: value})


# ---------------------------------------------------------------- which migrations start (pure)


def test_nothing_limits_an_unthrottled_wave() -> None:
    assert admit([("h0", "h1")] * 5, [], MigrationThrottles()) == [0, 1, 2, 3, 4]


def test_the_cluster_limit_counts_what_runs() -> None:
    t = MigrationThrottles(max_migrations=2)
    assert admit([("h0", "h1"), ("h2", "h3"), ("h4", "h5")], [], t) == [0, 1]
    assert admit([("h2", "h3"), ("h4", "h5")], [("h0", "h1")], t) == [0]
    assert admit([("h4", "h5")], [("h0", "h1"), ("h2", "h3")], t) == []


def test_a_host_limit_counts_arrivals_and_departures_together() -> None:
    t = MigrationThrottles(max_migrations_per_host=1)
    assert admit([("h0", "h1"), ("h0", "h2"), ("h2", "h0")], [], t) == [0]
    assert admit([("h2", "h1")], [("h0", "h1")], t) == []  # h1 already receives one
    assert admit([("h1", "h2")], [("h0", "h1")], t) == []  # h1 already sends ... or receives: one in all


def test_a_later_migration_between_free_hosts_starts_before_one_that_waits() -> None:
    t = MigrationThrottles(max_migrations_per_host=1)
    assert admit([("h0", "h2"), ("h3", "h4")], [("h0", "h1")], t) == [1]


def test_when_nothing_runs_the_first_migration_always_starts() -> None:
    t = MigrationThrottles(max_migrations=1, max_migrations_per_host=1)
    assert admit([("h0", "h1"), ("h0", "h1")], [], t) == [0]


def test_three_migrations_out_of_one_host_run_one_after_another() -> None:
    starts = schedule([("h0", "h1"), ("h0", "h2"), ("h0", "h3")], [3.0, 1.0, 2.0],
                      MigrationThrottles(max_migrations_per_host=1))
    assert starts == [(0.0, 0), (3.0, 1), (4.0, 2)]


def concurrent(ends: list[tuple[str, str]], seconds: list[float], starts: list[tuple[float, int]]) -> list[list[int]]:
    """For each start, which migrations run right after it."""
    out = []
    for t, _ in starts:
        out.append([i for s, i in starts if s <= t < s + seconds[i]])
    return out


@pytest.mark.parametrize("seed", range(20))
def test_a_schedule_never_exceeds_the_limits_and_runs_every_migration(seed: int) -> None:
    rng = random.Random(seed)
    hosts = [f"h{i}" for i in range(rng.randint(2, 6))]
    ends = [tuple(rng.sample(hosts, 2)) for _ in range(rng.randint(1, 12))]
    seconds = [rng.uniform(0.5, 5) for _ in ends]
    t = MigrationThrottles(rng.choice([None, 1, 2, 3]), rng.choice([None, 1, 2]))
    starts = schedule(ends, seconds, t)  # type: ignore[arg-type]
    assert sorted(i for _, i in starts) == list(range(len(ends)))
    for running in concurrent(ends, seconds, starts):  # type: ignore[arg-type]
        if t.max_migrations is not None:
            assert len(running) <= t.max_migrations
        if t.max_migrations_per_host is not None:
            for h in hosts:
                assert sum(h in ends[i] for i in running) <= t.max_migrations_per_host


# ---------------------------------------------------------------- the executor (in memory)


class CountingHypervisor(MemoryHypervisor):
    """Each migration takes ``seconds``; the most migrations seen at once, in all and per host, are recorded."""

    def __init__(self, *args: Any, seconds: float = 0.05, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = seconds
        self._guard = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.in_flight = 0
        self.most_in_flight = 0

    def migrate_vm(self, vm: str, source: str, target: str, cap_cores: float, *,
                   timeout_s: float | None = None) -> None:
        with self._guard:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            for h in (source, target):
                self.now[h] = self.now.get(h, 0) + 1
                self.most[h] = max(self.most.get(h, 0), self.now[h])
        time.sleep(self.seconds)
        with self._guard:
            self.in_flight -= 1
            for h in (source, target):
                self.now[h] -= 1
            super().migrate_vm(vm, source, target, cap_cores, timeout_s=timeout_s)


def three_leave_h0(throttles: MigrationThrottles, **kwargs: Any) -> tuple[CountingHypervisor, Any]:
    """Four 1-core VMs on h0 (1 core, capped at 0.25 each) and three empty hosts: three leave h0 in one wave."""
    hosts = [HostState(f"h{i}", 1, 8 * GIB) for i in range(4)]
    hv = CountingHypervisor("lab", hosts, [vm(f"v{i}", "h0", 1.0, 0.25, "v", mem=GIB // 2) for i in range(4)],
                            **kwargs)
    hv.throttles = throttles
    live = adapt_inventory("lab", hv.inventory(), 4 * GIB)
    assert live.plan is not None
    moves = [s for s in live.plan.steps if isinstance(s, MigrateStep)]
    assert len(moves) == 3 and {m.wave for m in moves} == {1} and {m.source for m in moves} == {"h0"}
    return hv, live.plan


def test_without_throttles_a_wave_runs_its_migrations_at_once() -> None:
    hv, plan = three_leave_h0(MigrationThrottles(), seconds=0.3)
    assert apply_plan(hv, plan).ok
    assert hv.most["h0"] == 3  # the contrast: what the throttles below prevent


def test_one_migration_per_host_runs_a_drain_wave_one_at_a_time() -> None:
    hv, plan = three_leave_h0(MigrationThrottles(max_migrations_per_host=1))
    report = apply_plan(hv, plan)
    assert report.ok, report.to_dict()
    assert hv.most["h0"] == 1
    assert sorted(v.host for v in hv.vms.values()) == ["h0", "h1", "h2", "h3"]


def test_the_cluster_limit_caps_a_wave() -> None:
    hv, plan = three_leave_h0(MigrationThrottles(max_migrations=2), seconds=0.3)
    assert apply_plan(hv, plan).ok
    assert hv.most_in_flight == 2


def test_each_migration_gets_the_timeout_its_bytes_buy() -> None:
    hv, plan = three_leave_h0(MigrationThrottles(timeout_per_gib=10))
    assert apply_plan(hv, plan).ok
    moved = {s.vm: s.bytes for s in plan.steps if isinstance(s, MigrateStep)}
    assert hv.timeouts == {name: pytest.approx(10 * b / GIB) for name, b in moved.items()}
    assert all(t == pytest.approx(5.0) for t in hv.timeouts.values())  # half a GiB each


def test_a_lost_lock_starts_no_further_migration_of_a_throttled_wave() -> None:
    hv, plan = three_leave_h0(MigrationThrottles(max_migrations_per_host=1))
    calls = []

    def guard() -> None:
        calls.append(1)
        if len(calls) > 1:  # the lock is gone once the first migration has run
            raise VcschedError("the cluster lock was lost")

    report = apply_plan(hv, plan, guard=guard)
    moves = [r for r in report.results if isinstance(r.step, MigrateStep)]
    assert [r.outcome for r in moves] == [DONE, NOT_RUN, NOT_RUN]
    assert report.stopped == "the cluster lock was lost" and not report.ok
    assert all(v.active for v in hv.vms.values()) and hv.most["h0"] == 1


def test_status_lists_the_migrations_in_flight_with_the_throttles() -> None:
    from cli.app import console
    from cli.status import render_migrations

    doc = {"migrations": [{"vm": "web-1", "source": "h0", "target": "h1", "elapsed_s": 2.5,
                           "processed_bytes": 3 * MIB, "remaining_bytes": 117 * MIB, "total_bytes": 128 * MIB,
                           "bandwidth_bps": MIB}],
           "throttles": MigrationThrottles(max_migrations_per_host=1, bandwidth=MIB).to_dict()}
    with console.capture() as out:
        render_migrations(doc)
    text = out.get()
    assert "max_migrations_per_host 1" in text and "migration_bandwidth 1 MiB/s" in text
    assert "web-1" in text and "h0" in text and "h1" in text and "117 MiB" in text and "2.5 s" in text
    with console.capture() as out:
        render_migrations({"migrations": [], "throttles": MigrationThrottles().to_dict()})
    assert out.get() == ""  # nothing in flight and no throttles: nothing to say


# ---------------------------------------------------------------- reading a host during a migration


class OldDaemon:
    """A libvirtd before 4.5: getAllDomainStats refuses the NOWAIT flag; answers without it."""

    def __init__(self) -> None:
        self.flags: list[int] = []

    def getAllDomainStats(self, _stats: int, flags: int = 0) -> list[Any]:
        import libvirt

        self.flags.append(flags)
        if flags:
            err = libvirt.libvirtError("unsupported flags (0x40000000)")
            err.err = (libvirt.VIR_ERR_INVALID_ARG, 0, "unsupported flags", 0, "", None, None, 0, 0)
            raise err
        return []


def test_inventories_ask_without_waiting_for_jobs_and_fall_back_on_an_old_daemon() -> None:
    import libvirt

    from hypervisor.drivers import driver_of
    from hypervisor.live_state import host_vms

    conn = OldDaemon()
    assert host_vms("h0", conn, driver_of("QEMU"), lambda _s: None) == ([], {})
    assert conn.flags == [libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT, 0]
