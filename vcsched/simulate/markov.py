"""Exact service rates on one pool: the Markov chain of Bonald & Roberts' dynamic model, solved numerically.

With Poisson arrivals, exponential work and allocations that depend only on
how many VCs of each class are present, the vector ``n = (n_1, …, n_K)`` is a
Markov chain ("Enhanced Cluster Computing Performance through Proportional
Fairness", §3.1): births at rate ``λ_k``, deaths at rate ``n_k y_k(n) / E[W_k]``,
``y_k(n)`` the policy's yield for a class-k VC in state ``n``.  Truncating each
``n_k`` at a bound and solving ``π Q = 0`` gives ``E[n_k]`` and ``γ_k = ρ_k /
E[n_k]`` exactly, up to the truncated mass, which is reported (the bound is
doubled until it is below ``tol``).  This is the oracle the simulator is
tested against; the yields come from the simulator's own engines, which are
tested against the policy registry separately.

:func:`strategy_proofness` is the one-dimensional chain of §3.4: one
permanent class-1 job (which may lie about its profile) and class-2 arrivals.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.linalg import spsolve

from vcsched.errors import InputError
from vcsched.model import Host
from vcsched.policies import PolicyOptions
from vcsched.simulate import scenarios
from vcsched.simulate.engines import Cluster, engine_for
from vcsched.simulate.state import VC
from vcsched.simulate.workload import Workload

MAX_STATES = 2_000_000


@dataclass(frozen=True)
class Chain:
    """Exact means of a truncated chain."""

    mean_in_system: tuple[float, ...]
    service_rate: tuple[float | None, ...]  # γ_k = ρ_k / E[n_k]; None for a class without arrivals
    truncated_mass: float  # stationary probability of the states on the truncation boundary
    states: int
    permanent_yield: tuple[float | None, ...] = ()  # mean yield of a class's permanent VCs (§3.4's γ_1)


class PoolYields:
    """``y_k(n)`` for one-host workloads, from the simulator's engine for the policy (cached per state)."""

    def __init__(self, workload: Workload, policy: str, alpha: float | None = None) -> None:
        if workload.n_hosts != 1:
            raise InputError("markov: the exact chain is for one host (one pool)")
        h = workload.host_list[0]
        self.res = workload.resources
        cluster = Cluster(self.res, (Host(h.name, h.cpu, h.memory, h.capacity),), workload.capacity_matrix(),
                          workload.tenants)
        self.engine = engine_for(cluster, policy, PolicyOptions(alpha=alpha if policy == "alpha-fair" else None))
        self.workload = workload
        self.protos: list[VC] = []
        for k, c in enumerate(workload.classes):
            if len(c.phases) != 1 or len(c.phases[0].parts) != 1:
                raise InputError(f"markov: class {c.name!r} has phases; the chain needs one part per class")
            vc = VC(k, k, 0.0, 1.0, c.weight, False)
            need = dict(c.phases[0].parts[0].needs)
            vc.agg = tuple(need.get(r, 0.0) for r in self.res)
            vc.hosts = {0: c.vms}
            vc.rows = tuple((r, c.vms * v) for r, v in enumerate(vc.agg) if v > 0)
            vc.key = (vc.weight, vc.rows)
            self.protos.append(vc)
        self.engine.caching = False  # this class caches per state itself
        self.cache: dict[tuple[int, ...], list[float]] = {}

    def __call__(self, counts: Sequence[int]) -> list[float]:
        key = tuple(counts)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        vcs = [self.protos[k] for k, n in enumerate(counts) for _ in range(n)]
        y = self.engine.allocate(vcs, [self.workload.classes[v.cls].memory for v in vcs],
                                 [self.workload.classes[v.cls].tenant for v in vcs]) if vcs else []
        out = [0.0] * len(counts)
        for v, yv in zip(vcs, y, strict=True):
            out[v.cls] = yv
        self.cache[key] = out
        return out


def solve_chain(workload: Workload, policy: str, *, alpha: float | None = None, tol: float = 1e-10,
                start: int | None = None) -> Chain:
    """``E[n_k]`` and ``γ_k`` for a one-host workload with exponential work (the classes' rates as given)."""
    for c in workload.classes:
        if c.work.dist != "exp":
            raise InputError(f"markov: class {c.name!r} has {c.work.dist} work; the chain needs exponential work")
        if c.permanent and c.rate > 0:
            raise InputError(f"markov: class {c.name!r} has permanent VCs and arrivals; the chain takes either")
    yields = PoolYields(workload, policy, alpha)
    lam = np.array([c.rate for c in workload.classes])
    mu = np.array([1.0 / c.work.mean for c in workload.classes])
    fixed = [c.permanent for c in workload.classes]
    load = float(workload.loads().max())
    bound = start or max(8, math.ceil(math.log(tol) / math.log(max(load, 1e-3))))
    dims = sum(1 for x in lam if x > 0)
    while True:
        if (bound + 1) ** dims > MAX_STATES:
            raise InputError(f"markov: {(bound + 1) ** dims:.3g} states for {dims} classes at load {load:.3g}, "
                             f"more than {MAX_STATES:.3g}: use the simulation")
        chain = _solve(yields, lam, mu, bound, fixed)
        if chain.truncated_mass <= tol:
            return chain
        bound *= 2


def _solve(yields: PoolYields, lam: np.ndarray, mu: np.ndarray, bound: int, fixed: Sequence[int]) -> Chain:
    """``fixed[k]``: permanent VCs of a class without arrivals (its count never changes)."""
    k_n = len(lam)
    dims = [bound + 1 if lam[k] > 0 else 1 for k in range(k_n)]
    states = [tuple(x if lam[k] > 0 else fixed[k] for k, x in enumerate(s))
              for s in itertools.product(*(range(d) for d in dims))]
    index = {s: i for i, s in enumerate(states)}
    rows, cols, vals = [], [], []
    for i, s in enumerate(states):
        y = yields(s)
        out = 0.0
        for k in range(k_n):
            if lam[k] > 0 and s[k] + 1 < dims[k]:
                j = index[(*s[:k], s[k] + 1, *s[k + 1:])]
                rows.append(i)
                cols.append(j)
                vals.append(lam[k])
                out += lam[k]
            if lam[k] > 0 and s[k] > 0:
                rate = s[k] * y[k] * mu[k]
                if rate > 0:
                    j = index[(*s[:k], s[k] - 1, *s[k + 1:])]
                    rows.append(i)
                    cols.append(j)
                    vals.append(rate)
                    out += rate
        rows.append(i)
        cols.append(i)
        vals.append(-out)
    n = len(states)
    q = coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
    # π Q = 0, Σ π = 1: replace one balance equation by the normalisation
    a = q.T.tolil()
    a[0, :] = np.ones(n)
    b = np.zeros(n)
    b[0] = 1.0
    pi = np.maximum(spsolve(a.tocsc(), b), 0.0)
    pi /= pi.sum()
    arr = np.array(states, dtype=float)
    mean = pi @ arr
    edge = np.zeros(n, dtype=bool)
    for k in range(k_n):
        if dims[k] > 1:
            edge |= arr[:, k] == dims[k] - 1
    rho = lam / mu
    gamma = tuple((float(rho[k] / mean[k]) if mean[k] > 0 else 1.0) if lam[k] > 0 else None for k in range(k_n))
    ys = np.array([yields(st) for st in states])
    perm = tuple(float(pi @ ys[:, k]) if fixed[k] and lam[k] == 0 else None for k in range(k_n))
    return Chain(tuple(float(x) for x in mean), gamma, float(pi[edge].sum()), n, perm)


def strategy_proofness(alpha: float, beta: float | None, rho2: float, policy: str = "pf",
                       tol: float = 1e-12) -> float:
    """§3.4: the permanent class-1 job's service rate ``γ_1 = Σ_n π(n) y_1(n)`` against Poisson class 2.

    Class 1 truly needs ``(1, α)`` and claims ``(1, β)`` (``beta=None``: the truth);
    class 2 needs ``(α, 1)``.  Its progress is its yield: CPU is its real
    bottleneck and its claimed CPU need is the true one.  Class-2 jobs form a
    birth–death chain: births ``ρ_2`` (``μ_2 = 1``), deaths ``n y_2(n)``.
    """
    w = scenarios.strategy_proofness(alpha, beta)
    yields = PoolYields(w, policy)
    pis = [1.0]
    y1 = [yields((1, 0))[0]]
    n = 0
    while True:
        n += 1
        y = yields((1, n))
        death = n * y[1]
        pis.append(pis[-1] * rho2 / death)
        y1.append(y[0])
        if pis[-1] / sum(pis) < tol and n > 10:
            break
    p = np.array(pis) / sum(pis)
    return float(p @ np.array(y1))
