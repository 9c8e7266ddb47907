"""Timing the sharing policies on large fixed placements (for ``vcsched bench``).

Two seeded instances, so that two machines time the same work:

* ``cluster``: the paper's protocol (Stillwell et al., §4.1 and §5: parallel
  jobs of 1–64 VMs) at 1,000 hosts and 10,000 VMs, plus two extra fluid
  resources (``disk``, ``net``: host capacity 1, per-VM needs drawn like CPU
  needs, mean 0.3), so 3 fluid resources; placed by MCB8, which ignores the
  extra resources (placement under a policy is not part of this).
* ``sequential``: the same with one-VM jobs (section 4.1): 10,000 jobs, the
  most variables for PF and the most events for the water-filling.
* ``tenants``: the same cluster size with 100 jobs of 100 VMs each, the
  leaves of a 3-level tenant tree (5 organisations x 4 teams x 5 jobs), for
  ``hdrf``.

:func:`bench` times each policy's own work (``PolicyAllocation.runtime_s``:
the policy function on the placement) and the whole :func:`allocate_policy`
call (input checks, per-VM shares, the validator).  Numbers are
machine-dependent; docs/policies.md records one run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from vcsched.experiments import OnProgress
from vcsched.experiments.generate import GeneratorSpec, generate, truncated_normal
from vcsched.model import Host, Instance, Job, SolveOptions, Tenant
from vcsched.policies.allocation import PolicyOptions
from vcsched.policies.registry import allocate_policy
from vcsched.solvers.registry import solve

BENCH_SEED = 20080101
EXTRA = ("disk", "net")
EXTRA_MEAN = 0.3


@dataclass(frozen=True)
class BenchRow:
    case: str
    policy: str
    policy_s: float  # the policy function alone
    total_s: float  # allocate_policy: checks + policy + per-VM shares + validation
    min_yield: float
    mean_yield: float
    note: str


def _with_extra_resources(instance: Instance, rng: np.random.Generator) -> Instance:
    needs = {r: truncated_normal(rng, EXTRA_MEAN, 0.5, instance.n_jobs) for r in EXTRA}
    hosts = tuple(Host(h.name, h.cpu, h.memory, tuple((r, 1.0) for r in EXTRA)) for h in instance.hosts)
    jobs = tuple(Job(j.name, j.cpu_need, j.memory, j.tasks, tuple((r, float(needs[r][i])) for r in EXTRA))
                 for i, j in enumerate(instance.jobs))
    return Instance(hosts, jobs, instance.tenants)


def _place(instance: Instance) -> np.ndarray:
    result = solve(instance, "mcb8", SolveOptions())
    if result.allocation is None:
        raise RuntimeError("bench: MCB8 found no placement for the bench instance")
    return np.asarray(result.allocation.hosts, dtype=np.int64)


def cluster_case(hosts: int = 1000, vms: int = 10_000, seed: int = BENCH_SEED,
                 parallel: bool = True) -> tuple[Instance, np.ndarray]:
    rng = np.random.default_rng(seed)
    spec = GeneratorSpec(hosts=hosts, tasks=vms, slack=0.3, cv_mem=0.5, cv_cpu=0.5, parallel=parallel)
    base = generate(spec, rng)
    instance = _with_extra_resources(base, rng)
    return instance, _place(instance)


def tenants_case(hosts: int = 1000, leaves_per_team: int = 5, teams: int = 4, orgs: int = 5,
                 vms_per_job: int = 100, seed: int = BENCH_SEED) -> tuple[Instance, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_jobs = leaves_per_team * teams * orgs
    mem_mean = 0.7 * hosts / (n_jobs * vms_per_job)
    cpu = truncated_normal(rng, 0.5, 0.5, n_jobs)
    mem = truncated_normal(rng, mem_mean, 0.5, n_jobs)
    tenants = [Tenant(f"org{o}", float(rng.integers(1, 4))) for o in range(orgs)]
    tenants += [Tenant(f"org{o}.team{t}", float(rng.integers(1, 4)), f"org{o}")
                for o in range(orgs) for t in range(teams)]
    per_org = teams * leaves_per_team
    jobs = tuple(Job(f"job{i}", float(cpu[i]), float(mem[i]), vms_per_job, (), float(rng.integers(1, 4)),
                     f"org{i // per_org}.team{(i // leaves_per_team) % teams}")
                 for i in range(n_jobs))
    base = Instance(tuple(Host(f"h{i}") for i in range(hosts)), jobs, tuple(tenants))
    instance = _with_extra_resources(base, rng)
    return instance, _place(instance)


def sequential_case() -> tuple[Instance, np.ndarray]:
    return cluster_case(parallel=False)


CASES = {"cluster": cluster_case, "sequential": sequential_case, "tenants": tenants_case}
POLICIES = {
    "cluster": ("yield", "drf", "drf-pools", "asset", "pf", "alpha-fair"),
    "sequential": ("yield", "drf", "drf-pools", "asset", "pf", "alpha-fair"),
    "tenants": ("drf", "pf", "hdrf"),
}
WEIGHTED = "drf (weighted)"  # the row of DRF with weights, on the cluster case
#: The targets (seconds of the policy's own work) at 1,000 hosts x 10,000 VMs x 3 resources (docs/policies.md §7).
TARGETS = {"drf": 0.1, WEIGHTED: 0.1, "drf-pools": 0.1, "asset": 0.1, "pf": 1.0, "hdrf": 0.5}


def weighted(instance: Instance, seed: int = BENCH_SEED) -> Instance:
    """The same jobs with weights drawn from {1, 2, 4}."""
    w = np.random.default_rng(seed).choice((1.0, 2.0, 4.0), instance.n_jobs)
    return Instance(instance.hosts, tuple(Job(j.name, j.cpu_need, j.memory, j.tasks, j.needs, float(w[i]), j.tenant)
                                          for i, j in enumerate(instance.jobs)), instance.tenants)


def bench(repeat: int = 3, on_progress: OnProgress | None = None) -> list[BenchRow]:
    """Best of ``repeat`` runs of every policy on every case; ``on_progress`` counts the rows timed."""
    rows: list[BenchRow] = []
    total = sum(len(p) for p in POLICIES.values()) + 1  # + the weighted DRF row
    if on_progress is not None:
        on_progress(0, total, "policies: building and placing the bench instances")
    for case, build in CASES.items():
        instance, hosts = build()
        size = f"{instance.n_hosts} hosts, {instance.n_tasks} VMs, {instance.n_jobs} jobs, " \
               f"{len(instance.resources)} resources"
        runs = [(policy, policy, instance) for policy in POLICIES[case]]
        if case == "cluster":
            runs.insert(2, (WEIGHTED, "drf", weighted(instance)))
        for label, policy, inst in runs:
            if on_progress is not None:
                on_progress(len(rows), total, f"policies: {case} {label}")
            options = PolicyOptions(alpha=2.0 if policy == "alpha-fair" else None)
            best_policy = best_total = float("inf")
            for _ in range(repeat):
                start = time.perf_counter()
                result = allocate_policy(inst, hosts, policy, options)
                best_total = min(best_total, time.perf_counter() - start)
                best_policy = min(best_policy, result.runtime_s)
            y = np.asarray(result.yields)
            rows.append(BenchRow(case, label, best_policy, best_total, float(y.min()), float(y.mean()),
                                 size + (", alpha 2" if policy == "alpha-fair" else "")))
    if on_progress is not None:
        on_progress(total, total, "policies")
    return rows


def within_target(row: BenchRow) -> bool | None:
    """Whether the policy's own time meets its target (None: no target for this row)."""
    target = TARGETS.get(row.policy)
    return None if target is None else row.policy_s <= target


def target_text(row: BenchRow) -> str:
    ok = within_target(row)
    return "" if ok is None else f"{'met' if ok else 'MISSED'} (<= {TARGETS[row.policy]:g} s)"


def markdown(rows: list[BenchRow]) -> str:
    lines = ["| case | policy | policy (s) | allocate_policy (s) | target | min yield | mean yield | instance |",
             "|---|---|---:|---:|---|---:|---:|---|"]
    lines += [f"| {r.case} | {r.policy} | {r.policy_s:.3f} | {r.total_s:.3f} | {target_text(r)} | "
              f"{r.min_yield:.4f} | {r.mean_yield:.4f} | {r.note} |" for r in rows]
    return "\n".join(lines)
