"""``vcsched solve``: place one instance with one algorithm and report yields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
import numpy as np

from cli.app import EXIT_OK, console, emit_json, read_json_file, refuse
from cli.params import FiniteFloatRange, json_option, policy_options, time_limit_option
from cli.tables import FitTable
from vcsched.formats.instance import instance_from_dict
from vcsched.model import Instance, SolveOptions, SolveResult
from vcsched.solvers.registry import algorithms, solve
from vcsched.validate import check_allocation

if TYPE_CHECKING:
    from vcsched.policies import PolicyAllocation


def result_to_dict(instance: Instance, result: SolveResult) -> dict[str, Any]:
    """The ``--json`` document (a fixed format: other tools read it)."""
    placement: list[dict[str, Any]] | None = None
    if result.allocation is not None:
        placement = []
        for t, h in enumerate(result.allocation.hosts):
            j = int(instance.task_job[t])
            placement.append(
                {
                    "job": instance.jobs[j].name,
                    "task": int(t - instance.job_first_task[j]),
                    "host": h,
                    "cpu": result.allocation.cpu[j],
                }
            )
    elif not result.feasible or result.bound is None:
        placement = []
    out: dict[str, Any] = {
        "ok": result.feasible,  # the verdict of every deciding command (docs/cli.md); "feasible" is deprecated
        "algorithm": result.algorithm,
        "feasible": result.feasible,
        "min_yield": result.min_yield,
        "avg_yield": result.avg_yield,
        "runtime_s": result.runtime_s,
        "optimal": result.optimal,
        "placement": placement,
    }
    if result.bound is not None:
        out["bound"] = result.bound
    if result.detail:
        out["detail"] = result.detail
    return out


def render_result(instance: Instance, result: SolveResult) -> None:
    status = "[green]feasible[/]" if result.feasible else "[red]no feasible placement found[/]"
    console.print(f"[bold]{result.algorithm}[/] on {instance.n_hosts} hosts, {instance.n_jobs} jobs "
                  f"({instance.n_tasks} tasks): {status}")
    if result.bound is not None:
        console.print(f"  upper bound on the minimum yield: [bold]{result.bound:.4f}[/]")
    if result.min_yield is not None and result.allocation is not None:
        console.print(f"  minimum yield [bold]{result.min_yield:.4f}[/]   average yield "
                      f"[bold]{result.avg_yield:.4f}[/]   solver time {result.runtime_s * 1e3:.2f} ms")
    if result.optimal is not None:
        console.print(f"  proved optimal: {'yes' if result.optimal else 'no (time limit)'}")
    for note in result.detail.get("fallback", []):  # type: ignore[attr-defined]
        console.print(f"  [yellow]note[/]: {note}", highlight=False)
    if result.allocation is None:
        return
    hosts = np.asarray(result.allocation.hosts)
    task_cpu = np.asarray(result.allocation.cpu)[instance.task_job]
    table = FitTable(title="per-host load")
    for col in ("host", "tasks", "CPU need", "CPU given", "CPU cap.", "memory", "mem. cap."):
        table.add_column(col, justify="right" if col != "host" else "left")
    for h, host in enumerate(instance.hosts):
        on = hosts == h
        table.add_row(
            host.name,
            str(int(on.sum())),
            f"{instance.task_alpha[on].sum():.3f}",
            f"{task_cpu[on].sum():.3f}",
            f"{host.cpu:g}",
            f"{instance.task_mem[on].sum():.3f}",
            f"{host.memory:g}",
        )
    console.print(table)


def add_policy_fields(out: dict[str, Any], instance: Instance, policy: str, palloc: PolicyAllocation | None) -> None:
    """``--policy``'s additions to the JSON: ``policy``, ``yields`` and one field per extra resource in each row."""
    out["policy"] = policy
    out["yields"] = palloc.yield_of(instance) if palloc is not None else {}
    if palloc is None or not out.get("placement"):
        return
    extra = list(enumerate(instance.resources))[1:]
    for row, t in zip(out["placement"], range(instance.n_tasks), strict=True):
        j = int(instance.task_job[t])
        for r, name in extra:
            row[name] = palloc.vm_share[j][r]


def render_policy(instance: Instance, palloc: PolicyAllocation) -> None:
    table = FitTable(title=f"policy {palloc.policy}: yields and dominant shares")
    for col in ("job", "yield", "dominant share", "dominant resource"):
        table.add_column(col, justify="left" if col in ("job", "dominant resource") else "right")
    for j, job in enumerate(instance.jobs):
        table.add_row(job.name, f"{palloc.yields[j]:.4f}", f"{palloc.dominant_share[j]:.4f}", palloc.dominant_pool[j])
    console.print(table)
    if palloc.detail.get("fallback"):
        console.print(f"  [yellow]note[/]: {palloc.detail['fallback']}", highlight=False)
    kkt = palloc.detail.get("kkt")
    if isinstance(kkt, dict):
        console.print("  KKT residuals: " + ", ".join(f"{k} {v:.1e}" for k, v in kkt.items()))


@click.command("solve")
@click.argument("instance_file", metavar="INSTANCE.json", type=click.Path(dir_okay=False))
@click.option("-a", "--algorithm", default="mcb8", show_default=True, metavar="NAME",
              help="Algorithm from the registry: mcb1..mcb8, gr, sg, gb, sgb, rrnd, rrnz, milp, lpbound, best.")
@json_option("Print one JSON object on stdout instead of tables.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed for randomized algorithms (rrnd, rrnz).")
@time_limit_option("Wall-clock limit in seconds for milp/rrnd/rrnz (milp then reports optimal=false); "
                   "the search budget of best (default 0.1).")
@click.option("--max-attempts", type=click.IntRange(min=1), default=500_000, show_default=True,
              help="Placement attempts before gb/sgb give up backtracking (paper: 500,000).")
@click.option("--precision", type=FiniteFloatRange(min=1e-9, max=0.1), default=1e-4, show_default=True,
              help="MCB binary search stops when the yield interval is narrower than this.")
@policy_options("Sharing policy for the yields once placed: yield (default), drf, drf-pools, asset, pf, "
                "alpha-fair, hdrf (docs/policies.md).  Adds 'policy' and 'yields' to --json.")
def solve_cmd(instance_file: str, algorithm: str, as_json: bool, seed: int,
              time_limit: float | None, max_attempts: int, precision: float,
              policy: str | None, alpha: float | None) -> int:
    """Place the jobs of INSTANCE.json on its hosts and report the yields.

    \b
    INSTANCE.json:
      {"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0}, ...],
       "jobs":  [{"name": "j0", "cpu_need": 0.5, "memory": 0.2, "tasks": 1}, ...]}

    CPU and memory are fractions of a reference host; cpu_need is the CPU a
    task uses when alone, in (0, 1]; tasks > 1 makes a parallel job whose
    tasks all get the same CPU fraction.  Every placing algorithm is followed
    by the optimal average-yield phase.

    With --policy the jobs are placed for that sharing policy and the yields
    are chosen by it (yield, drf and asset: MCB bisects on the policy's fill
    level; the others: placed for the max-min yield, then allocated by the
    policy).  Hosts may list extra fluid resources ("capacity": {"disk": 1.0})
    and jobs their "needs", "weight" and "tenant" (see docs/policies.md).  An
    instance with extra resources is placed on the whole resource vector and
    always gets them honoured (policy yield unless told otherwise).

    Exit codes: 0 placement found, 1 none found (the result is still printed), 2 bad input.
    """
    algos = algorithms()
    if algorithm not in algos:
        raise click.BadParameter(f"unknown algorithm {algorithm!r} (known: {', '.join(sorted(algos))})",
                                 param_hint="'--algorithm'")
    if policy is not None or alpha is not None:  # lazy: most runs need no policy
        from vcsched.policies import PolicyOptions, get
        from vcsched.policies.registry import check_options

        check_options(get(policy or "yield"), PolicyOptions(alpha=alpha))  # fail before placing
    instance = instance_from_dict(read_json_file(instance_file, "instance"))
    options = SolveOptions(seed=seed, time_limit=time_limit, max_attempts=max_attempts, precision=precision)
    with_policy = policy is not None or instance.has_extra_resources
    palloc = None
    if with_policy and not algos[algorithm].bound_only:
        from vcsched.policies import PolicyOptions
        from vcsched.policies.placement import place_policy

        placed = place_policy(instance, policy or "yield", algorithm, options, PolicyOptions(alpha=alpha))
        result, palloc = placed.result, placed.allocation
    else:
        result = solve(instance, algorithm, options)
    if result.allocation is not None:
        check_allocation(instance, result.allocation, min_yield=result.min_yield, avg_yield=result.avg_yield)
    if as_json:
        out = result_to_dict(instance, result)
        if with_policy:
            add_policy_fields(out, instance, policy or "yield", palloc)
        emit_json(out)
    else:
        render_result(instance, result)
        if palloc is not None:
            render_policy(instance, palloc)
    return EXIT_OK if result.feasible else refuse(f"{algorithm}: no feasible placement found")
