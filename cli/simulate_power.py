"""``vcsched simulate WORKLOAD --power auto,threshold,off``: power saving over time (docs/power.md).

Parses what is particular to the power study, runs :func:`vcsched.simulate.power.power_study`, renders
the table, JSON, CSV and the plot (energy saved against yield lost).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
import time
from typing import Any

from cli.app import EXIT_OK, console, emit_json, err_console
from cli.common import machine_info, progress_bar
from cli.tables import FitTable
from hypervisor.files import write_figure, write_output
from vcsched.errors import InputError

#: The table's columns: (metric, header, digits).
COLUMNS = (("energy_kwh", "energy kWh", 1), ("energy_saved", "saved", 3), ("mean_yield", "mean yield", 3),
           ("yield_lost", "yield lost", 3), ("min_yield_avg", "min yield (avg)", 3),
           ("min_yield_low", "min yield (lowest)", 3), ("waiting_vc_hours", "waiting VC·h", 2),
           ("migrations", "migrations", 1), ("migrated_gib", "GiB moved", 0), ("sleeps", "sleeps", 1),
           ("wakes", "wakes", 1), ("late_wakes", "late wakes", 1), ("hosts_on_avg", "hosts on", 2))


def parse_power(value: str) -> list[str]:
    from vcsched.simulate.power import POWER_POLICIES

    names = list(POWER_POLICIES) if value.strip() == "all" else [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise InputError("--power: no policy given (auto, threshold, off or all)")
    for n in names:
        if n not in POWER_POLICIES:
            raise InputError(f"--power: {n!r} is not one of {', '.join(POWER_POLICIES)}, all")
    return names


def _fmt(e: Any, digits: int) -> str:
    if e is None:
        return "-"
    return f"{e.mean:.{digits}f}" if e.ci is None else f"{e.mean:.{digits}f} ± {e.ci:.{digits}f}"


def render(points: list[Any], label: str) -> None:
    table = FitTable(title=f"{label}: power saving (mean ± 95% CI over replications; saved and lost against off)")
    table.add_column("power", justify="left", key=True)
    table.add_column("load", justify="right", key=True)
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for pt in points:
        table.add_row(pt.policy, "-" if pt.load is None else f"{pt.load:g}",
                      *(_fmt(pt.metrics[m], d) for m, _, d in COLUMNS))
    console.print(table)


def csv_text(points: list[Any], label: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["workload", "power", "load", "metric", "mean", "ci95", "n"])
    for pt in points:
        for m, e in pt.metrics.items():
            if e is not None:
                w.writerow([label, pt.policy, "" if pt.load is None else pt.load, m, e.mean,
                            "" if e.ci is None else e.ci, e.n])
    return buf.getvalue()


def plot(points: list[Any], label: str, path: str) -> None:
    """Energy saved against mean yield lost, one marker per (policy, load), the late wakes written beside."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot: matplotlib is not installed (pip install 'vcsched[plot]')")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    markers = {"auto": "o", "threshold": "s", "off": "x"}
    for policy in dict.fromkeys(pt.policy for pt in points):
        pts = [pt for pt in points if pt.policy == policy]
        xs = [pt.metrics["yield_lost"].mean for pt in pts]
        ys = [100 * pt.metrics["energy_saved"].mean for pt in pts]
        ax.errorbar(xs, ys, xerr=[pt.metrics["yield_lost"].ci or 0 for pt in pts],
                    yerr=[100 * (pt.metrics["energy_saved"].ci or 0) for pt in pts], marker=markers.get(policy, "o"),
                    linestyle="", capsize=2, label=policy)
        for pt, x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(f"{'' if pt.load is None else f'load {pt.load:g}, '}late {pt.metrics['late_wakes'].mean:.1f}"
                        f"/{pt.metrics['wakes'].mean:.1f}", (x, y), fontsize="x-small", xytext=(4, 4),
                        textcoords="offset points")
    ax.set_xlabel("mean yield lost against off")
    ax.set_ylabel("energy saved against off (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(label, fontsize="small")
    fig.tight_layout()
    write_figure("--plot", path, fig)


def run_power(workload: str, power: str, *, loads: list[float | None], hosts: int, hours: float, wake_time: float,
              diurnal: float, failures: int, power_yield: float, budget: int | None, seed: int, replications: int,
              as_json: bool, csv_file: str | None, plot_file: str | None) -> int:
    from cli.simulate import load_workload
    from vcsched.simulate.power import PowerRunOptions, power_study, with_hosts

    policies = parse_power(power)
    w, label = load_workload(workload)
    base = PowerRunOptions(hosts=hosts, hours=hours, wake_time=wake_time, diurnal=diurnal,
                           failures_tolerated=failures, target_yield=power_yield, seed=seed)
    if budget is not None:
        base = dataclasses.replace(base, budget=budget)
    base.check()
    scaled = [with_hosts(w, hosts, load) for load in loads]  # refuse a bad load before the run
    label = f"{label} on {hosts} hosts"
    start = time.perf_counter()
    points = []
    with progress_bar(console=err_console, transient=True) as on_progress:
        for load, wl in zip(loads, scaled, strict=True):
            points += power_study(wl, policies, base, replications, load, on_progress)
    wall = time.perf_counter() - start
    if csv_file:
        write_output("--csv", csv_file, csv_text(points, label))
    if plot_file:
        plot(points, label, plot_file)
    if as_json:
        emit_json({"workload": label, "wall_s": wall, "machine": machine_info().summary(),
                   "options": json.loads(json.dumps(base.__dict__)),
                   "points": [p.to_dict() for p in points]})
    else:
        render(points, label)
        console.print(f"{len(points)} points, {replications} replications each, in {wall:.1f} s", highlight=False)
    return EXIT_OK
