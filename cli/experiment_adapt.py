"""``vcsched experiment adapt``: yield versus migration budget over seeded arrival-departure traces."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cli.app import EXIT_OK, console, emit_json, err_console
from cli.common import machine_info, progress_bar, write_report
from hypervisor.files import write_figure, write_output
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
        write_figure("--output", path, fig)
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
        write_output("--output", out_dir / f"records_{name}.json",
                     json.dumps({"meta": meta, "records": [r.to_dict() for r in recs]}, indent=0))
    report = "\n\n".join(reports)
    write_report(out_dir, report, _adapt_plots(points_by_set, out_dir))
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
