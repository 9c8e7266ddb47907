"""A cluster whose VMs use CPU, on a fake clock: what the controller's unit tests run against.

:class:`LoadedHypervisor` is the in-memory hypervisor plus CPU accounting:
each VM *wants* ``demand[vm](t)`` cores at fake time ``t`` and gets
``min(want, cap)``; a host whose VMs together want more than its cores
shares them in proportion (only possible with uncapped VMs: caps never sum
above cores); the share a VM wanted and did not get is its run-queue delay
(``CpuCounters.delay_ns``, as libvirt's ``vcpu.N.delay``), and what it wanted
above its cap is its throttled time, in CFS periods of 100 ms.  Time moves only when the code under test waits
(:class:`FakeClock`), so an hour of controller runs in milliseconds and no
test asserts on real time.  :class:`FakeLocks` are exclusive locks in a dict,
with a switch to make a holder lose its lease.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from acting.lock import LockBusy, LockLost
from hypervisor.base import CpuCounters
from hypervisor.memory import MemoryHypervisor
from vcsched.inventory import HostState, VmState

Demand = Callable[[float], float]
STEP = 0.05  # seconds: the accounting's integration step


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.start = start
        self.now = 0.0
        #: (fake monotonic time, action) run once when time reaches it (a host dying, SIGTERM, ...)
        self.at: list[tuple[float, Callable[[], None]]] = []

    def time(self) -> float:
        return self.start + self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        end = self.now + max(seconds, 0.0)
        while True:
            due = sorted((t, i) for i, (t, _) in enumerate(self.at) if t <= end)
            if not due:
                break
            t, i = due[0]
            self.now = max(self.now, t)
            _, action = self.at.pop(i)
            action()
        self.now = end

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        if stop.is_set():
            return True
        self.advance(seconds)
        return stop.is_set()


class LoadedHypervisor(MemoryHypervisor):
    def __init__(self, cluster: str, hosts: Iterable[HostState], vms: Iterable[VmState], clock: FakeClock,
                 demand: dict[str, Demand] | None = None) -> None:
        super().__init__(cluster, hosts, vms)
        self.fake = clock
        self.clock = clock.time
        self.demand: dict[str, Demand] = dict(demand or {})
        self._cpu_ns: dict[str, float] = {}
        self._delay_ns: dict[str, float] = {}
        self._throttled_ns: dict[str, float] = {}
        self._t = clock.monotonic()

    def _account(self) -> None:
        now = self.fake.monotonic()
        while self._t < now - 1e-12:
            dt = min(STEP, now - self._t)
            t = self._t
            for h in self.hosts:
                if h in self.down:
                    continue
                on = [v for v in self.vms.values() if v.host == h and v.active]
                wished = {v.name: min(max(self.demand.get(v.name, lambda _t: 0.0)(t), 0.0), float(v.vcpus))
                          for v in on}
                want = {v.name: min(wished[v.name], v.cap_or_vcpus) for v in on}
                total = sum(want.values())
                share = min(1.0, self.hosts[h].cores / total) if total > 0 else 1.0
                for name, w in want.items():
                    self._cpu_ns[name] = self._cpu_ns.get(name, 0.0) + w * share * dt * 1e9
                    self._delay_ns[name] = self._delay_ns.get(name, 0.0) + w * (1 - share) * dt * 1e9
                    if wished[name] > w + 1e-9:
                        self._throttled_ns[name] = self._throttled_ns.get(name, 0.0) + dt * 1e9
            self._t += dt

    def cpu_time_ns(self, host: str, vm: str) -> int | None:
        self._vm_on(host, vm)
        self._account()
        return int(self._cpu_ns.get(vm, 0.0))

    def cpu_counters(self, host: str, vm: str) -> CpuCounters | None:
        ns = self.cpu_time_ns(host, vm)
        assert ns is not None
        throttled = self._throttled_ns.get(vm, 0.0)
        periods = int(self.fake.monotonic() / 0.1)
        return CpuCounters(ns, 0, int(throttled / 1e8), periods, int(self._delay_ns.get(vm, 0.0)), None)

    def set_cap(self, host: str, vm: str, cap_cores: float) -> None:
        self._account()
        super().set_cap(host, vm, cap_cores)

    def migrate_vm(self, vm: str, source: str, target: str, cap_cores: float, *,
                   timeout_s: float | None = None) -> None:
        self._account()
        super().migrate_vm(vm, source, target, cap_cores, timeout_s=timeout_s)


def busy(level: float) -> Demand:
    return lambda _t: level


def phases(*pattern: tuple[float, float], start: float = 0.0) -> Demand:
    """Cores wanted in repeating phases ``(cores, seconds), ...`` from fake time ``start``."""
    period = sum(s for _, s in pattern)

    def at(t: float) -> float:
        x = (t - start) % period if t >= start else 0.0
        if t < start:
            return pattern[-1][0]
        for cores, s in pattern:
            if x < s:
                return cores
            x -= s
        return pattern[-1][0]

    return at


@dataclass
class FakeLocks:
    """Exclusive named locks held by members; ``lost`` members fail their guard (an expired lease)."""

    holders: dict[str, str] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)

    def lock(self, name: str, member: str) -> FakeLock:
        return FakeLock(self, name, member)


@dataclass
class FakeLock:
    locks: FakeLocks
    name: str
    member: str

    def acquire(self, wait: float = 0.0) -> None:
        holder = self.locks.holders.get(self.name)
        if holder is not None and holder != self.member:
            raise LockBusy(f"{self.name} is locked by {holder}")
        self.locks.holders[self.name] = self.member
        self.locks.lost.discard(self.member)

    def guard(self) -> None:
        if self.member in self.locks.lost or self.locks.holders.get(self.name) != self.member:
            raise LockLost(f"{self.name}: lease of {self.member} expired")

    def held(self) -> bool:
        return self.member not in self.locks.lost and self.locks.holders.get(self.name) == self.member

    def release(self) -> None:
        if self.locks.holders.get(self.name) == self.member:
            del self.locks.holders[self.name]
