"""The event-driven fluid simulation: VCs arrive, progress at their yields, leave when their work is done.

Bonald & Roberts' dynamic model ("Enhanced Cluster Computing Performance
through Proportional Fairness", §3.1) on vcsched's hosts: between two events
every running part of every VC progresses at its yield (work is time at full
speed); at every **arrival**, **departure** and **end of a part** (phases,
:mod:`vcsched.simulate.workload`) the policy re-allocates instantly.  Events
come from a heap of predicted part ends (stale predictions are skipped by a
version number) and the arrival stream.

What an event re-allocates: with a policy that decomposes over VCs sharing
no host (:mod:`vcsched.simulate.engines`), only the connected component of
the hosts the event touched — the VCs on them, the VCs sharing hosts with
those, and so on; every other VC keeps its yield and its predicted end.
Otherwise (``yield``, ``hdrf``, altruism, adaptation) every running VC.  A VC
is only brought up to date (its remaining work) when its yields change, so
an event costs what its component costs.

Seeds: each class has its own random stream (inter-arrival times and work)
and altruism another, all spawned from the run's seed and the replication
number, so every policy sees the very same VCs at the very same times
(common random numbers: per-VC comparisons between policies are paired).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError, VcschedError
from vcsched.experiments import OnProgress
from vcsched.model import Host
from vcsched.policies import PolicyOptions
from vcsched.simulate.altruism import LEFTOVER_MODES, redistribute
from vcsched.simulate.engines import Cluster, engine_for
from vcsched.simulate.metrics import RunResult, Tally, class_result
from vcsched.simulate.placement import ADAPT_ALGORITHMS, PLACEMENTS, Placer
from vcsched.simulate.rows import Groups, Key
from vcsched.simulate.state import VC
from vcsched.simulate.workload import Workload, validate
from vcsched.units import FIT_TOLERANCE

MAX_IN_SYSTEM = 200_000
DONE_RTOL = 1e-9  # a part whose predicted end is this close (relative) to now has ended


class UnstableError(VcschedError):
    """The number of VCs in the system kept growing: the load is beyond what the cluster sustains."""


@dataclass(frozen=True)
class Arrival:
    time: float
    cls: int
    work: float | None = None  # None: drawn from the class's distribution


@dataclass(frozen=True)
class RunOptions:
    """One replication: the policy, how much to run and measure, altruism, placement."""

    policy: str = "drf"
    alpha: float | None = None
    arrivals: int = 10_000  # measured arrivals (Poisson); a trace: everything after the warm-up
    warmup: int = 1_000
    seed: int = 0
    replication: int = 0
    altruism: float = 0.0  # CARBYNE's P(altruism)
    leftover: str = "srtf"
    placement: str = "pack"
    migration_budget: int | None = None  # bytes per event; None: no adaptation
    adapt_algorithm: str = "heuristic"  # with a migration budget: the adaptation (vcsched.adaptation.solve)
    fast: bool = True  # the fast exact engines where they exist (False: always the registry)
    record: bool = False  # keep every measured VC's completion time (for paired comparisons)

    def check(self) -> None:
        if self.arrivals < 1:
            raise InputError(f"arrivals: {self.arrivals} must be at least 1")
        if self.warmup < 0:
            raise InputError(f"warmup: {self.warmup} must be at least 0")
        if not 0 <= self.altruism <= 1:
            raise InputError(f"altruism: {self.altruism!r} is a probability, in [0, 1]")
        if self.leftover not in LEFTOVER_MODES:
            raise InputError(f"leftover: {self.leftover!r} is not one of {', '.join(LEFTOVER_MODES)}")
        if self.placement not in PLACEMENTS:
            raise InputError(f"placement: {self.placement!r} is not one of {', '.join(PLACEMENTS)}")
        if self.migration_budget is not None and self.migration_budget < 0:
            raise InputError(f"migration budget: {self.migration_budget} bytes is negative")
        if self.adapt_algorithm not in ADAPT_ALGORITHMS:
            raise InputError(f"adapt algorithm: {self.adapt_algorithm!r} is not one of {', '.join(ADAPT_ALGORITHMS)}")
        if self.adapt_algorithm != "heuristic" and self.migration_budget is None:
            raise InputError(f"adapt algorithm: {self.adapt_algorithm!r} needs a migration budget (the adaptation "
                             "runs only with one)")

    def policy_options(self) -> PolicyOptions:
        return PolicyOptions(alpha=self.alpha if self.policy == "alpha-fair" else None)


def streams(seed: int, replication: int, n_classes: int) -> tuple[list[np.random.Generator], np.random.Generator]:
    """Independent generators: one per class (arrivals and work), one for altruism draws."""
    ss = np.random.SeedSequence(seed, spawn_key=(replication,))
    children = ss.spawn(n_classes + 1)
    return [np.random.default_rng(c) for c in children[:-1]], np.random.default_rng(children[-1])


def poisson(workload: Workload, rngs: Sequence[np.random.Generator]) -> Iterator[Arrival]:
    """The superposition of the classes' Poisson processes, in time order."""
    heap = []
    for k, c in enumerate(workload.classes):
        if c.rate > 0:
            heap.append((float(rngs[k].exponential(1.0 / c.rate)), k))
    heapq.heapify(heap)
    while heap:
        t, k = heap[0]
        heapq.heapreplace(heap, (t + float(rngs[k].exponential(1.0 / workload.classes[k].rate)), k))
        yield Arrival(t, k)


class Simulation:
    """One replication (see :func:`simulate`); the state lives here, the rules in the methods."""

    def __init__(self, workload: Workload, options: RunOptions, arrivals: Iterator[Arrival] | None = None,
                 on_progress: OnProgress | None = None) -> None:
        options.check()
        self.w = validate(workload)
        self.o = options
        self.on_progress = on_progress
        self.res = workload.resources
        self.R = len(self.res)
        hosts = workload.host_list
        self.cluster = Cluster(self.res, tuple(Host(h.name, h.cpu, h.memory, h.capacity) for h in hosts),
                               workload.capacity_matrix(), workload.tenants)
        self.engine = engine_for(self.cluster, options.policy, options.policy_options(), fast=options.fast)
        self.decomposable = self.engine.decomposable and options.altruism == 0 and options.migration_budget is None
        self.pair_cap = self.cluster.pair_capacity()
        self.totals = self.cluster.totals.tolist()
        self.inv_total = [1.0 / t if t > 0 else 0.0 for t in self.totals]
        self.rngs, self.alt_rng = streams(options.seed, options.replication, len(workload.classes))
        self.arrivals = arrivals if arrivals is not None else poisson(workload, self.rngs)
        self.trace = arrivals is not None
        # per class: per phase, the parts' need tuples and work fractions; the time at full speed after a phase
        self.phase_needs: list[list[list[tuple[float, ...]]]] = []
        self.phase_frac: list[list[list[float]]] = []
        self.after_phase: list[list[float]] = []
        need = np.zeros((len(workload.classes), self.R))
        for k, c in enumerate(workload.classes):
            index = {r: i for i, r in enumerate(self.res)}
            pn, pf, longest = [], [], []
            for ph in c.phases:
                rows = []
                for part in ph.parts:
                    v = [0.0] * self.R
                    for r, x in part.needs:
                        v[index[r]] = x
                        need[k, index[r]] += part.fraction * x
                    rows.append(tuple(v))
                pn.append(rows)
                pf.append([p.fraction for p in ph.parts])
                longest.append(max(p.fraction for p in ph.parts))
            self.phase_needs.append(pn)
            self.phase_frac.append(pf)
            self.after_phase.append([sum(longest[i + 1:]) for i in range(len(longest))])
        self.placer = Placer(workload, options.placement, need)
        self.memory = [c.memory for c in workload.classes]
        self.tenant = [c.tenant for c in workload.classes]
        # state
        self.t = 0.0
        self.heap: list[tuple[float, int, int, int]] = []  # (time, seq, vc id, version)
        self.seq = 0
        self.running: dict[int, VC] = {}
        self.queue: list[VC] = []
        n_pairs = len(hosts) * self.R
        self.on_pair: list[set[int]] = [set() for _ in range(n_pairs)]  # running VCs with a row on the pair
        self.demand = [0.0] * n_pairs  # Σ rows at full speed: a pair whose demand fits never binds
        self.cap = [self.pair_cap[p] for p in range(n_pairs)]
        self.bind = [False] * n_pairs  # demand[p] > cap[p]: the pair can saturate
        self.flipped: set[int] = set()  # pairs whose bind status changed during this event
        self.changed: set[int] = set()  # running VCs whose rows changed during this event
        self.tally = Tally(len(workload.classes), self.R)
        self.next_id = 0
        self.measured_left = 0
        self.times: list[list[float]] = [[] for _ in workload.classes]
        self.slow: list[list[float]] = [[] for _ in workload.classes]
        self.waits: list[list[float]] = [[] for _ in workload.classes]
        self.completion: dict[int, float] = {}
        self.dirty: set[int] = set()  # VCs whose needs changed since their yields were last set
        self.events = 0
        self.migrated = 0
        self.n_arrived = 0
        self.measured_rate = [0] * len(workload.classes)  # measured arrivals per class (traces: their rate)
        self.measured_size = [0.0] * len(workload.classes)

    # ------------------------------------------------------------------------------------------ VC life

    def new_vc(self, cls: int, arrival: float, work: float, measured: bool, permanent: bool = False) -> VC:
        c = self.w.classes[cls]
        vc = VC(self.next_id, cls, arrival, work, c.weight, measured, permanent)
        self.next_id += 1
        longest = [max(f) for f in self.phase_frac[cls]]
        vc.alone = math.inf if permanent else work * sum(longest)
        self.enter_phase(vc, 0)
        return vc

    def enter_phase(self, vc: VC, phase: int) -> set[int]:
        """Start a phase: its parts, their work; the old phase's usage leaves the tallies at the next
        :meth:`set_yields` (the VC is marked dirty by its caller)."""
        vc.phase = phase
        vc.needs = self.phase_needs[vc.cls][phase]
        vc.rem = [math.inf if vc.permanent else vc.work * f for f in self.phase_frac[vc.cls][phase]]
        vc.yields = [0.0] * len(vc.rem)
        return self.refresh_rows(vc)

    def refresh_rows(self, vc: VC) -> set[int]:
        """The VC's summed need over its running parts, and its capacity rows (its grouping key).

        Returns the pairs whose demand changed (the old rows' and the new ones'), if the VC runs."""
        agg = [0.0] * self.R
        for r_left, need in zip(vc.rem, vc.needs, strict=True):
            if r_left > 0:
                for r in range(self.R):
                    agg[r] += need[r]
        vc.agg = tuple(agg)
        vc.dom = max(range(self.R), key=agg.__getitem__)
        rows = []
        R = self.R
        for h, c in sorted(vc.hosts.items()):
            for r in range(R):
                if agg[r] > 0:
                    rows.append((h * R + r, c * agg[r]))
        touched = self.unregister(vc)
        vc.rows = tuple(rows)
        vc.key = (vc.weight, vc.rows)
        vc.rate = -1.0
        if vc.id in self.running:
            demand, cap, bind = self.demand, self.cap, self.bind
            for p, coef in vc.rows:
                demand[p] += coef
                was = bind[p]
                bind[p] = demand[p] > cap[p] * (1 + FIT_TOLERANCE)
                if was != bind[p]:
                    self.flipped.add(p)
                self.on_pair[p].add(vc.id)
                touched.add(p)
            self.changed.add(vc.id)
        return touched

    def unregister(self, vc: VC) -> set[int]:
        """Take the VC's rows off the pairs (if it runs); returns those pairs."""
        if vc.id not in self.running:
            return set()
        demand, cap, bind = self.demand, self.cap, self.bind
        for p, c in vc.rows:
            demand[p] -= c
            was = bind[p]
            bind[p] = demand[p] > cap[p] * (1 + FIT_TOLERANCE)
            if was != bind[p]:
                self.flipped.add(p)
            self.on_pair[p].discard(vc.id)
        return {p for p, _ in vc.rows}

    def binding(self, p: int) -> bool:
        """Can pair ``p`` saturate?  Not if its VCs all fit at full speed: its demand is within capacity."""
        return self.demand[p] > self.cap[p] * (1 + FIT_TOLERANCE)

    def remaining(self, vc: VC) -> float:
        """Time at full speed until the VC's end: its longest running part, then its later phases."""
        return max(vc.rem, default=0.0) + vc.work * self.after_phase[vc.cls][vc.phase]

    def admit(self, vc: VC, hosts: dict[int, int]) -> set[int]:
        """Start a VC on ``hosts``; returns the pairs it uses."""
        vc.hosts = hosts
        vc.started = self.t
        vc.t_upd = self.t
        self.placer.add(vc)
        self.running[vc.id] = vc
        touched = self.refresh_rows(vc)
        self.tally.running += 1
        self.tally.max_running = max(self.tally.max_running, self.tally.running)
        return touched

    def set_yields(self, vc: VC, ys: list[float]) -> None:
        """New part yields from now on: bring the VC up to date, move the tallies, predict its next end."""
        if ys == vc.yields and vc.id not in self.dirty:
            return
        self.dirty.discard(vc.id)
        vc.sync(self.t)
        tally = self.tally
        old_use = vc.use
        k = sum(vc.hosts.values())
        use = [0.0] * self.R
        for y, need, left in zip(ys, vc.needs, vc.rem, strict=True):
            if y > 0 and left > 0:
                for r in range(self.R):
                    use[r] += k * y * need[r]
        for r in range(self.R):
            tally.use[r] += use[r] - (old_use[r] if old_use else 0.0)
        vc.use = tuple(use)
        dom = vc.dom
        eff = use[dom] / (k * vc.agg[dom]) if vc.agg[dom] > 0 else 0.0
        tally.sum_y += eff - vc.eff
        tally.sum_y2 += eff * eff - vc.eff * vc.eff
        if vc.permanent:
            tally.perm_rate[vc.cls] += eff - vc.eff
        vc.eff = eff
        vc.yields = ys
        vc.version += 1
        end = vc.next_end()
        if end < math.inf:
            self.seq += 1
            heapq.heappush(self.heap, (end, self.seq, vc.id, vc.version))

    def leave(self, vc: VC) -> set[int]:
        """Remove a finished VC; returns the pairs it freed."""
        tally = self.tally
        for r in range(self.R):
            tally.use[r] -= vc.use[r] if vc.use else 0.0
        tally.sum_y -= vc.eff
        tally.sum_y2 -= vc.eff * vc.eff
        tally.running -= 1
        tally.count[vc.cls] -= 1
        freed = self.unregister(vc)
        del self.running[vc.id]
        self.placer.remove(vc)
        if vc.measured:
            span = self.t - vc.arrival
            self.times[vc.cls].append(span)
            self.slow[vc.cls].append(span / vc.alone if vc.alone > 0 else 1.0)
            self.waits[vc.cls].append(vc.started - vc.arrival)
            self.measured_left -= 1
            if self.o.record:
                self.completion[vc.id] = span
        return freed

    def try_queue(self) -> set[int]:
        """Admit waiting VCs that fit now, oldest first; returns the pairs they use."""
        touched: set[int] = set()
        still = []
        for vc in self.queue:
            hosts = self.placer.place(vc.cls, list(self.running.values()))
            if hosts is None:
                still.append(vc)
                continue
            touched |= self.admit(vc, hosts)
        self.queue = still
        return touched

    # ------------------------------------------------------------------------------------------ allocation

    def component(self, pairs: set[int]) -> tuple[list[VC], list[Key] | Groups]:
        """The VCs whose yields an event on ``pairs`` may change, and their rows on binding pairs.

        Under a decomposable policy, VCs interact only through pairs that can
        saturate (:attr:`bind`: their demand at full speed exceeds capacity):
        the allocation is that of each connected component of VCs linked by
        binding pairs, solved alone.  An event changes the demand of the pairs
        it touched only, so only pairs among those can change status; every
        component that changed holds a VC whose rows changed, or a VC on one
        of those pairs that binds now or did before.  Hence: those VCs, then
        everything linked to them through binding pairs.  A VC's rows on
        other pairs never constrain it and are left out.

        Returns the VCs and, for an engine that caches (one host), their keys
        (global pairs); otherwise the problem directly, one group per VC.
        """
        found: set[int] = set()
        vcs: list[VC] = []
        running, on_pair, bind = self.running, self.on_pair, self.bind
        for i in self.changed:
            if i in running:
                found.add(i)
                vcs.append(running[i])
        for p in pairs:
            if bind[p] or p in self.flipped:  # a pair that could not bind before nor now changes nobody
                for i in on_pair[p]:
                    if i not in found:
                        found.add(i)
                        vcs.append(running[i])
        local: dict[int, int] = {}
        rows: list[list[tuple[int, float]]] = []
        k = 0
        while k < len(vcs):
            vc = vcs[k]
            k += 1
            row = []
            for p, c in vc.rows:
                if bind[p]:
                    at = local.get(p)
                    if at is None:
                        at = local[p] = len(local)
                        for j in on_pair[p]:
                            if j not in found:
                                found.add(j)
                                vcs.append(running[j])
                    row.append((at, c))
            rows.append(row)
        pair_ids = list(local)
        if self.engine.caching:
            return vcs, [(vc.weight, tuple((pair_ids[i], c) for i, c in row)) for vc, row in zip(vcs, rows,
                                                                                              strict=True)]
        return vcs, Groups([1] * len(vcs), [vc.weight for vc in vcs], rows, pair_ids, [self.cap[p] for p in pair_ids])

    def keys(self, vcs: Sequence[VC]) -> list[Key]:
        """Each VC's rows on binding pairs only (the others never constrain it), with its weight."""
        bind = self.bind
        return [(vc.weight, tuple((p, c) for p, c in vc.rows if bind[p])) for vc in vcs]

    def reallocate(self, pairs: set[int]) -> None:
        keys: list[Key] | Groups
        if self.decomposable:
            vcs, keys = self.component(pairs)
        else:
            vcs = sorted(self.running.values(), key=lambda v: v.id)
            keys = self.keys(vcs)
        self.flipped.clear()
        self.changed.clear()
        if not vcs:
            return
        fair = self.engine.allocate(vcs, [self.memory[v.cls] for v in vcs], [self.tenant[v.cls] for v in vcs], keys)
        if self.o.altruism == 0:
            for vc, y in zip(vcs, fair, strict=True):
                vc.fair = y
                self.set_yields(vc, [y if r > 0 else 0.0 for r in vc.rem])
            return
        for vc in vcs:
            vc.sync(self.t)
        p = self.o.altruism
        alt = [True] * len(vcs) if p >= 1 else [bool(self.alt_rng.random() < p) for _ in vcs]
        ys, done = redistribute(vcs, fair, [self.remaining(v) for v in vcs], alt, self.pair_cap, self.R,
                                self.o.leftover, self.inv_total)
        for vc, y, part_ys in zip(vcs, fair, ys, strict=True):
            vc.fair = y
            self.set_yields(vc, part_ys)
        self.tally.given = [g / t if t > 0 else 0.0 for g, t in zip(done.given, self.totals, strict=True)]

    def adapt(self, arrival: VC | None) -> tuple[bool, set[int]]:
        """vcsched's adaptation within the budget (arrival included); False if the arrival does not fit."""
        running = sorted(self.running.values(), key=lambda v: v.id)
        assert self.o.migration_budget is not None
        out = self.placer.adapt(running, self.o.migration_budget, None if arrival is None else arrival.cls,
                                self.o.adapt_algorithm)
        if out is None:
            return False, set()
        new_hosts, arrival_hosts, moved = out
        if arrival is not None and arrival_hosts is None:
            return False, set()
        self.migrated += moved
        touched: set[int] = set()
        for vc, hosts in zip(running, new_hosts, strict=True):
            if hosts != vc.hosts:
                vc.sync(self.t)
                self.placer.remove(vc)
                vc.hosts = hosts
                self.placer.add(vc)
                touched |= self.refresh_rows(vc)
        if arrival is not None and arrival_hosts is not None:
            touched |= self.admit(arrival, arrival_hosts)
        return True, touched

    # ------------------------------------------------------------------------------------------ the loop

    def run(self) -> RunResult:
        start = time.perf_counter()
        o = self.o
        total = o.warmup + o.arrivals
        for k, c in enumerate(self.w.classes):
            for _ in range(c.permanent):
                vc = self.new_vc(k, 0.0, math.inf, False, permanent=True)
                hosts = self.placer.place(k, list(self.running.values()))
                if hosts is None:
                    raise InputError(f"classes[{k}].permanent: {c.permanent} VCs of class {c.name!r} do not fit "
                                     f"in memory together")
                self.tally.count[k] += 1
                self.admit(vc, hosts)
        self.reallocate(set(range(len(self.on_pair))))
        nxt = next(self.arrivals, None)
        arrived_all = nxt is None
        if self.trace and nxt is None:
            raise InputError("trace: no arrivals")
        last_report = 0
        if self.on_progress:
            self.on_progress(0, total, o.policy)
        while True:
            if self.measured_left == 0 and self.n_arrived >= total and not self.trace:
                break
            if self.measured_left == 0 and arrived_all:
                break
            t_arr = nxt.time if nxt is not None else math.inf
            while self.heap:
                t_end, _, i, version = self.heap[0]
                top = self.running.get(i)
                if top is None or top.version != version:
                    heapq.heappop(self.heap)
                    continue
                break
            t_end = self.heap[0][0] if self.heap else math.inf
            if t_arr == math.inf and t_end == math.inf:
                if self.queue:
                    raise UnstableError("VCs wait for memory that no departure will free")
                break
            self.events += 1
            if t_arr <= t_end:
                assert nxt is not None
                self.tally.advance(self.t, t_arr)
                self.t = max(self.t, t_arr)
                self.arrive(nxt)
                nxt = next(self.arrivals, None)
                if nxt is None:
                    arrived_all = True
                    if not self.trace:  # pragma: no cover - Poisson streams never end
                        raise AssertionError("the Poisson stream ended")
                if self.on_progress and self.n_arrived - last_report >= 2000:
                    last_report = self.n_arrived
                    self.on_progress(min(self.n_arrived, total), total, o.policy)
            else:
                _, _, i, _ = heapq.heappop(self.heap)
                self.tally.advance(self.t, t_end)
                self.t = max(self.t, t_end)
                self.part_end(self.running[i])
        if self.trace and self.tally.end == math.inf:
            self.tally.end = self.t
        if self.on_progress:
            self.on_progress(total, total, o.policy)
        return self.result(time.perf_counter() - start)

    def arrive(self, a: Arrival) -> None:
        idx = self.n_arrived
        self.n_arrived += 1
        o = self.o
        measured = idx >= o.warmup and (self.trace or idx < o.warmup + o.arrivals)
        if idx == o.warmup:
            self.tally.start = a.time
        if not self.trace and idx == o.warmup + o.arrivals - 1:
            self.tally.end = a.time
        if measured:
            self.measured_left += 1
            self.measured_rate[a.cls] += 1
        work = a.work if a.work is not None else float(self.w.classes[a.cls].work.draw(self.rngs[a.cls]))
        vc = self.new_vc(a.cls, a.time, work, measured)
        if measured:
            self.measured_size[a.cls] += vc.alone
        self.tally.count[a.cls] += 1
        if self.tally.count[a.cls] > MAX_IN_SYSTEM:
            raise UnstableError(f"more than {MAX_IN_SYSTEM} VCs of class {self.w.classes[a.cls].name!r} in the "
                                f"system at time {self.t:.6g}: the load is beyond what the cluster sustains")
        if o.migration_budget is not None:
            ok, touched = self.adapt(vc)
            if not ok:
                self.queue.append(vc)
                return
            self.reallocate(touched)
            return
        hosts = self.placer.place(a.cls, list(self.running.values()) if o.placement == "mcb8" else ())
        if hosts is None:
            self.queue.append(vc)
            return
        self.reallocate(self.admit(vc, hosts))

    def part_end(self, vc: VC) -> None:
        was = [r > 0 for r in vc.rem]
        vc.sync(self.t)
        horizon = DONE_RTOL * max(1.0, self.t)
        ended = False
        for b, (r, y) in enumerate(zip(vc.rem, vc.yields, strict=True)):
            if was[b] and (r <= 0 or (y > 0 and r / y <= horizon)):
                vc.rem[b] = 0.0
                ended = True
        if not ended:  # rounding: the predicted end came a hair early; predict again
            vc.version += 1
            self.seq += 1
            heapq.heappush(self.heap, (vc.next_end(), self.seq, vc.id, vc.version))
            return
        self.dirty.add(vc.id)
        if all(r <= 0 for r in vc.rem):
            if vc.phase + 1 < len(self.phase_needs[vc.cls]):
                touched = self.enter_phase(vc, vc.phase + 1)
            else:
                touched = self.leave(vc)
                touched |= self.try_queue()
                if self.o.migration_budget is not None and self.running:
                    _, moved = self.adapt(None)
                    touched |= moved
        else:
            touched = self.refresh_rows(vc)
        self.reallocate(touched)

    def result(self, wall: float) -> RunResult:
        tally = self.tally
        span = tally.end - tally.start if math.isfinite(tally.end) and math.isfinite(tally.start) else 0.0
        classes = []
        for k, c in enumerate(self.w.classes):
            if self.trace:
                rate = self.measured_rate[k] / span if span > 0 else 0.0
                size = self.measured_size[k] / self.measured_rate[k] if self.measured_rate[k] else 0.0
            else:
                rate, size = c.rate, c.work.mean * sum(max(f) for f in self.phase_frac[k])
            classes.append(class_result(c.name, rate, size, tally.area[k], span, self.times[k], self.slow[k],
                                        self.waits[k], tally.perm_area[k], c.permanent))
        util = {r: (tally.use_area[i] / span / self.totals[i] if span > 0 and self.totals[i] > 0 else 0.0)
                for i, r in enumerate(self.res)}
        given = {r: tally.given_area[i] / span if span > 0 else 0.0 for i, r in enumerate(self.res)}
        return RunResult(
            policy=self.o.policy, replication=self.o.replication, seed=self.o.seed, classes=tuple(classes),
            utilisation=util, jain=tally.jain_area / tally.jain_time if tally.jain_time > 0 else 1.0, given=given,
            window=(tally.start, tally.end), events=self.events, wall_s=wall, migrated_bytes=self.migrated,
            engine=dict(self.engine.stats), max_in_progress=tally.max_running,
            mean_in_progress=tally.run_area / span if span > 0 else 0.0,
            completion=dict(self.completion),
            mean_yield=tally.yield_area / tally.busy_time if tally.busy_time > 0 else None,
        )


def simulate(workload: Workload, options: RunOptions, arrivals: Sequence[Arrival] | None = None,
             on_progress: OnProgress | None = None) -> RunResult:
    """One replication of ``workload`` under ``options`` (Poisson arrivals, or the given trace)."""
    return Simulation(workload, options, iter(arrivals) if arrivals is not None else None, on_progress).run()
