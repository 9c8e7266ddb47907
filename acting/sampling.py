"""Sampling what VMs use, through the :class:`~hypervisor.base.Hypervisor` protocol, for the need estimate.

Each *round* reads the inventory (hosts, VMs, caps) and every running
managed VM's cumulative CPU time (libvirt ``getCPUStats``: vCPUs + emulator
thread); two consecutive rounds give one :class:`~vcsched.control.observe.Sample`
per VM: cores used in between, with the cap it had.  A pair is dropped, and
the VM measured afresh from the second reading, when the VM changed host or
cap in between (a sample must have one cap to be compared with), or when its
CPU time went backwards (a restarted domain).  Each VM keeps the samples of
a sliding window of ``window`` seconds.

A reading less than ``min_seconds`` after the VM's last one makes no sample
and leaves that last reading as the baseline, so the next sample spans the
whole gap.  A capped vCPU runs in bursts (its quota at the start of each
100 ms period, then nothing), so the CPU time over a few milliseconds says
nothing about its rate: such a "sample" reads 0 or a whole core at random.
On the lab the controller's interval began with a round a few milliseconds
after the previous one, and that sample, the latest of the window, decided
whether a VM was at its cap: a busy guest then counted as below its cap
interval after interval, and an idle one as at its cap now and then.

Beside the CPU time each reading takes the VM's other counters
(:meth:`~hypervisor.base.Hypervisor.cpu_counters`): the CFS periods its own
cap throttled and the time its vCPUs waited for a host CPU, so a sample says
whether what the VM used is its demand or a lower bound on it (a *censored*
sample, docs/contention.md).  A signal a host does not provide is named in
:attr:`CpuSampler.missing` (per host), never guessed: the estimate then
falls back on "used about its cap" alone.

An *unmanaged* domain's reading (``every_vm``) also takes its disk and network byte counters
(:meth:`~hypervisor.base.Hypervisor.io_counters`), so its samples carry the rates whose high percentile is
reserved off its host's declared ``disk_bps``/``net_bps`` (:func:`vcsched.control.unmanaged.io_reservation`).
Managed VMs' I/O is not read: their declared needs and caps bound it.

The estimate itself is pure and lives in :mod:`vcsched.control.observe`.
Probing (raising caps for a few seconds) changes hosts, so the caller holds
the cluster lock and goes through the executor (:func:`raise_caps`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from acting.executor import DONE, ApplyReport, StepResult, apply_plan
from acting.restore import restore_journal
from hypervisor import hazards
from hypervisor.base import CpuCounters, Hypervisor, HypervisorError, IoCounters
from hypervisor.journal import PROBE, Journal, probe_caps_back, probe_entries
from vcsched.caps import same_cap
from vcsched.control.observe import (
    DEFAULT_PARAMS,
    Estimate,
    ObserveParams,
    Sample,
    cap_plan,
    estimate_all,
    probe_caps,
    record_plan,
)
from vcsched.inventory import Inventory
from vcsched.plans.plan import Plan

if TYPE_CHECKING:
    from acting.unit_of_work import UnitOfWork


class Clock(Protocol):
    """Wall time (Unix seconds, for records others read), monotonic time (for durations) and an interruptible wait.

    Tests pass a fake one, so a daemon's hour runs in milliseconds and nothing asserts on real time.
    """

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Sleep up to ``seconds``; True (at once) when ``stop`` is set."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        return stop.wait(max(seconds, 0.0))


@dataclass(frozen=True)
class _Reading:
    at: float  # monotonic
    cpu_ns: int
    host: str
    cap: float | None
    counters: CpuCounters | None = None
    io: IoCounters | None = None  # unmanaged domains only (module docstring)


def _rate(now: int | None, before: int | None, seconds: float) -> float | None:
    """Cores' worth of a cumulative ns counter between two readings (None: not read both times)."""
    if now is None or before is None or now < before:
        return None
    return (now - before) / 1e9 / seconds


def _io_rates(now: IoCounters | None, before: IoCounters | None, seconds: float) -> tuple[float | None, float | None]:
    """Disk bytes/s and network bytes/s (the busier direction) between two readings; None: not read both times,
    or a counter went backwards (the domain restarted)."""
    if now is None or before is None:
        return None, None
    disk = now.disk_bytes - before.disk_bytes
    rx, tx = now.net_rx_bytes - before.net_rx_bytes, now.net_tx_bytes - before.net_tx_bytes
    return (disk / seconds if disk >= 0 else None), (max(rx, tx) / seconds if min(rx, tx) >= 0 else None)


def _waited(now: CpuCounters, before: CpuCounters, seconds: float) -> float | None:
    """Cores' worth of time its vCPUs were runnable but waited for a host CPU *not* because of its own cap.

    The run-queue delay (``vcpu.N.delay``) also counts the time a throttled vCPU waits for its next CFS period
    (measured on the lab: a busy guest capped at 0.3 core used 0.31 and was delayed 0.70), so the throttled
    time is taken off it.  Without throttling counters the whole delay counts: a VM its own cap holds back then
    reads as waiting too, which keeps its estimate from falling — the safe side.
    """
    delay = _rate(now.delay_ns, before.delay_ns, seconds)
    throttled = _rate(now.throttled_ns, before.throttled_ns, seconds)
    if delay is None:
        return None
    return max(0.0, delay - (throttled or 0.0))


def _throttled_share(now: CpuCounters, before: CpuCounters) -> float | None:
    """The share of its CFS periods in which the VM's own cap throttled it (None: not measured)."""
    if None in (now.periods, before.periods, now.throttled_periods, before.throttled_periods):
        return None
    assert now.periods is not None and before.periods is not None
    assert now.throttled_periods is not None and before.throttled_periods is not None
    periods = now.periods - before.periods
    if periods <= 0:
        return 0.0 if periods == 0 else None
    return min(1.0, max(0.0, (now.throttled_periods - before.throttled_periods) / periods))


class CpuSampler:
    """Sliding windows of CPU samples per managed VM (module docstring)."""

    def __init__(self, window: float, clock: Clock | None = None, min_seconds: float = 0.0,
                 every_vm: bool = False) -> None:
        self.window = window
        self.clock = clock or SystemClock()
        self.min_seconds = min_seconds  # shorter pairs make no sample (module docstring)
        #: Sample unmanaged VMs too (`vcsched top` shows what every VM uses; the estimate covers managed ones).
        self.every_vm = every_vm
        self._last: dict[str, _Reading] = {}
        self.windows: dict[str, deque[Sample]] = {}
        self.errors: list[str] = []  # VMs that could not be read in the last round, with the reason
        #: host -> the CPU signals its VMs' readings lacked in the last round (``CpuCounters.missing``)
        self.missing: dict[str, tuple[str, ...]] = {}

    def sample(self, hv: Hypervisor, probe: Collection[str] = (), min_seconds: float | None = None,
               hosts: Collection[str] | None = None) -> Inventory:
        """One round; returns the inventory it read.  ``probe``: VMs whose caps a probe has raised;
        ``min_seconds``: this round's shortest sample (default: the sampler's); ``hosts``: read only these
        (default: all; VMs of the others leave the windows, as VMs of a down host do)."""
        shortest = self.min_seconds if min_seconds is None else min_seconds
        inventory = hv.inventory(hosts)
        wall = self.clock.time()
        seen = set()
        self.errors = []
        missing: dict[str, set[str]] = {}
        up = inventory.up()
        vms = [v for v in up.vms if v.active and not v.in_doubt] if self.every_vm else up.managed()
        for v in vms:
            seen.add(v.name)
            try:
                counters = hv.cpu_counters(v.host, v.name)
            except HypervisorError as exc:  # gone meanwhile, or its host stopped answering
                self._last.pop(v.name, None)
                self.errors.append(str(exc))
                continue
            # Each reading has its own time: a slow libvirt call earlier in the round must not stretch or
            # shrink another VM's interval (a shared round time once made a VM capped at 0.33 "use" 1.12 cores).
            now = self.clock.monotonic()
            if counters is None:
                continue
            io = None
            if v.meta is None:
                with contextlib.suppress(HypervisorError):  # unread I/O makes no I/O rate; the CPU sample stays
                    io = hv.io_counters(v.host, v.name)
            ns = counters.cpu_ns
            missing.setdefault(v.host, set()).update(counters.missing())
            last = self._last.get(v.name)
            same = (last is not None and ns >= last.cpu_ns and last.host == v.host
                    and (last.cap is None) == (v.cap_cores is None)
                    and (last.cap is None or v.cap_cores is None or same_cap(last.cap, v.cap_cores, v.vcpus)))
            if same and last is not None and now - last.at < shortest:
                continue  # too short to measure a capped vCPU: the earlier reading stays the baseline
            self._last[v.name] = _Reading(now, ns, v.host, v.cap_cores, counters, io)
            if not same or last is None or now <= last.at:
                continue
            seconds = now - last.at
            used = (ns - last.cpu_ns) / 1e9 / seconds
            before = last.counters
            throttled = None if before is None else _throttled_share(counters, before)
            waited = None if before is None else _waited(counters, before, seconds)
            window = self.windows.setdefault(v.name, deque())
            disk, net = _io_rates(io, last.io, seconds)
            window.append(Sample(wall, seconds, used, v.cap_cores, v.vcpus, v.name in probe, throttled, waited,
                                 disk, net))
        self.missing = {host: tuple(sorted(names)) for host, names in missing.items() if names}
        for name in list(self._last):
            if name not in seen:
                del self._last[name]
        for name in list(self.windows):
            w = self.windows[name]
            while w and w[0].time - w[0].seconds < wall - self.window - 1e-6:  # only samples wholly inside
                w.popleft()
            if name not in seen or not w:
                del self.windows[name]
        return inventory

    def restart(self, vms: Collection[str]) -> None:
        """Measure ``vms`` afresh from the next round (their caps are about to change)."""
        for name in vms:
            self._last.pop(name, None)

    def samples(self) -> dict[str, list[Sample]]:
        return {name: list(w) for name, w in self.windows.items()}

    def sample_for(self, hv: Hypervisor, seconds: float, every: float, stop: threading.Event,
                   probe: Collection[str] = (),
                   on_round: Callable[[Inventory], None] | None = None) -> Inventory | None:
        """Rounds every ``every`` seconds for ``seconds`` (one at the start); the last inventory read (None if
        stopped first).  A round less than half of ``every`` after the last (the end of ``seconds``) makes no
        sample."""
        inventory = None
        end = self.clock.monotonic() + seconds
        while True:
            inventory = self.sample(hv, probe, every / 2)
            if on_round is not None:
                on_round(inventory)
            left = end - self.clock.monotonic()
            if left <= 1e-9:
                return inventory
            if self.clock.wait(min(every, left), stop):
                return inventory


def raise_caps(hv: Hypervisor, inventory: Inventory, caps: Mapping[str, float],
               guard: Callable[[], None] | None = None,
               on_step: Callable[[StepResult], None] | None = None) -> ApplyReport:
    """Set ``caps`` (a probe's raise, or putting caps back) through the executor and its checks."""
    return apply_plan(hv, cap_plan(inventory, caps), guard=guard, on_step=on_step)


@dataclass(frozen=True)
class ProbeResult:
    """What `vcsched observe --probe` did: the raised caps, the caps before, the two plans' reports, and the caps
    that could not be put back yet because their host did not answer (one line each; they stay journaled)."""

    caps: Mapping[str, float]
    before: Mapping[str, float | None]
    raised: ApplyReport | None = None
    restored: ApplyReport | None = None
    waiting: tuple[str, ...] = ()

    def reports(self) -> dict[str, ApplyReport]:
        return {k: r for k, r in (("probe", self.raised), ("restore", self.restored)) if r is not None}


def probe_and_restore(hv: Hypervisor, sampler: CpuSampler, seconds: float, every: float, stop: threading.Event,
                      guard: Callable[[], None] | None = None, params: ObserveParams = DEFAULT_PARAMS,
                      on_start: Callable[[Mapping[str, float]], None] | None = None,
                      journal: Journal | None = None,
                      ) -> tuple[ProbeResult, Inventory, dict[str, Estimate]]:
    """Probe the VMs at their full estimate (:func:`~vcsched.control.observe.probe_caps`) for ``seconds``, then
    put their caps back; the probe samples stay in ``sampler``.  Returns what was done, the inventory after,
    and the estimates with the probe.  The caller holds the cluster lock (``guard``: its guard).

    The caps to put back are journaled before any is raised (``journal``, :mod:`hypervisor.journal`) and the
    journal is cleared once they are back.  ``stop`` (SIGTERM, Ctrl-C) cuts the sampling short, never the
    putting back; an exception while raised puts them back too, and whatever could not be put back stays in
    the journal for the next probe, `vcsched run` or `vcsched repair`.
    """
    journal = journal or Journal(PROBE)
    fresh = hv.inventory()
    caps = probe_caps(fresh, estimate_all(fresh, sampler.samples(), params=params), params)
    before = {name: v.cap_cores for name in caps if (v := fresh.vm(name)) is not None}
    if not caps or stop.is_set():
        return ProbeResult({}, {}), fresh, estimate_all(fresh, sampler.samples(), params=params)
    if on_start is not None:
        on_start(caps)
    entries = probe_entries(fresh, caps)
    if not hazards.on(hazards.PROBE_NO_RESTORE):
        journal.write(cluster=fresh.cluster, vms=entries)  # before the first cap is raised
    try:
        raised_report = raise_caps(hv, fresh, caps, guard)
        raised = frozenset(r.step.vm for r in raised_report.results if r.outcome == DONE)
        if raised:
            sampler.restart(raised)
            sampler.sample_for(hv, seconds, every, stop, probe=raised)
    except BaseException:
        with contextlib.suppress(Exception):
            restore_journal(hv, kinds=(PROBE,), directory=journal.directory, guard=guard, own=True)
        raise
    now = hv.inventory()
    back, waiting = probe_caps_back(now, entries)
    restored = raise_caps(hv, now, back, guard) if back else None
    if not waiting and (restored is None or restored.ok):  # a cap on a host that is down waits in the journal
        journal.clear()
    sampler.restart(raised)
    after = hv.inventory()
    return (ProbeResult(caps, before, raised_report, restored, tuple(waiting)), after,
            estimate_all(after, sampler.samples(), params=params))


def record_estimates(uow: UnitOfWork, estimates: Mapping[str, Estimate]) -> tuple[Plan, ApplyReport]:
    """Write the estimates as the VMs' recorded needs: set-need steps through the unit of work (validated whole,
    under its lock, and recorded in the definitions store, so a VM restarted elsewhere keeps its new need)."""
    fresh = uow.inventory()
    plan = record_plan(fresh, [e for e in estimates.values() if fresh.vm(e.vm) is not None])
    report = uow.apply(plan)
    assert report is not None  # no irreversible action: always a report
    return plan, report
