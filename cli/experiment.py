"""``vcsched experiment small|large|parallel``: the paper's section 4 (and 5) on this machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cli.app import EXIT_OK, EXIT_UNSATISFIED, console, emit_json, err_console, fail, read_json_file
from cli.common import machine_info, progress_bar, write_report
from cli.params import json_option, output_option, time_limit_option
from hypervisor.files import write_figure, write_output
from vcsched.errors import InputError
from vcsched.experiments.paper import (
    BOUND,
    EXACT,
    PAPER_INSTANCES,
    SET_TASKS,
    SETS,
    Record,
    degradation,
    in_run_order,
    mean_by,
    missing_items,
    parse_label,
    report_markdown,
    resumable_records,
    run_items,
    specs,
    work_items,
)
from vcsched.solvers.registry import algorithms as registered


def parse_names(value: str | None, what: str) -> list[str] | None:
    """A comma-separated list of registered algorithm names, each optionally with its own time limit
    (``best@0.1``: :func:`vcsched.experiments.paper.parse_label`); None when not given."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    known = registered()
    for n in names:
        try:
            name, _ = parse_label(n)
        except InputError as exc:
            raise InputError(f"{what}: {exc}") from None
        if name not in known:
            raise InputError(f"{what}: unknown algorithm {name!r} (known: {', '.join(sorted(known))})")
    return names


def default_algorithms(set_name: str) -> list[str]:
    """Every registered algorithm, the exact MILP only on the small set (it does not scale), the bound last."""
    names = [n for n in registered() if n != BOUND and (n != EXACT or set_name == "small")]
    return [*sorted(names), BOUND]


CHECKPOINT_S = 60.0


def code_version() -> str:
    """The git commit the run used, and whether vcsched/ had uncommitted changes (results depend on it)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "vcsched"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head} (vcsched/ with uncommitted changes)" if dirty else head


def save_records(path: Path, meta: dict[str, Any], records: list[Record]) -> None:
    """Write records.json atomically (a reader or a crash never sees half a file)."""
    write_output("--output", path, json.dumps({"meta": meta, "records": [r.to_dict() for r in records]}, indent=0))


def load_previous(path: Path, meta: dict[str, Any]) -> list[Record]:
    """Records of an earlier run with the same parameters (``meta`` gets its wall time); [] if none."""
    if not path.exists():
        return []
    doc = read_json_file(str(path), "records")
    try:
        previous = resumable_records(doc, meta, str(path))
    except InputError as exc:
        raise InputError(f"--resume: {exc}") from None
    meta["wall_s"] = previous.wall_s
    return previous.records


def write_plots(records: list[Record], names: list[str], out_dir: Path) -> list[Path]:
    """Yields vs slack and run time vs tasks as PNGs, when matplotlib is installed (the ``plot`` extra)."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for attr, group, ylabel, log in (("min_yield", "slack", "mean minimum yield", False),
                                     ("avg_yield", "slack", "mean average yield", False),
                                     ("runtime_s", "tasks", "mean solver time (s)", True)):
        means = mean_by(records, attr, group)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for a in names:
            if means.get(a):
                xs = sorted(means[a])
                ax.plot(xs, [means[a][x] for x in xs], marker="o", label=a)
        ax.set_xlabel(group)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize="small", ncol=2)
        ax.grid(alpha=0.3)
        path = out_dir / f"{attr}_vs_{group}.png"
        fig.tight_layout()
        write_figure("--output", path, fig)
        written.append(path)
    return written


def _task_counts(tasks_opt: str | None) -> list[int] | None:
    if tasks_opt is None:
        return None
    try:
        tasks = [int(t) for t in tasks_opt.split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--tasks: {tasks_opt!r} is not a comma-separated list of whole numbers") from None
    if not tasks or min(tasks) < 1:
        raise InputError(f"--tasks: {tasks_opt!r} must name at least one task count >= 1")
    return tasks


@click.command("experiment")
@click.argument("set_name", metavar="SET", type=click.Choice((*SETS, "adapt", "policies")))
@click.option("-n", "--instances", type=click.IntRange(min=1), default=None,
              help="Instances per family (paper: 10 for small, 100 for large and parallel).  [default: the paper's]")
@click.option("-a", "--algorithms", "algorithms_opt", default=None, metavar="A,B,...",
              help="Algorithms to run (comma-separated); NAME@S runs NAME with a time limit of S seconds, e.g. "
                   "best@0.1,best@1.  [default: all registered; milp only on small]")
@click.option("-x", "--exclude", default=None, metavar="A,B,...",
              help="Algorithms to leave out of the default list, e.g. rrnd,rrnz,gb,sgb at large scale.")
@click.option("--tasks", "tasks_opt", default=None, metavar="J,J,...",
              help="Only these task counts of the set (e.g. 100,250 for a reduced large set).")
@click.option("-j", "--jobs", type=click.IntRange(min=1, max=256), default=None,
              help="Worker processes.  [default: os.cpu_count()]")
@output_option("Where report.md, records.json (and PNG plots with matplotlib) go.  [default: results/SET]", "DIR",
               directory=True)
@time_limit_option("Per-run limit in seconds for milp/rrnd/rrnz (milp then reports optimal=false).", default=60.0)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Run seed; every instance gets its own seed derived from it.")
@click.option("--resume", is_flag=True,
              help="Keep the instances already in DIR/records.json (same set, seed, algorithms, time limit) and "
                   "run only the rest: resumes an interrupted run (results are saved every minute) or extends "
                   "one with more instances per family or more task counts.")
@json_option("Print a JSON summary (degradation table) on stdout.")
def experiment_cmd(set_name: str, instances: int | None, algorithms_opt: str | None, exclude: str | None,
                   tasks_opt: str | None, jobs: int | None, output: str | None, time_limit: float, seed: int,
                   resume: bool, as_json: bool) -> int:
    """Reproduce the paper's simulation experiments (section 4; parallel jobs: section 5).

    \b
    SET is one of
      small     4 hosts, 6/8/10/12 tasks                  144 families x 10 instances
      large     64 hosts, 100/250/500 tasks               108 families x 100 instances
      parallel  as large, jobs of 1..64 tasks (Lublin-Feitelson)
      adapt     yield vs migration budget over arrival/departure traces
                (section 6.1; -n traces per budget, default 5; see cli/experiment_adapt.py)
      policies  every sharing policy (docs/policies.md) on the same instances:
                64 hosts, --tasks 100,250 VMs in parallel jobs, plus disk and
                net; -n instances per family, default 3
    Families: slack 0.1..0.9 x cv_mem x cv_cpu in {0.25, 0.75}.

    Every instance is generated from its own seed, solved by every algorithm
    through the registry, and every allocation is checked by the validator
    (an invalid one counts as a failure and is listed in the report).  The
    report gives the % degradation from the best minimum yield found on each
    instance, failures, yields vs slack, run times vs tasks, the MILP and LP
    bound gaps, side by side with the paper's numbers.

    \b
    Example (a quick look, then the paper's small set, then `best` at three budgets
    beside MCB8, the MILP and the LP bound, docs/results.md):
      vcsched experiment small -n 1 -a mcb8,sg -o /tmp/quick
      nice vcsched experiment small -o results/small
      nice vcsched experiment small -a milp,mcb8,best@0.01,best@0.1,best@1,lpbound -o results/best-small

    Cost: rrnd/rrnz solve an LP per instance and gb/sgb backtrack; at 500
    tasks they dominate the run, so leave them out with -x when in a hurry.

    Exit codes: 0 done, 1 some runs failed (the report says which), 2 bad
    input.
    """
    if set_name == "adapt":  # its own machinery, in cli/experiment_adapt.py
        from cli.experiment_adapt import adapt_experiment

        return adapt_experiment(instances, output, time_limit, seed, jobs, as_json)
    if set_name == "policies":  # its own machinery, in cli/policy_experiment.py
        from cli.policy_experiment import policies_experiment

        return policies_experiment(instances, output, seed, jobs, _task_counts(tasks_opt), as_json)
    names = parse_names(algorithms_opt, "--algorithms") or default_algorithms(set_name)
    excluded = parse_names(exclude, "--exclude") or []
    names = [n for n in names if n not in excluded]
    if not names:
        raise InputError("--algorithms: nothing left to run after --exclude")
    tasks = _task_counts(tasks_opt)
    n_instances = instances or PAPER_INSTANCES[set_name]
    jobs = jobs or os.cpu_count() or 1
    items = work_items(set_name, n_instances, names, seed=seed, time_limit=time_limit, tasks=tasks)
    out_dir = Path(output or f"results/{set_name}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--output {out_dir}: cannot create ({exc.strerror})") from None

    meta: dict[str, Any] = {
        "set": set_name, "instances_per_spec": n_instances, "families": len(specs(set_name, tasks)),
        "tasks": list(tasks or SET_TASKS[set_name]), "seed": seed, "algorithms": names,
        "time_limit": time_limit, "jobs": jobs, "wall_s": 0.0, "machine": machine_info().summary(),
        "code": code_version(),
        "complete": False,
    }
    records_path = out_dir / "records.json"
    records: list[Record] = load_previous(records_path, meta) if resume else []
    todo = missing_items(items, records)
    previous_wall = float(meta["wall_s"])
    start = last_save = time.perf_counter()
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with progress_bar(*columns, console=err_console, transient=as_json) as on_progress:
        for batch in run_items(todo, jobs, on_progress):
            records.extend(batch)
            if time.perf_counter() - last_save > CHECKPOINT_S:  # an interrupted run keeps its results
                meta["wall_s"] = previous_wall + time.perf_counter() - start
                save_records(records_path, meta, records)
                last_save = time.perf_counter()
    wall = time.perf_counter() - start
    records = in_run_order(records, names)
    meta["wall_s"] = previous_wall + wall
    meta["complete"] = True
    save_records(records_path, meta, records)
    report = report_markdown(records, meta)
    write_report(out_dir, report, write_plots(records, names, out_dir))

    table = degradation(records)
    errors = sum(1 for r in records if r.error)
    if as_json:
        emit_json({"meta": meta, "degradation": {a: vars(d) for a, d in table.items()}, "errors": errors})
    else:
        console.print(f"{len(todo)} instances run in {wall:.0f} s ({len(items) - len(todo)} from an earlier run); "
                      f"report in {out_dir / 'report.md'}", highlight=False)
        for d in sorted(table.values(), key=lambda d: d.avg):
            console.print(f"  {d.algorithm:8s} avg {d.avg:6.2f} %  max {d.max:6.2f} %  failed {d.failed}",
                          highlight=False)
    if errors:
        fail(f"{errors} solver errors or invalid allocations; see {out_dir / 'report.md'}", EXIT_UNSATISFIED)
    return EXIT_OK
