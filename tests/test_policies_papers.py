"""The sharing policies reproduce every worked example of the three sharing papers.

Papers, by title: "Dominant Resource Fairness: Fair Allocation of Multiple
Resource Types" (the DRF notes); T. Bonald and J. Roberts, "Enhanced Cluster
Computing Performance through Proportional Fairness" (BR); A. Bhattacharya
et al., "Hierarchical Scheduling for Diverse Datacenter Workloads" (H-DRF).
Where a printed value contradicts the paper's own definitions, the test uses
the corrected value and says so ("erratum").  Every example runs on one host
with the mapping of tests/policy_cases.py: yields are dominant shares.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.policy_cases import one_host, phi, run, shares, useful_yield
from vcsched.model import Instance
from vcsched.policies.hdrf import collapsed_weights

EXACT = 1e-9  # water-filling is exact
CONIC = 1e-9  # interior point (Clarabel), then Newton on the active set
EPS = 1e-3  # H-DRF's epsilon-filling, epsilon = 1e-4


def nu(result: object, resources: tuple[str, ...] = ("cpu", "io")) -> list[float]:
    prices = result.detail["nu"]  # type: ignore[attr-defined]
    return [prices.get(f"h0:{r}", 0.0) for r in resources]


# --- The DRF notes: the one worked example (9 CPUs, 18 GB) ---------------------------------------------------

# A: <1 CPU, 4 GB> of <9, 18>; B: <3 CPU, 1 GB>.  Per-task shares: A (1/9, 2/9), B (1/3, 1/18).
DRF_NOTES = [(1 / 9, 2 / 9), (1 / 3, 1 / 18)]


def tasks(result: object) -> np.ndarray:
    return phi(result, DRF_NOTES)  # type: ignore[arg-type]


def test_drf_notes_drf_gives_3_and_2_tasks_with_equal_dominant_shares_of_two_thirds() -> None:
    r = run(*one_host(DRF_NOTES), "drf")
    assert r.yields == pytest.approx((2 / 3, 2 / 3), abs=EXACT)
    assert tasks(r) == pytest.approx((3, 2), abs=EXACT)
    assert r.dominant_share == pytest.approx((2 / 3, 2 / 3), abs=EXACT)
    assert r.dominant_pool == ("io", "cpu")  # A's dominant resource is memory (here io), B's CPU


def test_drf_notes_drf_gives_a_3_cpus_12_gb_and_b_6_cpus_2_gb_with_cpu_saturated() -> None:
    r = run(*one_host(DRF_NOTES), "drf")
    pool = np.array([9.0, 18.0])
    assert np.array(r.vm_share[0]) * pool == pytest.approx((3, 12), abs=1e-8)
    assert np.array(r.vm_share[1]) * pool == pytest.approx((6, 2), abs=1e-8)
    used = (np.array(r.vm_share[0]) + np.array(r.vm_share[1])) * pool
    assert used == pytest.approx((9, 14), abs=1e-8)  # CPU saturated, 14 of 18 GB


def test_drf_notes_asset_fairness_gives_63_25_and_54_25_tasks() -> None:
    r = run(*one_host(DRF_NOTES), "asset")
    assert r.yields == pytest.approx((14 / 25, 18 / 25), abs=EXACT)  # (0.56, 0.72)
    assert tasks(r) == pytest.approx((63 / 25, 54 / 25), abs=EXACT)  # 6x = 7y: equal "spend" of $2/CPU, $1/GB
    assert 6 * tasks(r)[0] == pytest.approx(7 * tasks(r)[1])
    assert (np.array(r.vm_share[0]) + np.array(r.vm_share[1]))[0] == pytest.approx(1.0)  # CPU saturated


def test_drf_notes_ceei_is_pf_and_gives_45_11_and_18_11_tasks_with_both_resources_saturated() -> None:
    r = run(*one_host(DRF_NOTES), "pf")
    assert r.yields == pytest.approx((10 / 11, 6 / 11), abs=CONIC)
    assert tasks(r) == pytest.approx((45 / 11, 18 / 11), abs=CONIC)
    used = np.array(r.vm_share[0]) + np.array(r.vm_share[1])
    assert used == pytest.approx((1.0, 1.0), abs=CONIC)
    assert nu(r) == pytest.approx((9 / 5, 1 / 5), abs=CONIC)  # duals on normalised rows; sum = 2 = n
    assert sum(nu(r)) == pytest.approx(2.0, abs=CONIC)


def test_drf_notes_ceei_maximises_the_product_of_dominant_shares() -> None:
    """CEEI's objective max x*y s.t. x + 3y <= 9, 4x + y <= 18; PF's optimum attains it (it is the same)."""
    grid = np.linspace(0, 4.5, 45_001)
    best_on_grid = max(x * min((9 - x) / 3, 18 - 4 * x) for x in grid)
    x, y = tasks(run(*one_host(DRF_NOTES), "pf"))
    assert x * y == pytest.approx(810 / 121, abs=CONIC)  # 45/11 * 18/11
    assert x * y >= best_on_grid - 1e-6


@pytest.mark.parametrize("policy", ["drf", "asset", "pf"])
def test_drf_notes_every_policy_beats_the_equal_split_here(policy: str) -> None:
    """Equal split: A could run 2.25 tasks and B 1.5; all three policies give more (not an SI counterexample)."""
    x, y = tasks(run(*one_host(DRF_NOTES), policy))
    assert x >= 2.25 - CONIC and y >= 1.5 - CONIC


def test_drf_notes_asset_fairness_violates_the_sharing_incentive() -> None:
    """a_A = (1, 1), a_B = (1, 0): asset fairness gives A a third of each resource, below the equal split's half."""
    r = run(*one_host([(1, 1), (1, 0)]), "asset")
    assert r.vm_share[0] == pytest.approx((1 / 3, 1 / 3), abs=EXACT)
    assert r.yields[0] < 1 / 2
    assert run(*one_host([(1, 1), (1, 0)]), "drf").yields[0] == pytest.approx(1 / 2)  # DRF keeps the half


def test_drf_notes_asset_fairness_violates_bottleneck_fairness() -> None:
    """a_A = (1, 0.5), a_B = (1, 0): both CPU-dominant, yet asset fairness splits the CPU 0.4 / 0.6."""
    r = run(*one_host([(1, 0.5), (1, 0)]), "asset")
    assert (r.vm_share[0][0], r.vm_share[1][0]) == pytest.approx((0.4, 0.6), abs=EXACT)
    d = run(*one_host([(1, 0.5), (1, 0)]), "drf")
    assert (d.vm_share[0][0], d.vm_share[1][0]) == pytest.approx((0.5, 0.5), abs=EXACT)  # max-min on the bottleneck


def test_drf_notes_drf_is_not_resource_monotone() -> None:
    """Pool (10 CPU, 10 GB) -> (10 CPU, 20 GB), A = <1, 2>, B = <1, 0.5> per task: B falls from 20/3 to 5 tasks.

    One unit = 10 CPUs or 10 GB; each job is one VM of 5 (A) or 10 (B) tasks' worth.
    """
    before, hosts = one_host([(0.5, 1.0), (1.0, 0.5)], normalise=False)
    after, _ = one_host([(0.5, 1.0), (1.0, 0.5)], normalise=False, capacity=(1.0, 2.0))
    task_count = np.array([5.0, 10.0])
    b = np.asarray(run(before, hosts, "drf").yields) * task_count
    a = np.asarray(run(after, hosts, "drf").yields) * task_count
    assert b == pytest.approx((10 / 3, 20 / 3), abs=EXACT)
    assert a == pytest.approx((5, 5), abs=EXACT)
    assert a[1] < b[1]  # B lost although resources were only added


# --- Bonald & Roberts §2.4: the static examples (J = 2, n = 2) -----------------------------------------------

def test_br_remark_2_drf_gives_two_thirds_each_and_leaves_resource_2_at_eight_ninths() -> None:
    profiles = [(1, 1 / 3), (1 / 2, 1)]
    r = run(*one_host(profiles), "drf")
    assert phi(r, profiles) == pytest.approx((2 / 3, 2 / 3), abs=EXACT)
    assert r.vm_share[0][1] + r.vm_share[1][1] == pytest.approx(8 / 9, abs=EXACT)


def test_br_remark_2_without_resource_2_gives_phi_half_and_one_erratum() -> None:
    """Printed phi' = (1, 2) would use 2 units of resource 1; capacity gives (1/2, 1) (same ratio)."""
    profiles = [(1,), (1 / 2,)]
    r = run(*one_host(profiles, resources=("cpu",)), "drf")
    assert r.yields == pytest.approx((1 / 2, 1 / 2), abs=EXACT)  # "equal shares of resource 1"
    assert phi(r, profiles) == pytest.approx((1 / 2, 1), abs=EXACT)


def test_br_remark_2_pf_gives_three_fifths_and_four_fifths_with_prices_three_halves_and_half() -> None:
    profiles = [(1, 1 / 3), (1 / 2, 1)]
    r = run(*one_host(profiles), "pf")
    assert phi(r, profiles) == pytest.approx((3 / 5, 4 / 5), abs=CONIC)
    assert nu(r) == pytest.approx((3 / 2, 1 / 2), abs=CONIC)


def test_br_prop_5_pf_and_drf_give_two_thirds_each_with_unit_prices() -> None:
    profiles = [(1 / 2, 1), (1, 1 / 2)]
    r = run(*one_host(profiles), "pf")
    assert phi(r, profiles) == pytest.approx((2 / 3, 2 / 3), abs=CONIC)
    assert nu(r) == pytest.approx((1, 1), abs=CONIC)
    assert phi(run(*one_host(profiles), "drf"), profiles) == pytest.approx((2 / 3, 2 / 3), abs=EXACT)


def test_br_prop_5_pf_is_not_strategy_proof_job_1_gains_by_claiming_two_thirds_of_resource_1() -> None:
    truthful = (1 / 2, 1)
    lie = [(2 / 3, 1), (1, 1 / 2)]
    r = run(*one_host(lie), "pf")
    assert phi(r, lie) == pytest.approx((3 / 4, 1 / 2), abs=CONIC)
    assert nu(r) == pytest.approx((2, 0), abs=CONIC)  # both resources tight, yet nu_2 = 0
    assert r.vm_share[0][1] + r.vm_share[1][1] == pytest.approx(1.0, abs=CONIC)
    assert useful_yield(truthful, lie[0], r.yields[0]) == pytest.approx(3 / 4, abs=CONIC)
    assert useful_yield(truthful, lie[0], r.yields[0]) > 2 / 3  # it gained


def test_br_prop_5_drf_gives_the_same_lie_nothing() -> None:
    truthful = (1 / 2, 1)
    lie = [(2 / 3, 1), (1, 1 / 2)]
    r = run(*one_host(lie), "drf")
    assert useful_yield(truthful, lie[0], r.yields[0]) <= 2 / 3 + EXACT


def test_br_remark_3_a_lie_can_make_both_jobs_lose_under_pf() -> None:
    lie = [(1, 1), (1, 1 / 2)]
    r = run(*one_host(lie), "pf")
    assert phi(r, lie) == pytest.approx((1 / 2, 1 / 2), abs=CONIC)
    assert nu(r) == pytest.approx((2, 0), abs=CONIC)
    assert useful_yield((1 / 2, 1), lie[0], r.yields[0]) < 2 / 3  # liar below its truthful 2/3
    assert phi(r, lie)[1] < 2 / 3  # and so is the other job


def test_br_remark_4_pf_gives_four_fifths_and_three_fifths_with_prices_three_halves_and_half_erratum() -> None:
    """Printed nu = (1, 1) would give phi_1 = 2/3; the KKT conditions give nu = (3/2, 1/2)."""
    profiles = [(1 / 2, 1), (1, 1 / 3)]
    r = run(*one_host(profiles), "pf")
    assert phi(r, profiles) == pytest.approx((4 / 5, 3 / 5), abs=CONIC)
    assert nu(r) == pytest.approx((3 / 2, 1 / 2), abs=CONIC)


def test_br_remark_4_the_lie_makes_both_lose_and_leaves_resource_2_at_eleven_twelfths() -> None:
    lie = [(2 / 3, 1), (1, 1 / 3)]
    r = run(*one_host(lie), "pf")
    assert phi(r, lie) == pytest.approx((3 / 4, 1 / 2), abs=CONIC)
    assert nu(r) == pytest.approx((2, 0), abs=CONIC)
    assert r.vm_share[0][1] + r.vm_share[1][1] == pytest.approx(11 / 12, abs=CONIC)
    assert useful_yield((1 / 2, 1), lie[0], r.yields[0]) < 4 / 5
    assert phi(r, lie)[1] < 3 / 5


@pytest.mark.parametrize(("n", "beta", "gain"), [(1, 0.5263, 0.95), (2, 0.3571, 0.9333), (5, 0.1818, 0.9167)])
def test_br_section_3_4_static_pf_lie_beta_star_raises_job_1_above_its_truthful_one_over_1_1(
        n: int, beta: float, gain: float) -> None:
    """a_1 = (1, 0.1) against n jobs of (0.1, 1); claiming beta* = 1 / (1 + n (1 - 0.1)) of resource 2 pays."""
    alpha = 0.1
    beta_star = 1 / (1 + n * (1 - alpha))
    assert beta_star == pytest.approx(beta, abs=1e-4)
    others = [(alpha, 1.0)] * n
    truthful = run(*one_host([(1.0, alpha), *others]), "pf")
    lied = run(*one_host([(1.0, beta_star), *others]), "pf")
    assert truthful.yields[0] == pytest.approx(1 / 1.1, abs=CONIC)
    expected = min((1 - alpha) / (1 - alpha * beta_star), 1 / (beta_star * (n + 1)))  # the corrected phi_1(n)
    assert lied.yields[0] == pytest.approx(expected, abs=CONIC)
    assert lied.yields[0] == pytest.approx(gain, abs=1e-4)
    assert useful_yield((1.0, alpha), (1.0, beta_star), lied.yields[0]) > truthful.yields[0]


@pytest.mark.parametrize("policy", ["drf", "pf"])
def test_br_local_fairness_with_one_resource_drf_and_pf_give_equal_shares(policy: str) -> None:
    """J = 1: shares phi_i a_i1 all equal 1/n (jobs given in task units: need = a_i, not normalised)."""
    a = [0.4, 0.6, 0.9]
    r = run(*one_host([(x,) for x in a], resources=("cpu",), normalise=False), policy)
    shares = np.asarray(r.yields) * np.array(a)
    assert shares == pytest.approx([1 / 3] * 3, abs=CONIC)


def test_br_local_fairness_max_min_on_phi_is_not_locally_fair() -> None:
    """vcsched's own max-min of yields, with yields = task volumes, gives phi_i = 1 / sum_k a_k1."""
    a = [0.4, 0.6, 0.9]
    r = run(*one_host([(x,) for x in a], resources=("cpu",), normalise=False), "yield")
    assert r.yields == pytest.approx([1 / sum(a)] * 3, abs=1e-9)
    shares = np.asarray(r.yields) * np.array(a)
    assert max(shares) - min(shares) > 0.1


def test_br_prop_7_alpha_fair_other_than_pf_is_not_locally_fair() -> None:
    """One resource, a = (1/2, 1/(2x)) with x = 2: only alpha = 1 splits the resource evenly.

    The capacity is 1/4 so that the even split (yields 1/4, 1/2) stays below the caps of 1.
    """
    a = [0.5, 0.25]
    for alpha, equal in ((0.5, False), (1.0, True), (2.0, False)):
        inst, hosts = one_host([(x,) for x in a], resources=("cpu",), normalise=False, capacity=(0.25,))
        r = run(inst, hosts, "alpha-fair", alpha=alpha)
        shares = np.asarray(r.yields) * np.array(a)
        assert bool(abs(shares[0] - shares[1]) < 1e-5) is equal, (alpha, shares)


# --- H-DRF (Bhattacharya et al.) -----------------------------------------------------------------------------

def two_orgs(n1: list[tuple[str, tuple[float, ...]]], n2: list[tuple[str, tuple[float, ...]]],
             resources: tuple[str, ...] = ("cores", "gpu"), w1: float = 1.0,
             w2: float = 1.0) -> tuple[Instance, np.ndarray]:
    """Tree n1 -> n1's leaves, n2 -> n2's leaves; resources (CPU, GPU) as extra fluid resources (a leaf may need
    no CPU)."""
    leaves = [*n1, *n2]
    return one_host([a for _, a in leaves], resources, names=[n for n, _ in leaves],
                    tenants=[("n1", w1, None), ("n2", w2, None)],
                    job_tenants=["n1"] * len(n1) + ["n2"] * len(n2))


def test_hdrf_fig_2_one_resource_480_slots_gives_240_48_96_96() -> None:
    names = ["n1,1", "n2,1", "n2,2,1", "n2,3"]
    inst, hosts = one_host([(1,)] * 4, ("cpu",), names=names, weights=[1, 1, 1, 2],
                           tenants=[("n1", 1, None), ("n2", 1, None), ("n2,2", 2, "n2")],
                           job_tenants=["n1", "n2", "n2,2", "n2"])
    r = run(inst, hosts, "hdrf", epsilon=1e-4)
    assert np.asarray(r.yields) * 480 == pytest.approx((240, 48, 96, 96), abs=480 * EPS)


def test_hdrf_fig_2_when_n2_3_leaves_its_share_goes_to_its_siblings_80_and_160() -> None:
    inst, hosts = one_host([(1,)] * 3, ("cpu",), names=["n1,1", "n2,1", "n2,2,1"],
                           tenants=[("n1", 1, None), ("n2", 1, None), ("n2,2", 2, "n2")],
                           job_tenants=["n1", "n2", "n2,2"])
    r = run(inst, hosts, "hdrf", epsilon=1e-4)
    assert np.asarray(r.yields) * 480 == pytest.approx((240, 80, 160), abs=480 * EPS)  # n1 gets nothing extra


@pytest.mark.parametrize("policy", ["drf", "hdrf"])
def test_hdrf_fig_3_drf_gives_both_jobs_dominant_share_0_6_by_dovetailing(policy: str) -> None:
    """100 GB, 100 CPUs; <3 GB, 2 CPU> and <2 GB, 3 CPU>; resources ordered (CPU, GB) -> (2/3, 1), (1, 2/3)."""
    r = run(*one_host([(2 / 3, 1), (1, 2 / 3)], ("cpu", "gb")), policy)
    assert r.yields == pytest.approx((0.6, 0.6), abs=EPS)
    assert np.ravel(r.vm_share) * 100 == pytest.approx([40, 60, 60, 40], abs=100 * EPS)  # (CPU, GB)


def test_hdrf_fig_4_gives_n1_1_and_n2_1_half_the_cpus_and_n2_2_all_the_gpus() -> None:
    inst, hosts = two_orgs([("n1,1", (1, 0))], [("n2,1", (1, 0)), ("n2,2", (0, 1))])
    r = run(inst, hosts, "hdrf", epsilon=1e-4)
    assert r.yields == pytest.approx((0.5, 0.5, 1.0), abs=EPS)


def test_hdrf_collapsed_hierarchy_breaks_the_share_guarantee_on_fig_4_with_n1_1_needing_both() -> None:
    """n1,1 = <1, 1>: weights 0.5, 0.25, 0.25; flattened weighted DRF gives n2 a third, H-DRF a half."""
    inst, hosts = two_orgs([("n1,1", (1, 1))], [("n2,1", (1, 0)), ("n2,2", (0, 1))])
    w = collapsed_weights(inst)
    assert w == pytest.approx((0.5, 0.25, 0.25))
    flat = Instance(inst.hosts, tuple(type(j)(j.name, j.cpu_need, j.memory, j.tasks, j.needs, float(wj))
                                      for j, wj in zip(inst.jobs, w, strict=True)))
    collapsed = run(flat, hosts, "drf")
    assert collapsed.yields == pytest.approx((2 / 3, 1 / 3, 1 / 3), abs=EXACT)  # n2 gets 33%, not its 50%
    h = run(inst, hosts, "hdrf", epsilon=1e-4)
    assert h.yields == pytest.approx((0.5, 0.5, 0.5), abs=EPS)


def test_hdrf_collapsed_hierarchy_is_right_with_a_single_resource() -> None:
    """Control: n2,2 = <1, 0> too; collapsing gives 50% / 25% / 25%, as H-DRF does."""
    inst, hosts = two_orgs([("n1,1", (1, 0))], [("n2,1", (1, 0)), ("n2,2", (1, 0))])
    w = collapsed_weights(inst)
    flat = Instance(inst.hosts, tuple(type(j)(j.name, j.cpu_need, j.memory, j.tasks, j.needs, float(wj))
                                      for j, wj in zip(inst.jobs, w, strict=True)))
    assert run(flat, hosts, "drf").yields == pytest.approx((0.5, 0.25, 0.25), abs=EXACT)
    assert run(inst, hosts, "hdrf", epsilon=1e-4).yields == pytest.approx((0.5, 0.25, 0.25), abs=EPS)


def naive_hdrf_steady_state(rounds: int = 200) -> dict[str, int]:
    """Naive H-DRF (§3.3, the Hadoop implementations'): internal share = that of the plain sum of children.

    10 CPU and 10 GPU slots, unit tasks; start from Fig. 4(b): n1,1 5 CPUs, n2,1 5 CPUs, n2,2 10 GPUs.
    Tasks end one at a time, oldest first; each freed slot goes down the tree to the demanding child with
    the smallest dominant share, among those whose task fits.
    """
    demand = {"n1,1": "cpu", "n2,1": "cpu", "n2,2": "gpu"}
    tree = {"n1": ["n1,1"], "n2": ["n2,1", "n2,2"]}
    running = ["n1,1"] * 5 + ["n2,1"] * 5 + ["n2,2"] * 10  # oldest first

    def share(leaves: list[str]) -> float:
        use = {"cpu": 0, "gpu": 0}
        for t in running:
            if t in leaves:
                use[demand[t]] += 1
        return max(use.values()) / 10

    for _ in range(rounds):
        cpu_tasks = [t for t in running if demand[t] == "cpu"]
        running.remove(cpu_tasks[0])  # the oldest CPU task ends: a CPU slot is free
        fits = [org for org, leaves in tree.items() if any(demand[x] == "cpu" for x in leaves)]
        org = min(fits, key=lambda o: share(tree[o]))
        leaf = min((x for x in tree[org] if demand[x] == "cpu"), key=lambda x: share([x]))
        running.append(leaf)
    return {leaf: running.count(leaf) for leaf in demand}


def test_hdrf_naive_hierarchy_starves_n2_1_erratum() -> None:
    """n2 shows 100% (its GPUs) whenever n2,1 frees a CPU, so the CPU goes to n1,1: n2,1 ends with nothing.

    The paper names n2,2 as the starved node; it is n2,1.
    """
    assert naive_hdrf_steady_state() == {"n1,1": 10, "n2,1": 0, "n2,2": 10}


def test_hdrf_static_keeps_n2_1_at_half_the_cpus_where_naive_starves_it() -> None:
    inst, hosts = two_orgs([("n1,1", (1, 0))], [("n2,1", (1, 0)), ("n2,2", (0, 1))])
    assert run(inst, hosts, "hdrf").yields[1] == pytest.approx(0.5, abs=EPS)


def test_hdrf_fig_5_gives_the_cpu_jobs_a_third_and_the_gpu_jobs_a_half() -> None:
    leaves = [("n1,1", (1, 0), "n1"), ("n2,1", (1, 0), "n2"), ("n3,1", (1, 0), "n3"), ("n3,2", (0, 1), "n3"),
              ("n4,1", (0, 1), "n4")]
    inst, hosts = one_host([a for _, a, _ in leaves], ("cores", "gpu"), names=[n for n, _, _ in leaves],
                           tenants=[(f"n{i}", 1, None) for i in range(1, 5)], job_tenants=[t for _, _, t in leaves])
    r = run(inst, hosts, "hdrf", epsilon=1e-4)
    assert r.yields == pytest.approx((1 / 3, 1 / 3, 1 / 3, 1 / 2, 1 / 2), abs=EPS)


FIG6 = [("n1,1", (1, 2 / 3)), ("n2,1", (1, 1)), ("n2,2", (1 / 3, 1))]  # <3 CPU, 2 GPU>, <1, 1>, <1, 3>


def test_hdrf_fig_6_gives_60_30_30_with_the_per_resource_shares_of_fig_7() -> None:
    inst, hosts = two_orgs([FIG6[0]], FIG6[1:])
    r = run(inst, hosts, "hdrf", epsilon=1e-4)
    assert r.yields == pytest.approx((0.6, 0.3, 0.3), abs=EPS)
    assert shares(r, ("cores", "gpu")).ravel() == pytest.approx([0.6, 0.4, 0.3, 0.3, 0.1, 0.3], abs=EPS)


def test_hdrf_fig_7_is_not_population_monotone_n1_drops_from_60_to_50_when_n2_2_leaves() -> None:
    """Theorem 5: after n2,2 stops demanding, n1,1 = (50%, 33%) and n2,1 = (50%, 50%)."""
    inst, hosts = two_orgs([FIG6[0]], FIG6[1:2])
    r = run(inst, hosts, "hdrf", epsilon=1e-4)
    assert r.yields == pytest.approx((0.5, 0.5), abs=EPS)
    assert shares(r, ("cores", "gpu")).ravel() == pytest.approx([0.5, 1 / 3, 0.5, 0.5], abs=EPS)
    assert r.dominant_share[0] < 0.6 - 0.05  # n1 lost although a job left


FIG8 = [("n1,1", (1, 0.25, 0)), ("n1,2", (0, 0.25, 1)), ("n2,1", (1, 0.25, 0)), ("n2,2", (1, 0.25, 0))]


def fig8(leaves: list[tuple[str, tuple[float, ...]]]) -> tuple[Instance, np.ndarray]:
    """49 servers of 16 GB, 4 CPU, 4 GPU pooled; demands <1 GB, 1 CPU, 0 GPU> etc.: GB is a quarter of CPU's share.

    Resources (CPU, GB, GPU); GB is kept as a fluid resource and never binds.  n1 has weight 4, n2 weight 1.
    """
    tenants = {"n1,1": "n1", "n1,2": "n1", "n2,1": "n2", "n2,2": "n2"}
    return one_host([a for _, a in leaves], ("cores", "gb", "gpu"), names=[n for n, _ in leaves],
                    tenants=[("n1", 4, None), ("n2", 1, None)], job_tenants=[tenants[n] for n, _ in leaves],
                    normalise=False)


def test_hdrf_fig_8_weights_4_to_1_give_0_8_1_0_1_0_1() -> None:
    r = run(*fig8(FIG8), "hdrf", epsilon=1e-4)
    assert r.yields == pytest.approx((0.8, 1.0, 0.1, 0.1), abs=EPS)


def test_hdrf_fig_8_after_n1_1_leaves_n2_gets_the_cpus_and_n1_2_keeps_the_gpus() -> None:
    r = run(*fig8([FIG8[1], FIG8[2], FIG8[3]]), "hdrf", epsilon=1e-4)
    assert r.yields == pytest.approx((1.0, 0.5, 0.5), abs=EPS)


def test_hdrf_fig_8_after_n2_2_leaves_too_each_remaining_job_has_its_resource() -> None:
    r = run(*fig8([FIG8[1], FIG8[2]]), "hdrf", epsilon=1e-4)
    assert r.yields == pytest.approx((1.0, 1.0), abs=EPS)


def test_hdrf_treats_a_leaf_demand_and_its_double_alike() -> None:
    """§4: <3 GB, 2 CPU> is scheduled like <6 GB, 4 CPU> (shares, not yields: the double gets half the yield)."""
    half = (0.5, 0.5)  # capacities low enough that no yield reaches its cap of 1
    base = run(*one_host([(1 / 3, 1 / 2), (1 / 2, 1 / 3)], ("cpu", "gb"), normalise=False, capacity=half), "hdrf")
    double = run(*one_host([(2 / 3, 1), (1 / 2, 1 / 3)], ("cpu", "gb"), normalise=False, capacity=half), "hdrf")
    assert base.yields == pytest.approx((0.6, 0.6), abs=EPS)
    assert double.yields == pytest.approx((0.3, 0.6), abs=EPS)
    assert np.ravel(double.vm_share) == pytest.approx(np.ravel(base.vm_share), abs=EPS)
