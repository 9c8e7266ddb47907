"""Builders and independent checks for the sharing-policy tests.

The papers' single-pool examples map onto one vcsched host (docs/policies.md
§5): every capacity 1, each paper job one VM whose need is its demand vector
divided by its largest component, so that
its yield is its dominant share (``y_i = phi_i * max_r a_ir``) and the cap
``y <= 1`` never binds before capacity does.

The checks here (loads, Pareto efficiency, the leximin LP) are written
against the model directly, not through vcsched.policies, so that they test
the policies rather than repeat them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linprog

from vcsched.model import Host, Instance, Job, Tenant
from vcsched.policies import PolicyAllocation, PolicyOptions, allocate_policy

NO_CPU = 1e-12


def one_host(profiles: Sequence[Sequence[float]], resources: Sequence[str] = ("cpu", "io"), *,
             names: Sequence[str] | None = None, weights: Sequence[float] | None = None,
             tenants: Sequence[tuple[str, float, str | None]] = (), job_tenants: Sequence[str | None] | None = None,
             capacity: Sequence[float] | None = None, normalise: bool = True) -> tuple[Instance, np.ndarray]:
    """One host, one single-VM job per profile; ``profiles[i][r]`` is paper job i's demand of ``resources[r]``.

    ``normalise`` divides each profile by its largest component (the
    mapping of docs/policies.md §5); ``capacity`` defaults to 1 for every resource.

    vcsched needs ``cpu_need > 0`` but some paper jobs need no CPU (a GPU-only
    job).  Then give resources not starting with ``"cpu"`` (e.g. ``("cores",
    "gpu")``): they all become extra fluid resources, and vcsched's own CPU is
    a bystander that every job needs ``NO_CPU`` of, far below any tolerance
    here, so it never binds nor dominates.
    """
    caps = list(capacity) if capacity is not None else [1.0] * len(resources)
    if resources[0] != "cpu":
        resources, caps = ("cpu", *resources), [1.0, *caps]
        profiles = [(NO_CPU * max(a), *a) for a in profiles]
    host = Host("h0", caps[0], 1.0, tuple(zip(resources[1:], caps[1:], strict=True)))
    jobs = []
    for i, a in enumerate(profiles):
        a = np.asarray(a, dtype=float)
        alpha = a / a.max() if normalise else a
        jobs.append(Job(names[i] if names else f"j{i}", float(alpha[0]), 0.0, 1,
                        tuple((r, float(v)) for r, v in zip(resources[1:], alpha[1:], strict=True) if v > 0),
                        weights[i] if weights else 1.0, job_tenants[i] if job_tenants else None))
    inst = Instance((host,), tuple(jobs), tuple(Tenant(n, w, p) for n, w, p in tenants))
    return inst, np.zeros(len(jobs), dtype=np.int64)


def run(inst: Instance, hosts: np.ndarray, policy: str, **options: float) -> PolicyAllocation:
    return allocate_policy(inst, hosts, policy, PolicyOptions(**options))  # type: ignore[arg-type]


def shares(result: PolicyAllocation, resources: Sequence[str]) -> np.ndarray:
    """What each job gets of the named resources (``jobs x resources``), e.g. the paper's (CPU, GPU)."""
    index = [result.resources.index(r) for r in resources]
    return np.asarray(result.vm_share)[:, index]


def phi(result: PolicyAllocation, profiles: Sequence[Sequence[float]]) -> np.ndarray:
    """The papers' task volumes back from the yields: ``phi_i = y_i / max_r a_ir``."""
    return np.asarray(result.yields) / np.array([max(a) for a in profiles])


def loads(inst: Instance, hosts: np.ndarray, y: Sequence[float]) -> np.ndarray:
    """Fluid load per host and resource (``n_hosts x resources``), by a plain loop over the VMs."""
    out = np.zeros((inst.n_hosts, len(inst.resources)))
    t = 0
    for j, job in enumerate(inst.jobs):
        for _ in range(job.tasks):
            for r, name in enumerate(inst.resources):
                out[hosts[t], r] += y[j] * job.need_of(name)
            t += 1
    return out


def needed_pairs(inst: Instance, hosts: np.ndarray, j: int) -> set[tuple[int, int]]:
    """The (host, resource) pairs job j needs: a host with one of its VMs, a resource it needs."""
    first = sum(job.tasks for job in inst.jobs[:j])
    on = {int(h) for h in hosts[first:first + inst.jobs[j].tasks]}
    return {(h, r) for h in on for r, name in enumerate(inst.resources) if inst.jobs[j].need_of(name) > 0}


def not_pareto(inst: Instance, hosts: np.ndarray, y: Sequence[float], rtol: float = 1e-7) -> list[str]:
    """Jobs that could grow alone: below yield 1 and on no saturated pair they need."""
    load = loads(inst, hosts, y)
    cap = inst.host_capacity
    full = load >= cap - rtol * np.maximum(cap, 1.0)
    return [job.name for j, job in enumerate(inst.jobs)
            if y[j] < 1 - rtol and not any(full[h, r] for h, r in needed_pairs(inst, hosts, j))]


def constraint_rows(inst: Instance, hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense ``A y <= C`` over every (host, resource), by a plain loop (independent of vcsched.policies)."""
    n_res = len(inst.resources)
    a = np.zeros((inst.n_hosts * n_res, inst.n_jobs))
    t = 0
    for j, job in enumerate(inst.jobs):
        for _ in range(job.tasks):
            for r, name in enumerate(inst.resources):
                a[hosts[t] * n_res + r, j] += job.need_of(name)
            t += 1
    return a, inst.host_capacity.reshape(-1)


def leximin_lp(inst: Instance, hosts: np.ndarray, rates: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Lexicographic max-min of ``y_j / rates_j`` by a sequence of LPs (HiGHS), the textbook way.

    Round: maximise t with ``y_j >= rates_j t`` for every free job; then every
    free job that cannot exceed ``rates_j t*`` while the others keep theirs is
    fixed there.  Repeat until all are fixed.
    """
    a, cap = constraint_rows(inst, hosts)
    n = inst.n_jobs
    fixed: dict[int, float] = {}
    while len(fixed) < n:
        free = [j for j in range(n) if j not in fixed]
        bounds = [(fixed[j], fixed[j]) if j in fixed else (0.0, 1.0) for j in range(n)]
        # variables: y (n), t
        a_ub = [np.r_[a_row, 0.0] for a_row in a]
        b_ub = list(cap)
        for j in free:  # rates_j t - y_j <= 0
            row = np.zeros(n + 1)
            row[j], row[n] = -1.0, rates[j]
            a_ub.append(row)
            b_ub.append(0.0)
        res = linprog(np.r_[np.zeros(n), -1.0], A_ub=np.array(a_ub), b_ub=b_ub,
                      bounds=[*bounds, (0.0, None)], method="highs")
        assert res.status == 0, res.message
        t = res.x[n]
        newly = []
        for j in free:
            c = np.zeros(n + 1)
            c[j] = -1.0
            b2 = [*bounds, (t, t)]
            r2 = linprog(c, A_ub=np.array(a_ub), b_ub=b_ub, bounds=b2, method="highs")
            assert r2.status == 0, r2.message
            if r2.x[j] <= rates[j] * t + tol:
                newly.append(j)
        assert newly, "leximin LP: no job blocked at the optimum level"
        for j in newly:
            fixed[j] = min(1.0, rates[j] * t)
    return np.array([fixed[j] for j in range(n)])


def useful_yield(true_need: Sequence[float], reported_need: Sequence[float], y_reported: float) -> float:
    """What a job that lied can use: whole tasks of its true need from ``y * reported`` (Leontief), at most 1."""
    ratios = [y_reported * rep / true for true, rep in zip(true_need, reported_need, strict=True) if true > 0]
    return min(1.0, *ratios)
