"""`vcsched run`: the controller that observes, re-caps and re-balances a cluster on its own, one interval at a time.

Per interval, on the leader (see *Leadership* below):

1. read the inventory; note hosts that stopped or started answering (a down
   host is left out of everything until it answers again);
2. estimate every managed VM's need from the samples of the last window
   (:mod:`vcsched.control.observe`);
3. *probe*: VMs at their cap with their full estimate get their host's unused
   capacity for ``probe_seconds`` (a set-cap plan through the executor, under
   the cluster lock), sampled, and estimated again;
4. power saving (:attr:`Controller.power_saving`, docs/power.md §8): a host may be put to sleep or woken (or
   that proposed); an interval that did either ends there, re-balancing on the hosts as they are next time;
5. decide (:class:`vcsched.control.rebalance.Rebalancer`): re-cap to the
   measured needs, or re-balance with migrations within the per-interval
   budget when the gain beats the threshold for long enough and no VM in its
   cool-down moves;
6. apply: take the cluster lock, read the inventory again, compute the same
   kind of plan on it, and apply it through the executor with a guard that
   stops before the next step if leadership or the cluster lock is lost or
   the process was asked to stop;
7. sample CPU use until the next interval.

The first interval of a new leader only samples (it has no window yet):
caps, needs and cool-downs are all in libvirt (the VMs' caps and metadata),
so a restarted controller or a new leader continues from there, and the
estimator's memory rebuilds within one window.

**Faults.**  Any error in an interval (libvirt, the solver, the lock
service) is logged as an ``error`` event and the next interval starts
afresh, with new connections.  A step running when SIGTERM arrives finishes;
no further step starts and :meth:`Controller.run` returns.

**Probe caps are put back on every way out.**  A probe's raised caps are
written to this process's journal (:mod:`hypervisor.journal`) before they
are raised.  They stay raised only if this interval's plan then sets the
caps (it is applied whole, or there was nothing to change); on any other
outcome — no plan, a failed or refused plan, the lock busy, an error, a stop
(SIGTERM, SIGINT, ``--duration``) or losing leadership — the interval ends by
putting back every probe cap still at its raised value, under the cluster
lock, and clearing the journal.  What cannot be put back then (the lock
busy, a host down) stays in the journal and is tried again at the start of
the next interval and when :meth:`Controller.run` returns.  Every interval
also starts by putting back the probe caps of processes that died with them
raised (SIGKILL, a crash): their journals, on this machine.

**Leadership.**  The leader is whoever holds the cluster's *leader lock*
(:func:`acting.lock.leader_lock_name`), an ordinary cluster-lock-kind
tooz lock: on etcd a key on a lease renewed every third of the TTL.  A
standby tries to take it every interval, so it takes over at most one TTL
(the dead leader's lease running out) plus one interval after the leader
dies.  The leader checks its lease (``guard``) at every sampling round and
before every step: one that cannot renew for 0.6 TTL stops acting before the
lease could have expired, releases it and becomes a standby.  Acting on
hosts also takes the ordinary cluster lock, like every command that changes
hosts.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from acting.definitions import StoreError
from acting.events import EventLog
from acting.executor import DONE, ApplyReport, StepResult
from acting.failure import Failover, FailureState
from acting.lock import LockBusy
from acting.metrics import ControllerMetrics, HostMetrics, UnmanagedMetrics, VmMetrics
from acting.power import asleep_in, sleep_host, wake_host
from acting.power_saving import (
    TREND_INTERVALS,
    PowerSaving,
    empty_plan,
    proposal,
    room_short_now,
    settle_waking,
    sleep_held,
    wake_test_due,
)
from acting.recovery import (
    NotFailed,
    RecoveryRun,
    RestartRun,
    plan_host_recovery,
    plan_lost_restart,
    recover_host,
    restart_lost,
)
from acting.restore import restore_journal
from acting.sampling import Clock, CpuSampler, SystemClock
from acting.unit_of_work import Reporting, UnitOfWork
from hypervisor.base import Hypervisor
from hypervisor.journal import PROBE, Journal, journal_dir, pending, probe_entries
from vcsched.control.audit import DEFAULT_SETTLE_WINDOWS, AuditLog, Pending, audit, interrupted, mean_used
from vcsched.control.audit import add as add_audit
from vcsched.control.audit import pending as pending_audit
from vcsched.control.observe import DEFAULT_PARAMS, Estimate, ObserveParams, cap_plan, estimate_all, probe_caps
from vcsched.control.rebalance import NOTHING, Decision, RebalanceOptions, Rebalancer
from vcsched.control.recommend import (
    APPLIED,
    Book,
    new_recommendation,
    note_needs,
    recommendation_id,
    record,
    worth_proposing,
)
from vcsched.control.status import vm_yield
from vcsched.control.unmanaged import unmanaged_io_reserves, unmanaged_reserves
from vcsched.errors import InputError, VcschedError
from vcsched.inventory import Inventory
from vcsched.plans.plan import Plan
from vcsched.plans.reasons import effect, step_reasons
from vcsched.plans.repair import plan_repair
from vcsched.plans.steps import CreateStep, MigrateStep

if TYPE_CHECKING:
    from acting.fence import FenceResult
    from vcsched.control.power import PowerDecision, PowerState
    from vcsched.formats.cluster import ClusterHost
    from vcsched.plans.repair import RepairReport


T = TypeVar("T")
#: Intervals of each VM's mean use the controller keeps: an approval is audited against the last window that ended
#: before it was approved, and applying it (its migrations) may take several intervals.
USED_HISTORY = 16


class Stopping(VcschedError):
    """The controller was asked to stop (SIGTERM): the running step finished, no further step starts."""

    exit_code = 0


class Recommendations(Protocol):
    """What the controller needs of a :class:`acting.recommendations.RecommendationStore`."""

    def read(self) -> Book: ...

    def update(self, change: Callable[[Book], tuple[Book, T]]) -> T: ...


class Audits(Protocol):
    """What the controller needs of a :class:`acting.audits.AuditStore`."""

    def update(self, change: Callable[[AuditLog], tuple[AuditLog, T]]) -> T: ...


class Lock(Protocol):
    """What the controller needs of a :class:`acting.lock.ClusterLock` (tests pass fakes)."""

    member: str

    def acquire(self, wait: float = 0.0) -> None: ...

    def guard(self) -> None: ...

    def held(self) -> bool: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    interval: float
    rebalance: RebalanceOptions
    window: float | None = None  # seconds of samples the estimate uses (default: one interval)
    sample: float | None = None  # seconds between sampling rounds (default: min(2, interval / 4))
    probe_seconds: float | None = None  # default: min(5, interval / 3); 0: never probe
    lock_wait: float | None = None  # seconds to wait for the cluster lock (default: min(5, interval / 2))
    dry_run: bool = False
    params: ObserveParams = DEFAULT_PARAMS
    #: ``--mode recommend``: decide as when acting, but record each plan as a recommendation instead of applying
    #: it (and never probe: nothing changes hosts).
    recommend: bool = False
    valid_for: float = 600.0  # seconds a recommendation stays valid
    #: Windows an applied plan (or an approved recommendation) settles before it is audited (vcsched/control/audit.py).
    audit_windows: int = DEFAULT_SETTLE_WINDOWS

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise InputError(f"--interval: {self.interval!r} must be above 0 seconds")
        for name in ("window", "sample"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise InputError(f"--{name}: {value!r} must be above 0 seconds")
        if self.audit_windows < 1:
            raise InputError(f"--audit-after: {self.audit_windows!r} is below 1 window")
        for name in ("probe_seconds", "lock_wait"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise InputError(f"--{name.replace('_', '-')}: {value!r} must be at least 0 seconds")

    @property
    def window_s(self) -> float:
        return self.window if self.window is not None else self.interval

    @property
    def sample_s(self) -> float:
        return self.sample if self.sample is not None else min(2.0, self.interval / 4)

    @property
    def probe_s(self) -> float:
        return self.probe_seconds if self.probe_seconds is not None else min(5.0, self.interval / 3)

    @property
    def audit_settle_s(self) -> float:
        return self.audit_windows * self.window_s

    @property
    def lock_wait_s(self) -> float:
        return self.lock_wait if self.lock_wait is not None else min(5.0, self.interval / 2)


@dataclass
class _Leadership:
    lock: Lock | None = None
    since: float = 0.0  # monotonic time it was taken
    state: str | None = None  # "leader" / "standby" as last logged


#: Decision kinds that start VMs again rather than move or re-cap running ones.
RESTARTS = frozenset({"restart", "recover"})


def answered(inventory: Inventory) -> frozenset[str]:
    """The hosts that answered the read ``inventory`` comes from (what the next sampling round reads)."""
    return frozenset(h.name for h in inventory.hosts if h.down is None)


@dataclass
class Controller:
    """One `vcsched run` process (module docstring).  ``hv`` stays open; errors close its connections."""

    cluster: str
    hv: Hypervisor
    options: RunOptions
    leader_lock: Callable[[], Lock]  # a fresh, unacquired leader lock
    cluster_lock: Callable[[], Lock]  # a fresh, unacquired cluster lock
    events: EventLog
    metrics: ControllerMetrics
    clock: Clock = field(default_factory=SystemClock)
    stop: threading.Event = field(default_factory=threading.Event)
    #: Where probe journals live (default: ``<state dir>/journal``, hypervisor.journal).
    journals: Path | None = None
    #: Failed hosts: detected, fenced, their VMs restarted (acting/failure.py); None: hosts down are only
    #: reported, as before.
    failover: Failover | None = None
    #: The recommendations book (vetoes are respected in both modes; recommend mode records there).
    recommendations: Recommendations | None = None
    #: Where the audits of applied plans are kept (None: only their events and metrics).
    audits: Audits | None = None
    #: Where the leader publishes what each managed VM used over its last sample, after each interval
    #: (acting/window.py: `status` shows it instead of sampling again); None: not published.
    window: Callable[[Mapping[str, float | None]], None] | None = None
    #: Reads the cluster's power record (acting/power.py): a host vcsched put to sleep is read as asleep, not
    #: down — never declared failed, never fenced.  None: no record (every host that does not answer is down).
    power: Callable[[], PowerState] | None = None
    #: Power saving (acting/power_saving.py): with the cluster file's ``power_saving`` "auto" hosts are put to sleep
    #: and woken, with "recommend" (or ``--mode recommend``) proposed; None: never (docs/power.md §8).
    power_saving: PowerSaving | None = None
    #: Whether a wave's migrations run at once, in threads (:class:`acting.unit_of_work.UnitOfWork`'s ``threads``):
    #: False in the fault simulation, whose schedules must replay exactly (threads interleave as the OS schedules).
    threads: bool = True

    def __post_init__(self) -> None:
        if self.power_saving is not None and self.power is None:
            self.power = self.power_saving.store.read
        self._lead = _Leadership()
        self._fresh_state()
        self._next_tick: float | None = None
        self.ticks = 0
        self._journal = Journal(PROBE, self.journals or journal_dir())
        #: Probe caps are raised and this interval's plan has not (yet) taken them over (module docstring).
        self._probe_open = False
        #: The hosts in-doubt VMs waited for at the last settlement (a recovery fences such a host even with
        #: nothing to restart: :func:`vcsched.control.failover.plan_recovery`'s ``waited_on``).
        self._blocked: frozenset[str] = frozenset()

    def _fresh_state(self) -> None:
        """What a new leader knows: nothing but libvirt (module docstring)."""
        o = self.options
        # One sampling period more than the window: the oldest sample of a window begins where the window does,
        # give or take the period, and one that began a moment before must not be dropped (as `observe` does).
        # every_vm: unmanaged domains are sampled too, for their reservation (vcsched/control/unmanaged.py).
        self.sampler = CpuSampler(o.window_s + o.sample_s, self.clock, min_seconds=o.sample_s / 2, every_vm=True)
        self.rebalancer = Rebalancer(o.rebalance)
        self.estimates: dict[str, Estimate] = {}
        self.planned: dict[str, float] = {}
        #: The CPU signals hosts lacked when last said (a ``signals`` event whenever it changes: docs/contention.md).
        self.signals_missing: dict[str, tuple[str, ...]] | None = None
        self.down: dict[str, str] = {}
        self.down_intervals: dict[str, int] = {}  # host -> intervals in a row it was found down (the metric)
        self.failures = FailureState()
        # The hosts the sampling rounds between two intervals read: those that answered the interval's own read
        # and every round since (None: every host).  A host that does not answer costs its host_timeout on each
        # read; asked again every round (every --sample seconds) a hung host stretched each interval several
        # times over (a 2 s interval took ~10 s in the lab), and with it failure detection and every decision.
        # It is asked again at the next interval's read, which is what failure detection counts.
        self.round_hosts: frozenset[str] | None = None
        # Audits (vcsched/control/audit.py): plans applied and not yet settled, with when they are due (monotonic);
        # the recommendations seen applied (None: not read yet: those applied before this leader are not
        # audited); each VM's mean use over each recent interval's window, with when it ended (an act-mode plan's
        # "before": the newest; an approval's: the newest that ended before it was approved).
        # Power saving: since when each host's sleep condition has held without a break (a new leader counts again
        # from nothing: it did not watch), the measured needs of the last intervals (the demand's trend), and when
        # the energy saved was last counted; the hosts on when the counts were last taken (a host slept or woke
        # by someone else — an approved proposal, `vcsched power`, `place --apply` — starts every count again).
        self.ready_since: dict[str, float | None] = {}
        self.counted_on: frozenset[str] | None = None
        self.needs_history: collections.deque[tuple[float, dict[str, float]]] = collections.deque(
            maxlen=TREND_INTERVALS)
        self.energy_counted_at: float | None = None
        self.pending_audits: list[tuple[float, Pending]] = []
        self._known_applied: set[str] | None = None
        self._used_prev: dict[str, float | None] = {}
        self._used_history: collections.deque[tuple[float, dict[str, float | None]]] = collections.deque(
            maxlen=USED_HISTORY)

    @property
    def leader(self) -> bool:
        return self._lead.lock is not None

    # ------------------------------------------------------------------ leadership

    def _log_state(self, state: str, **fields: Any) -> None:
        if self._lead.state != state:
            self._lead.state = state
            self.events.emit(state, cluster=self.cluster, **fields)
        self.metrics.leader = state == "leader"

    def _try_lead(self, renew: bool = True) -> None:
        """A standby tries to take the leader lock; the leader checks it still holds it (``renew``: asking the
        backend, which may block for the client's timeout; else only the time of the last renewal)."""
        lock = self._lead.lock
        if lock is not None:
            if not lock.held():
                self._step_down("the leader lock: not renewed for too long; "
                                "standing down before its lease can expire")
                return
            if renew:
                try:
                    lock.guard()
                except VcschedError as exc:
                    self._step_down(f"the leader lock: {exc}")
            return
        lock = self.leader_lock()
        try:
            lock.acquire(0.0)
        except LockBusy as exc:
            self._log_state("standby", reason=str(exc))
            return
        except VcschedError as exc:  # the coordination service is down: nobody can lead; try again later
            self._log_state("standby", reason=str(exc))
            return
        self._lead = _Leadership(lock, self.clock.monotonic(), self._lead.state)
        self._fresh_state()
        self._log_state("leader")

    def _step_down(self, reason: str) -> None:
        lock, self._lead.lock = self._lead.lock, None
        self.metrics.set_vms(())
        self.metrics.set_hosts((), None)  # a standby reads no host: the leader's series are the ones to alert on
        self.metrics.set_lost(None)
        self.metrics.clear_power()
        self._log_state("standby", reason=reason)  # first: releasing may wait on a coordination service that hangs
        if lock is not None:
            with contextlib.suppress(Exception):
                lock.release()

    def _guard(self, cluster_lock: Lock | None) -> Callable[[], None]:
        """Before every step: not stopping, still the leader, still holding the cluster lock."""
        def guard() -> None:
            if self.stop.is_set():
                raise Stopping("stopping (SIGTERM): the running step finished, no further step is started")
            if self._lead.lock is None:
                raise Stopping("no longer the leader")
            self._lead.lock.guard()
            if cluster_lock is not None:
                cluster_lock.guard()
        return guard

    def _acting(self) -> UnitOfWork:
        """The unit of work of one change of hosts (acting/unit_of_work.py): the cluster lock (busy: LockBusy),
        in-doubt VMs settled first (each a ``repair`` event), every step under :meth:`_guard`, recorded in the
        definitions store; a dry run takes no lock and changes nothing."""
        def settled(report: RepairReport) -> None:
            self._blocked = frozenset((*report.plan.blocked, *report.plan.leftovers))
            for a, outcome, detail in report.outcomes:
                self.events.emit("repair", vm=a.vm, host=a.host, action=a.action, outcome=outcome,
                                 detail=detail or a.why)

        def warn(line: str) -> None:
            self.events.emit("error", during="definitions", error=line, type="StoreError")

        return UnitOfWork(self.hv, None if self.options.dry_run else self.cluster_lock(),
                          wait=self.options.lock_wait_s,
                          store=self.failover.store if self.failover is not None else None,
                          reporting=Reporting(note=warn, settled=settled), before_step=self._guard(None),
                          power=self.power, threads=self.threads)

    # ------------------------------------------------------------------ the loop

    def run(self, **start: Any) -> None:
        """Until :attr:`stop` is set: be leader or standby, and act every interval as leader.

        ``start``: more fields for the ``start`` event (where the metrics are served).
        """
        o = self.options
        self.events.emit("start", cluster=self.cluster, interval=o.interval, budget=o.rebalance.budget,
                         threshold=o.rebalance.threshold, window=o.window_s, sample=o.sample_s,
                         cooldown=o.rebalance.cooldown, settle=o.rebalance.settle, probe_seconds=o.probe_s,
                         dry_run=o.dry_run, mode="recommend" if o.recommend else "act",
                         schedule=o.rebalance.schedule.to_dict(), **start)
        try:
            while not self.stop.is_set():
                self.cycle()
        finally:
            self.finish()

    def finish(self) -> None:
        """The way out of :meth:`run` (stopped, or an error): put back this process's probe caps still raised, stand
        down as leader, say ``stop``.  The fault simulation calls it after a SIGTERM (docs/faultsim.md)."""
        if self._probe_open or self._journal.exists():
            self._put_back_probe()
        was_leader = self.leader
        if was_leader:
            self._step_down("stopping")
        self.events.emit("stop", cluster=self.cluster, was_leader=was_leader)

    def cycle(self) -> None:
        """One interval: leadership, the interval's work (leader), then sampling (leader) or waiting until the next."""
        now = self.clock.monotonic()
        if self._next_tick is None:
            self._next_tick = now
        self._try_lead()
        if self.leader and not self.stop.is_set():
            self.tick()
        self._next_tick += self.options.interval
        now = self.clock.monotonic()
        if self._next_tick < now:  # the work took longer than an interval: start the next one now
            self._next_tick = now
        self._idle_until(self._next_tick)

    def _idle_until(self, deadline: float) -> None:
        """Wait for ``deadline``; the leader samples meanwhile, in equal periods of at most ``--sample`` that end
        on it (a short last period would make no sample: :mod:`acting.sampling`)."""
        while not self.stop.is_set():
            left = deadline - self.clock.monotonic()
            if left <= 1e-9:
                return
            if self.leader:
                rounds = max(1, math.ceil(left / self.options.sample_s - 1e-9))
                if self.clock.wait(left / rounds, self.stop):
                    return
                self._sample()
                self._try_lead(renew=False)  # the lock's own heartbeat renews; this only looks
            elif self.clock.wait(left, self.stop):
                return

    def _sample(self, probe: frozenset[str] = frozenset()) -> Inventory | None:
        """One sampling round between intervals, of the hosts still answering (:attr:`round_hosts`)."""
        try:
            inventory = self.sampler.sample(self.hv, probe, hosts=self.round_hosts)
        except Exception as exc:  # one failed round is a gap in the samples, not a reason to stop
            self._error("sample", exc)
            return None
        self.round_hosts = answered(inventory)
        return inventory

    def _error(self, during: str, exc: BaseException) -> None:
        self.events.emit("error", during=during, error=str(exc) or type(exc).__name__, type=type(exc).__name__)
        with contextlib.suppress(Exception):
            self.hv.close()  # reconnect next time: the daemon may be back

    # ------------------------------------------------------------------ one interval

    def tick(self) -> None:
        start = self.clock.monotonic()
        self.ticks += 1
        try:
            self._put_back_left()
            self._work()
        except Stopping:
            pass
        except Exception as exc:
            self._error("interval", exc)
        finally:
            if self._probe_open:
                self._put_back_probe()
            took = self.clock.monotonic() - start
            self.metrics.interval_seconds = took
            self.events.emit("interval", seconds=round(took, 6), tick=self.ticks)

    def _hosts(self, inventory: Inventory) -> None:
        """Once per interval: log hosts that went down or came back, and count the intervals each stays down."""
        for h in inventory.hosts:
            down = None if h.asleep else h.down  # a host vcsched put to sleep is not down (docs/power.md)
            if down is not None and h.name not in self.down:
                self.down[h.name] = down
                self.events.emit("host-down", host=h.name, reason=down)
            elif down is None and h.name in self.down:
                del self.down[h.name]
                self.events.emit("host-up", host=h.name, was_failed=self.failures.up(h.name))
            if down is not None:
                self.failures.down_since.setdefault(h.name, self.clock.monotonic())
            self.down_intervals[h.name] = self.down_intervals.get(h.name, 0) + 1 if down is not None else 0

    def _reserved(self, inventory: Inventory) -> Inventory:
        """``inventory`` with its unmanaged domains' measured reservations, CPU and disk/network
        (vcsched/control/unmanaged.py): every plan the controller makes keeps that much of their hosts for them."""
        samples, params = self.sampler.samples(), self.options.params
        inventory = asleep_in(inventory, self.power, lambda line: self.events.emit("error", during="power",
                                                                                    error=line, type="StoreError"))
        return inventory.with_reserves(unmanaged_reserves(inventory, samples, params),
                                       unmanaged_io_reserves(inventory, samples, params))

    def _estimate(self, inventory: Inventory) -> dict[str, Estimate]:
        if self.sampler.missing != self.signals_missing:  # probed at start: what cannot be measured is said once
            self.signals_missing = dict(self.sampler.missing)
            self.events.emit("signals", missing={h: list(names) for h, names in sorted(self.signals_missing.items())})
        self.estimates = estimate_all(inventory, self.sampler.samples(), self.planned, self.options.params)
        return self.estimates

    def _work(self) -> None:
        o = self.options
        inventory = self._reserved(self.sampler.sample(self.hv))  # a sampling round too: a new leader's baseline
        self.round_hosts = answered(inventory)
        self._hosts(inventory)
        if inventory.in_doubt or any(v.paused and v.meta is not None for v in inventory.vms):
            self._settle()
        if self.failover is not None:
            self._restart_lost(inventory)  # first: a recovery below fences and restarts on this same inventory
        if self.failover is not None and inventory.down_hosts():
            self._failures(inventory)
        estimates = self._estimate(inventory)
        self._used_prev = self._used()
        self._used_history.append((self.clock.time(), self._used_prev))
        self._audit_due()
        warming = self.clock.monotonic() - self._lead.since < o.window_s - o.sample_s / 2  # half a period late: on time
        if warming:
            self._publish(inventory, estimates)
            self.events.emit("observe", vms=[e.to_dict() for e in estimates.values()])
            self.events.emit("decision", kind=NOTHING, reason="new leader: sampling its first window")
            return
        unprobed = inventory  # the caps the window's use was measured under: an audit's "before"
        if o.probe_s > 0 and not o.recommend and probe_caps(inventory, estimates, o.params):
            inventory, estimates = self._probe(inventory, estimates)
        self.events.emit("observe", vms=[e.to_dict() for e in estimates.values()])
        needs = {name: e.estimate for name, e in estimates.items()}
        self.planned = dict(needs)
        self._try_lead(renew=False)  # no network: a leader whose lease went stale stands down before asking the book
        if not self.leader:
            return
        book: Book | None = None
        if self.recommendations is not None and o.recommend:  # one read-modify-write: the book, and the needs
            book = self.recommendations.update(lambda b: (note_needs(b, needs, self.clock.time())[0], b))
            self._audit_approved(book)  # the needs: what an approval checks floors with (vcsched.control.recommend)
        elif self.recommendations is not None:
            book = self.recommendations.read()
        if self.power_saving is not None and self._power(inventory, estimates, needs, book):
            self._publish(self._reserved(self.hv.inventory()), self.estimates)
            return  # a host slept or woke: re-balancing plans on the hosts as they are now, next interval
        vetoed = book.vetoed(self.clock.time()) if book is not None else ()
        decision = self.rebalancer.decide(inventory, needs, self.clock.time(), vetoed=vetoed)
        self.events.emit("decision", **decision.to_dict())
        self._publish(inventory, estimates)
        if decision.plan is not None and not decision.plan.steps:
            self._probe_taken_over()  # the caps as they are (probe caps included) are what it wants
        if decision.plan is None or not decision.plan.steps:
            return
        if o.recommend:
            self._recommend(decision, decision.plan, inventory, needs)
            return
        self.events.emit("plan", kind=decision.kind, dry_run=o.dry_run, plan=decision.plan.to_dict())
        if o.dry_run:
            return
        try:
            with self._acting() as uow:
                fresh = self._reserved(uow.inventory())  # planned again on what the hosts hold now, under the lock
                live = self.rebalancer.plan_for(decision.kind, fresh, needs, decision.pinned)
                if live.plan is None or not live.plan.steps:
                    if live.plan is not None:
                        self._probe_taken_over()
                    self.events.emit("applied", kind=decision.kind, ok=True, steps=0, migrated_bytes=0,
                                     reason="nothing left to do on the fresh inventory")
                    return
                report = self._apply(uow, live.plan, decision.kind, take_over=True)
                if report is not None and report.ok and report.results:
                    doc = live.plan.to_dict()
                    self._audit_later(recommendation_id(self.cluster, doc, self.clock.time(), "p"), decision.kind,
                                      "run", doc, effect(live.plan, unprobed, needs).to_dict(), self._used_prev)
        except LockBusy as exc:
            self.events.emit("lock-busy", action=decision.kind, reason=str(exc))
            return
        if report is not None and report.results:
            self.sampler.restart([r.step.vm for r in report.results])
            self._publish(self._reserved(self.hv.inventory()), self.estimates)

    def _recommend(self, decision: Decision, plan: Plan, inventory: Inventory, needs: dict[str, float]) -> None:
        """Record the plan the controller would apply as a recommendation (module docstring of
        :mod:`vcsched.control.recommend`) and log it."""
        if self.recommendations is None:
            raise VcschedError("recommend mode without a recommendations store")
        now = self.clock.time()
        censored = [name for name, e in self.estimates.items() if e.censored]  # their yields: upper bounds
        predicted = effect(plan, inventory, needs, censored).to_dict()
        # A restart of lost VMs is worth proposing whatever it does to the yields of those that run: it is about
        # availability, not gain (the gain threshold is for re-caps and re-balancing).
        withheld = None if decision.kind in RESTARTS else worth_proposing(predicted, self.options.rebalance.threshold)
        if withheld is not None:
            self.events.emit("recommendation", id=None, kind=decision.kind, new=False, withheld=withheld,
                             steps=len(plan.steps), effect=predicted)
            return
        rec = new_recommendation(decision.kind, self.cluster, decision.reason, plan.to_dict(),
                                 step_reasons(plan, inventory, needs), predicted, now,
                                 self.options.valid_for, self.events.member)
        kept = self.recommendations.update(lambda book: record(book, rec))
        self.events.emit("recommendation", id=kept.id, kind=kept.kind, new=kept.id == rec.id, reason=kept.reason,
                         steps=len(plan.steps), effect=kept.effect, valid_until=kept.valid_until)

    def _apply(self, uow: UnitOfWork, plan: Plan, kind: str, take_over: bool = False,
               after_step: Callable[[StepResult], None] | None = None) -> ApplyReport:
        """Apply ``plan`` through ``uow`` (each step an event and a metric); ``take_over``: a plan that sets every
        cap, which, applied whole, makes this interval's probe caps its own (module docstring).  ``after_step``
        runs as each step ends, so that what a step did is said even when a stop (SIGTERM) ends the plan early."""
        start = self.clock.monotonic()
        report = uow.apply(plan, on_step=self._step_said(kind, after_step))
        assert report is not None  # no irreversible action: always a report
        return self._applied(plan, kind, report, start, take_over)

    def _step_said(self, kind: str, after_step: Callable[[StepResult], None] | None = None
                   ) -> Callable[[StepResult], None]:
        """What :meth:`_apply` does as each step of a ``kind`` plan ends (a metric, a ``step`` event, then
        ``after_step``): given as ``on_step`` to an acting function that applies itself (acting/recovery.py)."""
        def on_step(r: StepResult) -> None:
            self.metrics.add_step(r.step.op, r.outcome)
            self.events.emit("step", kind=kind, outcome=r.outcome, seconds=r.seconds, detail=r.detail,
                             **r.step.to_dict())
            if after_step is not None:
                after_step(r)
        return on_step

    def _applied(self, plan: Plan, kind: str, report: ApplyReport, start: float,
                 take_over: bool = False) -> ApplyReport:
        """What :meth:`_apply` does once ``plan`` (begun at monotonic ``start``) was applied: the ``applied`` event and
        metrics, the probe caps taken over, leadership checked, a stop (SIGTERM) obeyed."""
        moved = sum(r.step.bytes for r in report.results
                    if isinstance(r.step, MigrateStep) and r.outcome == DONE)
        self.metrics.add_plan(report.ok, moved)
        self.events.emit("applied", kind=kind, ok=report.ok, stopped=report.stopped, steps=len(plan.steps),
                         migrated_bytes=moved, budget=plan.extra.get("budget"),
                         seconds=round(self.clock.monotonic() - start, 6))
        if take_over and report.ok:
            self._probe_taken_over()
        if report.stopped is not None and self._lead.lock is not None:
            try:
                self._lead.lock.guard()
            except VcschedError as exc:
                self._step_down(str(exc))
        if self.stop.is_set():
            raise Stopping("stopping")
        return report

    # ------------------------------------------------------------------ power saving (acting/power_saving.py)

    def _power(self, inventory: Inventory, estimates: dict[str, Estimate], needs: dict[str, float],
               book: Book | None = None) -> bool:
        """This interval's power decision (docs/power.md §8): settle wakes cut short, then decide on the measured
        needs and their trend (no sleep while :func:`acting.power_saving.sleep_held` says why not; no host that
        a skipped sleep in ``book`` keeps on), and act (``auto``), propose (``recommend``) or run the periodic
        wake test.  True when a host slept or woke (the hosts changed under this interval's plans)."""
        from vcsched.control.power import NONE, ON, WAKE, decide, demand_trend

        ps = self.power_saving
        assert ps is not None
        cluster, now = ps.cluster, self.clock.time()
        self.needs_history.append((now, dict(needs)))
        try:
            state = settle_waking(cluster, ps.store, inventory, now, self.events.emit)
        except VcschedError as exc:  # the coordination service down: nothing is decided without the record
            self._error("power", exc)
            return False
        if cluster.power.mode == "off":
            return False
        on = frozenset(h for h in cluster.host_names if state.of(h).state == ON)
        if on != self.counted_on:  # a host slept or woke since the counts were taken: each is a new question
            self.ready_since, self.counted_on = {}, on
        state = self._with_ready(state)
        kept_on = book.kept_on(now) if book is not None else None
        decision = decide(cluster, inventory, state, now, budget=ps.budget, demand=demand_trend(self.needs_history),
                          needs=needs, kept_on=kept_on)
        below = [v.name for v in inventory.up().managed() if v.meta is not None
                 for y in (vm_yield(v, estimates.get(v.name)),)
                 if y is not None and y.value < max(v.meta.min_yield or 0.0, cluster.min_yield) - 1e-6]
        held = sleep_held(inventory, below, self.metrics.lost)
        if held is not None:  # the condition is broken: every count starts again
            self.ready_since = {}
            if decision.action != WAKE:
                self.events.emit("power_decision", action=NONE, host=None, reason=f"no sleep now: {held}")
                return False
        else:
            self.ready_since = {h.host: h.ready_since for h in decision.state.hosts}
        if decision.action == NONE:
            self.events.emit("power_decision", **decision.to_dict())
            due = wake_test_due(cluster, state, now)
            if due is None or self.options.recommend or cluster.power.mode != "auto" or self.options.dry_run:
                return False
            return self._wake_test(due)
        self.events.emit("power_decision", **decision.to_dict())
        if self.options.recommend or cluster.power.mode == "recommend":
            self._propose_power(decision, inventory, needs, state)
            return False
        if self.options.dry_run:
            return False
        try:
            with self._acting() as uow:
                fresh = self._reserved(uow.inventory())
                state = self._with_ready(ps.store.read())
                live = decide(cluster, fresh, state, self.clock.time(), budget=ps.budget,
                              demand=demand_trend(self.needs_history), needs=needs, kept_on=kept_on)
                if (live.action, live.host) != (decision.action, decision.host):
                    self.events.emit("power_decision", action=NONE, host=None,
                                     reason=f"on the hosts as they are now: {live.action} {live.host or ''}: "
                                            f"{live.reason}")
                    return False
                if live.action == WAKE:
                    assert live.host is not None
                    self._wake(uow, live.host)
                    return True
                assert live.host is not None and live.plan is not None and live.plan.plan is not None
                result = sleep_host(uow, cluster, live.host, live.plan.plan, store=ps.store, agent=ps.agent,
                                    clock=self.clock.time, emit=self.events.emit)
                self._power_steps(result.report)
                self.ready_since = {}  # with one host fewer on, every other host's condition is a new question
                return True
        except LockBusy as exc:
            self.events.emit("lock-busy", action=f"power-{decision.action}", reason=str(exc))
            return False

    def _with_ready(self, state: PowerState) -> PowerState:
        """``state`` with this leader's count of each host's sleep condition (:attr:`ready_since`; the record's own is
        not used: a new leader did not watch the condition hold)."""
        assert self.power_saving is not None
        for name in self.power_saving.cluster.host_names:
            state = state.with_host(dataclasses.replace(state.of(name), ready_since=self.ready_since.get(name)))
        return state

    def _wake(self, uow: UnitOfWork, host: str) -> bool:
        """Wake ``host`` through ``uow`` (its wake measured, or it is marked wake-failed: acting/power.py)."""
        ps = self.power_saving
        assert ps is not None
        def pause(seconds: float) -> None:
            self.clock.wait(seconds, self.stop)  # a stop ends the wait; the guard then stops the wake

        result = wake_host(uow, ps.cluster, host, store=ps.store, agent=ps.agent, clock=self.clock.time,
                           sleep=pause, emit=self.events.emit)
        return result.woke

    def _wake_test(self, host: str) -> bool:
        """The periodic wake test (``wake_test_every``): wake ``host`` and, once it answers as itself, put it back
        to sleep (it is empty: nothing was planned onto it meanwhile, the lock held throughout)."""
        ps = self.power_saving
        assert ps is not None
        self.events.emit("power_wake_test", host=host, every=ps.cluster.power.wake_test_every)
        try:
            with self._acting() as uow:
                if not self._wake(uow, host):
                    self.events.emit("power_wake_test", host=host, ok=False)
                    return True
                result = sleep_host(uow, ps.cluster, host, empty_plan(ps.cluster), store=ps.store, agent=ps.agent,
                                    clock=self.clock.time, emit=self.events.emit)
                self.events.emit("power_wake_test", host=host, ok=True, asleep_again=result.slept,
                                 reason=result.reason)
                return True
        except LockBusy as exc:
            self.events.emit("lock-busy", action="power-wake-test", reason=str(exc))
            return False

    def _power_steps(self, report: ApplyReport | None) -> None:
        """An evacuation's steps, each an event and a metric, as every other plan's (:meth:`_apply`)."""
        if report is None:
            return
        for r in report.results:
            self.metrics.add_step(r.step.op, r.outcome)
            self.events.emit("step", kind="power-sleep", outcome=r.outcome, seconds=r.seconds, detail=r.detail,
                             **r.step.to_dict())
        moved = sum(r.step.bytes for r in report.results if isinstance(r.step, MigrateStep) and r.outcome == DONE)
        self.metrics.add_plan(report.ok, moved)
        if report.results:
            self.sampler.restart([r.step.vm for r in report.results])

    def _propose_power(self, decision: PowerDecision, inventory: Inventory, needs: dict[str, float],
                       state: PowerState) -> None:
        """Record a sleep or a wake as a recommendation (acting/power_saving.py) and say so (``power_proposed``)."""
        if self.recommendations is None:
            raise VcschedError("power_saving = \"recommend\" without a recommendations store")
        assert self.power_saving is not None
        kind, plan, reasons, predicted = proposal(self.power_saving.cluster, decision, inventory, needs, state)
        rec = new_recommendation(kind, self.cluster, decision.reason, plan, reasons, predicted, self.clock.time(),
                                 self.options.valid_for, self.events.member)
        kept = self.recommendations.update(lambda book: record(book, rec))
        self.events.emit("power_proposed", id=kept.id, kind=kind, host=decision.host, new=kept.id == rec.id,
                         reason=kept.reason, effect=kept.effect, valid_until=kept.valid_until)

    def _power_metrics(self, inventory: Inventory, needs: dict[str, float]) -> None:
        """The power metrics (acting/metrics.py), with every other metric (:meth:`_publish`): hosts sleeping, each
        host's longest wake and failed wake, the energy saved since they were last counted
        (:func:`vcsched.control.power.energy_saved`), the failover room."""
        from vcsched.control.power import SLEEPING, energy_saved

        ps = self.power_saving
        if ps is None:
            return
        try:
            state = ps.store.read()
        except VcschedError as exc:
            self._error("power", exc)
            return
        now = self.clock.time()
        since = self.energy_counted_at
        saved = 0.0 if since is None else energy_saved(ps.cluster, state, now, now - since)
        self.energy_counted_at = now
        self.metrics.set_power(sleeping=sum(1 for h in state.hosts if h.state == SLEEPING and not h.failed),
                               wake_seconds={h.host: h.wake_s for h in state.hosts if h.wake_s is not None},
                               wake_failed={h: state.of(h).failed for h in ps.cluster.host_names},
                               saved_joules=saved,
                               room_short=room_short_now(ps.cluster, inventory, needs))

    # ------------------------------------------------------------------ audits (vcsched/control/audit.py)

    def _used(self) -> dict[str, float | None]:
        """Each sampled VM's mean use (cores) over the window the sampler holds."""
        return {vm: mean_used(ss) for vm, ss in self.sampler.samples().items()}

    def _audit_later(self, plan_id: str, kind: str, source: str, plan: Mapping[str, Any],
                     predicted: Mapping[str, Any], used_before: Mapping[str, float | None]) -> None:
        """Audit ``plan`` (just applied, predicting ``predicted``) once it has settled.  A pending audit of a VM
        this plan touches again is dropped, and said so: it would measure this plan, not its own."""
        touched = frozenset(str(s["vm"]) for s in plan.get("steps", []))
        for due, p in list(self.pending_audits):
            if interrupted(p, touched):
                self.pending_audits.remove((due, p))
                self.events.emit("audit", plan=p.plan_id, kind=p.kind, source=p.source, result="dropped",
                                 reason=f"{plan_id} changed {', '.join(sorted(touched & {t.vm for t in p.vms}))} "
                                        "before it settled")
        settle = self.options.audit_settle_s
        p = pending_audit(plan_id, kind, source, plan, predicted, used_before, self.clock.time(), settle)
        if p.vms:
            self.pending_audits.append((self.clock.monotonic() + settle, p))

    def _used_before(self, vms: list[str], at: float) -> dict[str, float | None]:
        """Each VM's mean use over the newest window that ended by ``at`` (Unix seconds) in which it was measured
        (a VM being migrated has none at the interval during its move); None: none kept."""
        out: dict[str, float | None] = {}
        for vm in vms:
            out[vm] = next((used[vm] for t, used in reversed(self._used_history)
                            if t <= at and used.get(vm) is not None), None)
        return out

    def _audit_approved(self, book: Book) -> None:
        """Recommendations an operator approved and vcsched applied since the last interval: audited once they
        settle, measured from now (their VMs' samples start afresh: a migrated VM's CPU time restarts), against
        their use over the last window that ended before they were approved."""
        applied = {r.id: r for r in book.recommendations if r.state == APPLIED}
        if self._known_applied is None:  # applied before this leader: not ours to audit
            self._known_applied = set(applied)
            return
        for rec_id in sorted(applied.keys() - self._known_applied):
            r = applied[rec_id]
            vms = sorted({str(s["vm"]) for s in r.plan.get("steps", [])})
            approved = r.decided_at if r.decided_at is not None else self.clock.time()
            self._audit_later(r.id, r.kind, "approve", r.plan, r.effect, self._used_before(vms, approved))
            self.sampler.restart(vms)
        self._known_applied |= applied.keys()

    def _audit_due(self) -> None:
        """Audit the plans that have settled, on the samples of the window that just ended (half a sampling
        period late: on time, as for a new leader's first window)."""
        now = self.clock.monotonic() + self.options.sample_s / 2
        due = [(d, p) for d, p in self.pending_audits if d <= now]
        if not due:
            return
        self.pending_audits = [x for x in self.pending_audits if x not in due]
        samples = self.sampler.samples()
        for _, p in due:
            a = audit(p, samples, self.clock.time())
            self.metrics.add_audit(a.predicted_gain, a.achieved_gain, a.result)
            self.events.emit("audit", **a.to_dict())
            if self.audits is not None:
                try:
                    self.audits.update(functools.partial(add_audit, a=a))
                except VcschedError as exc:  # the coordination service down: the event and metrics still say it
                    self.events.emit("error", during="audit", error=str(exc), type=type(exc).__name__)

    # ------------------------------------------------------------------ failed hosts

    def _failures(self, inventory: Inventory) -> None:
        """Declare hosts down for ``failure_timeout`` failed, then fence and restart (acting/failure.py)."""
        assert self.failover is not None
        cluster, now = self.failover.cluster, self.clock.monotonic()
        for h in inventory.down_hosts():
            since = self.failures.down_since.get(h.name, now)
            if now - since < cluster.failure_timeout:
                continue
            if h.name not in self.failures.failed_at:
                self.failures.failed_at[h.name] = now
                self.metrics.add_failure("hosts_failed")
                self.events.emit("host_failed", host=h.name, down_seconds=round(now - since, 3), reason=h.down,
                                 failure_timeout=cluster.failure_timeout)
            try:
                self._recover(inventory, h.name)
            except LockBusy as exc:
                self.events.emit("lock-busy", action="recover", reason=str(exc))
            except StoreError as exc:
                self._error("recover", exc)

    def _stranded(self, host: str, stranded: tuple[tuple[str, str], ...],
                  waiting: tuple[tuple[str, str], ...] = ()) -> None:
        """Each VM a recovery does not restart, said once per VM and failure: ``vm_stranded`` (it cannot be), or
        ``vm_waiting`` (not yet: another failed host that is not fenced may run it; no metric, no alert — its
        recovery follows, after which this one restarts it)."""
        for vm, why in waiting:
            if (host, vm) not in self.failures.said_waiting:
                self.failures.said_waiting.add((host, vm))
                self.events.emit("vm_waiting", vm=vm, host=host, reason=why)
        for vm, why in stranded:
            if (host, vm) not in self.failures.said_stranded:
                self.failures.said_stranded.add((host, vm))
                self.metrics.add_failure("vms_stranded")
                self.events.emit("vm_stranded", vm=vm, host=host, reason=why)

    def _recover(self, inventory: Inventory, host: str) -> None:
        """Plan the recovery of failed ``host``; fence it and create its VMs (not in a dry run), through
        acting/recovery.py's :func:`~acting.recovery.recover_host` on a fresh read under the lock."""
        assert self.failover is not None
        cluster, store, failover = self.failover.cluster, self.failover.store, self.failover
        leftovers = plan_repair(inventory, fenced=frozenset(store.fenced())).leftovers  # marks read, nothing more
        recovery = plan_host_recovery(cluster, store, inventory, host,
                                      waited_on=host in self._blocked or host in leftovers).recovery
        self._stranded(host, recovery.stranded, recovery.waiting)
        if recovery.plan is None:
            return
        self.events.emit("plan", kind="recover", dry_run=self.options.dry_run, plan=recovery.plan.to_dict())
        if self.options.dry_run:
            return
        below: dict[str, tuple[float, float]] = {}
        detected = start = 0.0  # when the host was declared failed; when its recovery plan starts (monotonic)

        def planned(run: RecoveryRun) -> None:  # on the fresh read, before anything changes
            nonlocal detected, start
            self._stranded(host, run.recovery.stranded, run.recovery.waiting)
            below.update({vm: (got, floor) for vm, got, floor in run.recovery.below_floor})
            if run.recovery.plan is not None:
                detected, start = self.failures.failed_at.get(host, self.clock.monotonic()), self.clock.monotonic()

        def fence(target: ClusterHost) -> FenceResult:
            """Once the recovery plan is validated whole (acting/unit_of_work.py), once per failure."""
            result = failover.fence(target)
            self.metrics.add_failure("fence_ok" if result.fenced else "fence_failed")
            self.events.emit("host_fenced", **result.to_dict())
            if result.fenced:  # else its VMs may still run there: nothing is created; tried again next interval
                self.failures.fenced.add(host)
            return result

        def restarted(r: StepResult) -> None:
            if isinstance(r.step, CreateStep) and r.outcome == DONE:
                seconds = self.clock.monotonic() - detected
                self.metrics.add_restart(seconds)
                self.events.emit("vm_restarted", vm=r.step.vm, host=r.step.host, failed_host=host,
                                 seconds_since_failed=round(seconds, 3))
                if r.step.vm in below:
                    self._below_floor(r.step.vm, r.step.host, host, *below[r.step.vm])

        with self._acting() as uow:
            try:
                run = recover_host(uow, cluster, store, self._reserved(uow.inventory()), host, fence=fence,
                                   already_fenced=host in self.failures.fenced, planned=planned,
                                   on_step=self._step_said("recover", restarted),
                                   unmarked=lambda exc: self._error("definitions", exc))
            except NotFailed as exc:
                reason = f"{exc}: nothing restarted" if exc.asleep else f"host {host} answers again: nothing restarted"
                self.events.emit("decision", kind="recover", reason=reason)
                return
            if run.refused is not None:
                raise run.refused  # the interval's error, as any plan refused (nothing fenced, nothing changed)
            if run.report is not None and run.recovery.plan is not None:  # applied (not: the fence failed)
                self._applied(run.recovery.plan, "recover", run.report, start)

    def _restart_lost(self, inventory: Inventory) -> None:
        """Start the lost VMs (vcsched/control/lost.py: recorded, running nowhere, not awaiting a recovery) again
        from their records, as `vcsched restart` would but keeping to the cluster file's ``on_failure``; with
        ``--mode recommend``, propose it (kind ``restart``).  Each lost VM is said once (``vm_lost``), each one
        that cannot be restarted once (``vm_stranded``, its recorded host), each restart as it happens
        (``vm_restarted`` with ``lost``)."""
        assert self.failover is not None
        cluster, store = self.failover.cluster, self.failover.store
        try:
            lost = store.lost(inventory)
        except (StoreError, InputError) as exc:
            self.metrics.set_lost(None)
            self._error("definitions", exc)
            return
        self.metrics.set_lost(len(lost))
        for x in lost:
            if x.vm not in self.failures.said_lost:
                self.events.emit("vm_lost", **x.to_dict())
        self.failures.said_lost = {x.vm for x in lost}  # one that runs again and is lost later is said again
        if not lost:
            return
        restart = plan_lost_restart(cluster, store, inventory, lost=lost).restart
        recorded_on = {x.vm: x.host for x in lost}
        for vm, why in restart.refused:  # said once per VM and failure of its host, as a recovery's strandings
            self._stranded(recorded_on[vm], ((vm, why),))
        if restart.plan is None:
            return
        reason = f"{len(restart.restarts)} lost VM(s) run nowhere: " + ", ".join(vm for vm, _ in restart.restarts)
        if self.options.recommend:
            self._recommend(Decision("restart", restart.plan, reason), restart.plan, inventory, {})
            return
        self.events.emit("plan", kind="restart", dry_run=self.options.dry_run, plan=restart.plan.to_dict())
        if self.options.dry_run:
            return
        below: dict[str, tuple[float, float]] = {}
        start = 0.0  # when the restart plan starts (monotonic)

        def planned(run: RestartRun) -> None:  # on the fresh read, before anything changes
            nonlocal start
            below.update({vm: (got, floor) for vm, got, floor in run.restart.below_floor})
            if run.restart.plan is not None:
                start = self.clock.monotonic()

        def restarted(r: StepResult) -> None:
            if isinstance(r.step, CreateStep) and r.outcome == DONE:
                self.events.emit("vm_restarted", vm=r.step.vm, host=r.step.host, lost=True)
                if r.step.vm in below:
                    self._below_floor(r.step.vm, r.step.host, "", *below[r.step.vm])

        try:
            with self._acting() as uow:
                # Under the lock, on a fresh read: what another command did meanwhile is in it, and in its records.
                run = restart_lost(uow, cluster, store, self._reserved(uow.inventory()), planned=planned,
                                   on_step=self._step_said("restart", restarted))
                if run.report is not None and run.restart.plan is not None:
                    self._applied(run.restart.plan, "restart", run.report, start)
        except LockBusy as exc:
            self.events.emit("lock-busy", action="restart", reason=str(exc))

    def _settle(self) -> None:
        """Settle the VMs in doubt (or a copy a cut migration left paused) now, through the unit of work's repair,
        rather than only when a plan happens to act: an interval with nothing to change would otherwise leave a
        copy paused everywhere and running nowhere for as long as nothing else changes (found by the fault
        simulation, docs/faultsim.md).  Not in a dry run nor in recommend mode, which change no host."""
        if self.options.dry_run or self.options.recommend:
            return
        try:
            with self._acting():
                pass  # entering it settles (its ``repair`` events say what was done)
        except LockBusy as exc:
            self.events.emit("lock-busy", action="repair", reason=str(exc))

    def _below_floor(self, vm: str, where: str, failed_host: str, got: float, floor: float) -> None:
        """A VM restarted below its floor (on_failure = "restart"): said once per restart; the metrics' per-VM
        yield and floor then fire VcschedVmBelowItsFloor until room is made."""
        self.events.emit("vm_below_floor", vm=vm, host=where, failed_host=failed_host, **{"yield": round(got, 6)},
                         min_yield=floor, reason="the survivors could not meet its floor; on_failure = \"restart\"")

    def _probe(self, inventory: Inventory, estimates: dict[str, Estimate]) -> tuple[Inventory, dict[str, Estimate]]:
        """Raise the caps of VMs that want a probe into unused capacity, sample, estimate again (module docstring)."""
        o = self.options
        caps = probe_caps(inventory, estimates, o.params)
        if o.dry_run:
            self.events.emit("probe", dry_run=True, caps=caps)
            return inventory, estimates
        try:
            with self._acting() as uow:
                fresh = self._reserved(uow.inventory())
                caps = probe_caps(fresh, self._estimate(fresh), o.params)
                if not caps:
                    return fresh, self.estimates
                before = {name: fresh.vm(name).cap_cores for name in caps}  # type: ignore[union-attr]
                self.events.emit("probe", dry_run=False, caps=caps, before=before, seconds=o.probe_s)
                self._journal.write(cluster=fresh.cluster, vms=probe_entries(fresh, caps))  # before raising
                self._probe_open = True
                report = self._apply(uow, cap_plan(fresh, caps), "probe")
        except LockBusy as exc:
            self.events.emit("lock-busy", action="probe", reason=str(exc))
            return inventory, estimates
        assert report is not None  # no irreversible action: a report always
        raised = frozenset(r.step.vm for r in report.results if r.outcome == DONE)
        if not raised:
            return inventory, estimates
        self.sampler.restart(raised)
        after = self.sampler.sample_for(self.hv, o.probe_s, min(o.sample_s, max(o.probe_s / 3, 1e-3)), self.stop,
                                        probe=raised)
        if self.stop.is_set():
            raise Stopping("stopping")
        # The probe's raised caps stay until this interval's plan sets every cap again (it reads them as they are),
        # or are put back when the interval ends otherwise (module docstring).
        self.sampler.restart(raised)
        inventory = self._reserved(after if after is not None else self.hv.inventory())
        return inventory, self._estimate(inventory)

    # ------------------------------------------------------------------ putting probe caps back

    def _probe_taken_over(self) -> None:
        """This interval's plan set the caps (or found them as it wants them): the probe's are no longer ours to
        put back."""
        if self._probe_open:
            self._probe_open = False
            self._journal.clear()

    def _put_back_probe(self) -> None:
        """Put back this process's probe caps still at their raised value (and any dead process's), under the
        cluster lock; whatever cannot be put back now stays in the journal (module docstring)."""
        self._restore("probe-restore", own=True)
        self._probe_open = self._journal.exists()

    def _put_back_left(self) -> None:
        """At the start of an interval (leader, not a dry run): probe caps that a dead process or an earlier
        interval of this one left raised."""
        if self.options.dry_run or not pending(PROBE, self._journal.directory, own=True):
            return
        self._restore("probe-restore", own=True)

    def _restore(self, what: str, own: bool) -> None:
        try:
            with self._acting() as uow:
                # Not the steps' guard: a stop (SIGTERM) must not stop this; only a lost cluster lock may.
                guard = None if uow.dry_run else uow.lock_guard
                report = restore_journal(self.hv, kinds=(PROBE,), directory=self._journal.directory, guard=guard,
                                         own=own)
        except LockBusy as exc:
            self.events.emit("lock-busy", action=what, reason=str(exc))
            return
        except Exception as exc:
            self._error(what, exc)
            return
        if report.restored or report.problems:
            self.events.emit(what, restored=list(report.restored), problems=list(report.problems))

    # ------------------------------------------------------------------ metrics

    def _publish(self, inventory: Inventory, estimates: dict[str, Estimate]) -> None:
        samples = self.sampler.samples()
        rows = []
        for v in inventory.up().managed():
            assert v.meta is not None
            e = estimates.get(v.name)
            y = vm_yield(v, e)  # the one yield (status, top, recommendations): cap over the estimate
            assert y is not None
            last = samples.get(v.name)
            rows.append(VmMetrics(v.name, v.host, v.meta.cluster, v.meta.cpu_need_cores, y.need_cores,
                                  e.confidence if e is not None else 0.0, v.cap_cores,
                                  last[-1].used_cores if last else None, y.value, v.meta.min_yield,
                                  y.upper_bound))
        self.metrics.set_vms(tuple(rows))
        self._power_metrics(inventory, {name: e.estimate for name, e in estimates.items()})
        if self.window is not None:
            self.window({r.vm: r.used for r in rows})
        self.metrics.set_hosts(tuple(HostMetrics(h.name, h.down is None, self.down_intervals.get(h.name, 0),
                                                 inventory.unmanaged_cores(h.name))
                                     for h in inventory.hosts),
                               sum(1 for d in inventory.in_doubt if d.resolved is None),
                               tuple(UnmanagedMetrics(v.name, v.host, w[-1].used_cores if w else None, v.reserved)
                                     for v in inventory.up().vms if v.unmanaged
                                     for w in (samples.get(v.name),)))
