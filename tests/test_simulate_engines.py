"""The simulator's fast engines give the policy registry's allocations, on random problems."""

from __future__ import annotations

import numpy as np
import pytest

from vcsched.constraints import capacities
from vcsched.model import Host, Instance, Job
from vcsched.policies import PolicyOptions, allocate_policy
from vcsched.policies.shares import asset_shares, dominant_shares, pool_shares
from vcsched.simulate import dualpf, maxmin
from vcsched.simulate.engines import Cluster, MaxMinEngine, RegistryEngine, UtilityEngine
from vcsched.simulate.rows import Groups, group
from vcsched.simulate.state import VC

RESOURCES = ("cpu", "io")


def random_case(rng: np.random.Generator) -> tuple[Instance, np.ndarray, list[VC]]:
    """An instance of 1–3 hosts and 1–7 jobs of 1–3 VMs, and the same jobs as simulator VCs."""
    n_hosts = int(rng.integers(1, 4))
    hosts = tuple(Host(f"h{i}", cpu=float(rng.uniform(0.5, 2)), memory=10.0,
                       capacity=(("io", float(rng.uniform(0.5, 2))),)) for i in range(n_hosts))
    jobs, place, vcs = [], [], []
    for j in range(int(rng.integers(1, 8))):
        k = int(rng.integers(1, 4))
        cpu, io = float(rng.uniform(0.01, 1)), float(rng.choice([0.0, rng.uniform(0, 1)]))
        weight = float(rng.choice([0.5, 1.0, 2.0]))
        jobs.append(Job(f"j{j}", cpu, 0.0, k, needs=(("io", io),) if io > 0 else (), weight=weight))
        where = rng.integers(0, n_hosts, size=k).tolist()
        place += where
        vc = VC(j, 0, 0.0, 1.0, weight, False)
        vc.hosts = {}
        for h in where:
            vc.hosts[h] = vc.hosts.get(h, 0) + 1
        vc.agg = (cpu, io)
        vc.rows = tuple((h * 2 + r, c * v) for h, c in sorted(vc.hosts.items()) for r, v in enumerate(vc.agg) if v > 0)
        vc.key = (weight, vc.rows)
        vcs.append(vc)
    inst = Instance(hosts, tuple(jobs))
    return inst, np.array(place), vcs


def cluster_of(inst: Instance) -> Cluster:
    return Cluster(inst.resources, inst.hosts, inst.host_capacity)


@pytest.mark.parametrize("policy", ["drf", "drf-pools", "asset"])
def test_water_filling_engine_gives_the_registrys_max_min_policies(policy: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(60):
        inst, place, vcs = random_case(rng)
        engine = MaxMinEngine(cluster_of(inst), policy, PolicyOptions())
        mine = engine.allocate(vcs, [0.0] * len(vcs), [None] * len(vcs))
        ref = allocate_policy(inst, place, policy).yields
        np.testing.assert_allclose(mine, ref, atol=1e-12)


@pytest.mark.parametrize(("policy", "alpha"), [("pf", None), ("alpha-fair", 2.0), ("alpha-fair", 0.5)])
def test_dual_newton_gives_the_registrys_conic_optimum(policy: str, alpha: float | None) -> None:
    rng = np.random.default_rng(11)
    for _ in range(40):
        inst, place, vcs = random_case(rng)
        engine = UtilityEngine(cluster_of(inst), policy, PolicyOptions(alpha=alpha))
        mine = engine.allocate(vcs, [0.0] * len(vcs), [None] * len(vcs))
        ref = allocate_policy(inst, place, policy, PolicyOptions(alpha=alpha)).yields
        np.testing.assert_allclose(mine, ref, atol=1e-8)
        assert engine.stats["fallbacks"] == 0


def test_dual_newton_converges_when_one_group_binds_several_pairs() -> None:
    # One free group over six pairs: the dual Hessian has rank 1 (the prices are not unique); damping copes.
    g = Groups(mult=[1, 1], weight=[0.5, 1.0],
               entries=[[(0, 0.6477), (1, 0.3824), (2, 0.6477), (3, 0.3824), (4, 0.6477), (5, 0.3824)],
                        [(4, 0.0176), (5, 0.2757)]],
               pairs=list(range(6)), capacity=[0.6869, 0.5169, 1.6213, 1.6461, 0.7235, 1.3591])
    for alpha in (1.0, 2.0, 0.5):
        solved = dualpf.solve(g, alpha)
        assert solved is not None
        y, prices = solved
        load = [sum(g.mult[k] * c * y[k] for k in range(2) for q, c in g.entries[k] if q == p) for p in range(6)]
        assert all(v <= cap * (1 + 1e-12) for v, cap in zip(load, g.capacity, strict=True))
        assert all(v >= 0 for v in prices.values())


def test_pf_prices_sum_to_the_number_of_jobs_on_one_pool() -> None:
    # Bonald & Roberts eq. (5): Σ_j ν_j = n when no cap binds.  Remark 4: ν = (3/2, 1/2).
    g, _, _ = group([(1.0, ((0, 0.5), (1, 1.0))), (1.0, ((0, 1.0), (1, 1 / 3)))], [1.0, 1.0])
    y, nu = dualpf.solve(g) or ([], {})
    np.testing.assert_allclose(y, [0.8, 0.6], atol=1e-12)
    np.testing.assert_allclose([nu[0], nu[1]], [1.5, 0.5], atol=1e-12)


def test_groups_of_identical_vcs_get_one_yield() -> None:
    keys = [(1.0, ((0, 1.0),)), (1.0, ((0, 0.5),)), (1.0, ((0, 1.0),))]
    g, of, sig = group(keys, [1.0], signature=True)
    assert g.mult == [2, 1] and of == [0, 1, 0]
    _g2, _, sig2 = group(list(reversed(keys)), [1.0], signature=True)
    assert sig == sig2  # same problem whatever the order: one cache entry
    # DRF on one resource (rates 1 / need): equal shares y × need = 1/3 for the three VCs
    y = maxmin.waterfill(g, [1.0, 2.0])
    assert y == pytest.approx([1 / 3, 2 / 3])


def test_registry_engine_caches_by_the_multiset_of_vcs() -> None:
    rng = np.random.default_rng(3)
    inst, _, vcs = random_case(rng)
    engine = RegistryEngine(cluster_of(inst), "drf", PolicyOptions())
    first = engine.allocate(vcs, [0.0] * len(vcs), [None] * len(vcs))
    again = engine.allocate(list(reversed(vcs)), [0.0] * len(vcs), [None] * len(vcs))
    assert engine.stats["cache_hits"] == 1
    assert again == list(reversed(first))


def test_shares_used_by_the_rates_are_the_registrys() -> None:
    rng = np.random.default_rng(5)
    inst, place, vcs = random_case(rng)
    cl = cluster_of(inst)
    drf, asset, pools = (MaxMinEngine(cl, p, PolicyOptions()) for p in ("drf", "asset", "drf-pools"))
    d, _ = dominant_shares(inst)
    per_pool, _ = pool_shares(capacities(inst, place), inst.n_jobs)
    for j, vc in enumerate(vcs):
        assert drf.rate(vc) == pytest.approx(vc.weight / d[j])
        assert asset.rate(vc) == pytest.approx(vc.weight / asset_shares(inst)[j])
        assert pools.rate(vc) == pytest.approx(vc.weight / per_pool[j])
