"""The policy registry, what a PolicyAllocation holds, and the one-line errors for bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from vcsched.errors import InputError
from vcsched.experiments.policy_bench import BenchRow, cluster_case, markdown, tenants_case
from vcsched.model import Host, Instance, Job, Tenant
from vcsched.policies import PolicyOptions, allocate_policy, policies
from vcsched.policies.hdrf import collapsed_weights, tenant_tree


def small() -> tuple[Instance, np.ndarray]:
    hosts = (Host("h0", 1.0, 1.0, (("disk", 1.0), ("net", 0.5))), Host("h1", 0.5, 1.0, (("disk", 1.0),)))
    jobs = (Job("a", 0.5, 0.1, 2, (("disk", 0.3),), 2.0), Job("b", 0.4, 0.2, 1, (("disk", 0.6), ("net", 0.4))))
    return Instance(hosts, jobs), np.array([0, 1, 0])


def test_the_registry_holds_every_policy() -> None:
    assert set(policies()) == {"yield", "drf", "drf-pools", "asset", "pf", "alpha-fair", "hdrf"}
    assert all(p.summary for p in policies().values())


def test_unknown_policy_is_a_one_line_input_error_listing_the_known_ones() -> None:
    with pytest.raises(InputError, match=r"policy: unknown policy 'fair' \(known: alpha-fair, asset, drf"):
        allocate_policy(*small(), "fair")


@pytest.mark.parametrize("alpha", [0.0, -1.0, math.nan, math.inf, 101.0])
def test_alpha_fair_refuses_an_alpha_outside_0_to_100(alpha: float) -> None:
    with pytest.raises(InputError, match=r"^alpha: .* must be a number in \(0, 100\]"):
        allocate_policy(*small(), "alpha-fair", PolicyOptions(alpha=alpha))


def test_alpha_fair_needs_an_alpha_and_the_others_refuse_one() -> None:
    with pytest.raises(InputError, match="needs an alpha"):
        allocate_policy(*small(), "alpha-fair")
    with pytest.raises(InputError, match="only the alpha-fair policy takes an alpha, not 'drf'"):
        allocate_policy(*small(), "drf", PolicyOptions(alpha=2.0))


def test_a_placement_of_the_wrong_length_or_range_is_an_input_error() -> None:
    inst, _ = small()
    with pytest.raises(InputError, match="placement: expected 3 host indices"):
        allocate_policy(inst, [0, 1], "drf")
    with pytest.raises(InputError, match=r"placement: host index out of range 0\.\.1"):
        allocate_policy(inst, [0, 2, 0], "drf")


@pytest.mark.parametrize(("change", "message"), [
    ({"weight": math.nan}, r"jobs\[0\].weight: nan must be a finite number above 0"),
    ({"weight": 0.0}, r"jobs\[0\].weight: 0.0 must be a finite number above 0"),
    ({"tenant": "nobody"}, r"jobs\[0\].tenant: unknown tenant 'nobody'"),
    ({"needs": (("gpu", 0.5),)}, r"jobs\[0\].needs.gpu: no host has capacity for 'gpu'"),
])
def test_instances_built_in_python_meet_the_same_checks_as_files(change: dict[str, object], message: str) -> None:
    inst, hosts = small()
    job = inst.jobs[0]
    fields = {"name": job.name, "cpu_need": job.cpu_need, "memory": job.memory, "tasks": job.tasks,
              "needs": job.needs, "weight": job.weight, "tenant": job.tenant, **change}
    bad = Instance(inst.hosts, (Job(**fields), inst.jobs[1]))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=message):
        allocate_policy(bad, hosts, "drf")


def test_a_cycle_in_a_tenant_tree_built_in_python_is_an_input_error() -> None:
    inst, hosts = small()
    bad = Instance(inst.hosts, inst.jobs, (Tenant("x", 1.0, "y"), Tenant("y", 1.0, "x")))
    with pytest.raises(InputError, match=r"tenants\[0\].parent: cycle x -> y -> x"):
        allocate_policy(bad, hosts, "hdrf")


@pytest.mark.parametrize("policy", ["yield", "drf", "drf-pools", "asset", "pf", "hdrf"])
def test_a_policy_allocation_gives_every_vm_its_yield_times_its_needs(policy: str) -> None:
    inst, hosts = small()
    r = allocate_policy(inst, hosts, policy)
    assert r.resources == ("cpu", "disk", "net")
    y = np.asarray(r.yields)
    assert np.asarray(r.vm_share) == pytest.approx(y[:, None] * inst.job_need)
    per_vm = r.per_vm(inst)
    assert per_vm.shape == (3, 3)
    assert per_vm[1] == pytest.approx(per_vm[0])  # both VMs of job a
    assert r.allocation(inst).cpu == pytest.approx(tuple(y * inst.job_alpha))
    assert r.yield_of(inst) == {"a": r.yields[0], "b": r.yields[1]}
    assert r.runtime_s >= 0


def test_drf_reports_dominant_shares_on_cluster_totals_and_the_dominant_resource() -> None:
    inst, hosts = small()
    r = allocate_policy(inst, hosts, "drf")
    # cluster totals: cpu 1.5, disk 2, net 0.5; a: (2*0.5/1.5, 2*0.3/2, 0) -> cpu; b: (0.4/1.5, 0.3, 0.8) -> net
    assert r.dominant_pool == ("cpu", "net")
    assert r.dominant_share == pytest.approx((r.yields[0] * 2 / 3, r.yields[1] * 0.8))
    assert r.detail["bottleneck"] == ("yield 1", "yield 1")  # both reach their cap before any pair fills


def test_drf_pools_reports_the_host_resource_pair_it_measures_shares_on() -> None:
    inst, hosts = small()
    r = allocate_policy(inst, hosts, "drf-pools")
    # a: per pool h0:cpu 0.5/1, h1:cpu 0.5/0.5 = 1 -> h1:cpu; b: h0:net 0.4/0.5 = 0.8 -> h0:net
    assert r.dominant_pool == ("h1:cpu", "h0:net")
    assert r.dominant_share == pytest.approx((r.yields[0] * 1.0, r.yields[1] * 0.8))


def test_weights_scale_drf_dominant_shares() -> None:
    """Weighted DRF equalises s_j / w_j: weight 2 gets twice the dominant share."""
    hosts = (Host("h0"),)
    jobs = (Job("a", 1.0, 0.1, 1, (), 2.0), Job("b", 1.0, 0.1, 1, (), 1.0))
    r = allocate_policy(Instance(hosts, jobs), [0, 0], "drf")
    assert r.yields == pytest.approx((2 / 3, 1 / 3))
    assert r.detail["bottleneck"] == ("h0:cpu", "h0:cpu")


def test_pf_weights_split_one_resource_in_their_ratio() -> None:
    hosts = (Host("h0"),)
    jobs = (Job("a", 1.0, 0.1, 1, (), 3.0), Job("b", 1.0, 0.1, 1, (), 1.0))
    r = allocate_policy(Instance(hosts, jobs), [0, 0], "pf")
    assert r.yields == pytest.approx((0.75, 0.25), abs=1e-9)
    assert r.detail["kkt"]["duality_gap"] < 1e-9  # type: ignore[index]


def test_the_conic_solver_is_imported_only_when_a_conic_policy_runs() -> None:
    code = ("import sys; from vcsched.model import Host, Instance, Job; from vcsched.policies import allocate_policy;"
            "i = Instance((Host('h'),), (Job('a', 0.5, 0.1),));"
            "[allocate_policy(i, [0], p) for p in ('yield', 'drf', 'drf-pools', 'asset', 'hdrf')];"
            "print('cvxpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_yield_policy_and_the_registry_load_without_scipy() -> None:
    """`status` and `place` on a CPU-only cluster under `yield` never need scipy (~0.4 s to import at start-up)."""
    code = ("import sys; from vcsched.model import Host, Instance, Job; from vcsched.policies import allocate_policy;"
            "from vcsched.policies.registry import policies; import vcsched.control.live;"
            "i = Instance((Host('h'),), (Job('a', 0.5, 0.1),));"
            "assert len(policies()) >= 7; allocate_policy(i, [0], 'yield');"
            "print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_tenant_tree_hangs_jobs_without_a_tenant_under_the_root() -> None:
    hosts = (Host("h0"),)
    jobs = (Job("a", 0.5, 0.1, 1, (), 1.0, "org"), Job("b", 0.5, 0.1), Job("c", 0.5, 0.1, 1, (), 1.0, "team"))
    inst = Instance(hosts, jobs, (Tenant("org", 2.0), Tenant("team", 1.0, "org")))
    tree = tenant_tree(inst)
    assert tree.names == ("", "org", "team", "a", "b", "c")
    assert tree.children[0] == (1, 4) and tree.children[1] == (2, 3) and tree.children[2] == (5,)
    # collapsed: org 2/3 (with b 1/3); a and team split org's half-and-half; c has all of team
    assert collapsed_weights(inst) == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def test_hdrf_reports_the_dominant_share_of_every_tenant() -> None:
    hosts = (Host("h0"),)
    jobs = (Job("a", 1.0, 0.1, 1, (), 1.0, "x"), Job("b", 1.0, 0.1, 1, (), 1.0, "y"))
    r = allocate_policy(Instance(hosts, jobs, (Tenant("x", 3.0), Tenant("y", 1.0))), [0, 0], "hdrf")
    assert r.yields == pytest.approx((0.75, 0.25), abs=1e-3)
    assert r.detail["node_share"] == pytest.approx({"x": 0.75, "y": 0.25}, abs=1e-3)  # type: ignore[arg-type]
    assert r.detail["epsilon"] == 1e-4


def test_hdrf_epsilon_must_be_positive_and_small() -> None:
    with pytest.raises(InputError, match=r"epsilon: 0.5 must be in \(0, 0.1\]"):
        allocate_policy(*small(), "hdrf", PolicyOptions(epsilon=0.5))


def test_bench_cases_build_valid_placed_instances_at_small_sizes() -> None:
    inst, hosts = cluster_case(hosts=8, vms=40, parallel=False)
    assert inst.resources == ("cpu", "disk", "net") and inst.n_tasks == 40
    assert allocate_policy(inst, hosts, "drf").yields
    inst, hosts = tenants_case(hosts=8, leaves_per_team=2, teams=2, orgs=2, vms_per_job=2)
    assert inst.n_jobs == 8 and len(inst.tenants) == 6
    assert allocate_policy(inst, hosts, "hdrf").yields


def test_bench_markdown_has_one_row_per_timing() -> None:
    text = markdown([BenchRow("cluster", "drf", 0.01, 0.02, 0.1, 0.4, "1000 hosts")])
    assert text.splitlines()[2] == "| cluster | drf | 0.010 | 0.020 | met (<= 0.1 s) | 0.1000 | 0.4000 | 1000 hosts |"


def test_reallocate_keeps_the_solvers_result_bit_for_bit_under_yield_and_replaces_it_otherwise() -> None:
    from vcsched.policies.placed import reallocate
    from vcsched.solvers.registry import solve

    inst = Instance((Host("h0"), Host("h1")), (Job("a", 0.8, 0.3), Job("b", 0.6, 0.3, 2), Job("c", 0.9, 0.3)))
    result = solve(inst, "mcb8")
    same, palloc = reallocate(inst, result, "yield")
    assert same is result and palloc is not None
    assert palloc.yields == tuple(result.allocation.yields(inst))  # type: ignore[union-attr]
    drf, palloc = reallocate(inst, result, "drf")
    assert palloc is not None and drf.allocation is not None
    assert drf.allocation.hosts == result.allocation.hosts  # type: ignore[union-attr]
    assert drf.min_yield == pytest.approx(min(palloc.yields))
    bound = solve(inst, "lpbound")
    assert reallocate(inst, bound, "drf") == (bound, None)
