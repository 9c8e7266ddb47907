"""``vcsched experiment policies``: every sharing policy on the same instances (vcsched.experiments.policies)."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cli.app import EXIT_OK, EXIT_UNSATISFIED, console, emit_json, err_console, fail
from cli.common import machine_info, progress_bar, write_report
from hypervisor.files import write_figure, write_output
from vcsched.errors import InputError
from vcsched.experiments.policies import (
    EXTRA,
    PLACEMENTS,
    POLICY_LABELS,
    PolicyRecord,
    PolicySummary,
    families,
    report_markdown,
    run_items,
    summarise,
    work_items,
)

HOSTS = 64
TASKS = (100, 250)
SLACKS = (0.3, 0.5, 0.7)
CVS = (0.25, 0.75)
PER_FAMILY = 3


def write_plots(records: list[PolicyRecord], out_dir: Path) -> list[Path]:
    """Yields, fairness and utilisation per policy; yields per placement (PNG, with matplotlib)."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = summarise(records)
    labels = [r.policy for r in rows]
    x = np.arange(len(labels))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    ax1.bar(x - 0.2, [r.min_yield for r in rows], 0.4, label="min yield")
    ax1.bar(x + 0.2, [r.avg_yield for r in rows], 0.4, label="avg yield")
    ax1.set_title("yields (mean over instances)")
    ax2.bar(x - 0.2, [r.jain for r in rows], 0.4, label="Jain's index of yields")
    ax2.bar(x + 0.2, [r.share_spread for r in rows], 0.4, label="dominant-share spread (CV)")
    ax2.set_title("fairness")
    resources = list(rows[0].utilisation) if rows else []
    width = 0.8 / max(len(resources), 1)
    for k, res in enumerate(resources):
        ax3.bar(x - 0.4 + width * (k + 0.5), [r.utilisation[res] for r in rows], width, label=res)
    ax3.set_title("utilisation (used / cluster total)")
    first = _bars_per_policy(fig, (ax1, ax2, ax3), x, labels, out_dir / "policies.png")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    by: dict[str, list[PolicySummary]] = {p: summarise(records, p) for p in PLACEMENTS}
    width = 0.8 / len(PLACEMENTS)
    for k, p in enumerate(PLACEMENTS):
        vals = {r.policy: r for r in by[p]}
        ax1.bar(x - 0.4 + width * (k + 0.5), [vals[label].min_yield if label in vals else 0 for label in labels],
                width, label=f"placed: {p}")
        ax2.bar(x - 0.4 + width * (k + 0.5), [vals[label].avg_yield if label in vals else 0 for label in labels],
                width, label=f"placed: {p}")
    ax1.set_title("min yield by placement")
    ax2.set_title("avg yield by placement")
    return [first, _bars_per_policy(fig, (ax1, ax2), x, labels, out_dir / "policies_placement.png")]


def _bars_per_policy(fig: Any, axes: tuple[Any, ...], x: Any, labels: list[str], path: Path) -> Path:
    """The policies along each bar chart's x axis, a grid and a legend; the figure written to ``path``."""
    for ax in axes:
        ax.set_xticks(x, labels, rotation=40, ha="right")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    write_figure("--output", path, fig)
    return path


def policies_experiment(instances: int | None, output: str | None, seed: int, jobs: int | None,
                        tasks: list[int] | None, as_json: bool) -> int:
    """Run the policies experiment and write report.md, records.json and the plots into the output directory."""
    per_family = instances or PER_FAMILY
    jobs = jobs or os.cpu_count() or 1
    task_list = list(tasks or TASKS)
    specs = families(HOSTS, task_list, SLACKS, CVS)
    items = work_items(specs, per_family, seed)
    out_dir = Path(output or "results/policies")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--output {out_dir}: cannot create ({exc.strerror})") from None
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    start = time.perf_counter()
    records: list[PolicyRecord] = []
    with progress_bar(*columns, console=err_console, transient=as_json) as on_progress:
        for batch in run_items(items, jobs, on_progress):
            records.extend(batch)
    wall = time.perf_counter() - start
    order = {label: k for k, label in enumerate(POLICY_LABELS)}
    records.sort(key=lambda r: (r.family, r.instance, order[r.policy], PLACEMENTS.index(r.placement)))
    meta: dict[str, Any] = {
        "instances": len(items), "families": len(specs), "per_family": per_family, "hosts": HOSTS,
        "tasks": task_list, "slacks": list(SLACKS), "cvs": list(CVS),
        "extra": {r: {"mean": m, "cv": cv, "host_capacity": 1.0} for r, (m, cv) in EXTRA.items()},
        "seed": seed, "jobs": jobs, "wall_s": wall, "machine": machine_info().summary(),
    }
    write_output("--output", out_dir / "records.json",
                 json.dumps({"meta": meta, "records": [r.to_dict() for r in records]}, indent=0))
    report = report_markdown(records, meta)
    write_report(out_dir, report, write_plots(records, out_dir))
    rows = summarise(records)
    errors = sum(1 for r in records if r.error)
    if as_json:
        emit_json({"meta": meta, "summary": [vars(r) for r in rows],
                   "placements": {p: [vars(r) for r in summarise(records, p)] for p in PLACEMENTS},
                   "errors": errors})
    else:
        console.print(f"{len(items)} instances in {wall:.0f} s; report in {out_dir / 'report.md'}", highlight=False)
        for r in rows:
            console.print(f"  {r.policy:10s} min {r.min_yield:.4f}  avg {r.avg_yield:.4f}  Jain {r.jain:.3f}  "
                          f"spread {r.share_spread:.3f}  {r.time_s:.3f} s", highlight=False)
    if errors:
        fail(f"{errors} policy runs failed; see {out_dir / 'report.md'}", EXIT_UNSATISFIED)
    return EXIT_OK
