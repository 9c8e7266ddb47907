"""Prometheus metrics of `vcsched run`, through the standard ``prometheus-client`` library.

The controller keeps its latest view in a :class:`ControllerMetrics`; a
collector turns it into metric families each time Prometheus scrapes, so a
VM that left disappears from the next scrape (no stale label sets).

==========================================  =====================================================
metric                                      meaning
==========================================  =====================================================
``vcsched_leader``                          1 on the active controller, 0 on a standby
``vcsched_vm_need_cores``                   the need recorded in the VM's metadata (declared)
``vcsched_vm_estimated_need_cores``         the measured need the controller plans with
``vcsched_vm_estimate_confidence``          0..1 (docs/needs.md, need discovery)
``vcsched_vm_cap_cores``                    the VM's cap (absent when uncapped)
``vcsched_vm_used_cores``                   cores used over the latest sample
``vcsched_vm_yield``                        cap over estimated need, at most 1 (the one yield: docs/contention.md)
``vcsched_vm_yield_upper_bound``            1 when the estimate is censored: the yield is an upper bound
``vcsched_vm_min_yield``                    the floor its virtual cluster was admitted with (if any)
``vcsched_cluster_min_yield``, ``_avg_``    over the managed VMs
``vcsched_cluster_min_yield_floor``         the cluster file's ``min_yield`` (0 when it has none)
``vcsched_host_up``                         1 while the host answers, 0 while it is down
``vcsched_host_down_intervals``             intervals in a row the host has been down (0 when up)
``vcsched_host_unmanaged_reserved_cores``   cores every plan keeps for the host's unmanaged domains
``vcsched_unmanaged_used_cores``            an unmanaged domain's cores over the latest sample (``vm``, ``host``)
``vcsched_unmanaged_reserved_cores``        its reservation (docs/introducing.md): measured, else its cap or vCPUs
``vcsched_vms_in_doubt``                    VMs in doubt: active on two hosts at once, or a paused arrival
``vcsched_vms_lost``                        VMs the definitions store records that run nowhere (docs/failures.md)
``vcsched_migrated_bytes_total``            bytes of the migrations applied since start
``vcsched_plans_applied_total{outcome}``    plans applied: ``ok`` or ``failed`` (stopped early)
``vcsched_steps_total{op,outcome}``         plan steps carried out, by kind and outcome
``vcsched_interval_duration_seconds``       wall time of the last interval's work
``vcsched_hosts_failed_total``              hosts declared failed (down for ``failure_timeout``)
``vcsched_fences_total{outcome}``           fence attempts: ``ok`` (off, and status off) or ``failed``
``vcsched_vms_restarted_total``             VMs of failed hosts created again on the survivors
``vcsched_vms_stranded_total``              VMs of failed hosts that could not be restarted (said once each)
``vcsched_restart_seconds``                 summary: from a host declared failed to each of its VMs running
``vcsched_hosts_sleeping``                  hosts vcsched put to sleep (power saving, docs/power.md), not wake-failed
``vcsched_energy_saved_joules_total``       energy saved while this leader led: each sleeping host's idle_watts × s
``vcsched_host_wake_seconds``               a host's longest measured wake (``host``; absent until one was measured)
``vcsched_host_wake_failed``                1 while a host's wake has failed (until `vcsched power clear`), else 0
``vcsched_failover_room_short``             1 while the hosts on lack the room for ``failures_tolerated`` failures
==========================================  =====================================================

Per-VM metrics carry ``vm``, ``host`` and ``vc`` labels, per-host ones a
``host`` label; every metric a ``cluster`` label.  Only the leader reads the
hosts: a standby exports ``vcsched_leader`` 0 and no VM, host, in-doubt or lost
series, so alerts on those follow whichever controller leads.

The alert rules shipped in ``deploy/vcsched.rules.yml`` use these names (a
test scrapes a running ``vcsched run`` and checks every name they use).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vcsched.errors import InputError

#: The steps' kinds and the outcomes counted in ``vcsched_steps_total``: every pair is exported from the start
#: (at 0), so that ``increase()`` over a range sees the first failure (a series born at 1 shows no increase).
STEP_OPS = ("create", "set-cap", "set-need", "migrate", "remove", "adopt", "release")
STEP_OUTCOMES = ("done", "failed")
FAILURE_COUNTERS = ("hosts_failed", "fence_ok", "fence_failed", "vms_restarted", "vms_stranded")


@dataclass(frozen=True)
class HostMetrics:
    host: str
    up: bool
    down_intervals: int = 0
    unmanaged_cores: float = 0.0  # its unmanaged domains' reservation (vcsched/control/unmanaged.py)


@dataclass(frozen=True)
class UnmanagedMetrics:
    """One running unmanaged domain: what it used and what every plan keeps for it."""

    vm: str
    host: str
    used: float | None
    reserved: float


@dataclass(frozen=True)
class VmMetrics:
    vm: str
    host: str
    vc: str
    need: float
    estimate: float
    confidence: float
    cap: float | None
    used: float | None
    yield_: float
    floor: float | None = None  # the min_yield recorded in its metadata
    upper_bound: bool = False  # the estimate is censored (a lower bound on the need): the yield may be lower


@dataclass
class ControllerMetrics:
    cluster: str
    min_yield_floor: float = 0.0  # the cluster file's min_yield
    leader: bool = False
    vms: tuple[VmMetrics, ...] = ()
    hosts: tuple[HostMetrics, ...] = ()
    unmanaged: tuple[UnmanagedMetrics, ...] = ()
    in_doubt: int | None = None  # None: not read (a standby)
    lost: int | None = None  # recorded VMs running nowhere (vcsched/control/lost.py); None: not read
    min_yield: float | None = None
    avg_yield: float | None = None
    migrated_bytes: int = 0
    plans: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0})
    steps: dict[tuple[str, str], int] = field(
        default_factory=lambda: {(op, outcome): 0 for op in STEP_OPS for outcome in STEP_OUTCOMES})
    interval_seconds: float | None = None
    #: Failed hosts (acting/failure.py): counters, and the seconds from failure to each restart (sum, count).
    failures: dict[str, int] = field(default_factory=lambda: {k: 0 for k in FAILURE_COUNTERS})
    restart_seconds: tuple[float, int] = (0.0, 0)
    #: The last audited plan's gains of the lowest yield among its VMs (vcsched/control/audit.py), and how many
    #: plans were audited, by result (met, short, unmeasured).
    plan_gain_predicted: float | None = None
    plan_gain_achieved: float | None = None
    audits: dict[str, int] = field(default_factory=lambda: {"met": 0, "short": 0, "unmeasured": 0})
    #: Power saving (None / empty: not managed): hosts sleeping, each host's longest measured wake and whether its
    #: wake failed, the joules saved since start, whether the failover room is short now.
    hosts_sleeping: int | None = None
    wake_seconds: dict[str, float] = field(default_factory=dict)
    wake_failed: dict[str, bool] = field(default_factory=dict)
    energy_saved_joules: float = 0.0
    failover_room_short: bool | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set_power(self, sleeping: int, wake_seconds: dict[str, float], wake_failed: dict[str, bool],
                  saved_joules: float, room_short: bool) -> None:
        """One interval's power view; ``saved_joules``: the energy saved since the last (added to the counter)."""
        with self.lock:
            self.hosts_sleeping = sleeping
            self.wake_seconds = dict(wake_seconds)
            self.wake_failed = dict(wake_failed)
            self.energy_saved_joules += max(saved_joules, 0.0)
            self.failover_room_short = room_short

    def clear_power(self) -> None:
        """A standby reads no power record: no power series (the counter keeps its value for a later lead)."""
        with self.lock:
            self.hosts_sleeping = None
            self.wake_seconds, self.wake_failed, self.failover_room_short = {}, {}, None

    def set_hosts(self, hosts: tuple[HostMetrics, ...], in_doubt: int | None,
                  unmanaged: tuple[UnmanagedMetrics, ...] = ()) -> None:
        with self.lock:
            self.hosts = hosts
            self.in_doubt = in_doubt
            self.unmanaged = unmanaged

    def set_lost(self, lost: int | None) -> None:
        with self.lock:
            self.lost = lost

    def add_step(self, op: str, outcome: str) -> None:
        with self.lock:
            self.steps[op, outcome] = self.steps.get((op, outcome), 0) + 1

    def set_vms(self, vms: tuple[VmMetrics, ...]) -> None:
        with self.lock:
            self.vms = vms
            ys = [v.yield_ for v in vms]
            self.min_yield = min(ys) if ys else None
            self.avg_yield = sum(ys) / len(ys) if ys else None

    def add_failure(self, what: str) -> None:
        with self.lock:
            self.failures[what] = self.failures.get(what, 0) + 1

    def add_restart(self, seconds: float) -> None:
        with self.lock:
            self.failures["vms_restarted"] += 1
            total, n = self.restart_seconds
            self.restart_seconds = (total + seconds, n + 1)

    def add_audit(self, predicted: float, achieved: float | None, result: str) -> None:
        with self.lock:
            self.plan_gain_predicted = predicted
            self.plan_gain_achieved = achieved
            self.audits[result] = self.audits.get(result, 0) + 1

    def add_plan(self, ok: bool, migrated_bytes: int) -> None:
        with self.lock:
            self.plans["ok" if ok else "failed"] += 1
            self.migrated_bytes += migrated_bytes


class _Collector:
    def __init__(self, metrics: ControllerMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families depend on what runs

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        m = self.m
        with m.lock:
            c = m.cluster
            leader = GaugeMetricFamily("vcsched_leader", "1 on the active vcsched run controller, 0 on a standby",
                                       labels=["cluster"])
            leader.add_metric([c], 1.0 if m.leader else 0.0)
            yield leader
            per_vm = [
                ("vcsched_vm_need_cores", "CPU need recorded in the VM's metadata (cores)", lambda v: v.need),
                ("vcsched_vm_estimated_need_cores", "measured CPU need the controller plans with (cores)",
                 lambda v: v.estimate),
                ("vcsched_vm_estimate_confidence", "confidence of the estimated need (0..1)", lambda v: v.confidence),
                ("vcsched_vm_cap_cores", "the VM's CPU cap (cores)", lambda v: v.cap),
                ("vcsched_vm_used_cores", "cores the VM used over the latest sample", lambda v: v.used),
                ("vcsched_vm_yield", "cap over estimated need, at most 1", lambda v: v.yield_),
                ("vcsched_vm_yield_upper_bound", "1: the need estimate is censored, the yield is an upper bound",
                 lambda v: 1.0 if v.upper_bound else 0.0),
                ("vcsched_vm_min_yield", "the floor (min_yield) the VM's virtual cluster was admitted with",
                 lambda v: v.floor),
            ]
            for name, doc, get in per_vm:
                fam = GaugeMetricFamily(name, doc, labels=["cluster", "vm", "host", "vc"])
                for v in m.vms:
                    value = get(v)
                    if value is not None:
                        fam.add_metric([c, v.vm, v.host, v.vc], float(value))
                yield fam
            for name, doc, value in (("vcsched_cluster_min_yield", "minimum yield over managed VMs", m.min_yield),
                                     ("vcsched_cluster_avg_yield", "average yield over managed VMs", m.avg_yield),
                                     ("vcsched_cluster_min_yield_floor", "the cluster file's min_yield (0: none)",
                                      m.min_yield_floor),
                                     ("vcsched_vms_in_doubt", "VMs in doubt: on two hosts at once, or a paused arrival",
                                      m.in_doubt),
                                     ("vcsched_vms_lost", "VMs the definitions store records that run nowhere",
                                      m.lost),
                                     ("vcsched_interval_duration_seconds", "wall time of the last interval's work",
                                      m.interval_seconds)):
                fam = GaugeMetricFamily(name, doc, labels=["cluster"])
                if value is not None:
                    fam.add_metric([c], float(value))
                yield fam
            up = GaugeMetricFamily("vcsched_host_up", "1 while the host answers libvirt, 0 while it is down",
                                   labels=["cluster", "host"])
            down = GaugeMetricFamily("vcsched_host_down_intervals", "intervals in a row the host has been down",
                                     labels=["cluster", "host"])
            reserved = GaugeMetricFamily("vcsched_host_unmanaged_reserved_cores", "cores every plan keeps for the "
                                         "host's unmanaged domains", labels=["cluster", "host"])
            for h in m.hosts:
                up.add_metric([c, h.host], 1.0 if h.up else 0.0)
                down.add_metric([c, h.host], float(h.down_intervals))
                if h.up:
                    reserved.add_metric([c, h.host], h.unmanaged_cores)
            yield up
            yield down
            yield reserved
            used = GaugeMetricFamily("vcsched_unmanaged_used_cores", "cores an unmanaged domain used over the latest "
                                     "sample", labels=["cluster", "vm", "host"])
            kept = GaugeMetricFamily("vcsched_unmanaged_reserved_cores", "cores reserved for an unmanaged domain",
                                     labels=["cluster", "vm", "host"])
            for u in m.unmanaged:
                if u.used is not None:
                    used.add_metric([c, u.vm, u.host], u.used)
                kept.add_metric([c, u.vm, u.host], u.reserved)
            yield used
            yield kept
            moved = CounterMetricFamily("vcsched_migrated_bytes", "bytes moved by applied live migrations",
                                        labels=["cluster"])
            moved.add_metric([c], float(m.migrated_bytes))
            yield moved
            plans = CounterMetricFamily("vcsched_plans_applied", "plans applied, by outcome",
                                        labels=["cluster", "outcome"])
            for outcome, n in sorted(m.plans.items()):
                plans.add_metric([c, outcome], float(n))
            yield plans
            for name, doc, value in (
                    ("vcsched_plan_gain_predicted", "the last audited plan's predicted gain of the lowest yield "
                     "among the VMs it touched", m.plan_gain_predicted),
                    ("vcsched_plan_gain_achieved", "the last audited plan's achieved gain of that yield, measured "
                     "once it settled (use over need, after less before)", m.plan_gain_achieved)):
                fam = GaugeMetricFamily(name, doc, labels=["cluster"])
                if value is not None:
                    fam.add_metric([c], float(value))
                yield fam
            audits = CounterMetricFamily("vcsched_plan_audits", "applied plans audited once settled, by result "
                                         "(met, short: achieved gain under predicted, unmeasured)",
                                         labels=["cluster", "result"])
            for result, n in sorted(m.audits.items()):
                audits.add_metric([c, result], float(n))
            yield audits
            steps = CounterMetricFamily("vcsched_steps", "plan steps carried out, by kind and outcome",
                                        labels=["cluster", "op", "outcome"])
            for (op, outcome), n in sorted(m.steps.items()):
                steps.add_metric([c, op, outcome], float(n))
            yield steps
            f = m.failures
            for name, doc, key in (("vcsched_hosts_failed", "hosts declared failed", "hosts_failed"),
                                   ("vcsched_vms_restarted", "VMs of failed hosts created again", "vms_restarted"),
                                   ("vcsched_vms_stranded", "VMs of failed hosts not restarted", "vms_stranded")):
                counter = CounterMetricFamily(name, doc, labels=["cluster"])
                counter.add_metric([c], float(f.get(key, 0)))
                yield counter
            fences = CounterMetricFamily("vcsched_fences", "fence attempts, by outcome", labels=["cluster", "outcome"])
            fences.add_metric([c, "ok"], float(f.get("fence_ok", 0)))
            fences.add_metric([c, "failed"], float(f.get("fence_failed", 0)))
            yield fences
            total, n = m.restart_seconds
            restart = SummaryMetricFamily("vcsched_restart_seconds", "seconds from a host declared failed to each "
                                          "of its VMs running again", labels=["cluster"])
            restart.add_metric([c], count_value=n, sum_value=total)
            yield restart
            yield from self._power(c)

    def _power(self, c: str) -> Iterator[Any]:
        """The power-saving families: exported only by a leader that manages power (``hosts_sleeping`` read)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self.m
        if m.hosts_sleeping is None:
            return
        sleeping = GaugeMetricFamily("vcsched_hosts_sleeping", "hosts vcsched put to sleep (not wake-failed)",
                                     labels=["cluster"])
        sleeping.add_metric([c], float(m.hosts_sleeping))
        yield sleeping
        short = GaugeMetricFamily("vcsched_failover_room_short", "1 while the hosts on lack the room for "
                                  "failures_tolerated host failures", labels=["cluster"])
        short.add_metric([c], 1.0 if m.failover_room_short else 0.0)
        yield short
        saved = CounterMetricFamily("vcsched_energy_saved_joules", "energy saved by sleeping hosts while this "
                                    "controller led: each one's idle_watts times the seconds it slept",
                                    labels=["cluster"])
        saved.add_metric([c], m.energy_saved_joules)
        yield saved
        wake = GaugeMetricFamily("vcsched_host_wake_seconds", "the longest wake measured for the host (seconds "
                                 "from power on to libvirt answering as the host that slept)",
                                 labels=["cluster", "host"])
        for host, seconds in sorted(m.wake_seconds.items()):
            wake.add_metric([c, host], seconds)
        yield wake
        failed = GaugeMetricFamily("vcsched_host_wake_failed", "1 while the host's wake has failed (never chosen "
                                   "again until `vcsched power clear`)", labels=["cluster", "host"])
        for host, bad in sorted(m.wake_failed.items()):
            failed.add_metric([c, host], 1.0 if bad else 0.0)
        yield failed


class MetricsServer:
    """The HTTP endpoint Prometheus scrapes (``/metrics``), bound at once so a bad port fails before anything."""

    def __init__(self, metrics: ControllerMetrics, port: int, addr: str = "127.0.0.1") -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(metrics))
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise InputError(f"--metrics-port {port}: cannot listen on {addr}:{port} ({exc.strerror or exc})") \
                from None
        self.addr, self.port = self._server.server_address[:2]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
