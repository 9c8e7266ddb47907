"""How a sharing policy of the registry is evaluated at every event of a simulation.

Every policy of :mod:`vcsched.policies` can run through :class:`RegistryEngine`:
the running VCs become an :class:`~vcsched.model.Instance` (one job per VC,
its needs the sum of its running parts' needs) and
:func:`vcsched.policies.allocate_policy` allocates them, validated, exactly as
``vcsched solve --policy`` would.  That costs milliseconds (the conic policies
tens of them), too much for hundreds of thousands of events, so:

* the results are cached by the multiset of VCs (identical VCs — same class
  state, placement and weight — are interchangeable): on one host the state
  is the number of VCs of each class, and a run revisits the same states;
* the policies that decompose over VCs that share no host (``drf``,
  ``drf-pools``, ``asset``, ``pf``, ``alpha-fair``: their rates or objective
  are per VC) have fast exact engines, called on the connected component of
  the VCs an event touched only: :class:`MaxMinEngine` (water-filling on
  groups of identical VCs, :mod:`vcsched.simulate.maxmin`) and
  :class:`UtilityEngine` (Newton on the dual, :mod:`vcsched.simulate.dualpf`,
  warm-started from the last prices, falling back to the registry if Newton
  ever fails).  tests/test_simulate_engines.py checks them against the
  registry on random problems.

``yield`` (max-min then mean: the minimum is global) and ``hdrf`` (the tenant
tree) do not decompose and always run through the registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vcsched.model import CPU, Host, Instance, Job, Tenant
from vcsched.policies import PolicyOptions, allocate_policy, get
from vcsched.simulate import dualpf, maxmin
from vcsched.simulate.rows import Groups, Key, group, singles
from vcsched.simulate.state import VC

FAST = ("drf", "drf-pools", "asset", "pf", "alpha-fair")
CACHE_SIZE = 200_000


@dataclass(frozen=True)
class Cluster:
    """The fixed side of every allocation: hosts, resources, capacities per (host, resource) pair."""

    resources: tuple[str, ...]
    hosts: tuple[Host, ...]
    capacity: np.ndarray  # hosts x resources
    tenants: tuple[Tenant, ...] = ()

    @property
    def n_res(self) -> int:
        return len(self.resources)

    @property
    def totals(self) -> np.ndarray:
        return self.capacity.sum(axis=0)

    def pair_capacity(self) -> list[float]:
        """Capacity of every pair, indexed ``host × R + resource``."""
        return [float(v) for v in self.capacity.ravel()]


class Engine(ABC):
    """Fair yields for a list of VCs; ``decomposable``: may be called on one connected component at a time.

    Abstract: a subclass says how (``allocate``); this base holds what all share, the cache and the problem's
    grouping.
    """

    name = ""
    decomposable = False

    def __init__(self, cluster: Cluster, policy: str, options: PolicyOptions) -> None:
        self.cluster = cluster
        self.policy = policy
        self.options = options
        self.pair_cap = cluster.pair_capacity()
        self.stats: dict[str, int] = {"calls": 0, "cache_hits": 0}
        self.cache: OrderedDict[object, Any] = OrderedDict()
        # On one host the state is the number of VCs of each class, and states recur: cache.  On many hosts
        # placements make nearly every problem new, and the cache would cost more than it saves.
        self.caching = len(cluster.hosts) == 1

    def cached(self, sig: object) -> Any:
        """A result for the same problem (same signature), LRU; the fast engines cache per group."""
        hit = self.cache.get(sig)
        if hit is not None:
            self.cache.move_to_end(sig)
            self.stats["cache_hits"] += 1
        return hit

    def problem(self, vcs: Sequence[VC], keys: Sequence[Key] | Groups | None
                ) -> tuple[Groups, list[int], frozenset[tuple[Key, int]] | None]:
        """The groups to solve, each VC's group, and the signature to cache by (None: not caching)."""
        if isinstance(keys, Groups):
            return keys, list(range(len(vcs))), None
        ks = sig_keys(vcs, keys)
        if self.caching:
            return group(ks, self.pair_cap, signature=True)
        return singles(ks, self.pair_cap), list(range(len(ks))), None

    def lookup(self, vcs: Sequence[VC], keys: Sequence[Key] | Groups | None
               ) -> tuple[Groups, list[int], frozenset[tuple[Key, int]] | None, list[float] | None]:
        """One call of a grouped engine: :meth:`problem`, and the yields in VC order if it was solved before."""
        self.stats["calls"] += 1
        groups, of, sig = self.problem(vcs, keys)
        hit = self.cached(sig) if sig is not None else None
        return groups, of, sig, None if hit is None else [hit[k] for k in sig_keys(vcs, keys)]

    def remember(self, sig: object, vcs: Sequence[VC], keys: Sequence[Key] | Groups | None, of: Sequence[int],
                 y: Sequence[float]) -> None:
        """Cache a grouped engine's per-group yields ``y`` by key (nothing when not caching: ``sig`` None)."""
        if sig is not None:
            self.store(sig, {k: y[g] for k, g in zip(sig_keys(vcs, keys), of, strict=True)})

    def store(self, sig: object, y: Any) -> None:
        self.cache[sig] = y
        if len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)

    @abstractmethod
    def allocate(self, vcs: Sequence[VC], memory: Sequence[float], tenants: Sequence[str | None],
                 keys: Sequence[Key] | Groups | None = None) -> list[float]:
        """Fair yields of ``vcs``.

        ``keys``: their rows restricted to the pairs that can bind (default: all their rows), or the problem
        already built, one group per VC in order.
        """


def sig_keys(vcs: Sequence[VC], keys: Sequence[Key] | Groups | None) -> list[Key]:
    return [vc.key for vc in vcs] if keys is None or isinstance(keys, Groups) else list(keys)


class RegistryEngine(Engine):
    """Any registry policy, through :func:`vcsched.policies.allocate_policy`, cached by the multiset of VCs."""

    def allocate(self, vcs: Sequence[VC], memory: Sequence[float], tenants: Sequence[str | None],
                 keys: Sequence[Key] | Groups | None = None) -> list[float]:
        self.stats["calls"] += 1
        vc_keys = [(vc.key, memory[i], tenants[i]) for i, vc in enumerate(vcs)]
        counts: dict[object, int] = {}
        for k in vc_keys:
            counts[k] = counts.get(k, 0) + 1
        sig = frozenset(counts.items())
        hit = self.cached(sig)
        if hit is not None:
            return [hit[k] for k in vc_keys]
        y = self.solve(vcs, memory, tenants)
        # Identical VCs may differ by a solver's tie-breaking (H-DRF's document order, an LP's vertex): they
        # get their mean, which is as feasible and, for these symmetric objectives, as good.
        sums: dict[object, list[float]] = {}
        for k, v in zip(vc_keys, y, strict=True):
            s = sums.setdefault(k, [0.0, 0.0])
            s[0] += v
            s[1] += 1
        mean = {k: s[0] / s[1] for k, s in sums.items()}
        self.store(sig, mean)
        return [mean[k] for k in vc_keys]

    def instance(self, vcs: Sequence[VC], memory: Sequence[float], tenants: Sequence[str | None]
                 ) -> tuple[Instance, np.ndarray]:
        res = self.cluster.resources
        jobs = []
        place: list[int] = []
        for i, vc in enumerate(vcs):
            agg = dict(zip(res, vc.agg, strict=True))
            k = sum(vc.hosts.values())
            jobs.append(Job(f"vc{vc.id}", agg.pop(CPU), memory[i], k,
                            needs=tuple((r, v) for r, v in agg.items() if v > 0), weight=vc.weight,
                            tenant=tenants[i]))
            for h, c in sorted(vc.hosts.items()):
                place.extend([h] * c)
        return Instance(self.cluster.hosts, tuple(jobs), self.cluster.tenants), np.array(place, dtype=np.int64)

    def solve(self, vcs: Sequence[VC], memory: Sequence[float], tenants: Sequence[str | None]) -> list[float]:
        if not vcs:
            return []
        inst, place = self.instance(vcs, memory, tenants)
        return list(allocate_policy(inst, place, self.policy, self.options).yields)


class MaxMinEngine(Engine):
    """``drf``, ``drf-pools``, ``asset``: exact water-filling with each VC's rate (see the policies' docs)."""

    def __init__(self, cluster: Cluster, policy: str, options: PolicyOptions) -> None:
        super().__init__(cluster, policy, options)
        self.decomposable = True
        totals = cluster.totals
        self.inv_total = [1.0 / t if t > 0 else 0.0 for t in totals.tolist()]

    def rate(self, vc: VC) -> float:
        r = self.cluster.n_res
        if self.policy == "drf-pools":
            worst = 0.0
            for p, c in vc.rows:
                cap = self.pair_cap[p]
                if cap <= 0:
                    return 0.0
                worst = max(worst, c / cap)
            return vc.weight / worst if worst > 0 else 0.0
        k = sum(vc.hosts.values())
        shares = [k * need * inv for need, inv in zip(vc.agg, self.inv_total, strict=True)]
        per_unit = sum(shares) if self.policy == "asset" else max(shares, default=0.0)
        del r
        return vc.weight / per_unit if per_unit > 0 else 0.0

    def allocate(self, vcs: Sequence[VC], memory: Sequence[float], tenants: Sequence[str | None],
                 keys: Sequence[Key] | Groups | None = None) -> list[float]:
        groups, of, sig, hit = self.lookup(vcs, keys)
        if hit is not None:
            return hit
        rates = [0.0] * groups.n
        for vc, g in zip(vcs, of, strict=True):
            if vc.rate < 0:
                vc.rate = self.rate(vc)
            rates[g] = vc.rate
        y = maxmin.waterfill(groups, rates)
        self.remember(sig, vcs, keys, of, y)
        return [y[g] for g in of]


class UtilityEngine(Engine):
    """``pf`` and ``alpha-fair``: Newton on the dual, warm-started; the registry's conic solver as fallback."""

    def __init__(self, cluster: Cluster, policy: str, options: PolicyOptions) -> None:
        super().__init__(cluster, policy, options)
        self.decomposable = True
        self.alpha = 1.0 if policy == "pf" else float(options.alpha or 1.0)
        self.prices: dict[int, float] = {}
        self.fallback = RegistryEngine(cluster, policy, options)
        self.stats.update(newton=0, fallbacks=0)

    def allocate(self, vcs: Sequence[VC], memory: Sequence[float], tenants: Sequence[str | None],
                 keys: Sequence[Key] | Groups | None = None) -> list[float]:
        groups, of, sig, hit = self.lookup(vcs, keys)
        if hit is not None:
            return hit
        solved = dualpf.solve(groups, self.alpha, self.prices, self.stats)
        if solved is None:
            self.stats["fallbacks"] += 1
            return self.fallback.solve(vcs, memory, tenants)
        y, prices = solved
        self.remember(sig, vcs, keys, of, y)
        for p in groups.pairs:
            self.prices.pop(p, None)
        self.prices.update(prices)
        return [y[g] for g in of]


def engine_for(cluster: Cluster, policy: str, options: PolicyOptions | None = None, *, fast: bool = True) -> Engine:
    """The engine that evaluates ``policy`` (checked against the registry); ``fast=False``: always the registry."""
    options = options or PolicyOptions()
    get(policy)  # unknown names: the registry's one-line error
    if fast and policy in ("drf", "drf-pools", "asset"):
        return MaxMinEngine(cluster, policy, options)
    if fast and policy in ("pf", "alpha-fair"):
        return UtilityEngine(cluster, policy, options)
    return RegistryEngine(cluster, policy, options)
