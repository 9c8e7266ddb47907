"""Properties of the sharing policies on random instances (hypothesis), and exact cross-checks.

Single host: the papers' own model (one pool), where their theorems apply
as stated.  Several hosts: vcsched's model, where a job's single yield
couples its hosts; there the properties are stated in Bonald & Roberts'
pool reading (every (host, resource) pair a pool), which is the model their
proofs cover.  The max-min policies are checked against an independent
sequence of LPs (HiGHS), PF against its KKT conditions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.policy_cases import constraint_rows, leximin_lp, loads, needed_pairs, not_pareto, one_host, run, useful_yield
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.model import Host, Instance, Job, Tenant
from vcsched.policies import PolicyOptions, allocate_policy
from vcsched.solvers.registry import solve
from vcsched.yields import allocate

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FRACTION = st.integers(1, 20).map(lambda k: k / 20)  # 0.05 .. 1 on a grid: no near-ties from float noise
CAPACITY = st.integers(2, 40).map(lambda k: k / 20)  # 0.1 .. 2
TIGHT = st.integers(2, 10).map(lambda k: k / 20)  # 0.1 .. 0.5: few jobs reach their cap
ALL = ("yield", "drf", "drf-pools", "asset", "pf", "alpha-fair", "hdrf")


@st.composite
def clusters(draw: st.DrawFn, hosts: tuple[int, int] = (1, 1), resources: tuple[int, int] = (1, 4),
             jobs: tuple[int, int] = (2, 6), max_tasks: int = 3, weighted: bool = False,
             zero_capacity: bool = False, tight: bool = False) -> tuple[Instance, np.ndarray]:
    """Random hosts and jobs, and a random placement (memory is 0: only fluid resources matter)."""
    capacity = TIGHT if tight else CAPACITY
    n_hosts = draw(st.integers(*hosts))
    extras = [f"r{i}" for i in range(1, draw(st.integers(*resources)))]
    host_list = []
    for h in range(n_hosts):
        caps = []
        for r in extras:
            zero = zero_capacity and h > 0 and draw(st.booleans())  # host 0 always has some of each
            caps.append((r, 0.0 if zero else draw(capacity)))
        host_list.append(Host(f"h{h}", draw(capacity), 1.0, tuple(caps)))
    job_list = []
    for j in range(draw(st.integers(*jobs))):
        needs = tuple((r, v) for r in extras if (v := draw(st.sampled_from([0.0]) | FRACTION)) > 0)
        weight = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) if weighted else 1.0
        job_list.append(Job(f"j{j}", draw(FRACTION), 0.0, draw(st.integers(1, max_tasks)), needs, weight))
    inst = Instance(tuple(host_list), tuple(job_list))
    placement = np.array([draw(st.integers(0, n_hosts - 1)) for _ in range(inst.n_tasks)], dtype=np.int64)
    return inst, placement


def options(policy: str) -> PolicyOptions:
    return PolicyOptions(alpha=2.0 if policy == "alpha-fair" else None)


def cluster_dominant(inst: Instance) -> np.ndarray:
    """D_j on cluster totals, computed here from the definition: max_r k_j need_jr / sum_h C_hr."""
    totals = {r: sum(h.capacity_of(r) for h in inst.hosts) for r in inst.resources}
    return np.array([max(j.tasks * j.need_of(r) / totals[r] for r in inst.resources if j.need_of(r) > 0)
                     for j in inst.jobs])


def pool_dominant(inst: Instance, hosts: np.ndarray) -> np.ndarray:
    """D_j over pools: max over the pairs it needs of n_jh need_jr / C_hr (inf on a pair of capacity 0)."""
    out = []
    first = 0
    for j, job in enumerate(inst.jobs):
        on = hosts[first:first + job.tasks]
        first += job.tasks
        best = 0.0
        for h, r in needed_pairs(inst, hosts, j):
            cap = inst.hosts[h].capacity_of(inst.resources[r])
            need = int(np.sum(on == h)) * job.need_of(inst.resources[r])
            best = max(best, math.inf if cap <= 0 else need / cap)
        out.append(best)
    return np.array(out)


# --- every policy -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ALL)
@PROPS
@given(case=clusters(hosts=(1, 4), weighted=True, zero_capacity=True))
def test_every_policy_is_feasible_and_pareto_efficient(policy: str, case: tuple[Instance, np.ndarray]) -> None:
    """Capacities hold (the validator runs inside allocate_policy) and no job could grow alone."""
    inst, hosts = case
    r = allocate_policy(inst, hosts, policy, options(policy))
    assert not_pareto(inst, hosts, r.yields, rtol=1e-5 if policy == "yield" else 1e-7) == []
    assert np.asarray(r.vm_share) == pytest.approx(np.asarray(r.yields)[:, None] * inst.job_need, abs=1e-15)


@pytest.mark.parametrize("policy", ALL)
def test_a_job_on_a_host_without_a_resource_it_needs_gets_yield_0(policy: str) -> None:
    hosts = (Host("h0", 1.0, 1.0, (("disk", 1.0),)), Host("h1", 1.0, 1.0))
    inst = Instance(hosts, (Job("a", 0.5, 0.1, 2, (("disk", 0.2),)), Job("b", 0.5, 0.1, 1, (("disk", 0.2),))))
    r = allocate_policy(inst, [0, 1, 0], policy, options(policy))
    assert r.yields[0] == 0.0  # one of a's VMs is on h1, which has no disk
    assert r.yields[1] == pytest.approx(1.0)


# --- sharing incentive --------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["drf", "drf-pools", "pf", "hdrf"])
@PROPS
@given(case=clusters())
def test_one_host_sharing_incentive_every_job_beats_an_equal_split(policy: str,
                                                                   case: tuple[Instance, np.ndarray]) -> None:
    """BR Props. 1 and 4, H-DRF Theorem 2: y_j >= min(1, 1 / (n D_j)), the yield of 1/n of every resource."""
    inst, hosts = case
    y = np.asarray(run(inst, hosts, policy).yields)
    equal_split = np.minimum(1.0, 1.0 / (inst.n_jobs * cluster_dominant(inst)))
    assert np.all(y >= equal_split - (2e-3 if policy == "hdrf" else 1e-7))


@pytest.mark.parametrize("policy", ["drf-pools", "pf"])
@PROPS
@given(case=clusters(hosts=(2, 4), zero_capacity=True))
def test_pool_sharing_incentive_on_several_hosts(policy: str, case: tuple[Instance, np.ndarray]) -> None:
    """With every (host, resource) a pool, each job beats 1/n of every pool: y_j >= min(1, 1 / (n D_j^pools))."""
    inst, hosts = case
    y = np.asarray(run(inst, hosts, policy).yields)
    with np.errstate(divide="ignore"):
        equal_split = np.minimum(1.0, 1.0 / (inst.n_jobs * pool_dominant(inst, hosts)))
    assert np.all(y >= equal_split - 1e-7)


def test_cluster_share_drf_lacks_the_pool_sharing_incentive_on_several_hosts() -> None:
    """Cluster shares weigh a job by its whole footprint: a 4-VM job sharing host h0 with a 1-VM job gets
    less of h0 than half, though h0 is the only pool either of them is short of."""
    hosts = tuple(Host(f"h{i}") for i in range(4))
    inst = Instance(hosts, (Job("big", 1.0, 0.1, 4), Job("small", 1.0, 0.1, 1)))
    placement = np.array([0, 1, 2, 3, 0])
    drf = run(inst, placement, "drf")
    assert drf.yields == pytest.approx((0.2, 0.8))  # rates 1/1 and 1/0.25: 1/(1+4) of h0 for big
    pools = run(inst, placement, "drf-pools")
    assert pools.yields == pytest.approx((0.5, 0.5))
    assert drf.yields[0] < min(1.0, 1 / (2 * 1.0))  # below the pool equal split of 1/2


# --- strategy-proofness --------------------------------------------------------------------------------------

@st.composite
def lies(draw: st.DrawFn, hosts: tuple[int, int]) -> tuple[Instance, np.ndarray, int, Job]:
    inst, placement = draw(clusters(hosts=hosts))
    liar = draw(st.integers(0, inst.n_jobs - 1))
    true = inst.jobs[liar]
    needs = tuple((r, v) for r in inst.resources[1:] if (v := draw(st.sampled_from([0.0]) | FRACTION)) > 0)
    return inst, placement, liar, Job(true.name, draw(FRACTION), true.memory, true.tasks, needs, true.weight)


@pytest.mark.parametrize(("policy", "hosts"), [("drf", (1, 1)), ("drf", (2, 4)), ("drf-pools", (2, 4))])
@settings(max_examples=80, deadline=None)
@given(case=st.data())
def test_drf_is_strategy_proof_no_lie_raises_the_liars_useful_yield(policy: str, hosts: tuple[int, int],
                                                                    case: st.DataObject) -> None:
    """BR Prop. 2 (and the DRF notes' SP, read as "should *not* be able to improve"): a job reporting other
    needs gets y' of them, of which it can use min_r y' reported_r / true_r; that is never above y."""
    inst, placement, liar, fake = case.draw(lies(hosts))
    truthful = run(inst, placement, policy).yields[liar]
    lied = Instance(inst.hosts, tuple(fake if j == liar else job for j, job in enumerate(inst.jobs)))
    y_lie = run(lied, placement, policy).yields[liar]
    true_needs = [inst.jobs[liar].need_of(r) for r in inst.resources]
    reported = [fake.need_of(r) for r in inst.resources]
    assert useful_yield(true_needs, reported, y_lie) <= truthful + 1e-9


# --- scale invariance, local fairness -------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["drf", "drf-pools", "pf"])
@PROPS
@given(case=clusters(hosts=(1, 3), tight=True), which=st.integers(0, 5), scale=st.sampled_from([1.25, 1.5, 2.0]))
def test_scaling_a_jobs_needs_leaves_every_allocation_unchanged(policy: str, case: tuple[Instance, np.ndarray],
                                                                which: int, scale: float) -> None:
    """BR Props. 3 and 6: multiply job i's needs by c >= 1: its yield becomes y / c, its resources and every
    other job's yield stay.  (Needs stay <= 1, and job i must not be at its cap, which c >= 1 cannot reach.)"""
    inst, hosts = case
    i = which % inst.n_jobs
    job = inst.jobs[i]
    assume(max(job.need_of(r) for r in inst.resources) * scale <= 1.0)
    before = run(inst, hosts, policy)
    assume(before.yields[i] < 1 - 1e-6)
    scaled = Job(job.name, job.cpu_need * scale, job.memory, job.tasks,
                 tuple((r, v * scale) for r, v in job.needs), job.weight)
    after = run(Instance(inst.hosts, tuple(scaled if k == i else j for k, j in enumerate(inst.jobs))), hosts, policy)
    expected = list(before.yields)
    expected[i] /= scale
    assert after.yields == pytest.approx(expected, abs=1e-7)
    assert after.vm_share[i] == pytest.approx(before.vm_share[i], abs=1e-7)


@pytest.mark.parametrize("policy", ["drf", "drf-pools", "pf", "hdrf"])
@PROPS
@given(needs=st.lists(FRACTION, min_size=2, max_size=6), capacity=st.sampled_from([0.1, 0.2, 0.3]))
def test_local_fairness_one_resource_gives_every_job_the_same_share(policy: str, needs: list[float],
                                                                    capacity: float) -> None:
    """BR §2.2: J = 1, every share y_j alpha_j equals C / n (when no cap binds: alpha_j >= C / n)."""
    n = len(needs)
    assume(min(needs) >= capacity / n)
    inst, hosts = one_host([(a,) for a in needs], ("cpu",), normalise=False, capacity=(capacity,))
    r = run(inst, hosts, policy)
    tol = 1e-4 if policy == "hdrf" else 1e-9
    assert np.asarray(r.yields) * np.array(needs) == pytest.approx([capacity / n] * n, abs=tol)


# --- yield is today's behaviour -------------------------------------------------------------------------------

@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_yield_policy_equals_vcsched_yields_allocate_on_generated_paper_instances(parallel: bool, seed: int) -> None:
    inst = generate(GeneratorSpec(hosts=4, tasks=12, slack=0.5, cv_mem=0.5, cv_cpu=0.5, parallel=parallel), seed)
    result = solve(inst, "mcb8")
    assert result.allocation is not None
    hosts = np.asarray(result.allocation.hosts)
    expected = allocate(inst, hosts)
    got = run(inst, hosts, "yield")
    assert got.yields == tuple(float(v) for v in expected.yields(inst))  # bit for bit
    assert got.allocation(inst).hosts == expected.hosts


def test_yield_policy_with_extra_resources_is_max_min_then_max_mean_on_every_row() -> None:
    """disk binds first (0.6 + 0.6 on h0): Y = 1/1.2; then job c (alone on h1) goes to 1."""
    hosts = (Host("h0", 1.0, 1.0, (("disk", 1.0),)), Host("h1", 1.0, 1.0, (("disk", 1.0),)))
    jobs = (Job("a", 0.2, 0.1, 1, (("disk", 0.6),)), Job("b", 0.2, 0.1, 1, (("disk", 0.6),)),
            Job("c", 0.5, 0.1, 1, (("disk", 0.6),)))
    r = run(Instance(hosts, jobs), np.array([0, 0, 1]), "yield")
    assert r.yields == pytest.approx((1 / 1.2, 1 / 1.2, 1.0))


# --- exact optima, cross-checked --------------------------------------------------------------------------------

def drf_rates(inst: Instance, hosts: np.ndarray) -> np.ndarray:
    return inst.job_weight / cluster_dominant(inst)


def pool_rates(inst: Instance, hosts: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(np.isfinite(pool_dominant(inst, hosts)), inst.job_weight / pool_dominant(inst, hosts), 0.0)


def asset_rates(inst: Instance, hosts: np.ndarray) -> np.ndarray:
    totals = {r: sum(h.capacity_of(r) for h in inst.hosts) for r in inst.resources}
    return inst.job_weight / np.array([sum(j.tasks * j.need_of(r) / totals[r] for r in inst.resources)
                                       for j in inst.jobs])


@pytest.mark.parametrize(("policy", "rates"), [("drf", drf_rates), ("drf-pools", pool_rates), ("asset", asset_rates)])
@settings(max_examples=25, deadline=None)
@given(case=clusters(hosts=(1, 3), jobs=(2, 5), weighted=True))
def test_water_filling_equals_the_leximin_of_a_sequence_of_lps(policy: str, rates: object,
                                                               case: tuple[Instance, np.ndarray]) -> None:
    """The exact optimum of each max-min objective, from scipy linprog(method="highs"), independently."""
    inst, hosts = case
    expected = leximin_lp(inst, hosts, rates(inst, hosts))  # type: ignore[operator]
    assert run(inst, hosts, policy).yields == pytest.approx(expected, abs=1e-7)


@PROPS
@given(case=clusters(hosts=(1, 4), weighted=True, zero_capacity=True))
def test_pf_satisfies_its_kkt_conditions(case: tuple[Instance, np.ndarray]) -> None:
    """w_j / y_j = sum_p a_jp nu_p + eta_j, nu, eta >= 0, complementary slackness; and (BR eq. 5 with caps)
    sum nu + sum eta = sum of the weights of the jobs that can run.  Checked here from the reported prices."""
    inst, hosts = case
    r = run(inst, hosts, "pf")
    y = np.asarray(r.yields)
    a, cap = constraint_rows(inst, hosts)
    names = [f"{h.name}:{res}" for h in inst.hosts for res in inst.resources]
    nu = np.array([r.detail["nu"].get(n, 0.0) for n in names])  # type: ignore[attr-defined]
    eta = np.array([r.detail["eta"].get(j.name, 0.0) for j in inst.jobs])  # type: ignore[attr-defined]
    runs = y > 0
    norm = np.divide(a, cap[:, None], out=np.zeros_like(a), where=cap[:, None] > 0)
    price = norm.T @ nu + eta
    assert (inst.job_weight[runs] / y[runs]) == pytest.approx(price[runs], rel=1e-7)
    assert np.all(nu >= 0) and np.all(eta >= 0)
    slack = 1 - np.divide(a @ y, cap, out=np.ones_like(cap), where=cap > 0)
    assert np.all(nu * slack <= 1e-7) and np.all(eta * (1 - y) <= 1e-7)
    assert nu.sum() + eta.sum() == pytest.approx(inst.job_weight[runs].sum(), rel=1e-7)
    kkt = r.detail["kkt"]
    assert kkt["stationarity"] < 1e-6 and kkt["duality_gap"] < 1e-7  # type: ignore[index]


def test_pf_unweighted_prices_sum_to_n_when_no_cap_binds() -> None:
    """BR eq. (5): sum_j nu_j = n."""
    r = run(*one_host([(1, 0.1), (0.1, 1), (0.5, 1), (1, 0.5)]), "pf")
    assert sum(r.detail["nu"].values()) == pytest.approx(4.0, abs=1e-9)  # type: ignore[attr-defined]


def test_alpha_fair_near_1_is_pf() -> None:
    profiles = [(1 / 9, 2 / 9), (1 / 3, 1 / 18)]
    pf = run(*one_host(profiles), "pf").yields
    assert run(*one_host(profiles), "alpha-fair", alpha=1.0).yields == pytest.approx(pf, abs=1e-9)
    assert run(*one_host(profiles), "alpha-fair", alpha=1.001).yields == pytest.approx(pf, abs=1e-3)


def test_alpha_fair_tends_to_the_max_min_of_the_yields_as_alpha_grows() -> None:
    """DRF notes' example: the max-min of the yields is (2/3, 2/3); alpha-fair closes in as alpha grows."""
    profiles = [(1 / 9, 2 / 9), (1 / 3, 1 / 18)]
    gaps = [float(np.max(np.abs(np.asarray(run(*one_host(profiles), "alpha-fair", alpha=a).yields) - 2 / 3)))
            for a in (2, 10, 30, 100)]
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] < 0.005


# --- H-DRF ----------------------------------------------------------------------------------------------------

@st.composite
def trees(draw: st.DrawFn, all_needed: bool = False) -> tuple[Instance, np.ndarray]:
    """One host; a random tenant tree of depth <= 3 with random weights; every leaf demanding.

    ``all_needed``: every leaf needs every resource, so all leaves stay unblocked until the first
    resource saturates, and then all block at once."""
    need = FRACTION if all_needed else st.sampled_from([0.0]) | FRACTION
    n_res = draw(st.integers(1, 3))
    resources = ("cpu", *(f"r{i}" for i in range(1, n_res)))
    tenants: list[Tenant] = []
    for depth in range(draw(st.integers(1, 2))):
        parents = [t.name for t in tenants if t.name.count(".") == depth - 1] if depth else [None]
        for p in parents:
            for k in range(draw(st.integers(1, 3))):
                name = f"{p}.{k}" if p else f"t{k}"
                tenants.append(Tenant(name, draw(st.sampled_from([1.0, 2.0, 3.0])), p))
    jobs = []
    for i in range(draw(st.integers(2, 7))):
        tenant = draw(st.sampled_from([t.name for t in tenants]))
        needs = tuple((r, v) for r in resources[1:] if (v := draw(need)) > 0)
        jobs.append(Job(f"j{i}", draw(FRACTION), 0.0, 1, needs, draw(st.sampled_from([1.0, 2.0])), tenant))
    host = Host("h0", 0.3, 1.0, tuple((r, 0.3) for r in resources[1:]))
    return Instance((host,), tuple(jobs), tuple(tenants)), np.zeros(len(jobs), dtype=np.int64)


def guaranteed_share(inst: Instance, j: int) -> float:
    """Product over the path of w / (sum of the weights of the siblings that hold jobs): Theorem 2's floor."""
    parent = {t.name: t.parent for t in inst.tenants}
    weight = {t.name: t.weight for t in inst.tenants}
    def holds_jobs(node: str) -> bool:
        return any(_under(parent, job.tenant, node) for job in inst.jobs)
    share = 1.0
    job = inst.jobs[j]
    siblings = [k.weight for k in inst.jobs if k.tenant == job.tenant] + [
        weight[t] for t in weight if parent[t] == job.tenant and holds_jobs(t)]
    share *= job.weight / sum(siblings)
    node = job.tenant
    while node is not None:
        up = parent[node]
        sib = [weight[t] for t in weight if parent[t] == up and holds_jobs(t)] + [
            k.weight for k in inst.jobs if k.tenant == up]
        share *= weight[node] / sum(sib)
        node = up
    return share


def _under(parent: dict[str, str | None], node: str | None, ancestor: str) -> bool:
    while node is not None:
        if node == ancestor:
            return True
        node = parent[node]
    return False


@PROPS
@given(case=trees())
def test_hdrf_hierarchical_share_guarantee(case: tuple[Instance, np.ndarray]) -> None:
    """Theorem 2: with every node demanding (no cap reached), each leaf's dominant share is at least the
    product of its weight fractions along the path."""
    inst, hosts = case
    r = run(inst, hosts, "hdrf")
    assume(max(r.yields) < 1 - 1e-9)
    for j in range(inst.n_jobs):
        assert r.dominant_share[j] >= guaranteed_share(inst, j) - 2e-3


@PROPS
@given(case=trees(all_needed=True))
def test_hdrf_siblings_never_blocked_before_the_end_have_equal_weighted_shares(
        case: tuple[Instance, np.ndarray]) -> None:
    """Algorithm 1's invariant: non-blocked siblings keep equal s / w.  Here no leaf is blocked before the
    first saturation, which blocks all of them, so every pair of siblings ends with equal s / w (to ~epsilon)."""
    inst, hosts = case
    r = run(inst, hosts, "hdrf")
    assume(max(r.yields) < 1 - 1e-9)
    share = dict(r.detail["node_share"])  # type: ignore[call-overload]
    share.update({j.name: r.dominant_share[k] for k, j in enumerate(inst.jobs)})
    weight = {t.name: t.weight for t in inst.tenants} | {j.name: j.weight for j in inst.jobs}
    parent = {t.name: t.parent for t in inst.tenants} | {j.name: j.tenant for j in inst.jobs}
    holds = {n for n in share if share[n] > 0}
    for p in {*parent.values()}:
        kids = [n for n in parent if parent[n] == p and n in holds]
        levels = [share[n] / weight[n] for n in kids]
        if len(levels) < 2:
            continue
        assert max(levels) - min(levels) <= 2e-3 * max(1.0, max(levels)), (p, dict(zip(kids, levels, strict=True)))


@PROPS
@given(case=clusters(hosts=(1, 3), weighted=True))
def test_hdrf_on_a_flat_tree_is_weighted_drf(case: tuple[Instance, np.ndarray]) -> None:
    inst, hosts = case
    assert run(inst, hosts, "hdrf").yields == pytest.approx(run(inst, hosts, "drf").yields, abs=2e-3)


def test_hdrf_load_of_every_host_and_resource_stays_within_capacity_on_several_hosts() -> None:
    hosts = (Host("h0", 1.0, 1.0, (("gpu", 1.0),)), Host("h1", 0.5, 1.0, (("gpu", 0.2),)))
    jobs = (Job("a", 0.6, 0.1, 2, (), 1.0, "x"), Job("b", 0.3, 0.1, 1, (("gpu", 0.9),), 1.0, "x"),
            Job("c", 0.4, 0.1, 2, (("gpu", 0.1),), 2.0, "z"))
    inst = Instance(hosts, jobs, (Tenant("x", 1.0), Tenant("z", 1.0)))
    placement = np.array([0, 1, 0, 0, 1])
    r = run(inst, placement, "hdrf")
    assert np.all(loads(inst, placement, r.yields) <= inst.host_capacity + 1e-12)
    assert not_pareto(inst, placement, r.yields) == []


def test_yield_phase_two_is_not_undone_by_a_rounding_sized_row() -> None:
    """Found by the Pareto property: HiGHS met the r2 row exactly and left y2 2.7e-17 above Y, so the
    rounding repair's ratio on that row (room ~1e-17 / extra ~1e-17) shrank every job's gain to 0.91."""
    caps = (("r1", 0.1), ("r2", 0.1), ("r3", 0.1))
    jobs = tuple(Job(n, c, 0.0, 1, needs, 0.5) for n, c, needs in (
        ("j0", 0.05, ()), ("j1", 0.5, (("r2", 0.15),)), ("j2", 0.05, (("r2", 0.55),)),
        ("j3", 0.1, ()), ("j4", 0.3, ()), ("j5", 0.05, ())))
    inst = Instance((Host("h0", 0.55, 1.0, caps),), jobs)
    r = allocate_policy(inst, np.zeros(6, dtype=np.int64), "yield", options("yield"))
    assert np.asarray(r.yields) == pytest.approx([1.0, 1 / 7, 1 / 7, 1.0, 0.2714285714285714 / 0.3, 1.0], abs=1e-9)
