"""``vcsched calibrate``: how accurately and how fast CPU caps take effect (paper section 7, assumption H5)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from calibration.cpus import check_cpu, conditions, cpu_busy, least_loaded_cpu
from calibration.experiment import Config, Result, Subjects, run
from calibration.report import markdown, pct, plot, rate_text, require_matplotlib, result_to_dict, summary_rows
from cli.app import FiniteFloatRange, console, emit_json, err_console
from vcsched.errors import InputError


class FloatList(click.ParamType):
    """Comma-separated numbers in (0, 1], e.g. ``0.05,0.1,0.25``."""

    name = "LIST"

    def __init__(self, count: int | None = None):
        self.count = count

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        out: list[float] = []
        for i, part in enumerate(str(value).split(",")):
            try:
                x = float(part)
            except ValueError:
                self.fail(f"item {i} {part.strip()!r} is not a number", param, ctx)
            if not 0 < x <= 1:
                self.fail(f"item {i} {x:g} is outside (0, 1]", param, ctx)
            out.append(x)
        if self.count is not None and len(out) != self.count:
            self.fail(f"expected {self.count} comma-separated numbers, got {len(out)}", param, ctx)
        return tuple(out)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so workers and cgroups are removed on the way out."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def open_subjects(
    backend: str,
    workers: int,
    cpu: int,
    connect: str | None,
    domains: tuple[str, ...],
    high_priority: bool,
    cluster: str | None,
) -> Any:
    """The backend's subjects, as a context manager that removes everything it created."""
    if backend == "cgroup":
        if connect or domains or cluster:
            raise InputError("--connect/--domain/--cluster: only meaningful with --backend libvirt")
        from calibration.cgroup_backend import CgroupSubjects

        return CgroupSubjects(workers, cpu, high_priority=high_priority)
    if not connect:
        raise InputError("--connect: required with --backend libvirt (e.g. qemu:///system or a lab host's URI)")
    if domains and len(domains) < workers:
        raise InputError(
            f"--domain: {workers} worker(s) need {workers} running CPU-loop guest(s), got {len(domains)} "
            "(give --domain NAME once per guest, or none to boot them from --cluster)"
        )
    return _libvirt_subjects(connect, domains[:workers], workers, cpu, cluster)


@contextlib.contextmanager
def _libvirt_subjects(
    uri: str, domains: tuple[str, ...], workers: int, cpu: int, cluster: str | None
) -> Iterator[Subjects]:
    from hypervisor.caps_probe import LibvirtSubjects, loop_guest_boot, loop_guests

    with contextlib.ExitStack() as stack:
        names = list(domains)
        if not names:
            from hypervisor.lab import default_cluster_file

            cluster_file = Path(cluster) if cluster else default_cluster_file()
            if cluster_file is None:
                raise InputError(
                    "--domain: none given, and no running lab whose guest image could boot CPU-loop guests "
                    "(give --domain NAME per running guest, or --cluster FILE with a [guest] section)"
                )
            image, partition = loop_guest_boot(cluster_file, uri)
            with err_console.status(f"booting {workers} CPU-loop guest(s) on {uri} ..."):
                names = stack.enter_context(loop_guests(uri, workers, image, partition))
        yield stack.enter_context(LibvirtSubjects(uri, names, cpu=cpu))


def render(result: Result, cond: dict[str, Any]) -> None:
    console.print(
        f"[bold]calibration[/] backend [bold]{result.backend}[/] on CPU {result.cpu}: bare rate "
        f"[bold]{rate_text(result.bare.rate)}[/] {result.unit}"
        + (f" (start→end drift {100 * result.bare_drift:+.2f}%)" if result.bare_drift is not None else " (nominal)")
        + f"; load average {cond.get('loadavg_1m')} at start, {cond.get('loadavg_1m_end')} at the end"
    )
    per_cap = Table(title="accuracy: measured vs expected (errors in points of the bare value)")
    for col in ("workers", "cap", "expected", "measured", "error", "CPU share", "share error"):
        per_cap.add_column(col, justify="right")
    for r in result.runs:
        per_cap.add_row(
            str(r.workers),
            f"{r.cap:g}",
            rate_text(r.expected.rate),
            ", ".join(rate_text(m.rate) for m in r.measured),
            pct(max(r.rate_errors)),
            ", ".join(f"{m.share:.3f}" for m in r.measured),
            pct(max(r.share_errors)),
        )
    console.print(per_cap)
    summary = Table(title="summary, beside the paper's Xen 3.1 numbers (section 7)")
    for col in ("quantity", "work rate", "CPU share", "Xen 3.1"):
        summary.add_column(col, justify="left" if col == "quantity" else "right")
    for row in summary_rows(result):
        summary.add_row(*row)
    console.print(summary)
    unsettled = [s for s in result.steps if s.rate_response is None or s.share_response is None]
    if unsettled:
        console.print(
            f"[yellow]'not settled': the {result.config.window:g} s window rate never stayed within ±"
            f"{100 * result.config.tolerance:g}% of the new expected value for {result.config.effective_confirm:g} s "
            "(other load on the CPU, work per CPU second changing under the cap, or a cap that did not take).[/]"
        )


@click.command("calibrate")
@click.option(
    "--backend",
    type=click.Choice(["cgroup", "libvirt"]),
    default="cgroup",
    show_default=True,
    help="cgroup: local DGEMM processes under CFS bandwidth control (needs root). "
    "libvirt: running CPU-loop guests capped with vcpu_quota/vcpu_period.",
)
@click.option("--connect", metavar="URI", help="libvirt URI of the host running the guests (libvirt backend).")
@click.option(
    "--domain",
    "domains",
    multiple=True,
    metavar="NAME",
    help="A running guest that loops on its CPU (libvirt backend); repeat once per worker. "
    "Without it, --workers transient CPU-loop guests are booted from the cluster file's [guest] and destroyed after.",
)
@click.option(
    "--cluster",
    type=click.Path(dir_okay=False),
    default=None,
    help="Cluster file whose [guest] boots the CPU-loop guests (libvirt backend without --domain). "
    "Default: the running lab's.",
)
@click.option(
    "--caps",
    type=FloatList(),
    default="0.05,0.1,0.25,0.5,0.75,1.0",
    show_default=True,
    help="Caps to measure, as fractions of one CPU in (0, 1].",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 16),
    default=1,
    show_default=True,
    help="Measure with 1..N concurrent capped subjects on the one CPU (only caps with N x cap <= 1).",
)
@click.option(
    "--duration",
    type=FiniteFloatRange(0, 600, min_open=True),
    default=2.0,
    show_default=True,
    help="Seconds per measurement (each also has a 0.3 s settling time).",
)
@click.option(
    "--tolerance",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    default=0.05,
    show_default=True,
    help="Response time = time until the rate stays within ±tolerance (relative) of the new expected rate.",
)
@click.option(
    "--steps",
    type=FloatList(count=2),
    default="0.25,0.75",
    show_default=True,
    help="LOW,HIGH: the cap is stepped LOW→HIGH→LOW on a running subject to time the response.",
)
@click.option(
    "--window",
    type=FiniteFloatRange(0, 10, min_open=True),
    default=None,
    help="Averaging window (s) for the response time. Default: 0.1 (one CFS period) for cgroup, 1.0 for libvirt.",
)
@click.option(
    "--pairs",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="Alternating bare/uncapped measurements averaged for the overhead.",
)
@click.option(
    "--confirm",
    type=FiniteFloatRange(0, 600, min_open=True),
    default=1.0,
    show_default=True,
    help="A response counts once the rate stayed in the band this long (capped by what the hold allows).",
)
@click.option(
    "--cpu",
    type=click.IntRange(0),
    default=None,
    help="CPU to measure on (libvirt: the guests' vCPU and emulator threads are pinned there for the run). "
    "Default: the least busy CPU of this machine.",
)
@click.option(
    "--priority",
    type=click.Choice(["high", "normal"]),
    default="high",
    show_default=True,
    help="cgroup backend: run workers (bare and capped alike) at nice -20 weight, so other processes on a "
    "shared machine disturb the measurement less; caps are quotas and hold either way.",
)
@click.option("--json", "as_json", is_flag=True, help="Print every measurement as one JSON object.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print the summary as Markdown (for docs).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), help="Write a PNG plot here.")
def calibrate_cmd(
    backend: str,
    connect: str | None,
    domains: tuple[str, ...],
    cluster: str | None,
    caps: tuple[float, ...],
    workers: int,
    duration: float,
    tolerance: float,
    steps: tuple[float, ...],
    window: float | None,
    pairs: int,
    confirm: float,
    cpu: int | None,
    priority: str,
    as_json: bool,
    as_markdown: bool,
    plot_path: str | None,
) -> int:
    """Measure how precisely and how quickly CPU caps take effect.

    Reproduces the paper's section 7 check of assumption H5 ("VM technology
    allows for precise, low-overhead, and quickly adaptable sharing"): on one
    CPU, a CPU-bound workload runs bare, uncapped under the mechanism
    (overhead), capped at each of --caps with 1..--workers concurrent
    subjects (accuracy: |measured - cap x bare| in points of the bare rate),
    and through cap steps (response time).  Errors are given on work done (the
    paper's metric) and on CPU time received (the cap's own currency).

    \b
    Examples:
      vcsched calibrate                                  # cgroup backend, about 30 s
      vcsched calibrate --workers 4 --duration 3 --plot calib.png
      vcsched calibrate --backend libvirt --connect qemu:///system --domain loop1
      vcsched calibrate --backend libvirt --connect URI_OF_LAB_HOST --workers 2   # boots its own guests

    Needs root for the cgroup backend.  Everything it creates (the
    vcsched-calib-<pid> cgroup, worker processes) is removed on exit, Ctrl-C
    or SIGTERM.
    """
    default_window = 0.1 if backend == "cgroup" else 1.0
    cfg = Config(
        caps=caps,
        workers=workers,
        duration=duration,
        tolerance=tolerance,
        steps=(steps[0], steps[1]),
        window=window if window is not None else default_window,
        confirm=confirm,
        pairs=pairs,
    )
    if plot_path:
        require_matplotlib(plot_path)
    from calibration.cgroup_backend import quota_for

    for c in (*caps, *steps):
        quota_for(c)  # CFS's 1 ms minimum quota (libvirt's too): fail before creating anything
    busy = cpu_busy()
    chosen = check_cpu(cpu) if cpu is not None else least_loaded_cpu(busy)
    cond = conditions(busy, chosen)
    with sigterm_as_interrupt(), open_subjects(
        backend, workers, chosen, connect, domains, priority == "high", cluster
    ) as subjects:
        result = _run_with_progress(subjects, cfg, backend, chosen)
    cond["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if plot_path:
        plot(result, plot_path)
    if as_json:
        emit_json(result_to_dict(result, cond))
    elif as_markdown:
        click.echo(markdown(result, cond), nl=False)
    else:
        render(result, cond)
        if plot_path:
            console.print(f"plot written to {plot_path}")
    return 0


def _run_with_progress(subjects: Subjects, cfg: Config, backend: str, cpu: int) -> Result:
    total = cfg.planned_seconds(bare_measured=subjects.nominal_bare is None)
    with Progress(
        TextColumn("[progress.description]{task.description:<34}"),
        BarColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=total)

        def tick(label: str, advance: float) -> None:
            bar.update(task, description=label, advance=advance)

        return run(subjects, cfg, backend, cpu, tick)

