"""``vcsched calibrate``: how accurately and how fast CPU, disk and network caps take effect (paper section 7, H5)."""

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

from calibration.cpus import check_cpu, conditions, cpu_busy, least_loaded_cpu
from calibration.experiment import Config, Result, Subjects, measure, run
from calibration.report import markdown, pct, plot, rate_text, require_matplotlib, result_to_dict, summary_rows
from cli.app import console, emit_json, err_console, refuse
from cli.params import FiniteFloatRange, cluster_option, json_option, lock_options
from cli.tables import FitTable
from vcsched.errors import InputError, VcschedError
from vcsched.formats.units import format_size

CPU_CAPS = "0.05,0.1,0.25,0.5,0.75,1.0"
#: Disk and network caps are fractions of what one guest reaches uncapped: only caps well below it show the cap
#: (at 1.0 a guest would measure its own speed, not the limit).
IO_CAPS = "0.02,0.05,0.1,0.2,0.3"
CPU_STEPS = "0.25,0.75"
IO_STEPS = "0.1,0.3"


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
    resource: str = "cpu",
    force: bool = False,
    managed: bool = False,
) -> Any:
    """The backend's subjects, as a context manager that removes everything it created.  ``managed``: domains
    vcsched manages may be taken (the caller holds their cluster's lock: :func:`cluster_locked`)."""
    if resource != "cpu":
        if backend != "libvirt":
            raise InputError(f"--resource {resource}: only the libvirt backend caps disk and network "
                             "(--backend libvirt --connect URI)")
        if not connect:
            raise InputError("--connect: required with --backend libvirt (e.g. a lab host's URI)")
        if domains and len(domains) < workers:
            raise InputError(f"--domain: {workers} worker(s) need {workers} running {resource} guest(s), "
                             f"got {len(domains)}")
        return _libvirt_io_subjects(connect, domains[:workers], workers, cluster, resource, force, managed)
    if backend == "cgroup":
        if connect or domains or cluster or force or managed:
            raise InputError("--connect/--domain/--cluster/--force/--allow-managed: only meaningful with --backend "
                             "libvirt")
        from calibration.cgroup_backend import CgroupSubjects

        return CgroupSubjects(workers, cpu, high_priority=high_priority)
    if not connect:
        raise InputError("--connect: required with --backend libvirt (e.g. qemu:///system or a lab host's URI)")
    if domains and len(domains) < workers:
        raise InputError(
            f"--domain: {workers} worker(s) need {workers} running CPU-loop guest(s), got {len(domains)} "
            "(give --domain NAME once per guest, or none to boot them from --cluster)"
        )
    return _libvirt_subjects(connect, domains[:workers], workers, cpu, cluster, force, managed)


class NotPutBack(VcschedError):
    """A calibration could not put every setting of its domains back (exit 1); its journal keeps them."""

    exit_code = 1


@contextlib.contextmanager
def _put_back_or_report(subjects: Any) -> Iterator[Any]:
    """The subjects for the block, closed after it (everything put back); what could not be put back is printed
    — and, when nothing else went wrong, is the command's error (exit 1), naming the journal that keeps it."""
    ok = False
    try:
        yield subjects
        ok = True
    finally:
        problems = subjects.close()
        for line in problems:
            err_console.print(f"vcsched: warning: {line}", highlight=False, markup=False)
        if problems and ok:
            where = subjects.journal.path if subjects.journal is not None else "no journal"
            raise NotPutBack(f"calibration: {len(problems)} setting(s) not put back (above); {where} keeps them "
                             "for `vcsched repair` or the next `vcsched calibrate --backend libvirt`")


def restore_left_calibrations() -> None:
    """Put back what calibrations killed before they could (SIGKILL, a crash) left, and say so (hypervisor.journal)."""
    from acting.restore import restore_journal
    from hypervisor.journal import CALIBRATION, GUESTS

    report = restore_journal(kinds=(CALIBRATION, GUESTS))
    for line in report.restored:
        err_console.print(f"vcsched: a killed calibration's {line}", highlight=False, markup=False)
    for line in report.problems:
        err_console.print(f"vcsched: warning: a killed calibration's {line}", highlight=False, markup=False)


@contextlib.contextmanager
def _libvirt_subjects(
    uri: str, domains: tuple[str, ...], workers: int, cpu: int, cluster: str | None, force: bool = False,
    managed: bool = False,
) -> Iterator[Subjects]:
    from hypervisor.caps_probe import LibvirtSubjects, loop_guest_boot, loop_guests
    from hypervisor.journal import CALIBRATION, Journal

    restore_left_calibrations()
    with contextlib.ExitStack() as stack:
        names = list(domains)
        if not names:
            from lab import default_cluster_file

            cluster_file = Path(cluster) if cluster else default_cluster_file()
            if cluster_file is None:
                raise InputError(
                    "--domain: none given, and no running lab whose guest image could boot CPU-loop guests "
                    "(give --domain NAME per running guest, or --cluster FILE with a [guest] section)"
                )
            image, partition = loop_guest_boot(cluster_file, uri)
            with err_console.status(f"booting {workers} CPU-loop guest(s) on {uri} ..."):
                names = stack.enter_context(loop_guests(uri, workers, image, partition))
        own = not domains  # guests it booted itself are its own to pin and pause
        subjects = LibvirtSubjects(uri, names, cpu=cpu, force=force or own, managed=managed,
                                   journal=Journal(CALIBRATION))
        yield stack.enter_context(_put_back_or_report(subjects))


@contextlib.contextmanager
def _libvirt_io_subjects(uri: str, domains: tuple[str, ...], workers: int, cluster: str | None, resource: str,
                         force: bool = False, managed: bool = False) -> Iterator[Subjects]:
    from hypervisor.caps_probe import LibvirtIoSubjects, io_guests, loop_guest_boot
    from hypervisor.journal import CALIBRATION, Journal

    restore_left_calibrations()
    with contextlib.ExitStack() as stack:
        names = list(domains)
        if not names:
            from lab import default_cluster_file

            cluster_file = Path(cluster) if cluster else default_cluster_file()
            if cluster_file is None:
                raise InputError(
                    f"--domain: none given, and no running lab whose guest image could boot {resource} guests "
                    "(give --domain NAME per running guest, or --cluster FILE with a [guest] section)"
                )
            image, partition = loop_guest_boot(cluster_file, uri)
            from lab.image import io_workloads_problem

            problem = io_workloads_problem(image)
            if problem is not None:
                raise InputError(f"--resource {resource}: {problem}")
            with err_console.status(f"booting {workers} {resource} guest(s) on {uri} ..."):
                names = stack.enter_context(io_guests(uri, workers, image, partition, resource))
        subjects = LibvirtIoSubjects(uri, names, resource, force=force or not domains, managed=managed,
                                     journal=Journal(CALIBRATION))
        yield stack.enter_context(_put_back_or_report(subjects))


@contextlib.contextmanager
def cluster_locked(cluster_file: str, connect: str | None, coordination: str | None, wait: float,
                   ttl: float | None) -> Iterator[None]:
    """The lock of the cluster of ``cluster_file``, held through a unit of work (acting/unit_of_work.py: the same
    lock, named by the hosts' identities, that place, adapt, drain and the controller hold while they cap its
    VMs), for a calibration of ``--domain`` guests vcsched manages on its host ``connect``.  Busy: exit 1 naming
    the holder, nothing touched."""
    from acting.unit_of_work import UnitOfWork, cluster_lock
    from cli.common import load_cluster, notice
    from hypervisor.libvirt_backend import LibvirtHypervisor

    cluster = load_cluster(cluster_file)
    uris = {h.uri: h.name for h in cluster.hosts}
    if connect not in uris:
        raise InputError(f"--connect: {connect!r} is not a host of cluster file {cluster_file} (its hosts: "
                         + ", ".join(f"{name} {uri}" for uri, name in uris.items()) + ")")
    with LibvirtHypervisor(cluster, on_notice=notice) as hv, \
            UnitOfWork(hv, cluster_lock(cluster, hv, coordination, ttl), wait=wait, settle=False):
        yield


def measure_reference(subjects: Any, duration: float, settle: float) -> dict[str, Any]:
    """What the guests reach uncapped, in bytes/s: one alone (the unit caps are fractions of) and all together
    (the host's capacity as these guests can show it)."""
    subjects.scale = 1.0
    for i in range(subjects.count):
        subjects.set_cap(i, None)
    with err_console.status(f"measuring the uncapped {subjects.resource} rate ..."):
        (single,) = measure(subjects, [0], duration, settle=settle)
        together = measure(subjects, list(range(subjects.count)), duration, settle=settle)
    return {"single_bps": single.rate, "aggregate_bps": sum(m.rate for m in together),
            "each_together_bps": [m.rate for m in together], "workers": subjects.count}


def cluster_lines(resource: str, reference: dict[str, Any], uri: str, cluster: str | None) -> list[str]:
    """The cluster-file lines to paste for the measured host: its capacity, rounded down to whole MiB/s."""
    host = None
    from lab import default_cluster_file

    path = Path(cluster) if cluster else default_cluster_file()
    if path is not None and path.is_file():
        import tomllib

        try:
            doc = tomllib.loads(path.read_text())
            host = next((h.get("name") for h in doc.get("hosts", []) if h.get("uri") == uri), None)
        except (OSError, tomllib.TOMLDecodeError):
            host = None
    mib = int(reference["aggregate_bps"]) >> 20
    where = f'the [[hosts]] table of "{host}"' if host else f"the [[hosts]] table whose uri is {uri}"
    return [f"# measured: {reference['workers']} guest(s) together, uncapped; paste into {where}:",
            f'{resource}_bps = "{mib}MiB"' if mib else f"{resource}_bps = {int(reference['aggregate_bps'])}"]


def render(result: Result, cond: dict[str, Any]) -> None:
    console.print(
        f"[bold]calibration[/] backend [bold]{result.backend}[/] on CPU {result.cpu}: bare rate "
        f"[bold]{rate_text(result.bare.rate)}[/] {result.unit}"
        + (f" (start→end drift {100 * result.bare_drift:+.2f}%)" if result.bare_drift is not None else " (nominal)")
        + f"; load average {cond.get('loadavg_1m')} at start, {cond.get('loadavg_1m_end')} at the end"
    )
    per_cap = FitTable(title="accuracy: measured vs expected (errors in points of the bare value)")
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
    summary = FitTable(title="summary, beside the paper's Xen 3.1 numbers (section 7)")
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
    "--resource",
    type=click.Choice(["cpu", "disk", "net"]),
    default="cpu",
    show_default=True,
    help="cpu: CPU caps (vcpu_quota, or CFS quotas). disk: guests writing to their disk, capped with "
    "blkiotune total_bytes_sec. net: guests receiving frames this machine sends into their tap, capped with "
    "libvirt's interface bandwidth. disk and net need --backend libvirt.",
)
@click.option(
    "--backend",
    type=click.Choice(["cgroup", "libvirt"]),
    default=None,
    help="cgroup: local DGEMM processes under CFS bandwidth control (needs root). "
    "libvirt: running guests capped through libvirt.  Default: cgroup for cpu, libvirt for disk and net.",
)
@click.option("--connect", metavar="URI", help="libvirt URI of the host running the guests (libvirt backend).")
@click.option(
    "--domain",
    "domains",
    multiple=True,
    metavar="NAME",
    help="A running guest that loops on its CPU (libvirt backend); repeat once per worker. "
    "Without it, --workers transient guests (CPU loop, disk writer or network sink, by --resource) are booted "
    "from the cluster file's [guest] and destroyed after.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Calibrate a --domain vcsched does not manage (no vcsched metadata); without it such a domain is "
    "refused, since a calibration pins, pauses and re-caps it.",
)
@click.option(
    "--allow-managed",
    is_flag=True,
    help="Calibrate a --domain vcsched manages: only with --cluster FILE naming its host, whose cluster lock is "
    "held for the whole run (without it such a domain is refused, exit 1).",
)
@cluster_option(
    "Cluster file whose [guest] boots the CPU-loop guests (libvirt backend without --domain); with --domain, "
    "the cluster whose lock the run holds. Default: the running lab's."
)
@click.option(
    "--caps",
    type=FloatList(),
    default=None,
    help=f"Caps to measure in (0, 1]: fractions of one CPU (default {CPU_CAPS}), or for disk and net of what "
    f"one guest reaches uncapped (default {IO_CAPS}).",
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
    default=None,
    help=f"LOW,HIGH: the cap is stepped LOW→HIGH→LOW on a running subject to time the response "
    f"(default {CPU_STEPS} for cpu, {IO_STEPS} for disk and net).",
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
@click.option(
    "--allow-unreliable",
    is_flag=True,
    help="Still say why a run cannot be trusted, but exit 0: for a script that keeps the numbers anyway, or a "
    "check of calibrate itself (journals, clean-up) on a machine that is known to be busy.",
)
@json_option("Print every measurement as one JSON object.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print the summary as Markdown (for docs).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), help="Write a PNG plot here.")
@lock_options()
def calibrate_cmd(
    resource: str,
    backend: str | None,
    connect: str | None,
    domains: tuple[str, ...],
    force: bool,
    allow_managed: bool,
    cluster_file: str | None,
    caps: tuple[float, ...] | None,
    workers: int,
    duration: float,
    tolerance: float,
    steps: tuple[float, ...] | None,
    window: float | None,
    pairs: int,
    confirm: float,
    cpu: int | None,
    priority: str,
    allow_unreliable: bool,
    as_json: bool,
    as_markdown: bool,
    plot_path: str | None,
    wait: float,
    coordination: str | None,
    lock_ttl: float | None,
) -> int:
    """Measure how precisely and how quickly CPU, disk and network caps take effect.

    Reproduces the paper's section 7 check of assumption H5 ("VM technology
    allows for precise, low-overhead, and quickly adaptable sharing"): on one
    CPU, a CPU-bound workload runs bare, uncapped under the mechanism
    (overhead), capped at each of --caps with 1..--workers concurrent
    subjects (accuracy: |measured - cap x bare| in points of the bare rate),
    and through cap steps (response time).  Errors are given on work done (the
    paper's metric) and on CPU time received (the cap's own currency).

    With --resource disk or net the same protocol runs on guests that write to
    their disk (bytes read + written, blockStats) or receive frames this
    machine sends into their tap (bytes received, interfaceStats): caps are
    fractions of what one guest reaches uncapped, measured first, and the
    command ends with the cluster-file line for the host (disk_bps or
    net_bps: what the guests reached together, uncapped).  A host that cannot
    cap the resource is refused before anything is measured (exit 2).

    \b
    Examples:
      vcsched calibrate                                  # cgroup backend, about 30 s
      vcsched calibrate --workers 4 --duration 3 --plot calib.png
      vcsched calibrate --backend libvirt --connect qemu:///system --domain loop1
      vcsched calibrate --backend libvirt --connect URI_OF_LAB_HOST --workers 2   # boots its own guests
      vcsched calibrate --resource disk --connect URI_OF_LAB_HOST --workers 2 --plot disk.png

    With --domain, a domain vcsched does not manage is refused unless
    --force.  One it manages is refused (exit 1) unless --cluster FILE names
    its host and --allow-managed is given: the run then holds that cluster's
    lock from before it touches the domain until everything is put back, as
    `place`, `adapt`, `drain` and `vcsched run` hold it while they set caps
    (busy: exit 1 naming the holder; --wait to wait).  What the libvirt backend changes on a domain (its CPU pinning,
    running state, vcpu_quota/period or disk/network limit) is written to a
    journal under the state directory before it is changed and put back on
    exit, Ctrl-C or SIGTERM, each setting on its own: a domain is never left
    paused, and whatever could not be put back is reported (exit 1).  After
    a SIGKILL, the next `vcsched calibrate --backend libvirt` (or `vcsched
    repair`) puts it back from the journal.

    Needs root for the cgroup backend.  Everything it creates (the
    vcsched-calib-<pid> cgroup, worker processes) is removed on exit, Ctrl-C
    or SIGTERM.

    A run that cannot be trusted is printed, then judged unreliable, each
    reason named (calibration/verdict.py): a load average at least the
    machine's CPUs, a busy measured CPU, measurements shorter than
    1 s (ten CFS periods), uncapped work faster than bare, a bare rate that
    drifted; --json says "reliable": false and lists them in "unreliable".

    Exit codes: 0 measured, 1 the run was unreliable (its reasons on stdout,
    one line on stderr; 0 with --allow-unreliable), a setting could not be put back (named on
    stderr), a --domain vcsched manages without --cluster/--allow-managed,
    or the cluster is locked (nothing touched), 2 bad input or a host that cannot cap the resource (nothing
    measured), 130 interrupted by Ctrl-C or SIGTERM (everything put back
    first).
    """
    if backend is None:
        backend = "cgroup" if resource == "cpu" else "libvirt"
    if caps is None:
        caps = FloatList().convert(CPU_CAPS if resource == "cpu" else IO_CAPS, None, None)
    if steps is None:
        steps = FloatList(count=2).convert(CPU_STEPS if resource == "cpu" else IO_STEPS, None, None)
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
    if resource == "cpu":
        from calibration.cgroup_backend import quota_for

        for c in (*caps, *steps):
            quota_for(c)  # CFS's 1 ms minimum quota (libvirt's too): fail before creating anything
    locked = backend == "libvirt" and bool(domains) and cluster_file is not None
    if allow_managed and not locked:
        raise InputError("--allow-managed: only with --backend libvirt, --domain and --cluster FILE (the cluster "
                         "whose lock the run holds)")
    busy = cpu_busy()
    chosen = check_cpu(cpu) if cpu is not None else least_loaded_cpu(busy)
    cond = conditions(busy, chosen)
    with contextlib.ExitStack() as held:
        if locked:
            assert cluster_file is not None
            held.enter_context(cluster_locked(cluster_file, connect, coordination, wait, lock_ttl))
        result, reference = _calibrate(backend, workers, chosen, connect, domains, priority == "high",
                                       cluster_file, resource, force, allow_managed and locked, cfg, duration)
    cond["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if reference is not None:
        cond["resource"] = resource
        cond["reference_bps"] = round(reference["single_bps"])
        cond["aggregate_bps"] = round(reference["aggregate_bps"])
    lines = cluster_lines(resource, reference, connect or "", cluster_file) if reference is not None else []
    reasons = _unreliable(result, cond, busy.get(chosen) if backend == "cgroup" else None,
                          workers if backend == "libvirt" else 0)
    if plot_path:
        plot(result, plot_path)
    if as_json:
        doc = result_to_dict(result, cond)
        if reference is not None:
            doc["reference"] = reference
            doc["cluster_lines"] = lines
        emit_json(doc | {"reliable": not reasons, "unreliable": reasons})
    elif as_markdown:
        click.echo(markdown(result, cond), nl=False)
        if lines:
            click.echo("\n```toml\n" + "\n".join(lines) + "\n```")
        if reasons:
            click.echo("\n**Unreliable run:**\n\n" + "".join(f"- {r}\n" for r in reasons))
    else:
        if reference is not None:
            each = ", ".join(f"{format_size(x)}/s" for x in reference["each_together_bps"])
            console.print(f"[bold]{resource}[/] reference: one guest uncapped [bold]"
                          f"{format_size(reference['single_bps'])}/s[/] (caps below are fractions of it); "
                          f"{reference['workers']} together {format_size(reference['aggregate_bps'])}/s ({each})")
        render(result, cond)
        if plot_path:
            console.print(f"plot written to {plot_path}")
        if lines:
            console.print("\n".join(lines), markup=False, highlight=False)
        for r in reasons:
            console.print(f"[red]unreliable run[/]: {r}", highlight=False)
    if reasons and allow_unreliable:
        return 0
    return refuse("calibration unreliable: " + "; ".join(reasons)) if reasons else 0


def _calibrate(backend: str, workers: int, cpu: int, connect: str | None, domains: tuple[str, ...],
               high_priority: bool, cluster_file: str | None, resource: str, force: bool, managed: bool,
               cfg: Config, duration: float) -> tuple[Result, dict[str, Any] | None]:
    """The measurements, on subjects opened and put back around them (SIGTERM unwinds as Ctrl-C); for disk and
    net, the uncapped reference the caps are fractions of."""
    reference: dict[str, Any] | None = None
    with sigterm_as_interrupt(), open_subjects(
        backend, workers, cpu, connect, domains, high_priority, cluster_file, resource, force, managed
    ) as subjects:
        if resource != "cpu":
            reference = measure_reference(subjects, duration, cfg.settle)
            if reference["single_bps"] <= 0:
                raise InputError(f"--domain: the guests moved no {resource} bytes uncapped (is their workload "
                                 "running?)")
            subjects.scale = reference["single_bps"]
            subjects.unit = f"x {format_size(reference['single_bps'])}/s"
        return _run_with_progress(subjects, cfg, backend, cpu), reference


def _unreliable(result: Result, cond: dict[str, Any], busy: float | None, own: int) -> list[str]:
    """Why this run cannot be trusted (calibration/verdict.py): ``busy``, the measured CPU's busy fraction
    before the run where the run's subjects were not running yet; ``own``, those that were (a libvirt run's
    guests).  The overhead is judged only where a bare rate was measured, not against a nominal one."""
    from calibration.verdict import unreliable

    return unreliable(load_1m=float(cond["loadavg_1m"]), cpus=int(cond.get("cpus") or 1), cpu=result.cpu,
                      cpu_busy_before=busy, duration=result.config.duration,
                      rate_overhead=result.rate_overhead if result.bare_before is not None else None,
                      bare_drift=result.bare_drift, own=own)


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

