"""``vcsched experiment policies``: every sharing policy on the same instances (docs/policies.md §8).

**Instances.**  The paper's protocol for parallel jobs (Stillwell et al.,
§4.1 and §5: ``H`` unit hosts, jobs of 1–64 VMs by Lublin & Feitelson, CPU
need ``TN(0.5, cv_cpu)``, memory ``TN((1 - s) H / J, cv_mem)``, ``TN`` a
normal conditioned on (0, 1]) plus a second and a third fluid resource:

* ``disk``: each job's per-VM need ``TN(0.4, 0.75)`` (mean 0.4, standard
  deviation 0.3), every host capacity 1;
* ``net``: ``TN(0.25, 0.75)``, every host capacity 1.

So jobs differ in their dominant resource (CPU for about half, disk or net
for the rest), which is what separates the policies.  Each job also draws a
weight from {1, 2, 4} and a leaf of a 3-level tenant tree (4 organisations
of weight 1–3, 2 teams each of weight 1–3; the job hangs under a team).
Weights and the tree are used only by ``wdrf`` and ``hdrf``; the other
policies run with every weight 1 (plain DRF, CEEI), so the same instance
compares the unweighted policies with each other.

**Runs.**  For each instance and policy, the jobs are placed for the policy
(:func:`vcsched.policies.placement.place_policy`: MCB8 on the resource
vector, bisecting on the policy's fill level for ``yield``/``drf``/
``wdrf``/``asset``, on the max-min yield for the others) and allocated by
it.  Two more placements measure what placing for the policy buys: the
max-min placement (MCB8 on the vector, rates 1) and the CPU-only placement
(MCB8 on CPU and memory, the extra resources ignored, as before this
existed), each then allocated by the same policy.

**Metrics** per run: minimum and average yield, Jain's index of the yields
``(sum y)^2 / (n sum y^2)``, utilisation of each fluid resource (used over
the cluster's total), the spread of the dominant shares ``y_j D_j``
(coefficient of variation: 0 when all are equal, as DRF aims for between
jobs that share a bottleneck) and the time to place and allocate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from vcsched.errors import VcschedError
from vcsched.experiments import OnProgress
from vcsched.experiments.generate import GeneratorSpec, generate, truncated_normal
from vcsched.experiments.workers import map_items
from vcsched.model import Host, Instance, Job, SolveOptions, Tenant
from vcsched.policies.allocation import PolicyOptions
from vcsched.policies.placement import place_policy
from vcsched.policies.registry import allocate_policy
from vcsched.policies.shares import cluster_totals, dominant_shares
from vcsched.solvers.registry import solve

#: The extra fluid resources: (mean, coefficient of variation) of a job's per-VM need; host capacity 1.
EXTRA = {"disk": (0.4, 0.75), "net": (0.25, 0.75)}
WEIGHTS = (1.0, 2.0, 4.0)
ORGS, TEAMS = 4, 2
ALPHA = 2.0

#: ``(label, registered policy, uses weights and the tree)``: every policy on the same instances.
POLICY_RUNS = (
    ("yield", "yield", False),
    ("drf", "drf", False),
    ("wdrf", "drf", True),
    ("drf-pools", "drf-pools", False),
    ("asset", "asset", False),
    ("pf", "pf", False),
    ("alpha-fair", "alpha-fair", False),
    ("hdrf", "hdrf", True),
)
POLICY_LABELS = tuple(label for label, _, _ in POLICY_RUNS)
#: How the run was placed: for the policy (its own), for max-min on the vector, or on CPU and memory only.
PLACEMENTS = ("policy", "max-min", "cpu-only")


def policy_instance(spec: GeneratorSpec, seed: int) -> Instance:
    """One instance of the protocol in the module docstring (weights and tree included)."""
    rng = np.random.default_rng(seed)
    base = generate(spec, rng)
    needs = {r: truncated_normal(rng, mean, cv, base.n_jobs) for r, (mean, cv) in EXTRA.items()}
    weights = rng.choice(WEIGHTS, base.n_jobs)
    tenants = [Tenant(f"org{o}", float(rng.integers(1, 4))) for o in range(ORGS)]
    tenants += [Tenant(f"org{o}.team{t}", float(rng.integers(1, 4)), f"org{o}") for o in range(ORGS)
                for t in range(TEAMS)]
    leaf = rng.integers(0, ORGS * TEAMS, base.n_jobs)
    hosts = tuple(Host(h.name, h.cpu, h.memory, tuple((r, 1.0) for r in EXTRA)) for h in base.hosts)
    jobs = tuple(Job(j.name, j.cpu_need, j.memory, j.tasks, tuple((r, float(needs[r][i])) for r in EXTRA),
                     float(weights[i]), f"org{leaf[i] // TEAMS}.team{leaf[i] % TEAMS}")
                 for i, j in enumerate(base.jobs))
    return Instance(hosts, jobs, tuple(tenants))


def unweighted(instance: Instance) -> Instance:
    """The same instance with every weight 1 and no tree (plain DRF, CEEI, ...)."""
    return Instance(instance.hosts, tuple(replace(j, weight=1.0, tenant=None) for j in instance.jobs))


def cpu_only(instance: Instance) -> Instance:
    """The instance as the placement saw it before extra resources counted: CPU and memory."""
    return Instance(tuple(Host(h.name, h.cpu, h.memory) for h in instance.hosts),
                    tuple(Job(j.name, j.cpu_need, j.memory, j.tasks) for j in instance.jobs))


# ---------------------------------------------------------------------------------------------- work


@dataclass(frozen=True)
class PolicyItem:
    """One instance to run every policy on."""

    family: int
    instance: int
    seed: int
    spec: GeneratorSpec


@dataclass(frozen=True)
class PolicyRecord:
    family: int
    instance: int
    seed: int
    hosts: int
    tasks: int
    jobs: int
    slack: float
    cv_mem: float
    cv_cpu: float
    policy: str
    placement: str
    feasible: bool
    min_yield: float | None = None
    avg_yield: float | None = None
    jain: float | None = None
    utilisation: dict[str, float] | None = None
    share_spread: float | None = None
    time_s: float = math.nan
    method: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def families(hosts: int, tasks: Sequence[int], slacks: Sequence[float],
             cvs: Sequence[float]) -> list[GeneratorSpec]:
    return [GeneratorSpec(hosts=hosts, tasks=t, slack=s, cv_mem=cm, cv_cpu=cc, parallel=True)
            for t in tasks for s in slacks for cm in cvs for cc in cvs]


def work_items(specs: Sequence[GeneratorSpec], instances: int, seed: int) -> list[PolicyItem]:
    """``instances`` per family, each with its own seed (independent of how many run)."""
    return [PolicyItem(f, i, seed * 1_000_003 + f * 1009 + i, spec)
            for f, spec in enumerate(specs) for i in range(instances)]


def jain(y: np.ndarray) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one job has everything."""
    s2 = float(np.sum(y * y))
    return float(np.sum(y) ** 2 / (len(y) * s2)) if len(y) and s2 > 0 else 1.0


def metrics(instance: Instance, hosts: Sequence[int], yields: Sequence[float]) -> dict[str, Any]:
    y = np.asarray(yields, dtype=float)
    used = (y * instance.job_tasks) @ instance.job_need  # per resource
    totals = cluster_totals(instance)
    per_unit, _ = dominant_shares(instance)
    shares = y * per_unit
    mean = float(shares.mean()) if len(shares) else 0.0
    return {
        "min_yield": float(y.min()), "avg_yield": float(y.mean()), "jain": jain(y),
        "utilisation": {r: float(used[k] / totals[k]) for k, r in enumerate(instance.resources)},
        "share_spread": float(shares.std() / mean) if mean > 0 else 0.0,
    }


def run_item(item: PolicyItem) -> list[PolicyRecord]:
    """Every policy, each on its own placement and on the two reference placements (module docstring)."""
    full = policy_instance(item.spec, item.seed)
    plain = unweighted(full)
    blank = PolicyRecord(item.family, item.instance, item.seed, item.spec.hosts, item.spec.tasks, full.n_jobs,
                         item.spec.slack, item.spec.cv_mem, item.spec.cv_cpu, "", "", False)
    shared: dict[str, tuple[np.ndarray | None, float]] = {}
    for name, inst in (("max-min", plain), ("cpu-only", cpu_only(plain))):
        start = time.perf_counter()
        res = solve(inst, "mcb8", SolveOptions())
        shared[name] = (None if res.allocation is None else np.asarray(res.allocation.hosts),
                        time.perf_counter() - start)
    records = []
    for label, policy, weighted in POLICY_RUNS:
        inst = full if weighted else plain
        options = PolicyOptions(alpha=ALPHA if policy == "alpha-fair" else None)
        base = replace(blank, policy=label)
        try:
            start = time.perf_counter()
            placed = place_policy(inst, policy, "mcb8", SolveOptions(), options)
            took = time.perf_counter() - start
            if placed.allocation is None:
                records.append(replace(base, placement="policy", time_s=took, method=placed.method))
            else:
                records.append(replace(base, placement="policy", feasible=True, time_s=took, method=placed.method,
                                       **metrics(inst, placed.allocation.hosts, placed.allocation.yields)))
            for name, (hosts, place_s) in shared.items():
                if hosts is None:
                    records.append(replace(base, placement=name, time_s=place_s))
                    continue
                start = time.perf_counter()
                palloc = allocate_policy(inst, hosts, policy, options)
                took = place_s + time.perf_counter() - start
                records.append(replace(base, placement=name, feasible=True, time_s=took,
                                       **metrics(inst, palloc.hosts, palloc.yields)))
        except (VcschedError, ArithmeticError, ValueError, RuntimeError) as exc:
            records.append(replace(base, placement="policy", error=f"{type(exc).__name__}: {exc}"))
    return records


def run_items(items: Sequence[PolicyItem], jobs: int = 1,
              on_progress: OnProgress | None = None) -> Iterator[list[PolicyRecord]]:
    """:func:`run_item` on each item, in ``jobs`` worker processes; ``on_progress`` is called in this process."""
    return map_items(run_item, items, jobs, on_progress)


# ---------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class PolicySummary:
    policy: str
    placement: str
    runs: int
    failed: int
    min_yield: float
    avg_yield: float
    jain: float
    utilisation: dict[str, float]
    share_spread: float
    time_s: float


def summarise(records: Sequence[PolicyRecord], placement: str = "policy") -> list[PolicySummary]:
    """Means over the feasible runs of each policy with ``placement`` (every policy has the same instances)."""
    out = []
    for label in POLICY_LABELS:
        recs = [r for r in records if r.policy == label and r.placement == placement]
        ok = [r for r in recs if r.feasible and r.min_yield is not None]
        if not recs:
            continue

        def mean(attr: str, rows: list[PolicyRecord] = ok) -> float:
            vals = [getattr(r, attr) for r in rows]
            return float(np.mean(vals)) if vals else math.nan

        resources = sorted({k for r in ok for k in (r.utilisation or {})}, key=lambda k: (k != "cpu", k))
        util = {k: float(np.mean([(r.utilisation or {})[k] for r in ok])) for k in resources}
        out.append(PolicySummary(label, placement, len(recs), len(recs) - len(ok), mean("min_yield"),
                                 mean("avg_yield"), mean("jain"), util, mean("share_spread"), mean("time_s", recs)))
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:"
                                                           for i in range(len(header))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def summary_table(rows: Sequence[PolicySummary]) -> str:
    resources = list(rows[0].utilisation) if rows else []
    header = ["policy", "runs", "min yield", "avg yield", "Jain", *(f"util {r}" for r in resources),
              "share spread (CV)", "time (s)"]
    body = [[r.policy, str(r.runs - r.failed) + (f" ({r.failed} failed)" if r.failed else ""),
             f"{r.min_yield:.4f}", f"{r.avg_yield:.4f}", f"{r.jain:.3f}",
             *(f"{r.utilisation.get(k, math.nan):.3f}" for k in resources), f"{r.share_spread:.3f}",
             f"{r.time_s:.3f}"] for r in rows]
    return _table(header, body)


def placement_table(records: Sequence[PolicyRecord]) -> str:
    """Min / avg yield of each policy on its own placement, the max-min one and the CPU-only one."""
    by = {(s.policy, s.placement): s for p in PLACEMENTS for s in summarise(records, p)}
    header = ["policy", "placed by", *(f"{p}: min / avg" for p in PLACEMENTS)]
    body = []
    for label in POLICY_LABELS:
        method = next((r.method for r in records if r.policy == label and r.method), "-")
        cells = []
        for p in PLACEMENTS:
            s = by.get((label, p))
            cells.append("-" if s is None else f"{s.min_yield:.4f} / {s.avg_yield:.4f}")
        body.append([label, method or "-", *cells])
    return _table(header, body)


def report_markdown(records: Sequence[PolicyRecord], meta: dict[str, Any]) -> str:
    errors = [r for r in records if r.error]
    parts = [
        "# Sharing policies on the same instances",
        "",
        f"{meta.get('instances')} instances ({meta.get('families')} families x {meta.get('per_family')}): "
        f"{meta.get('hosts')} hosts, {meta.get('tasks')} VMs in parallel jobs, slack {meta.get('slacks')}, "
        f"cv {meta.get('cvs')}; extra resources {meta.get('extra')}; seed {meta.get('seed')}; "
        f"{meta.get('jobs')} worker processes, wall time {meta.get('wall_s', 0):.0f} s; {meta.get('machine')}.",
        "",
        "## Each policy on its own placement",
        "",
        summary_table(summarise(records)),
        "",
        "## What placing for the policy buys (min / avg yield)",
        "",
        "`policy`: placed for the policy (level = MCB8 bisecting on its fill level; max-min = MCB8 on the "
        "vector for the max-min yield); `max-min`: the max-min vector placement for every policy; `cpu-only`: "
        "MCB8 on CPU and memory alone.",
        "",
        placement_table(records),
    ]
    if errors:
        parts += ["", f"## Errors ({len(errors)})", ""] + [f"- {r.policy} on family {r.family} instance "
                                                           f"{r.instance}: {r.error}" for r in errors[:20]]
    return "\n".join(parts) + "\n"
