"""``vcsched solve-adapt`` (re-place a running cluster within a migration byte budget, section 6.1) and
``vcsched experiment adapt`` (yield versus budget over arrival-departure traces)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from cli.app import EXIT_OK, EXIT_UNSATISFIED, FiniteFloatRange, console, emit_json, err_console, read_json_file
from cli.common import lock_options, machine_info, policy_options, progress_bar
from cli.solve import render_result, result_to_dict
from vcsched.adaptation.problem import AdaptProblem, AdaptResult, problem_from_dict
from vcsched.adaptation.problem import parse_budget as parse_bytes
from vcsched.adaptation.solve import ALGORITHMS, solve_adapt
from vcsched.control.live import LiveAdaptation, adapt_inventory
from vcsched.errors import InputError
from vcsched.experiments.adaptation import (
    SETS,
    CurvePoint,
    TraceSet,
    curves,
    milp_gaps,
    report_markdown,
    run_traces,
    trace_items,
    trace_meta,
)
from vcsched.formats.fields import check_number
from vcsched.formats.units import UNLIMITED
from vcsched.model import SolveOptions


class ByteSize(click.ParamType):
    """A click type for byte counts: 1073741824, 2GiB, 512MiB, 1.5GiB, unlimited."""

    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_bytes(f"--{param.name}" if param is not None and param.name else "size", str(value))
        except InputError as exc:
            self.fail(str(exc), param, ctx)


def _human(n: int) -> str:
    if n >= UNLIMITED:
        return "unlimited"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


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
    console.print(f"  migrated {_human(adapted.migrated_bytes)} of a budget of {_human(problem.budget)} "
                  f"({int(problem.running.sum())} running tasks, {_human(running)} in all; "
                  f"{int((~problem.running).sum())} new)", highlight=False)
    if not adapted.migrations:
        return
    inst = problem.instance
    table = Table(title="live migrations")
    for col in ("job", "task", "from", "to", "bytes"):
        table.add_column(col, justify="left" if col in ("job", "from", "to") else "right")
    for m in adapted.migrations:
        table.add_row(m.job, str(m.task), inst.hosts[m.source].name, inst.hosts[m.target].name, _human(m.bytes))
    console.print(table)


@click.command("solve-adapt")
@click.argument("instance_file", metavar="INSTANCE.json", type=click.Path(dir_okay=False))
@click.option("--budget", type=ByteSize(), required=True,
              help="Most bytes live migrations may move: 0 (re-cap only), 1073741824, 2GiB, 512MiB, unlimited.")
@click.option("-a", "--algorithm", type=click.Choice(ALGORITHMS), default="heuristic", show_default=True,
              help="milp: the paper's section 6.1 MILP (HiGHS; small instances).  heuristic: keep, pack, improve; "
                   "heuristic-best: the same with the anytime search `best` (0.1 s) for its re-placement.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of tables.")
@click.option("--time-limit", type=FiniteFloatRange(min=0, min_open=True), default=None, metavar="S",
              help="Wall-clock limit in seconds for milp (it then reports optimal=false).")
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
    return EXIT_OK if adapted.result.feasible else EXIT_UNSATISFIED


# ---------------------------------------------------------------------------------------------- experiment


def _adapt_plots(points_by_set: dict[str, list[CurvePoint]], out_dir: Path) -> list[Path]:
    """Minimum yield and bytes moved versus budget, one PNG per set (with matplotlib, the ``plot`` extra)."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, points in points_by_set.items():
        budgets = sorted({p.budget_fraction for p in points})
        labels = ["unl." if math.isinf(b) else f"{100 * b:g}%" for b in budgets]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
        for m in dict.fromkeys(p.method for p in points):
            ys = [next((p for p in points if p.method == m and p.budget_fraction == b), None) for b in budgets]
            ax1.plot(labels, [p.mean_min_yield if p else None for p in ys], marker="o", label=m)
            ax2.plot(labels, [100 * p.mean_migrated_fraction if p and p.mean_migrated_fraction is not None
                              else None for p in ys], marker="o", label=m)
        ax1.set_xlabel("budget (% of running bytes)")
        ax1.set_ylabel("mean minimum yield")
        ax2.set_xlabel("budget (% of running bytes)")
        ax2.set_ylabel("bytes migrated (% of running)")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
        fig.suptitle(f"adaptation, {name} traces")
        fig.tight_layout()
        path = out_dir / f"adapt_{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def adapt_experiment(traces: int | None, output: str | None, time_limit: float, seed: int, jobs: int | None,
                     as_json: bool, sets: Sequence[TraceSet] = SETS) -> int:
    """``vcsched experiment adapt``: yield-versus-budget curves over seeded arrival-departure traces.

    Two sets of traces: ``small`` (4 hosts, 10 tasks; the MILP included) and
    ``large`` (64 hosts, 500 tasks; no MILP).  Records go to
    ``records_<set>.json``, the tables to ``report.md`` (+ PNGs with matplotlib).
    """
    n_traces = traces or 5
    jobs = jobs or os.cpu_count() or 1
    out_dir = Path(output or "results/adapt")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--output {out_dir}: cannot create ({exc.strerror})") from None
    items = trace_items(sets, n_traces, seed, time_limit)
    start = time.perf_counter()
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with progress_bar(*columns, console=err_console, transient=as_json) as on_progress:
        records = run_traces(items, jobs=jobs, on_progress=on_progress)
    wall = time.perf_counter() - start
    reports, summary, points_by_set = [], {}, {}
    for name, spec, methods in sets:
        recs = records.get(name, [])
        meta = trace_meta(name, spec, methods, n_traces, seed, time_limit) | {
            "wall_s": wall, "machine": machine_info().summary()}
        reports.append(report_markdown(recs, meta))
        points_by_set[name] = curves(recs, methods)
        summary[name] = {"meta": meta, "curves": [vars(p) | {"budget_fraction": None if math.isinf(p.budget_fraction)
                                                              else p.budget_fraction} for p in points_by_set[name]],
                         "milp_gaps": [vars(g) | {"budget_fraction": None if math.isinf(g.budget_fraction)
                                                   else g.budget_fraction} for g in milp_gaps(recs)]}
        (out_dir / f"records_{name}.json").write_text(
            json.dumps({"meta": meta, "records": [r.to_dict() for r in recs]}, indent=0))
    report = "\n\n".join(reports)
    plots = _adapt_plots(points_by_set, out_dir)
    if plots:
        report += "\n## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n"
    (out_dir / "report.md").write_text(report)
    if as_json:
        emit_json(summary)
    else:
        console.print(f"{len(items)} traces in {wall:.0f} s; report in {out_dir / 'report.md'}", highlight=False)
        for name in summary:
            for p in points_by_set[name]:
                if p.method == "heuristic":
                    console.print(f"  {name:5s} budget {_budget_label(p.budget_fraction):>9s}: heuristic min yield "
                                  f"{p.mean_min_yield or 0:.4f}, moved {100 * (p.mean_migrated_fraction or 0):.1f} %",
                                  highlight=False)
    return EXIT_OK


def _budget_label(bf: float) -> str:
    return "unlimited" if math.isinf(bf) else f"{100 * bf:g} %"


# ---------------------------------------------------------------------------------------------- live adapt


def _parse_needs(items: tuple[str, ...]) -> dict[str, float]:
    needs: dict[str, float] = {}
    for item in items:
        vm, sep, value = item.partition("=")
        try:
            cores = float(value)
        except ValueError:
            cores = math.nan
        if not sep or not vm or not math.isfinite(cores) or cores <= 0:
            raise InputError(f"--set-need: {item!r} is not VM=CORES with CORES above 0 (e.g. web-0=0.3)")
        if vm in needs:
            raise InputError(f"--set-need: {vm!r} is given twice ({needs[vm]:g} and {cores:g} cores); "
                             "give each VM once")
        needs[vm] = cores
    return needs


@dataclass(frozen=True)
class Changes:
    """What ``vcsched adapt`` plans for besides the recorded state: new CPU needs and departed virtual clusters."""

    needs: dict[str, float]
    depart: tuple[str, ...]


def _changes_file(path: str | None) -> Changes:
    """``--changes FILE``: ``{"set_need": {"VM": cores, ...}, "depart": ["VC", ...]}`` (JSON, both optional)."""
    if path is None:
        return Changes({}, ())
    doc = read_json_file(path, "changes")
    if not isinstance(doc, dict) or set(doc) - {"set_need", "depart"}:
        raise InputError(f"changes {path}: expected an object with only \"set_need\" and \"depart\" "
                         f"(got {doc!r:.80})")
    raw = doc.get("set_need", {})
    if not isinstance(raw, dict):
        raise InputError(f"changes {path}: set_need: expected an object VM -> cores")
    depart = doc.get("depart", [])
    if not isinstance(depart, list) or not all(isinstance(vc, str) and vc for vc in depart):
        raise InputError(f"changes {path}: depart: expected a list of virtual cluster names (got {depart!r:.80})")
    needs = {vm: check_number(f"changes {path}: set_need.{vm}", cores) for vm, cores in raw.items()}
    return Changes(needs, tuple(depart))


def render_moves(live: LiveAdaptation) -> None:
    if live.order is None or not live.order.moves:
        return
    table = Table(title=f"live migrations ({live.order.waves} waves, {live.order.relays} relays)")
    for col in ("wave", "VM", "from", "to", "bytes", "cap on arrival"):
        table.add_column(col, justify="right" if col in ("wave", "bytes", "cap on arrival") else "left")
    for m in live.order.moves:
        table.add_row(str(m.wave), m.vm + (" (relay)" if m.relay else ""), m.source, m.target, _human(m.bytes),
                      f"{m.cap_cores:.3f}")
    console.print(table)


@click.command("adapt")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Cluster file (TOML).  Default: the running lab's (`vcsched lab up`).")
@click.option("--budget", type=ByteSize(), required=True,
              help="Most bytes the live migrations may move in all: 0, 512MiB, 2GiB, unlimited.")
@click.option("--set-need", "set_need", multiple=True, metavar="VM=CORES",
              help="Plan with a new CPU need for a VM, in cores (repeatable).  Needs are read from each VM's "
                   "metadata; applying the plan records the new one there (a set-need step).")
@click.option("--depart", "depart", multiple=True, metavar="VC",
              help="A virtual cluster that leaves: its VMs are stopped and removed first, and the others share "
                   "what they held (repeatable).")
@click.option("--changes", "changes_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help='JSON {"set_need": {"VM": cores, ...}, "depart": ["VC", ...]}: the file form of --set-need '
                   "and --depart (for a need, the command line wins).")
@click.option("-a", "--algorithm", type=click.Choice(ALGORITHMS), default="heuristic", show_default=True,
              help="heuristic; heuristic-best (its re-placement by the anytime search `best`, 0.1 s); "
                   "or milp (section 6.1; small clusters).")
@click.option("--parallel", type=click.IntRange(min=1, max=16), default=1, show_default=True,
              help="Most live migrations running at once between one pair of hosts.  The plan groups migrations "
                   "into waves that fit in memory together; apply runs each wave's migrations at once.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None, metavar="PLAN.json",
              help="Save the plan for `vcsched apply`.")
@click.option("--apply", "do_apply", is_flag=True, help="Carry the plan out now (default: dry run, print it).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (result, plan, apply report).")
@click.option("--time-limit", type=FiniteFloatRange(min=0, min_open=True), default=None, metavar="S",
              help="Wall-clock limit in seconds for milp.")
@policy_options()
@lock_options()
def adapt_cmd(cluster_file: str | None, budget: int, set_need: tuple[str, ...], depart: tuple[str, ...],
              changes_file: str | None,
              algorithm: str, parallel: int, output: str | None, do_apply: bool, as_json: bool,
              time_limit: float | None, policy: str | None, alpha: float | None, wait: float,
              coordination: str | None, lock_ttl: float | None) -> int:
    """Re-balance a running cluster: re-cap every managed VM and live-migrate a few, within --budget bytes.

    \b
    Reads the live inventory (hosts, managed VMs, their recorded CPU needs
    and memory), drops the VMs of departed virtual clusters (--depart: they
    are removed first, which only frees room), solves the section 6.1 problem (the highest minimum yield
    reachable moving at most --budget bytes; moving a VM costs its memory),
    and prints the plan.  The plan is ordered so that no host ever runs out
    of memory (a migrating VM counts on both hosts until it lands), caps go
    down before others go up, and swaps between full hosts are relayed
    through a host with room (their extra bytes count against the budget).

    \b
    Examples:
      vcsched adapt --budget 0                   re-cap only
      vcsched adapt --budget 2GiB --set-need web-0=0.3
      vcsched adapt --budget 1GiB --depart batch   batch leaves; the rest grow
      vcsched adapt --budget 2GiB -o plan.json && vcsched apply plan.json
      vcsched adapt --budget 2GiB --apply

    Under a sharing policy (--policy, else the cluster file's policy = "...")
    or when VMs need disk or network bandwidth, the byte-budgeted search
    places on every resource (CPU, memory and the hosts' declared disk_bps /
    net_bps) and the policy then allocates every resource on that placement
    (docs/policies.md).

    Applying is idempotent and stops at the first failure with every VM
    running (a failed migration leaves its VM on the source); run it again to
    continue.  With --apply the command holds the cluster lock from reading
    the hosts to the last step (--wait to wait for another holder).

    Exit codes: 0 planned (and applied), 1 nothing within the budget / no
    safe order / a step failed, 2 bad input.
    """
    from cli.common import (
        apply_exit_code,
        cluster_lock,
        hosts_down,
        load_cluster,
        note_in_doubt,
        notice,
        render_hosts_down,
        render_plan,
        render_report,
        run_apply,
    )
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.plans.migration import MigrationBlocked

    changes = _changes_file(changes_file)
    flags = _parse_needs(set_need)
    both = sorted(set(flags) & set(changes.needs))
    if both:
        raise InputError(f"--set-need: {both[0]!r} also has a need in --changes {changes_file}; give each VM once")
    needs = {**changes.needs, **flags}
    departing = tuple(dict.fromkeys(changes.depart + depart))
    cluster = load_cluster(cluster_file)
    from vcsched.control.sharing import sharing_for

    sharing = sharing_for(cluster, policy, alpha)  # bad input before any host is read
    with LibvirtHypervisor(cluster, on_notice=notice) as hv, \
            cluster_lock(cluster, coordination, wait, ttl=lock_ttl, needed=do_apply, hv=hv) as lock:
        inventory = hv.inventory()
        if lock is None:  # a dry run reads only: in-doubt VMs are reported, never settled
            note_in_doubt(inventory)
        down = hosts_down(inventory)
        if not as_json:
            render_hosts_down(inventory)
        try:
            live = adapt_inventory(cluster.name, inventory, budget, needs=needs, depart=departing, algorithm=algorithm,
                                   parallel=parallel, options=SolveOptions(time_limit=time_limit), cluster=cluster,
                                   sharing=sharing)
        except MigrationBlocked as exc:
            if as_json:
                emit_json({"feasible": False, "reason": str(exc), "hosts_down": down})
            else:
                console.print(f"[red]no safe plan[/]: {exc}")
            return EXIT_UNSATISFIED
        out: dict[str, Any] = adapt_result_to_dict(live.problem, live.adapted)
        out["policy"] = sharing.policy
        out["hosts_down"] = down
        if live.plan is None:
            if as_json:
                emit_json(out)
            else:
                console.print(f"[red]no placement within the budget[/] of {_human(budget)}")
            return EXIT_UNSATISFIED
        out["current_min_yield"] = live.current_min_yield
        plan_doc = live.plan.to_dict()
        out["plan"] = plan_doc
        out["floors_missed"] = [{"cluster": vc, "yield": got, "min_yield": floor}
                                for vc, got, floor in live.floors_missed]
        if output:
            try:
                Path(output).write_text(json.dumps(plan_doc, indent=1) + "\n")
            except OSError as exc:
                raise InputError(f"--output {output}: cannot write ({exc.strerror})") from None
        if not as_json:
            removed = live.plan.removed_vms()
            leaving = f", {len(removed)} of them leaving ({', '.join(departing)})" if departing else ""
            moved = live.plan.extra["migrated_bytes"]
            console.print(f"cluster {cluster.name!r}: {len(inventory.managed())} managed VMs{leaving}; plan moves "
                          f"{_human(moved)} of a budget of {_human(budget)}", highlight=False)
            if live.current_min_yield is not None:
                console.print(f"  minimum yield now {live.current_min_yield:.4f} (caps / needs), planned "
                              f"{live.plan.min_yield:.4f}", highlight=False)
            render_plan(live.plan, inventory)
            render_moves(live)
            for vc, got, floor in live.floors_missed:
                console.print(f"[yellow]warning:[/] virtual cluster {vc!r} gets a yield of {got:.4f}, below the "
                              f"min_yield {floor:g} it was admitted with (the best within this budget: "
                              "raise --budget, or --depart a cluster)", highlight=False)
        report = None
        if do_apply:
            report = run_apply(hv, live.plan, force=False, quiet=as_json, lock=lock, planned_here=True)
            out["apply"] = report.to_dict()
            if not as_json:
                render_report(report)
        elif not as_json:
            console.print("dry run: nothing changed (use --apply, or -o PLAN.json and `vcsched apply`)")
    if as_json:
        emit_json(out)
    return apply_exit_code(report)
