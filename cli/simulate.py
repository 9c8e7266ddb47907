"""``vcsched simulate``: virtual clusters arriving and leaving over time, under every sharing policy.

The library (:mod:`vcsched.simulate`) runs the studies; this module parses the options, draws the
progress bar, and renders tables, JSON, CSV and plots.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import time
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cli.app import EXIT_OK, console, emit_json, err_console, read_json_file, read_text_file
from cli.common import machine_info, progress_bar
from cli.params import FiniteFloatRange, json_option
from cli.tables import FitTable
from hypervisor.files import write_figure, write_output
from vcsched.errors import InputError

TASK_SCENARIOS = {"br-tasks": "Bonald & Roberts §4: 500 tasks per job, capacity 100, serve the most deprived job"}


def parse_loads(value: str | None) -> list[float | None]:
    """``0.2,0.5,0.8`` (the most loaded resource's load), or None: the workload's own rates."""
    if value is None:
        return [None]
    out: list[float | None] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            x = float(part)
        except ValueError:
            raise InputError(f"--load: {part!r} is not a number") from None
        from vcsched.simulate.workload import check_load

        check_load("--load", x)
        out.append(x)
    if not out:
        raise InputError("--load: no load given")
    return out


def parse_policies(value: str) -> list[str]:
    from vcsched.policies import get, policies

    if value.strip() == "all":
        return sorted(policies())
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise InputError("--policy: no policy given")
    for n in names:
        get(n)
    return names


def load_workload(source: str) -> tuple[Any, str]:
    """A built-in scenario by name, or a workload file (JSON); returns it and a label."""
    from vcsched.simulate.scenarios import SCENARIOS, scenario
    from vcsched.simulate.workload import workload_from_dict

    if source in SCENARIOS:
        return scenario(source), source
    if not source.endswith(".json") and not Path(source).exists():
        raise InputError(f"WORKLOAD: {source!r} is neither a scenario ({', '.join([*SCENARIOS, *TASK_SCENARIOS])}) "
                         f"nor a workload file")
    try:
        return workload_from_dict(read_json_file(source, "workload")), source
    except InputError as exc:
        if str(exc).startswith("workload "):
            raise
        raise InputError(f"workload {source}: {exc}") from None


# ---------------------------------------------------------------------------------------------- rendering


def fmt(e: Any, digits: int = 3) -> str:
    if e is None:
        return "-"
    return f"{e.mean:.{digits}f}" if e.ci is None else f"{e.mean:.{digits}f} ± {e.ci:.{digits}f}"


def render(points: list[Any], label: str, *, tasks: bool,
           exact: dict[tuple[str, float | None], tuple[float | None, ...] | str] | None = None) -> None:
    exact = exact or {}
    table = FitTable(title=f"{label}: per class (mean ± 95% CI half-width over replications)")
    permanent = any(m["permanent_yield"] is not None for pt in points for m in pt.summary.classes.values())
    for col in ("policy", "load", "class", "service rate γ", *(("exact γ",) if exact else ()), "mean time",
                "p95 time", "mean slowdown", *(("permanent VC's yield",) if permanent else ())):
        table.add_column(col, justify="left" if col in ("policy", "class") else "right",
                         key=col in ("policy", "load", "class"))
    for pt in points:
        chain = exact.get((pt.policy, pt.load))
        for k, (name, m) in enumerate(pt.summary.classes.items()):
            value = chain[k] if isinstance(chain, tuple) else None
            ex = () if not exact else (("-" if value is None else f"{value:.3f}"),)
            table.add_row(pt.policy, "-" if pt.load is None else f"{pt.load:g}", name, fmt(m["service_rate"]), *ex,
                          fmt(m["mean_time"]), fmt(m["p95_time"]), fmt(m["mean_slowdown"]),
                          *((fmt(m["permanent_yield"]),) if permanent else ()))
    console.print(table)
    for (policy, load), chain in exact.items():
        if isinstance(chain, str):
            console.print(f"  exact γ for {policy} at load {load}: {chain}", highlight=False)
    if tasks:
        return
    overall = FitTable(title="overall")
    for col in ("policy", "load", "utilisation", "mean yield", "Jain's index", "VCs in progress",
                "given away (altruism)", "migrated", "events", "time (s)"):
        overall.add_column(col, justify="left" if col == "policy" else "right", key=col in ("policy", "load"))
    for pt in points:
        s = pt.summary
        util = ", ".join(f"{r} {fmt(e, 2)}" for r, e in s.utilisation.items())
        given = ", ".join(f"{r} {fmt(e, 3)}" for r, e in s.given.items() if e is not None and abs(e.mean) > 0)
        moved = s.migrated_bytes
        migrated = "-" if moved is None or moved.mean == 0 else f"{moved.mean / 2**30:.1f} GiB"
        overall.add_row(pt.policy, "-" if pt.load is None else f"{pt.load:g}", util, fmt(s.mean_yield), fmt(s.jain),
                        f"{fmt(s.mean_in_progress, 1)} (max {s.max_in_progress})", given or "-", migrated,
                        str(s.events), f"{s.wall_s:.1f}")
    console.print(overall)
    for pt in points:
        if pt.reference is None or not pt.lateness:
            continue
        late = pt.lateness
        n = len(late)
        mean, ref = sum(x.mean_time for x in late) / n, sum(x.reference_mean_time for x in late) / n
        console.print(
            f"  altruism, {pt.policy}" + ("" if pt.load is None else f" at load {pt.load:g}") +
            f": mean completion time {mean:.4f} vs {ref:.4f} without; VCs later by more than "
            f"{late[0].tolerance:.0%}: {sum(x.later for x in late) / n:.2%}; 99th percentile of the ratio "
            f"{max(x.p99 for x in late):.3f}, worst {max(x.worst for x in late):.3f}", highlight=False)


def csv_text(points: list[Any], label: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["workload", "policy", "load", "class", "metric", "mean", "ci95", "replications"])
    for pt in points:
        load = "" if pt.load is None else pt.load
        for name, metrics in pt.summary.classes.items():
            for metric, e in metrics.items():
                if e is not None:
                    w.writerow([label, pt.policy, load, name, metric, e.mean, "" if e.ci is None else e.ci, e.n])
        for r, e in pt.summary.utilisation.items():
            if e is not None:
                w.writerow([label, pt.policy, load, "", f"utilisation_{r}", e.mean, "" if e.ci is None else e.ci, e.n])
        for metric, est in (("jain", pt.summary.jain), ("mean_yield", pt.summary.mean_yield)):
            if est is not None:
                w.writerow([label, pt.policy, load, "", metric, est.mean, "" if est.ci is None else est.ci, est.n])
    return buf.getvalue()


def check_outputs(csv_file: str | None, plot_file: str | None, load_opt: str | None) -> None:
    """Refuse an output that cannot be written before a run of minutes, not after it."""
    for flag, name in (("--csv", csv_file), ("--plot", plot_file)):
        if name is not None and not Path(name).resolve().parent.is_dir():
            raise InputError(f"{flag} {name}: cannot write (no directory {str(Path(name).resolve().parent)!r})")
    if plot_file is not None and load_opt is None:
        raise InputError("--plot: needs --load with at least one value (service rate against load)")


def plot(points: list[Any], label: str, path: str) -> None:
    """Service rate against load, one line per (class, policy): the papers' figures."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot: matplotlib is not installed (pip install 'vcsched[plot]')")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    series: dict[tuple[str, str], list[tuple[float, Any]]] = {}
    for pt in points:
        if pt.load is None:
            continue
        for name, m in pt.summary.classes.items():
            if m["service_rate"] is not None:
                series.setdefault((pt.policy, name), []).append((pt.load, m["service_rate"]))
    if not series:
        raise InputError("--plot: needs --load with at least one value (service rate against load)")
    styles = ["-", "--", ":", "-."]
    policies = sorted({p for p, _ in series})
    for (policy, name), pts in sorted(series.items()):
        pts.sort(key=lambda x: x[0])
        ax.errorbar([x for x, _ in pts], [e.mean for _, e in pts], yerr=[e.ci or 0.0 for _, e in pts],
                    linestyle=styles[policies.index(policy) % len(styles)], marker="o", markersize=3, capsize=2,
                    label=f"{name} {policy}")
    ax.set_xlabel("load of the most loaded resource")
    ax.set_ylabel("mean service rate γ")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(label)
    fig.tight_layout()
    write_figure("--plot", path, fig)


# ---------------------------------------------------------------------------------------------- the command


@click.command("simulate")
@click.argument("workload", metavar="WORKLOAD", required=False)
@click.option("-p", "--policy", "policy_opt", default="drf,pf", show_default=True, metavar="P,Q,...|all",
              help="Sharing policies of the registry to compare (see `vcsched solve --help`).")
@click.option("--load", "load_opt", default=None, metavar="X,Y,...",
              help="Scale the arrival rates so that the most loaded resource has this load, for each value "
                   "(each in (0, 1): the capacity region).  [default: the workload's own rates]")
@click.option("--alpha", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="The exponent of the alpha-fair policy.")
@click.option("-n", "--arrivals", type=click.IntRange(min=1), default=20_000, show_default=True,
              help="Measured arrivals per replication (a trace: everything after the warm-up).")
@click.option("--warmup", type=click.IntRange(min=0), default=2_000, show_default=True,
              help="Arrivals discarded at the start of every replication.")
@click.option("-r", "--replications", type=click.IntRange(min=1), default=5, show_default=True,
              help="Independent replications per point (confidence intervals need at least 2).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed; replication r of every point uses the same arrivals (paired comparisons).")
@click.option("--altruism", type=FiniteFloatRange(min=0, max=1), default=0.0, show_default=True,
              help="CARBYNE's P(altruism): each VC gives away what it does not need to finish no later than "
                   "under its fair share; 0 is the fair policy exactly.  Each point is then also run without.")
@click.option("--leftover", type=click.Choice(("srtf", "pack")), default="srtf", show_default=True,
              help="How the leftover is redistributed: shortest remaining first (then packing), or packing only.")
@click.option("--late-tolerance", type=FiniteFloatRange(min=0), default=0.05, show_default=True,
              help="With --altruism: count the VCs that finish later than without it by more than this fraction.")
@click.option("--placement", type=click.Choice(("pack", "spread", "mcb8")), default="pack", show_default=True,
              help="Where an arriving VC's VMs go (several hosts only).")
@click.option("--migration-budget", default=None, metavar="BYTES",
              help="Adapt the placement at every arrival and departure, migrating at most this many bytes "
                   "(vcsched's adaptation; e.g. 2GiB).  [default: no adaptation]")
@click.option("--adapt-algorithm", type=click.Choice(("heuristic", "heuristic-best")), default="heuristic",
              show_default=True,
              help="With --migration-budget: the adaptation's re-placement from scratch, MCB8 (heuristic) or the "
                   "anytime search best (heuristic-best: better placements, its time limit spent at every event).")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False), default=None, metavar="FILE.csv",
              help="Arrivals from a trace (CSV: time,class[,work]) instead of Poisson processes.")
@click.option("--erlang", type=click.IntRange(min=1), default=1, show_default=True,
              help="br-tasks: task times Erlang with this shape (1: exponential; the paper's Fig. 6b: 20).")
@click.option("--registry", is_flag=True,
              help="Evaluate every policy through the policy registry, never the simulator's fast engines "
                   "(slow; for checking them).")
@json_option("Print every point as JSON on stdout.")
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write every metric of every point as CSV.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="Plot the service rate of every class against the load (needs --load).")
@click.option("--exact", is_flag=True,
              help="Also solve the exact Markov chain (one host, exponential work, no phases, few classes) "
                   "and show its service rates (a permanent VC: its mean yield) beside the simulated ones.")
@click.option("--list", "list_scenarios", is_flag=True, help="List the built-in scenarios and exit.")
# --- power saving (docs/power.md): a study of its own, run when --power is given
@click.option("--power", "power_opt", default=None, metavar="auto,threshold,off|all",
              help="Power saving over a daily cycle instead of the policy study: vcsched's decision (auto), "
                   "vSphere DPM's 45-81 % utilisation band (threshold), all hosts on (off); energy, yields, "
                   "migrations, wakes and late wakes (docs/power.md).  --load is then the CPU load (daily mean).")
@click.option("--hosts", type=click.IntRange(min=2), default=8, show_default=True,
              help="With --power: hosts (the workload's host, repeated; its rates scaled to keep the load).")
@click.option("--hours", type=FiniteFloatRange(min=0, min_open=True), default=48.0, show_default=True,
              help="With --power: simulated hours measured (after 6 hours of warm-up).")
@click.option("--wake-time", "wake_time_opt", default="5m", show_default=True, metavar="DURATION",
              help="With --power: what a host really takes to wake (auto assumes 10 min until it measured one).")
@click.option("--diurnal", type=FiniteFloatRange(min=0, max=1, max_open=True), default=0.6, show_default=True,
              help="With --power: amplitude of the daily cycle of arrival rates, rate x (1 + A sin(2 pi t / 1 day)).")
@click.option("--failures", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --power: failures_tolerated, the room for host failures auto keeps.")
@click.option("--power-yield", type=FiniteFloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True,
              help="With --power: the yield every VM must keep with a host asleep (auto), below which hosts wake.")
def simulate_cmd(workload: str | None, policy_opt: str, load_opt: str | None, alpha: float | None, arrivals: int,
                 warmup: int, replications: int, seed: int, altruism: float, leftover: str, late_tolerance: float,
                 placement: str, migration_budget: str | None, adapt_algorithm: str, trace_file: str | None,
                 erlang: int,
                 registry: bool, as_json: bool, csv_file: str | None, plot_file: str | None, exact: bool,
                 list_scenarios: bool, power_opt: str | None = None, hosts: int = 8, hours: float = 48.0,
                 wake_time_opt: str = "5m", diurnal: float = 0.6, failures: int = 0,
                 power_yield: float = 1.0) -> int:
    """Simulate virtual clusters arriving and leaving over time, under every sharing policy.

    \b
    WORKLOAD is a built-in scenario (--list) or a workload file (JSON: hosts
    and classes of VCs; docs/simulate.md).  VCs arrive as Poisson processes
    (or from --trace), progress at their yield and leave when their work is
    done; the policy re-allocates at every arrival and departure.  Reported
    per class: the mean service rate γ (Bonald & Roberts), completion times,
    slowdown; overall: utilisation and Jain's index of the yields.

    \b
    Examples:
      vcsched simulate br-fig1b --load 0.2,0.5,0.8 -p drf,pf --plot fig1b.png
      vcsched simulate phased --load 0.7 -p drf --altruism 1
      vcsched simulate br-tasks --erlang 20 --load 0.5 -n 2000 --warmup 200
      vcsched simulate cluster64 --load 0.7 -p all -r 3
      vcsched simulate cluster64 --power auto,threshold --hosts 8 --load 0.4

    With --power it runs power saving over a daily cycle instead: vcsched's
    decision (auto) against vSphere DPM's utilisation band (threshold) and
    all hosts on (off): energy, yields, migrations, wakes and late wakes
    (docs/power.md).

    Loads outside the capacity region (some resource at load 1 or more) are
    refused: the number of VCs would grow without bound.

    Exit codes: 0 done, 2 bad input (an unknown policy or scenario, a load
    outside the capacity region, a malformed workload file).
    """
    from vcsched.simulate.scenarios import SCENARIOS

    if list_scenarios:
        for name, (_, what) in {**SCENARIOS, **{k: (None, v) for k, v in TASK_SCENARIOS.items()}}.items():
            console.print(f"  {name:10s} {what}", highlight=False)
        return EXIT_OK
    if workload is None:
        raise InputError("WORKLOAD: give a scenario name (see --list) or a workload file")
    if power_opt is not None:
        return _power(workload, power_opt, load_opt, hosts, hours, wake_time_opt, diurnal, failures, power_yield,
                      migration_budget, seed, replications, as_json, csv_file, plot_file)
    ctx = click.get_current_context()
    for name, flag in (("hosts", "--hosts"), ("hours", "--hours"), ("wake_time_opt", "--wake-time"),
                       ("diurnal", "--diurnal"), ("failures", "--failures"), ("power_yield", "--power-yield")):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise InputError(f"{flag}: only with --power (power saving over a daily cycle)")
    policies = parse_policies(policy_opt)
    if alpha is not None and "alpha-fair" not in policies:
        raise InputError("--alpha: only the alpha-fair policy takes an alpha")
    if "alpha-fair" in policies and alpha is None:
        raise InputError("--alpha: the alpha-fair policy needs an alpha (e.g. --alpha 2)")
    loads = parse_loads(load_opt)
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    start = time.perf_counter()
    check_outputs(csv_file, plot_file, load_opt)  # before the run, not after it
    tasks = workload in TASK_SCENARIOS
    if exact and (tasks or trace_file):  # before the run, not after it
        raise InputError("--exact: the Markov chain is for the fluid model with Poisson arrivals")
    if tasks:
        from vcsched.simulate.study import sweep_tasks
        from vcsched.simulate.tasks import TASK_POLICIES, paper_workload

        bad = [p for p in policies if p not in TASK_POLICIES]
        if bad:
            raise InputError(f"--policy: the task-based mode serves the most deprived job under "
                             f"{' or '.join(TASK_POLICIES)} only, not {bad[0]!r}")
        if None in loads:
            raise InputError("--load: br-tasks has no rates of its own; give the loads to run")
        if trace_file or altruism or migration_budget:
            raise InputError("br-tasks: --trace, --altruism and --migration-budget are for the fluid mode")
        label = f"br-tasks (Erlang-{erlang} task times)" if erlang > 1 else "br-tasks (exponential task times)"
        for load in loads:
            paper_workload(erlang).scaled_to_load(load or 0.0).check()
        with progress_bar(*columns, console=err_console, transient=True) as on_progress:
            points = sweep_tasks(paper_workload(erlang), policies, [x for x in loads if x is not None],
                                 arrivals=arrivals, warmup=warmup, seed=seed, replications=replications,
                                 on_progress=on_progress)
    else:
        from vcsched.formats.units import parse_size
        from vcsched.simulate.fluid import RunOptions
        from vcsched.simulate.study import sweep
        from vcsched.simulate.trace import parse_trace

        w, label = load_workload(workload)
        budget = None if migration_budget is None else parse_size("--migration-budget", migration_budget,
                                                                   allow_zero=True)
        trace = parse_trace(read_text_file(trace_file, "trace"), w, f"trace {trace_file}") if trace_file else None
        if trace is not None and load_opt is not None:
            raise InputError("--load: a trace fixes the arrival times; scaling rates does not apply")
        base = RunOptions(alpha=alpha, arrivals=arrivals, warmup=warmup, seed=seed, altruism=altruism,
                          leftover=leftover, placement=placement, migration_budget=budget,
                          adapt_algorithm=adapt_algorithm, fast=not registry)
        base.check()
        from vcsched.simulate.study import scaled

        for load in loads:  # refuse a bad load before the progress bar is drawn
            scaled(w, load, trace=trace is not None)
        with progress_bar(*columns, console=err_console, transient=True) as on_progress:
            points = sweep(w, policies, loads, base, replications, trace, on_progress, tolerance=late_tolerance)
    wall = time.perf_counter() - start
    chains: dict[tuple[str, float | None], tuple[float | None, ...] | str] = {}
    if exact:
        from vcsched.simulate.markov import solve_chain
        from vcsched.simulate.study import scaled

        for pt in points:
            try:
                chain = solve_chain(scaled(w, pt.load), pt.policy, alpha=alpha)
                chains[(pt.policy, pt.load)] = tuple(g if g is not None else py for g, py in
                                                     zip(chain.service_rate, chain.permanent_yield, strict=True))
            except InputError as exc:
                chains[(pt.policy, pt.load)] = str(exc)
    if csv_file:
        write_output("--csv", csv_file, csv_text(points, label))
    if plot_file:
        plot(points, label, plot_file)
    if as_json:
        docs = [json.loads(json.dumps(p.to_dict(), default=float)) for p in points]
        for d, p in zip(docs, points, strict=True):
            if (p.policy, p.load) in chains:
                d["exact_service_rate"] = chains[(p.policy, p.load)]
        emit_json({"workload": label, "wall_s": wall, "machine": machine_info().summary(), "points": docs})
    else:
        render(points, label, tasks=tasks, exact=chains)
        console.print(f"{len(points)} points, {replications} replications each, in {wall:.1f} s", highlight=False)
    return EXIT_OK


def _power(workload: str, power_opt: str, load_opt: str | None, hosts: int, hours: float, wake_time_opt: str,
           diurnal: float, failures: int, power_yield: float, migration_budget: str | None, seed: int,
           replications: int, as_json: bool, csv_file: str | None, plot_file: str | None) -> int:
    """``--power``: the options of the policy study that do not apply are refused, then cli/simulate_power.py."""
    from cli.simulate_power import run_power
    from vcsched.formats.duration import parse_duration
    from vcsched.formats.units import parse_size

    ctx = click.get_current_context()
    for name, flag in (("policy_opt", "--policy"), ("alpha", "--alpha"), ("arrivals", "--arrivals"),
                       ("warmup", "--warmup"), ("altruism", "--altruism"), ("leftover", "--leftover"),
                       ("late_tolerance", "--late-tolerance"), ("placement", "--placement"),
                       ("adapt_algorithm", "--adapt-algorithm"), ("trace_file", "--trace"), ("erlang", "--erlang"),
                       ("registry", "--registry"), ("exact", "--exact")):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise InputError(f"{flag}: not with --power (the power study allocates with vcsched's own yield "
                             "objective and admission; --hours sets its length)")
    if workload in TASK_SCENARIOS:
        raise InputError(f"--power: {workload} is task-based; power saving runs on the fluid workloads")
    for flag, out in (("--csv", csv_file), ("--plot", plot_file)):
        if out is not None and not Path(out).resolve().parent.is_dir():
            raise InputError(f"{flag} {out}: cannot write (no directory {str(Path(out).resolve().parent)!r})")
    budget = None if migration_budget is None else parse_size("--migration-budget", migration_budget,
                                                               allow_zero=True)
    return run_power(workload, power_opt, loads=parse_loads(load_opt), hosts=hosts, hours=hours,
                     wake_time=parse_duration("--wake-time", wake_time_opt), diurnal=diurnal, failures=failures,
                     power_yield=power_yield, budget=budget, seed=seed, replications=replications, as_json=as_json,
                     csv_file=csv_file, plot_file=plot_file)
