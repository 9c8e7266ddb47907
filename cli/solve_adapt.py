"""``vcsched solve-adapt``: re-place a running cluster given as an instance file, within a migration byte budget
(the paper's section 6.1), no hypervisor needed."""

from __future__ import annotations

from typing import Any

import click

from cli.app import EXIT_OK, console, emit_json, read_json_file, refuse
from cli.params import budget_option, json_option, time_limit_option
from cli.solve import render_result, result_to_dict
from cli.tables import FitTable
from vcsched.adaptation.problem import AdaptProblem, AdaptResult, problem_from_dict
from vcsched.adaptation.solve import ALGORITHMS, solve_adapt
from vcsched.formats.units import format_budget
from vcsched.model import SolveOptions


def adapt_result_to_dict(problem: AdaptProblem, adapted: AdaptResult) -> dict[str, Any]:
    """The ``solve`` JSON document plus ``migrations`` and ``migrated_bytes``."""
    out = result_to_dict(problem.instance, adapted.result)
    out["budget"] = problem.budget
    out["migrations"] = [m.to_dict() for m in adapted.migrations]
    out["migrated_bytes"] = adapted.migrated_bytes
    return out


def render_adapt(problem: AdaptProblem, adapted: AdaptResult) -> None:
    render_result(problem.instance, adapted.result)
    running = int(problem.task_bytes[problem.running].sum())
    console.print(f"  migrated {format_budget(adapted.migrated_bytes)} of a budget of {format_budget(problem.budget)} "
                  f"({int(problem.running.sum())} running tasks, {format_budget(running)} in all; "
                  f"{int((~problem.running).sum())} new)", highlight=False)
    if not adapted.migrations:
        return
    inst = problem.instance
    table = FitTable(title="live migrations")
    for col in ("job", "task", "from", "to", "bytes"):
        table.add_column(col, justify="left" if col in ("job", "from", "to") else "right")
    for m in adapted.migrations:
        table.add_row(m.job, str(m.task), inst.hosts[m.source].name, inst.hosts[m.target].name, format_budget(m.bytes))
    console.print(table)


@click.command("solve-adapt")
@click.argument("instance_file", metavar="INSTANCE.json", type=click.Path(dir_okay=False))
@budget_option("Most bytes live migrations may move: 0 (re-cap only), 1073741824, 2GiB, 512MiB, unlimited.")
@click.option("-a", "--algorithm", type=click.Choice(ALGORITHMS), default="heuristic", show_default=True,
              help="milp: the paper's section 6.1 MILP (HiGHS; small instances).  heuristic: keep, pack, improve; "
                   "heuristic-best: the same with the anytime search `best` (0.1 s) for its re-placement.")
@json_option()
@time_limit_option("Wall-clock limit in seconds for milp (it then reports optimal=false).")
def solve_adapt_cmd(instance_file: str, budget: int, algorithm: str, as_json: bool, time_limit: float | None) -> int:
    """Re-place a running cluster, migrating at most --budget bytes, for the best minimum yield.

    \b
    INSTANCE.json is the `vcsched solve` format; each job may also carry
      "current": [host index or null per task]   where its tasks run now
                                                  (null: a new arrival)
      "memory_bytes": N                           bytes one live migration
                                                  of a task moves
    and the document may carry "host_memory_bytes" (bytes of one reference
    host's memory, default 1 GiB) from which memory_bytes defaults to
    memory x host_memory_bytes.  Jobs that left are simply absent.

    Moving a running task costs its bytes; placing a new one is free.
    Budget 0 keeps every running task in place and only re-caps CPU; an
    unlimited budget allows a free re-placement.  The result lists the
    migrations (job, task, from, to, bytes) and their total.

    \b
    Example:
      vcsched solve-adapt cluster.json --budget 2GiB
      vcsched solve-adapt cluster.json --budget 0 --json | jq .min_yield

    Exit codes: 0 placement found, 1 none within the budget, 2 bad input.
    """
    problem = problem_from_dict(read_json_file(instance_file, "instance"), budget)
    adapted = solve_adapt(problem, algorithm, SolveOptions(time_limit=time_limit))
    if as_json:
        emit_json(adapt_result_to_dict(problem, adapted))
    else:
        render_adapt(problem, adapted)
    return EXIT_OK if adapted.result.feasible else refuse(f"{algorithm}: no placement within the budget of "
                                                          f"{format_budget(budget)}")
