"""``vcsched bench``: time every solver on fixed seeded instances, and vcsched itself start to exit; describe the
machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from cli.app import EXIT_OK, console, emit_json, err_console
from cli.common import MachineInfo, machine_info, progress_bar
from cli.params import json_option, output_option, time_limit_option
from cli.tables import FitTable
from hypervisor.files import write_output
from vcsched.errors import InputError, VcschedError
from vcsched.experiments import OnProgress
from vcsched.experiments.bench import (
    ADAPT_PREFIX,
    BENCH_CV,
    BENCH_SEED,
    BENCH_SLACK,
    DEFAULT_CASES,
    POLICIES_PREFIX,
    STARTUP_CASE,
    STARTUP_PREFIX,
    WHOLE_PROCESS,
    BenchCase,
    Timing,
    parse_cases,
    run_bench,
)
from vcsched.experiments.generate import generate
from vcsched.formats.instance import instance_to_dict
from vcsched.solvers.registry import algorithms as registered

if TYPE_CHECKING:
    from cli.bench_hosts import ScaleRow
    from vcsched.experiments.policy_bench import BenchRow as PolicyBenchRow
    from vcsched.simulate.bench import SimBenchRow

SIMULATE_PREFIX = "simulate"  # vcsched.simulate.bench.SIMULATE_PREFIX, without importing the simulator at start-up

HOSTS_PREFIX = "hosts"  # the scale rows (cli/bench_hosts.py)


class CommandFailed(VcschedError):
    """A command the bench times did not succeed: the row cannot be measured (exit 1, not bad input)."""

    exit_code = 1


def vcsched_command() -> list[str]:
    """How a user starts this vcsched: the console script beside the interpreter, else ``python -m cli.main``."""
    script = Path(sys.executable).with_name("vcsched")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "cli.main"]


def startup_commands(vcsched: Sequence[str], instance_file: str) -> list[tuple[str, list[str]]]:
    """The start-up rows: ``vcsched --help``, and ``vcsched solve`` (mcb8) of the STARTUP_CASE instance."""
    return [(f"{STARTUP_PREFIX} --help", [*vcsched, "--help"]),
            (f"{STARTUP_PREFIX} solve {STARTUP_CASE.name}", [*vcsched, "solve", instance_file])]


def time_commands(commands: Sequence[tuple[str, Sequence[str]]], *, repeat: int = 5,
                  on_progress: OnProgress | None = None) -> list[Timing]:
    """Wall-clock time of whole processes, start to exit: ``(row name, command line)`` each run ``repeat`` times.

    This is what a user waits for (interpreter start-up, imports, reading the
    input, the work, the output), where :func:`run_bench` times the solver
    alone.  Each command first runs once untimed, so that every timed run
    finds the files it reads in the page cache.  Output is discarded; a
    command that exits with a status other than 0 is an error (a row that
    timed a failure would read as a result).
    """
    total = len(commands)

    def progress(done: int, description: str) -> None:
        if on_progress is not None:
            on_progress(done, total, description)

    timings: list[Timing] = []
    for name, argv in commands:
        progress(len(timings), name)
        runs = []
        for i in range(repeat + 1):
            start = time.perf_counter()
            done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, check=False)
            took = time.perf_counter() - start
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
                raise CommandFailed(f"{name}: {' '.join(argv)} exited with status {done.returncode}: {last}")
            if i:  # run 0 warms the caches
                runs.append(took)
        timings.append(Timing(name, WHOLE_PROCESS, tuple(runs), True, None))
    progress(total, "done")
    return timings


def time_startup(repeat: int, on_progress: OnProgress | None = None) -> list[Timing]:
    """Whole-process times of :func:`startup_commands`, on the bench's STARTUP_CASE instance in a scratch file."""
    instance = generate(STARTUP_CASE.spec(), BENCH_SEED)
    with tempfile.TemporaryDirectory(prefix="vcsched-bench-") as tmp:
        path = Path(tmp) / f"{STARTUP_CASE.name}.json"
        path.write_text(json.dumps(instance_to_dict(instance)))
        return time_commands(startup_commands(vcsched_command(), str(path)), repeat=repeat, on_progress=on_progress)


def bench_markdown(timings: list[Timing], cases: tuple[BenchCase, ...], repeat: int, info: MachineInfo,
                   time_limit: float = 60.0, startup: Sequence[Timing] = (),
                   policy_rows: Sequence[PolicyBenchRow] = (), sim_rows: Sequence[SimBenchRow] = (),
                   scale_rows: Sequence[ScaleRow] = ()) -> str:
    lines = [
        "# vcsched bench", "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {info.summary()}.", "",
        f"Instances: the paper's protocol (section 4.1), slack {BENCH_SLACK}, cv_mem = cv_cpu = {BENCH_CV}, "
        f"seed {BENCH_SEED}; sizes {', '.join(c.name for c in cases)} (hosts x tasks).  Time: median of {repeat} "
        "run(s) of `registry.solve` (`runtime_s`: the placement plus the average-yield phase); "
        f"time limit {time_limit:g} s for milp/rrnd/rrnz.  `adapt` rows: the adaptation heuristic "
        "(`solve_adapt`, placement plus average-yield phase) on the same size after one round of changes "
        "(about 10 % of jobs leave, 10 % arrive, 10 % change need), budget as a fraction of the running VMs' "
        "bytes.", "",
        "| algorithm | " + " | ".join(c.name for c in cases) + " |",
        "| --- |" + " --- |" * len(cases),
    ]
    notes: dict[str, str] = {}
    for algo in dict.fromkeys(t.algorithm for t in timings):
        cells = []
        for c in cases:
            t = next((t for t in timings if t.algorithm == algo and t.case == c.name), None)
            cells.append(_cell(t, notes))
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *[f"- {mark} {why}" for why, mark in notes.items()]]
    lines += ["", "Cells: median seconds; `(none)` = no placement found (lpbound: memory does not fit even "
              "fractionally); the time is still shown."]
    if startup:
        lines += ["", "## Start-up: whole processes", "",
                  "Wall time of `vcsched --help` and of `vcsched solve INSTANCE.json` (mcb8) on the "
                  f"{STARTUP_CASE.name} instance of the protocol above, from start to exit, as a user waits for "
                  "them (Python start-up, imports, reading the file, solving, printing): median of "
                  f"{repeat} run(s) of the `vcsched` script by `subprocess.run`, after one untimed run.", "",
                  "| row | median |", "| --- | --- |"]
        lines += [f"| {t.algorithm} | {_cell(t, {})} |" for t in startup]
    if policy_rows:
        from vcsched.experiments.policy_bench import markdown as policy_markdown

        lines += ["", "## Sharing policies", "",
                  "Each policy on a fixed placement (docs/policies.md §7): `cluster` = the protocol's parallel jobs "
                  "at 1,000 hosts x 10,000 VMs plus disk and net, placed by MCB8 on the resource vector; "
                  "`sequential` = 10,000 one-VM jobs; `tenants` = 100 jobs of 100 VMs under a 3-level tree. "
                  f"Best of {repeat} run(s): the policy's own time and the whole `allocate_policy` call.", "",
                  policy_markdown(list(policy_rows))]
    if sim_rows:
        from vcsched.simulate.bench import markdown as sim_markdown

        lines += ["", "## Simulation", "",
                  "`vcsched simulate cluster64 -p drf,pf -n 90000 --warmup 10000 -r 1` (docs/simulate.md §8): "
                  "64 hosts, 100,000 arrivals at the scenario's own rates, one run per policy; target: DRF "
                  "within 60 s, PF within 3 times DRF's time.", "",
                  sim_markdown(list(sim_rows))]
    if scale_rows:
        from cli.bench_hosts import scale_markdown

        lines += scale_markdown(scale_rows, repeat)
    return "\n".join(lines) + "\n"


def _cell(t: Timing | None, notes: dict[str, str]) -> str:
    if t is None:
        return "–"
    if t.skipped:
        mark = notes.setdefault(t.skipped, f"({'abcdefghij'[len(notes) % 10]})")
        return f"skipped {mark}"
    med = t.median_s
    text = f"{med:.4g} s" if med is not None else "–"
    return text if t.feasible else f"{text} (none)"


def _table(timings: list[Timing], cases: tuple[BenchCase, ...]) -> FitTable:
    table = FitTable(title="median solver time (s)")
    table.add_column("algorithm")
    for c in cases:
        table.add_column(c.name, justify="right")
    notes: dict[str, str] = {}
    for algo in dict.fromkeys(t.algorithm for t in timings):
        cells = [_cell(next((t for t in timings if t.algorithm == algo and t.case == c.name), None), notes)
                 for c in cases]
        table.add_row(algo, *cells)
    if notes:
        table.caption = "  ".join(f"{m} {w}" for w, m in notes.items())
    return table


def _policy_table(rows: Sequence[PolicyBenchRow]) -> FitTable:
    from vcsched.experiments.policy_bench import target_text

    table = FitTable(title="sharing policies on a fixed placement (best time, s)")
    for col in ("case", "policy", "policy", "allocate_policy", "target", "min yield", "mean yield"):
        table.add_column(col, justify="left" if col in ("case", "target") or col == "policy" else "right")
    for r in rows:
        table.add_row(r.case, r.policy, f"{r.policy_s:.3f}", f"{r.total_s:.3f}", target_text(r),
                      f"{r.min_yield:.4f}", f"{r.mean_yield:.4f}")
    return table


def _within(row: PolicyBenchRow) -> bool | None:
    from vcsched.experiments.policy_bench import within_target

    return within_target(row)


def _sim_table(rows: Sequence[SimBenchRow]) -> FitTable:
    table = FitTable(title="simulate: 100,000 arrivals on 64 hosts (cluster64, one run)")
    for col in ("row", "events", "VCs in progress", "time (s)", "target (s)", "within"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for r in rows:
        table.add_row(r.name, f"{r.events:,}", f"{r.mean_in_progress:.1f}", f"{r.wall_s:.1f}", f"{r.target_s:.3g}",
                      "yes" if r.within_target else "no")
    return table


def _scale_table(rows: Sequence[ScaleRow]) -> FitTable:
    table = FitTable(title="1,000 test-driver hosts: whole process (median s)")
    for col in ("command", "hosts", "VMs", "wall", "CPU", "libvirt calls/host"):
        table.add_column(col, justify="left" if col == "command" else "right")
    for r in rows:
        table.add_row(r.command, str(r.hosts), str(r.vms), f"{r.wall_median:.3g}", f"{r.cpu_median:.3g}",
                      "–".join(dict.fromkeys(str(c) for c in r.calls_per_host)))
    return table


def _startup_table(startup: Sequence[Timing]) -> FitTable:
    table = FitTable(title="whole-process wall time (s)")
    table.add_column("row")
    table.add_column("median", justify="right")
    for t in startup:
        table.add_row(t.algorithm, _cell(t, {}))
    return table


@click.command("bench")
@click.option("-r", "--repeat", type=click.IntRange(min=1, max=1000), default=5, show_default=True,
              help="Runs per algorithm and size; the median is reported.")
@click.option("-a", "--algorithms", "algorithms_opt", default=None, metavar="A,B,...",
              help="Only these algorithms; 'adapt' for the adaptation heuristic's rows, 'cli' for the "
                   "whole-process start-up rows, 'policies' for the sharing policies' rows, 'simulate' for "
                   "the simulator's rows, 'hosts' for status and place on 1,000 test-driver hosts.  "
                   "[default: all registered, adapt, cli, policies, simulate and hosts]")
@click.option("--sizes", default=",".join(c.name for c in DEFAULT_CASES), show_default=True, metavar="HxJ,...",
              help="Instance sizes as HOSTSxTASKS.")
@output_option("Also write the results as Markdown (with the machine description) to FILE.md.", "FILE.md")
@time_limit_option("Per-run limit in seconds for milp/rrnd/rrnz.", default=60.0)
@json_option("Print one JSON object on stdout instead of the table.")
def bench_cmd(repeat: int, algorithms_opt: str | None, sizes: str, output: str | None, time_limit: float,
              as_json: bool) -> int:
    """Time each solver on fixed, seeded instances of the paper's protocol.

    Each algorithm runs REPEAT times on each size through the registry, the
    same path `vcsched solve` takes, and every allocation is checked by the
    validator.  Slow algorithms are skipped above a size, with the reason in
    the table: milp only at 12 tasks, rrnd/rrnz/gb/sgb up to 500 tasks.

    The 'policies' rows time every sharing policy on fixed placements of
    1,000 hosts x 10,000 VMs x 3 resources (docs/policies.md §7), best of
    REPEAT, against its target (DRF 0.1 s, PF 1 s, H-DRF 0.5 s).

    The 'simulate' rows run `vcsched simulate cluster64` for 100,000
    arrivals on 64 hosts under DRF and PF, once each (about a minute each),
    against the target: DRF within 60 s, PF within 3 times DRF's time.

    The 'cli' rows time vcsched itself from start to exit, as a user waits
    for it: `vcsched --help`, and `vcsched solve` of the 64x500 instance
    (whatever --sizes says), REPEAT runs each after an untimed one.

    The 'hosts' rows run `vcsched status --sample 0` and `vcsched place`
    (dry run) on 1,000 fake hosts of libvirt's test driver with 10,000
    VMs, whole processes (wall and CPU time, target 1 s each), and count
    the libvirt calls each command makes per host.

    \b
    Example:
      nice vcsched bench --repeat 5 --output docs/benchmarks.md

    The machine is described in the output (CPU, cores, Python, numpy,
    scipy, whether the MCB C kernel is in use, load average): timings from a
    shared machine are noisy, and the load average says how shared it was.

    Exit codes: 0 timed, 1 a timed command failed (its last line is said), 2
    bad input.
    """
    cases = parse_cases(sizes)
    known = registered()
    pseudo = (ADAPT_PREFIX, STARTUP_PREFIX, POLICIES_PREFIX, SIMULATE_PREFIX, HOSTS_PREFIX)
    names = [*sorted(known), *pseudo] if algorithms_opt is None else \
        [n.strip() for n in algorithms_opt.split(",") if n.strip()]
    for n in names:
        if n not in known and n not in pseudo:
            raise InputError(f"--algorithms: unknown algorithm {n!r} (known: {', '.join(sorted(known))}, "
                             f"{', '.join(pseudo)})")
    do_adapt, do_startup, do_policies, do_simulate, do_hosts = (p in names for p in pseudo)
    names = [n for n in names if n not in pseudo]
    info = machine_info()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with progress_bar(*columns, console=err_console, transient=True) as on_progress:
        timings = run_bench(cases, names, repeat=repeat, time_limit=time_limit, adapt=do_adapt,
                            on_progress=on_progress)
        startup = time_startup(repeat, on_progress) if do_startup else []
        policy_rows: list[PolicyBenchRow] = []
        if do_policies:
            from vcsched.experiments.policy_bench import bench as bench_policies

            policy_rows = bench_policies(repeat, on_progress)
        sim_rows: list[SimBenchRow] = []
        if do_simulate:
            from vcsched.simulate.bench import bench as bench_simulate

            sim_rows = bench_simulate(on_progress=on_progress)
        scale_rows: list[ScaleRow] = []
        if do_hosts:
            from cli.bench_hosts import time_scale

            scale_rows = time_scale(vcsched_command(), repeat, on_progress)
    if output is not None:
        write_output("--output", output, bench_markdown(timings, cases, repeat, info, time_limit, startup,
                                                        policy_rows, sim_rows, scale_rows))
    if as_json:
        doc: dict[str, Any] = {
            "machine": vars(info) | {"load_avg": list(info.load_avg)}, "repeat": repeat, "time_limit": time_limit,
            "timings": [{"algorithm": t.algorithm, "size": t.case, "median_s": t.median_s, "runs_s": list(t.runs_s),
                         "feasible": t.feasible, "min_yield": t.min_yield, "skipped": t.skipped} for t in timings],
            "startup": [{"row": t.algorithm, "median_s": t.median_s, "runs_s": list(t.runs_s)} for t in startup],
            "policies": [vars(r) | {"within_target": _within(r)} for r in policy_rows],
            "simulate": [vars(r) | {"within_target": r.within_target} for r in sim_rows],
            "hosts": [{"command": r.command, "hosts": r.hosts, "vms": r.vms, "wall_median_s": r.wall_median,
                       "cpu_median_s": r.cpu_median, "wall_s": list(r.wall_s), "cpu_s": list(r.cpu_s),
                       "calls_per_host": list(r.calls_per_host)} for r in scale_rows],
        }
        emit_json(doc)
    else:
        console.print(info.summary(), highlight=False)
        if timings:
            console.print(_table(timings, cases))
        if startup:
            console.print(_startup_table(startup))
        if policy_rows:
            console.print(_policy_table(policy_rows))
        if sim_rows:
            console.print(_sim_table(sim_rows))
        if scale_rows:
            console.print(_scale_table(scale_rows))
        if output:
            console.print(f"wrote {output}", highlight=False)
    return EXIT_OK
