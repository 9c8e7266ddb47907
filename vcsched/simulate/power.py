"""Power saving over time: ``vcsched simulate WORKLOAD --power auto,threshold,off`` (docs/power.md).

Virtual clusters (VCs) of the workload's classes arrive and leave, as in :mod:`vcsched.simulate.fluid`, on
``hosts`` hosts; every ``interval`` seconds a controller looks at the cluster and may put a host to sleep
or wake one.  What is compared:

* ``auto``: vcsched's decision, :func:`vcsched.control.power.decide`, the very function a controller calls,
  on the simulated inventory (floors, ``power_yield``, ``failures_tolerated``, the drain planner's budget,
  hysteresis, wake times measured as hosts wake, the cluster's demand growth and the waiting requests);
* ``threshold``: vSphere DPM's rule as documented: a host's utilisation (CPU demand over capacity) is kept
  in 63 % ± 18 %: when every host on has been below 45 % for 40 minutes, the least loaded host is evacuated
  (the same drain planner) and powered off if the others stay at 63 % or less on average; a host above
  81 % over the last 5 minutes (one interval), or a VC waiting for memory, powers one on;
* ``off``: every host always on.

**The model.**  Hosts of ``cores`` cores and ``memory`` bytes each (the workload's reference host); a VM of
a class needs its first phase's CPU (a fraction of the reference host) and its memory (at least
:data:`MIN_VM_MEMORY`).  A VC is admitted by vcsched's admission (:func:`vcsched.control.admission.admit`) on
the hosts on, or waits (first come, first served, a later one that fits goes first); it progresses at its
yield (vcsched's allocation, :func:`vcsched.control.power.vm_yields`), one unit of work being
``time_unit`` seconds at full speed, and leaves when its work is done.  Extra fluid resources (disk,
network, the papers' ``io``) are not modelled: power saving frees CPU and memory.  Migrations and power-off
are instantaneous; a wake takes ``wake_time`` seconds, during which the host draws its idle power and takes
no VM.  Arrivals are Poisson with a day-long cycle: rate ``λ (1 + diurnal sin(2π t / 1 day))``, so that
there is something to save at night and something to wake for in the morning.

**Measured** (after ``warmup`` seconds): energy (a host on draws idle + (peak − idle) × utilisation, asleep
0), the time-average of the VMs' mean and min yield and the lowest min yield, VC-hours spent waiting for
admission, migrations and their bytes, wakes, and **late wakes**: wakes during which, at the decision or at
any interval before the host was up, demand went unmet (a VC waiting, or a VM below ``power_yield``, or the
``failures_tolerated`` room short) — the demand arrived before the host was up.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.control.admission import admit
from vcsched.control.failover import after_plan
from vcsched.control.live import adapt_inventory
from vcsched.control.power import (
    ON,
    SLEEP,
    SLEEPING,
    WAKE,
    WAKING,
    Demand,
    PowerState,
    decide,
    room_short,
    slept,
    vm_yields,
    wake_candidates,
    waking,
    watts,
    woke,
)
from vcsched.errors import InputError, VcschedError
from vcsched.experiments import OnProgress
from vcsched.formats.cluster import Cluster, ClusterHost, FenceConfig, GuestDefaults
from vcsched.formats.power import HostPower as HostPowerConfig
from vcsched.formats.power import PowerSettings
from vcsched.formats.request import Request
from vcsched.inventory import HostState, Inventory
from vcsched.simulate.metrics import Estimate, estimate
from vcsched.simulate.workload import Workload

POWER_POLICIES = ("auto", "threshold", "off")
#: vSphere DPM's documented defaults: target 63 % ± 18 %, power-off history 40 min, power-on history 5 min.
DPM_LOW, DPM_TARGET, DPM_HIGH, DPM_OFF_HISTORY_S = 0.45, 0.63, 0.81, 2400.0
MIN_VM_MEMORY = 256 << 20
DAY_S = 86400.0


@dataclass(frozen=True)
class PowerRunOptions:
    """One replication of one power policy (module docstring)."""

    policy: str = "auto"
    hosts: int = 8
    cores: int = 16
    memory: int = 64 << 30
    hours: float = 48.0  # measured
    warmup: float = 6 * 3600.0  # seconds, not measured
    interval: float = 300.0  # the controller's interval (DPM's power-on history)
    wake_time: float = 300.0  # what a wake really takes in the simulation
    assumed_wake_time: float = 600.0  # the cluster file's wake_time: the decision's guess until measured
    time_unit: float = 3600.0  # seconds per unit of work
    diurnal: float = 0.6
    failures_tolerated: int = 0
    target_yield: float = 1.0
    budget: int = 64 << 30  # bytes an evacuation may migrate
    idle_watts: float = 120.0
    peak_watts: float = 300.0
    seed: int = 0
    replication: int = 0

    def check(self) -> None:
        if self.policy not in POWER_POLICIES:
            raise InputError(f"--power: {self.policy!r} is not one of {', '.join(POWER_POLICIES)}")
        if self.hosts < 2:
            raise InputError(f"--hosts: {self.hosts} hosts: power saving needs at least 2")
        if not 0 <= self.diurnal < 1:
            raise InputError(f"--diurnal: {self.diurnal:g} is not in [0, 1)")
        if self.failures_tolerated >= self.hosts:
            raise InputError(f"--failures: {self.failures_tolerated} is not below the {self.hosts} hosts")


@dataclass(frozen=True)
class PowerResult:
    """What one replication measured (module docstring)."""

    policy: str
    energy_kwh: float
    mean_yield: float
    min_yield_avg: float
    min_yield_low: float
    waiting_vc_hours: float
    migrations: int
    migrated_bytes: int
    wakes: int
    late_wakes: int
    sleeps: int
    hosts_on_avg: float
    vcs: int
    wall_s: float
    #: The lowest min yield right after a sleep (1.0: none): auto's promise is that it stays at power_yield.
    after_sleep_min_yield: float = 1.0
    #: The fewest hosts on at any step.
    fewest_on: int = 0

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass
class _VC:
    name: str
    cls: int
    arrival: float
    work: float
    request: Request
    started: bool = False


def sim_cluster(options: PowerRunOptions, mode: str) -> Cluster:
    """The simulated cluster file: ``hosts`` equal hosts with a power agent and the run's watts."""
    power = HostPowerConfig(FenceConfig("fence_simulated"), True, options.idle_watts, options.peak_watts)
    hosts = tuple(ClusterHost(f"h{i}", f"sim:///h{i}.xml", power=power) for i in range(options.hosts))
    return Cluster("sim", hosts, 0.0, GuestDefaults("/k", "/i"), failures_tolerated=options.failures_tolerated,
                   power=PowerSettings(mode, 1, options.target_yield, DPM_OFF_HISTORY_S, options.assumed_wake_time))


def arrivals(workload: Workload, options: PowerRunOptions, until: float) -> list[tuple[float, int, float]]:
    """``(time s, class, work)`` in time order: each class a Poisson process of rate ``λ (1 + a sin)`` per time
    unit, by thinning (its own random stream, so every policy sees the same VCs)."""
    ss = np.random.SeedSequence(options.seed, spawn_key=(options.replication,))
    out = []
    for k, (c, child) in enumerate(zip(workload.classes, ss.spawn(len(workload.classes)), strict=True)):
        rng = np.random.default_rng(child)
        peak = c.rate * (1 + options.diurnal) / options.time_unit
        t = 0.0
        while peak > 0:
            t += float(rng.exponential(1.0 / peak))
            if t >= until:
                break
            keep = (1 + options.diurnal * math.sin(2 * math.pi * t / DAY_S)) / (1 + options.diurnal)
            work = float(c.work.draw(rng))
            if float(rng.random()) < keep:
                out.append((t, k, work))
    return sorted(out)


def _request(workload: Workload, options: PowerRunOptions, k: int, name: str) -> Request:
    c = workload.classes[k]
    cpu = sum(dict(p.needs).get("cpu", 0.0) for p in c.phases[0].parts)
    cores = max(cpu * options.cores, 0.01)
    memory = max(int(c.memory * options.memory) >> 20 << 20, MIN_VM_MEMORY)
    return Request(name, c.vms, max(1, math.ceil(cores)), memory, cpu_cores=cores)


def with_hosts(workload: Workload, hosts: int, cpu_load: float | None) -> Workload:
    """``workload`` on ``hosts`` hosts with its CPU load per host kept (or set to ``cpu_load``)."""
    scale = hosts / workload.n_hosts
    if cpu_load is not None:
        now = float(workload.loads()[0])
        if now <= 0:
            raise InputError("--load: the workload's classes need no CPU")
        scale *= cpu_load / now
    return dataclasses.replace(workload, classes=tuple(dataclasses.replace(c, rate=c.rate * scale)
                                                       for c in workload.classes))


class PowerSimulation:
    """One replication (:func:`simulate_power`)."""

    def __init__(self, workload: Workload, options: PowerRunOptions) -> None:
        options.check()
        self.w, self.o = workload, options
        self.cluster = sim_cluster(options, "auto" if options.policy == "auto" else "off")
        self.hosts = {f"h{i}": HostState(f"h{i}", options.cores, options.memory) for i in range(options.hosts)}
        self.inv = Inventory("sim", tuple(self.hosts.values()), ())
        self.state = PowerState()
        self.vcs: dict[str, _VC] = {}
        self.waiting: list[_VC] = []
        self.history: list[tuple[float, float]] = []  # (time, CPU demand in cores): the estimates' trend
        self.low_since: dict[str, float] = {}  # threshold: since when each host on is below DPM_LOW

    # --- the cluster as the controller sees it

    def inventory(self) -> Inventory:
        """Hosts asleep or waking are down (their VMs: none); the others answer."""
        hosts = tuple(h if (s := self.state.of(h.name).state) == ON else dataclasses.replace(h, down=s)
                      for h in self.hosts.values())
        return dataclasses.replace(self.inv, hosts=hosts)

    def demand(self) -> Demand:
        """The waiting requests, and the cluster's CPU demand growth over the last hour (least squares)."""
        recent = [(t, d) for t, d in self.history if t >= self.history[-1][0] - 3600.0] if self.history else []
        growth = 0.0
        if len(recent) >= 3 and recent[-1][1] > 0:
            ts, ds = np.array([t for t, _ in recent]), np.array([d for _, d in recent])
            growth = float(np.polyfit(ts - ts[0], ds, 1)[0]) / recent[-1][1]
        return Demand(pending=tuple(v.request for v in self.waiting), growth=growth)

    # --- events

    def admit_waiting(self) -> None:
        inv = self.inventory()
        for vc in list(self.waiting):
            d = admit(self.cluster, inv, vc.request)
            if d.admitted and d.plan is not None:
                inv = after_plan(inv, d.plan)
                vc.started = True
                self.waiting.remove(vc)
        self.inv = dataclasses.replace(self.inv, vms=inv.vms)

    def leave(self, gone: Sequence[str]) -> None:
        out = set(gone)
        self.inv = dataclasses.replace(self.inv, vms=tuple(v for v in self.inv.vms if v.cluster not in out))
        for name in gone:
            del self.vcs[name]

    def cpu_use(self, yields: dict[str, float]) -> dict[str, float]:
        """Cores used on each host: each VM's need times its yield."""
        used = dict.fromkeys(self.hosts, 0.0)
        for v in self.inv.vms:
            if v.meta is not None:
                used[v.host] += v.meta.cpu_need_cores * yields.get(v.name, 0.0)
        return used

    def unmet(self) -> bool:
        """Demand already here and not served: a VC waiting, or a VM below the target yield."""
        return room_short(self.cluster, self.inventory(), Demand(pending=tuple(v.request for v in self.waiting)),
                          0.0) is not None

    def move(self, where: dict[str, str]) -> tuple[int, int]:
        """Each VM to its host in ``where`` (migrations are instantaneous here); the migrations and bytes."""
        moved = [v for v in self.inv.vms if where.get(v.name, v.host) != v.host]
        self.inv = dataclasses.replace(self.inv, vms=tuple(dataclasses.replace(v, host=where.get(v.name, v.host))
                                                           for v in self.inv.vms))
        return len(moved), sum(v.memory_bytes for v in moved)

    def sleep(self, host: str, where: dict[str, str], now: float) -> tuple[int, int]:
        """Put ``host`` to sleep once its VMs are where the evacuation puts them."""
        moves = self.move(where)
        assert not self.inv.vms_on(host), f"{host} still runs VMs"
        self.state = slept(self.state, self.hosts[host], now)
        return moves

    def adapt(self, yields: dict[str, float]) -> tuple[int, int]:
        """What `vcsched run` does every interval: when a VM is below the target yield, re-place within the
        budget (the adaptation), taken when it raises the min yield."""
        low = min(yields.values(), default=1.0)
        if low >= self.o.target_yield - 1e-6:
            return 0, 0
        try:
            adapted = adapt_inventory("sim", self.inventory(), self.o.budget, cluster=self.cluster)
        except VcschedError:
            return 0, 0
        if adapted.plan is None or adapted.plan.min_yield <= low + 0.01:
            return 0, 0
        return self.move({name: p.host for name, p in adapted.plan.per_vm.items()})

    def step_auto(self, now: float) -> tuple[str, str | None, dict[str, str]]:
        d = decide(self.cluster, self.inventory(), self.state, now, budget=self.o.budget, demand=self.demand())
        self.state = d.state
        if d.action == SLEEP and d.plan is not None and d.plan.plan is not None:
            return SLEEP, d.host, {name: p.host for name, p in d.plan.plan.per_vm.items()}
        return d.action, d.host, {}

    def step_threshold(self, now: float) -> tuple[str, str | None, dict[str, str]]:
        """vSphere DPM's rule (module docstring), host by host."""
        on = [h for h in self.hosts if self.state.of(h).state == ON]
        util = self.utilisation(on, {v.name: v.host for v in self.inv.vms})
        for h in self.hosts:
            if h not in on or util[h] >= DPM_LOW:
                self.low_since.pop(h, None)
            else:
                self.low_since.setdefault(h, now)
        if self.state.in_state(WAKING):
            return "none", None, {}
        if any(u > DPM_HIGH for u in util.values()) or self.waiting:
            candidates = wake_candidates(self.cluster, self.state)
            return (WAKE, candidates[0], {}) if candidates else ("none", None, {})
        low = [h for h in on if now - self.low_since.get(h, now) >= DPM_OFF_HISTORY_S]
        if not low or len(on) <= 1:
            return "none", None, {}
        host = min(low, key=lambda h: (util[h], h))
        try:
            ev = adapt_inventory("sim", self.inventory(), self.o.budget, cluster=self.cluster, drain=host)
        except VcschedError:
            return "none", None, {}
        if ev.plan is None or ev.stays:
            return "none", None, {}
        where = {name: p.host for name, p in ev.plan.per_vm.items()}
        after = self.utilisation([h for h in on if h != host], where)
        if max(after.values()) > DPM_HIGH or sum(after.values()) / len(after) > DPM_TARGET:
            return "none", None, {}
        return SLEEP, host, where

    def utilisation(self, hosts: Sequence[str], where: dict[str, str]) -> dict[str, float]:
        """DPM's utilisation: each host's CPU demand (its VMs' needs, uncapped) over its cores."""
        demand = dict.fromkeys(hosts, 0.0)
        for v in self.inv.vms:
            h = where.get(v.name, v.host)
            if v.meta is not None and h in demand:
                demand[h] += v.meta.cpu_need_cores
        return {h: d / self.o.cores for h, d in demand.items()}

    def run(self, on_progress: OnProgress | None = None) -> PowerResult:
        start = time.perf_counter()
        o = self.o
        end = o.warmup + o.hours * 3600.0
        incoming = arrivals(self.w, o, end)
        steps = math.ceil(end / o.interval)
        energy = mean_y = min_y = waiting = hosts_on = 0.0
        low = 1.0
        migrations = moved_bytes = wakes = late = sleeps = measured_vcs = 0
        ready_at: dict[str, float] = {}
        after_sleep, fewest = 1.0, o.hosts
        counted: dict[str, bool] = {}  # waking hosts: whether their wake is measured (decided after the warm-up)
        late_flag: dict[str, bool] = {}  # waking hosts: whether demand went unmet before they were up
        a = 0
        for step in range(steps):
            now = step * o.interval
            measured = now >= o.warmup
            for h, t in list(ready_at.items()):  # wakes that completed: the host answers again
                if t <= now:
                    self.state = woke(self.state, h, t)
                    del ready_at[h]
                    late += counted.pop(h, False) and late_flag.pop(h, False)
            while a < len(incoming) and incoming[a][0] <= now:
                t, k, work = incoming[a]
                name = f"vc{a}"
                vc = _VC(name, k, t, work * o.time_unit, _request(self.w, o, k, name))
                self.vcs[name] = vc
                self.waiting.append(vc)
                measured_vcs += measured
                a += 1
            self.admit_waiting()
            yields = vm_yields(self.inventory())
            used = self.cpu_use(yields)
            self.history.append((now, sum(v.meta.cpu_need_cores for v in self.inv.vms if v.meta is not None)
                                 + sum(r.request.vms * (r.request.cpu_cores or 0.0) for r in self.waiting)))
            if o.policy != "off":
                action, host, where = (self.step_auto(now) if o.policy == "auto" else self.step_threshold(now))
                if action == SLEEP and host is not None:
                    n, b = self.sleep(host, where, now)
                    sleeps += measured
                    if measured:
                        migrations, moved_bytes = migrations + n, moved_bytes + b
                    yields = vm_yields(self.inventory())
                    used = self.cpu_use(yields)
                    after_sleep = min(after_sleep, *yields.values(), 1.0)
                elif action == WAKE and host is not None:
                    self.state = waking(self.state, host, now)
                    ready_at[host] = now + o.wake_time
                    counted[host], late_flag[host] = measured, False
                    wakes += measured
            if ready_at and self.unmet():  # demand unmet while hosts are still waking: those wakes are late
                late_flag.update(dict.fromkeys(ready_at, True))
            n, b = self.adapt(yields)
            if n:
                yields = vm_yields(self.inventory())
                used = self.cpu_use(yields)
                if measured:
                    migrations, moved_bytes = migrations + n, moved_bytes + b
            # Progress over the interval at these yields; VCs whose work is done leave.
            per_vc: dict[str, list[float]] = {}
            for v in self.inv.vms:
                if v.cluster is not None:
                    per_vc.setdefault(v.cluster, []).append(yields.get(v.name, 0.0))
            done = []
            for name, ys in per_vc.items():
                vc = self.vcs[name]
                vc.work -= min(ys) * o.interval
                if vc.work <= 0:
                    done.append(name)
            fewest = min(fewest, sum(self.state.of(h).state == ON for h in self.hosts))
            if measured:
                dt = o.interval
                for h in self.hosts:
                    s = self.state.of(h).state
                    energy += dt * watts(self.cluster.host(h).power, used[h] / o.cores, asleep=s == SLEEPING)
                    hosts_on += dt * (s != SLEEPING)
                all_y = [y for ys in per_vc.values() for y in ys]
                if all_y:
                    mean_y += dt * float(np.mean(all_y))
                    min_y += dt * min(all_y)
                    low = min(low, min(all_y))
                else:
                    mean_y += dt
                    min_y += dt
                waiting += dt * len(self.waiting)
            self.leave(done)
            if on_progress is not None and step % 24 == 0:
                on_progress(step, steps, o.policy)
        late += sum(1 for h in ready_at if counted.get(h) and late_flag.get(h))  # still waking at the end
        span = o.hours * 3600.0
        return PowerResult(o.policy, energy / 3.6e6, mean_y / span, min_y / span, low, waiting / 3600.0, migrations,
                           moved_bytes, wakes, late, sleeps, hosts_on / span, measured_vcs,
                           time.perf_counter() - start, after_sleep, fewest)


def simulate_power(workload: Workload, options: PowerRunOptions, on_progress: OnProgress | None = None
                   ) -> PowerResult:
    """Run one replication of ``options.policy`` on ``workload`` (module docstring)."""
    return PowerSimulation(workload, options).run(on_progress)


#: What a point reports, in the order of the table; ``energy_saved`` and ``yield_lost`` are paired against ``off``
#: on the same replication (the same VCs at the same times).
POINT_METRICS = ("energy_kwh", "energy_saved", "mean_yield", "yield_lost", "min_yield_avg", "min_yield_low",
                 "waiting_vc_hours", "migrations", "migrated_gib", "sleeps", "wakes", "late_wakes", "hosts_on_avg")


@dataclass(frozen=True)
class PowerPoint:
    """One policy at one load over the replications: every metric's mean and 95 % interval."""

    policy: str
    load: float | None
    replications: int
    metrics: dict[str, Estimate | None]
    wall_s: float

    def to_dict(self) -> dict[str, object]:
        return {"policy": self.policy, "load": self.load, "replications": self.replications, "wall_s": self.wall_s,
                "metrics": {k: None if e is None else {"mean": e.mean, "ci95": e.ci, "n": e.n}
                            for k, e in self.metrics.items()}}


def power_study(workload: Workload, policies: Sequence[str], base: PowerRunOptions, replications: int,
                load: float | None = None, on_progress: OnProgress | None = None) -> list[PowerPoint]:
    """Every policy (and ``off``, the reference), ``replications`` times each on the same arrivals."""
    runs: dict[str, list[PowerResult]] = {p: [] for p in dict.fromkeys(("off", *policies))}
    for r in range(replications):
        for p in runs:
            runs[p].append(simulate_power(workload, dataclasses.replace(base, policy=p, replication=r), on_progress))
    out = []
    for p in dict.fromkeys(policies):
        rs, offs = runs[p], runs["off"]
        values: dict[str, list[float | None]] = {
            "energy_saved": [1 - x.energy_kwh / o.energy_kwh if o.energy_kwh else None
                             for x, o in zip(rs, offs, strict=True)],
            "yield_lost": [o.mean_yield - x.mean_yield for x, o in zip(rs, offs, strict=True)],
            "migrated_gib": [x.migrated_bytes / (1 << 30) for x in rs]}
        for m in POINT_METRICS:
            if m not in values:
                values[m] = [float(getattr(x, m)) for x in rs]
        out.append(PowerPoint(p, load, replications, {m: estimate(values[m]) for m in POINT_METRICS},
                              sum(x.wall_s for x in rs)))
    return out
