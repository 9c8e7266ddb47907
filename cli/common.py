"""What several commands share: reading cluster and request files, rendering plans and apply reports,
describing the machine, and the progress bar that the library's ``on_progress`` callbacks drive.

Heavy modules (the hypervisor adapter, rich tables, numpy, scipy) are imported
inside the functions that use them, so that a command that needs one helper
does not pay at start-up for the others.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.app import console, err_console, read_document
from cli.params import (  # noqa: F401  (re-exported: commands written before cli/params.py import them here)
    cluster_option,
    lock_options,
    policy_options,
)
from vcsched.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import ProgressColumn

    from acting.executor import ApplyReport, StepResult
    from acting.power import PowerStore
    from acting.unit_of_work import Reporting, UnitOfWork
    from hypervisor.identity import Identities
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.control.live import LiveAdaptation
    from vcsched.control.lost import Lost
    from vcsched.experiments import OnProgress
    from vcsched.formats.cluster import Cluster
    from vcsched.formats.request import Request
    from vcsched.inventory import Inventory, VmState
    from vcsched.plans.plan import Plan
    from vcsched.plans.steps import MigrateStep

# ---------------------------------------------------------------------------------------------- input files


def read_toml_file(path: str | Path, what: str) -> dict[str, Any]:
    """Read and decode a TOML file, turning every failure into an InputError naming the file."""
    doc: dict[str, Any] = read_document(path, what, tomllib.loads, lambda e: f"malformed TOML: {e}"
                                        if isinstance(e, tomllib.TOMLDecodeError) else None)
    return doc


def cluster_path(path: str | None) -> Path:
    """The cluster file of ``--cluster``, else the running default lab's."""
    if path is not None:
        return Path(path)
    from lab import default_cluster_file

    found = default_cluster_file()
    if found is None:
        raise InputError("--cluster: no cluster file given and no lab is running (start one with "
                         "`vcsched lab up`, or pass --cluster FILE)")
    return found


def load_cluster(path: str | None) -> Cluster:
    """The cluster of ``--cluster``, else the running default lab's."""
    from vcsched.formats.cluster import cluster_from_dict

    path = str(cluster_path(path))
    try:
        cluster = cluster_from_dict(read_toml_file(path, "cluster file"))
        if cluster.pki is not None:
            from hypervisor.pki import check_pki

            check_pki("pki", cluster.pki)
        if any(h.fence is not None for h in cluster.hosts):
            from acting.fence import check_agents

            check_agents(cluster)
    except InputError as exc:
        if str(exc).startswith("cluster file "):
            raise
        raise InputError(f"cluster file {path}: {exc}") from None
    for warning in cluster.warnings:
        click.echo(f"warning: cluster file {path}: {warning}", err=True)
    return cluster


def load_request(path: str) -> Request:
    """A request file; a relative template/image path is taken relative to the request file."""
    from vcsched.formats.request import request_from_dict

    try:
        request = request_from_dict(read_toml_file(path, "request"))
    except InputError as exc:
        if str(exc).startswith("request "):
            raise
        raise InputError(f"request {path}: {exc}") from None
    base = Path(path).resolve().parent

    def resolved(field: str, value: str | None) -> str | None:
        if value is None:
            return None
        full = (base / value).resolve()
        if not full.is_file():
            raise InputError(f"request {path}: {field}: {value!r} is not a file ({full})")
        return str(full)

    return dataclasses.replace(request, template=resolved("template", request.template),
                               image=resolved("image", request.image))


def check_request_boot(cluster: Cluster, request: Request, path: str) -> None:
    """What the request's VMs would boot, checked before any host is read (hypervisor/bootcheck.py): its template
    is domain XML; its template, image or the cluster's ``[guest]`` files exist, are readable, hold a kernel and
    fit its memory when any host is on this machine — a VM placed there boots from these very files, so a problem
    is the request's, said before the plan (not as ``plan.steps[5].boot.kernel`` after "admitted", when one other
    host is remote).  Plans are checked again, on each target host, before their first step."""
    from hypervisor.bootcheck import boot_problems, files_local
    from vcsched.control.admission import boot_for

    if request.template is None and request.image is None and cluster.guest is None:
        return  # admission names what is missing
    fields = {"path": "template" if request.template is not None else "image",
              "kernel": "guest.kernel (cluster file)", "initrd": "guest.initrd (cluster file)"}
    local = any(files_local(h.uri) for h in cluster.hosts)
    problems = boot_problems("request", boot_for(cluster, request), request.memory_bytes, local=local, fields=fields)
    if problems:
        raise InputError(f"request {path}: " + "; ".join(problems[:3]))



# ---------------------------------------------------------------------------------------------- plans


#: What a down host means for a plan, said wherever one is named (text and --json alike).
DOWN_CONSEQUENCE = "its VMs were not counted and nothing was planned onto it or off it"


def hosts_down(inventory: Inventory) -> list[dict[str, str]]:
    """``[{"host", "reason", "consequence"}]`` for every host that did not answer: the ``hosts_down`` of the
    deciding commands' ``--json`` (place, adapt, drain, apply)."""
    return [{"host": h.name, "reason": str(h.down), "consequence": DOWN_CONSEQUENCE}
            for h in inventory.down_hosts()]


def render_hosts_down(inventory: Inventory) -> None:
    """One line per down host, before the decision: the plan below was made without it."""
    for h in inventory.down_hosts():
        console.print(f"[yellow]host {h.name} is down[/] ({h.down}): {DOWN_CONSEQUENCE}", highlight=False)


def render_plan(plan: Plan, inventory: Inventory, reasons: Sequence[str] | None = None) -> None:
    """The plan as a table, one row per step (with ``reasons``: a "why" column, vcsched.plans.reasons)."""
    from cli.tables import FitTable
    from vcsched.formats.units import format_size
    from vcsched.plans.steps import AdoptStep, CreateStep, MigrateStep, ReleaseStep, RemoveStep

    policy = plan.extra.get("policy")
    console.print(f"  predicted minimum yield [bold]{plan.min_yield:.4f}[/], average yield "
                  f"[bold]{plan.avg_yield:.4f}[/] over the whole cluster"
                  + (f" (policy [bold]{policy}[/])" if policy else ""))
    io = sorted({r for p in plan.per_vm.values() for r, _ in p.io_bytes_sec})
    if io:
        from vcsched.formats.units import format_size

        console.print("  predicted disk/network per VM: " + "; ".join(
            f"{vm} " + ", ".join(f"{r} {format_size(v)}/s" for r, v in p.io_bytes_sec)
            for vm, p in sorted(plan.per_vm.items()) if p.io_bytes_sec), highlight=False)
    if not plan.steps:
        # Not "nothing to do": a drain whose VMs all stay has no step either, and still has its work undone.
        console.print("  the plan has no step: every VM keeps its host and its cap")
        return
    from vcsched.formats.words import plural

    table = FitTable(title=f"plan ({plural(len(plan.steps), 'step')}, in this order)")
    for col in ("#", "step", "VM", "host", "cap now", "cap after", "detail", *(("why",) if reasons else ())):
        table.add_column(col, justify="right" if col in ("#", "cap now", "cap after") else "left",
                         key=col in ("#", "VM"), wrap=col in ("detail", "why"))
    for i, step in enumerate(plan.steps):
        vm = inventory.vm(step.vm)
        now = "-" if vm is None or vm.cap_cores is None else f"{vm.cap_cores:.3f}"
        after = getattr(step, "cap_cores", None)
        detail = ""
        if isinstance(step, CreateStep):
            detail = (f"{step.vcpus} vCPU, {format_size(step.memory_bytes)}, needs {step.cpu_need_cores:.3f} "
                      f"cores, boot: {step.boot.kind}")
        elif isinstance(step, RemoveStep):
            detail = f"{step.cluster} departs"
        elif isinstance(step, AdoptStep | ReleaseStep):
            detail = (f"joins {step.definition.cluster}, needs {step.definition.cpu_need_cores:.3f} cores"
                      if isinstance(step, AdoptStep) else f"leaves {step.cluster}: uncapped, unmanaged")
        elif isinstance(step, MigrateStep):
            detail = migration_detail(step, vm, inventory)
        step_caps = getattr(step, "io_caps", None)
        if step_caps:
            shown = {"disk_bytes_sec": "disk {}/s", "disk_iops_sec": "{} IOPS", "net_bytes_sec": "net {}/s"}
            parts = [shown[k].format(v if k == "disk_iops_sec" else format_size(v))
                     for k, v in step_caps.given().items()]
            detail = ", ".join([detail, *parts] if detail else parts)
        table.add_row(str(i + 1), step.op, step.vm, step.host, now, "-" if after is None else f"{after:.3f}", detail,
                      *((reasons[i],) if reasons else ()))
    console.print(table)


def migration_detail(step: MigrateStep, vm: VmState | None, inventory: Inventory) -> str:
    """What a migration will copy, from the VM and its two hosts as they are (vcsched.plans.claims.move_bytes),
    not only as the plan claims it: a hand-edited ``"bytes": 1`` reads "claims 1 B; moves 512 MiB" — the table
    of a plan about to be refused for it does not say "1 B moved"."""
    from vcsched.formats.units import format_size
    from vcsched.plans.claims import move_bytes

    claimed = int(step.bytes)
    hosts = {h.name: h for h in inventory.hosts}
    if vm is None or vm.host != step.source or step.source not in hosts or step.target not in hosts:
        return f"{format_size(claimed)} to move"  # moved already (a re-run), or on a host that did not answer
    actual = move_bytes(vm, hosts[step.source], hosts[step.target])
    if actual != claimed:
        return f"claims {format_size(claimed)}; moves {format_size(actual)}"
    disk = actual - vm.memory_bytes
    return f"{format_size(actual)} to move" + (
        f" (memory {format_size(vm.memory_bytes)} + disks {format_size(disk)}: other storage)" if disk > 0 else "")


def write_report(out_dir: Path, report: str, plots: list[Path]) -> None:
    """An experiment's ``report.md`` in ``out_dir`` (``--output``), its plots (written already) linked at the end."""
    from hypervisor.files import write_output

    if plots:
        report += "\n## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n"
    write_output("--output", out_dir / "report.md", report)


def save_plan(plan: Plan, output: str) -> None:
    """``-o PLAN.json`` of place, adapt and drain: the one way a plan is saved (atomically) for `vcsched apply`."""
    import json

    from hypervisor.files import write_output

    write_output("--output", output, json.dumps(plan.to_dict(), indent=1) + "\n")


def render_moves(live: LiveAdaptation) -> None:
    """The live migrations of an adapt or drain plan, wave by wave."""
    from cli.tables import FitTable
    from vcsched.formats.units import format_size

    if live.order is None or not live.order.moves:
        return
    from vcsched.formats.words import plural

    table = FitTable(title=f"live migrations ({plural(live.order.waves, 'wave')}, "
                           f"{plural(live.order.relays, 'relay')})")
    for col in ("wave", "VM", "from", "to", "bytes", "cap on arrival"):
        table.add_column(col, justify="right" if col in ("wave", "bytes", "cap on arrival") else "left",
                         key=col in ("wave", "VM"))
    for m in live.order.moves:
        table.add_row(str(m.wave), m.vm + (" (relay)" if m.relay else ""), m.source, m.target, format_size(m.bytes),
                      f"{m.cap_cores:.3f}")
    console.print(table)


def render_spare(report: object) -> None:
    """What the budget left over bought (``adapt``'s ``spare`` detail): the score before and after, or why not."""
    if not isinstance(report, Mapping):
        return
    mode = report["mode"]
    if "skipped" in report:
        console.print(f"  spare room ({mode}): nothing done: {report['skipped']}", highlight=False)
        return
    before, after = report["now"], report["after"]
    from vcsched.formats.units import format_size

    console.print(f"  spare room ({mode}): score {before['score']:.4f} -> {after['score']:.4f} (stddev of free "
                  f"memory {before['free_memory_stddev']:.4f} -> {after['free_memory_stddev']:.4f}, of free CPU "
                  f"{before['free_cpu_stddev']:.4f} -> {after['free_cpu_stddev']:.4f}); hosts empty "
                  f"{before['hosts_empty']} -> {after['hosts_empty']}; {report['moves']} more move(s), "
                  f"{format_size(max(int(report['bytes']), 0))}", highlight=False)


def warn_floors_missed(missed: Sequence[tuple[str, float, float]], advice: str = "") -> None:
    """One warning on stderr per virtual cluster an adapt or drain plan leaves below the min_yield it was
    admitted with (docs/cli.md: warnings go to stderr, the plan to stdout)."""
    from cli.app import err_console

    for vc, got, floor in missed:
        err_console.print(f"vcsched: warning: virtual cluster {vc!r} gets a yield of {got:.4f}, below the "
                          f"min_yield {floor:g} it was admitted with{advice}", highlight=False, markup=False)


def reporting() -> Reporting:
    """How a command's unit of work speaks (acting/unit_of_work.py): notes on stderr (``--json`` keeps stdout one
    document); what settling did is said by the adapter's own notices (``LibvirtHypervisor(on_notice=notice)``)."""
    from acting.unit_of_work import Reporting

    return Reporting(note=notice)


@contextmanager
def acting_on(cluster: Cluster, *, apply: bool, coordination: str | None, wait: float, ttl: float | None,
              quiet: bool, settle: bool = True) -> Iterator[tuple[UnitOfWork, Inventory]]:
    """The unit of work of a command that decides and, with --apply, acts (place, adapt, drain, apply, recover,
    approve): connections to the hosts, the cluster lock when it applies (a dry run takes none, reads only and
    notes its in-doubt VMs), and the inventory read under it.  The hosts that are down are said first (unless
    ``quiet``: --json says them in its document)."""
    from acting.unit_of_work import for_cluster
    from hypervisor.libvirt_backend import LibvirtHypervisor

    with LibvirtHypervisor(cluster, on_notice=notice) as hv, \
            for_cluster(cluster, hv, apply=apply, coordination=coordination, wait=wait, ttl=ttl, settle=settle,
                        reporting=reporting()) as uow:
        inventory = uow.inventory()
        if not quiet:
            render_hosts_down(inventory)
        yield uow, inventory


def host_identities(cluster: Cluster, hv: LibvirtHypervisor | None = None) -> Identities:
    """Each host's identity (:meth:`hypervisor.libvirt_backend.LibvirtHypervisor.identities`), through ``hv`` or
    connections of its own."""
    if hv is not None:
        return hv.identities()
    from hypervisor.libvirt_backend import LibvirtHypervisor

    with LibvirtHypervisor(cluster, on_notice=notice) as own:
        return own.identities()


def power_store(cluster: Cluster, hv: object = None, coordination: str | None = None) -> PowerStore:
    """The cluster's power record (acting/power.py), named like its lock by the hosts' identities read through
    ``hv`` (a unit of work's adapter) or connections of its own: every command that reads or changes it."""
    from acting.power import store_for

    return store_for(cluster, host_identities(cluster, hv), coordination)  # type: ignore[arg-type]


def apply_shown(uow: UnitOfWork, plan: Plan, *, quiet: bool, force: bool = False,
                planned_here: bool = False) -> ApplyReport | None:
    """:meth:`acting.unit_of_work.UnitOfWork.apply`, with a progress bar (unless ``quiet``), one line per step as
    it finishes.  ``planned_here``: the plan was computed by this command from a read moments earlier (``place``,
    ``adapt``, ``drain`` with ``--apply``): a cluster that changed in between is refused (exit 1) and the command
    asked to be run again, instead of the saved-plan advice (recompute, or --force).  (A command whose acting
    function applies itself, `recover` and `restart`, gives :func:`steps_shown`'s bar to that function.)"""
    with steps_shown(quiet) as shown:
        shown.start(plan)
        return uow.apply(plan, force=force, planned_here=planned_here, on_step=shown.step if shown.live else None)


class StepsShown:
    """The progress bar of a plan being applied (:func:`steps_shown`): :meth:`start` it once the plan is known and
    is about to be applied (a command whose acting function plans and applies starts it from its ``planned``
    callback, acting/recovery.py), and give :meth:`step` as the apply's ``on_step``."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.progress: Any = None
        self.task: Any = None

    @property
    def live(self) -> bool:
        return self.progress is not None

    def start(self, plan: Plan) -> None:
        """Show the bar of ``plan``'s steps (not when quiet, nor for a plan with no step)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        if self.quiet or not plan.steps or self.progress is not None:
            return
        self.progress = Progress(TextColumn("applying"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}"), console=console, transient=True)
        self.progress.start()
        self.task = self.progress.add_task("", total=len(plan.steps))

    def step(self, r: StepResult) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=1, description=f"{r.step.op} {r.step.vm}: {r.outcome}")

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


@contextmanager
def steps_shown(quiet: bool) -> Iterator[StepsShown]:
    """A :class:`StepsShown`, its bar taken down on the way out (a transient bar: nothing of it stays)."""
    shown = StepsShown(quiet)
    try:
        yield shown
    finally:
        shown.stop()


def apply_would_refuse(uow: UnitOfWork, plan: Plan, inventory: Inventory | None = None, *, force: bool = False,
                       planned_here: bool = True) -> str | None:
    """Why ``--apply`` would refuse ``plan`` before its first step, or None: the same whole-plan check on the
    live cluster (:meth:`acting.unit_of_work.UnitOfWork.validate`; ``planned_here``: a plan this command computed,
    else a saved one, `vcsched apply --dry-run`, whose snapshot ``force`` lets differ).  A dry run runs it so that
    it exits with the code ``--apply`` would (docs/cli.md: 1 where --apply refuses); it only reads, on the
    ``inventory`` it planned on when given (no second read of every host)."""
    refused = uow.would_refuse(plan, force=force, planned_here=planned_here, inventory=inventory)
    return None if refused is None else str(refused)


def run_apply(uow: UnitOfWork, plan: Plan, *, quiet: bool, force: bool = False,
              planned_here: bool = False) -> ApplyReport:
    """:func:`apply_shown` of a plan with no irreversible action first: always a report."""
    report = apply_shown(uow, plan, quiet=quiet, force=force, planned_here=planned_here)
    assert report is not None  # only an irreversible action that fails applies nothing
    return report


def render_report(report: ApplyReport) -> None:
    from acting.executor import DONE, FAILED, SKIPPED
    from cli.tables import FitTable

    colour = {DONE: "green", SKIPPED: "dim", FAILED: "red"}
    if report.ok:
        title = "applied"
    elif report.stopped is not None:
        title = f"[red]stopped: {report.stopped}[/] (every VM left running)"
    else:
        title = "[red]stopped at a failed step[/] (every VM left running)"
    table = FitTable(title=title)
    for col in ("#", "step", "VM", "host", "outcome", "time", "detail"):
        table.add_column(col, justify="right" if col in ("#", "time") else "left", key=col in ("#", "VM"),
                         wrap=col == "detail")
    for i, r in enumerate(report.results):
        c = colour.get(r.outcome, "yellow")
        took = "-" if r.seconds is None else f"{r.seconds:.2f} s"
        table.add_row(str(i + 1), r.step.op, r.step.vm, r.step.host, f"[{c}]{r.outcome}[/]", took, r.detail)
    console.print(table)
    for r in report.restored:
        state = "put back" if r.outcome == DONE else f"[red]not put back[/] ({r.detail})"
        console.print(f"  cap of {r.step.vm} on {r.step.host} {state} to {r.step.to_dict().get('cap_cores', 0):.3f} "
                      "cores: the plan had lowered it for a VM it did not create", highlight=False)
    if not report.snapshot_matched:
        console.print("[yellow]note:[/] applied with --force to a cluster that changed since the plan was made")
    if not report.ok:
        console.print("Fix the cause and run the same plan again: finished steps are skipped.")


def apply_exit_code(report: ApplyReport | None) -> int:
    """0 applied (or nothing applied), 130 interrupted by Ctrl-C, 1 a step failed or the plan stopped.

    A plan that did not finish also says so in one line on stderr (the step, its host and what went wrong),
    whatever went to stdout (the report table, or ``--json``): a script or an operator watching stderr sees
    the failure without parsing the report.
    """
    from acting.executor import CTRL_C
    from cli.app import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNSATISFIED

    if report is None or report.ok:
        return EXIT_OK
    bad = report.failed()
    if bad is not None:
        index = report.results.index(bad) + 1
        why = f" at step {index} ({bad.step.op} {bad.step.vm} on {bad.step.host}), {bad.outcome}: {bad.detail}"
    else:
        why = f": {report.stopped}"
    restored = sum(1 for r in report.restored if r.outcome == "done")
    back = f"; {restored} lowered cap(s) put back" if restored else ""
    click.echo(f"vcsched: error: the plan stopped{why}{back}; every VM is left running (re-run the plan to "
               "continue)", err=True)
    return EXIT_INTERRUPTED if report.stopped == CTRL_C else EXIT_UNSATISFIED


# ---------------------------------------------------------------------------------------------- the machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def mcb_kernel() -> str:
    """Which MCB implementation runs: the C kernel or pure Python (as vcsched.solvers.mcb reports it)."""
    import importlib

    try:
        mcb = importlib.import_module("vcsched.solvers.mcb")
    except ModuleNotFoundError:
        return "vcsched.solvers.mcb not installed"
    backend = getattr(mcb, "DEFAULT_BACKEND", None)  # "c" when vcsched.solvers._mcbc is built, else "python"
    if backend is None:
        return "not reported by vcsched.solvers.mcb"
    return "C (vcsched.solvers._mcbc)" if backend == "c" else f"{backend} (C kernel not built)"


@dataclass(frozen=True)
class MachineInfo:
    cpu: str
    cores: int
    python: str
    numpy: str
    scipy: str
    mcb_kernel: str
    load_avg: tuple[float, float, float]

    def summary(self) -> str:
        return (f"{self.cpu}, {self.cores} cores, Python {self.python}, numpy {self.numpy}, scipy {self.scipy}, "
                f"MCB kernel: {self.mcb_kernel}, load average {self.load_avg[0]:.2f} at start")


def machine_info() -> MachineInfo:
    import numpy as np
    import scipy

    return MachineInfo(
        cpu=_cpu_model(), cores=os.cpu_count() or 1, python=platform.python_version(), numpy=np.__version__,
        scipy=scipy.__version__, mcb_kernel=mcb_kernel(), load_avg=os.getloadavg(),
    )



# ---------------------------------------------------------------------------------------------- progress


@contextmanager
def progress_bar(*columns: ProgressColumn, console: Console, transient: bool) -> Iterator[OnProgress]:
    """A rich progress bar, handed to the library as its ``on_progress(done, total, description)`` callback.

    The library calls it in this process (also when it farms work out to
    worker processes), first with ``done = 0``; the bar is drawn from then on.
    """
    from rich.progress import Progress

    with Progress(*columns, console=console, transient=transient) as progress:
        task = progress.add_task("", total=None)

        def on_progress(done: int, total: int, description: str) -> None:
            progress.update(task, completed=done, total=total, description=description)

        yield on_progress


def notice(line: str) -> None:
    """What an inventory settled on its own (an in-doubt VM's paused copy removed, a paused arrival resumed):
    one line on stderr, so ``--json`` output stays one document."""
    err_console.print(f"[yellow]note:[/] {line}", highlight=False)


def read_lost(cluster: Cluster, inventory: Inventory, coordination: str | None = None
              ) -> tuple[tuple[Lost, ...], str | None]:
    """The lost VMs (vcsched/control/lost.py), and why they are unknown when the definitions store cannot be read
    (reported, not fatal: the hosts were read)."""
    from acting.definitions import DefinitionStore, StoreError
    from acting.lock import resolve_url

    try:
        store = DefinitionStore.for_url(resolve_url(coordination, cluster.coordination), cluster.name)
        return store.lost(inventory), None
    except (StoreError, InputError) as exc:
        return (), str(exc)
