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
from collections.abc import Callable, Iterator, Sequence
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

    from acting.executor import ApplyReport
    from acting.lock import ClusterLock
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.control.live import LiveAdaptation
    from vcsched.experiments import OnProgress
    from vcsched.formats.cluster import Cluster
    from vcsched.formats.request import Request
    from vcsched.inventory import Inventory
    from vcsched.plans.plan import Plan

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
    is domain XML; its template, image or the cluster's ``[guest]`` files exist, are readable and fit its memory
    when every host is on this machine (the lab).  Plans are checked again, on each target host, before their
    first step."""
    from hypervisor.bootcheck import boot_problems, files_local
    from vcsched.control.admission import boot_for

    if request.template is None and request.image is None and cluster.guest is None:
        return  # admission names what is missing
    fields = {"path": "template" if request.template is not None else "image",
              "kernel": "guest.kernel (cluster file)", "initrd": "guest.initrd (cluster file)"}
    local = all(files_local(h.uri) for h in cluster.hosts)
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
    from vcsched.plans.steps import AdoptStep, CreateStep, ReleaseStep, RemoveStep

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
        console.print("  nothing to do: every VM already has its cap")
        return
    table = FitTable(title=f"plan ({len(plan.steps)} steps, in this order)")
    for col in ("#", "step", "VM", "host", "cap now", "cap after", "detail", *(("why",) if reasons else ())):
        table.add_column(col, justify="right" if col in ("#", "cap now", "cap after") else "left",
                         key=col in ("#", "VM"))
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
        elif step.op == "migrate":
            moved = int(getattr(step, "bytes", 0))
            disk = moved - (vm.memory_bytes if vm is not None else moved)
            detail = f"{format_size(moved)} moved" + (
                f" (memory {format_size(vm.memory_bytes)} + disks {format_size(disk)}: other storage)"
                if vm is not None and disk > 0 else "")
        step_caps = getattr(step, "io_caps", None)
        if step_caps:
            shown = {"disk_bytes_sec": "disk {}/s", "disk_iops_sec": "{} IOPS", "net_bytes_sec": "net {}/s"}
            parts = [shown[k].format(v if k == "disk_iops_sec" else format_size(v))
                     for k, v in step_caps.given().items()]
            detail = ", ".join([detail, *parts] if detail else parts)
        table.add_row(str(i + 1), step.op, step.vm, step.host, now, "-" if after is None else f"{after:.3f}", detail,
                      *((reasons[i],) if reasons else ()))
    console.print(table)


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
    table = FitTable(title=f"live migrations ({live.order.waves} waves, {live.order.relays} relays)")
    for col in ("wave", "VM", "from", "to", "bytes", "cap on arrival"):
        table.add_column(col, justify="right" if col in ("wave", "bytes", "cap on arrival") else "left",
                         key=col in ("wave", "VM"))
    for m in live.order.moves:
        table.add_row(str(m.wave), m.vm + (" (relay)" if m.relay else ""), m.source, m.target, format_size(m.bytes),
                      f"{m.cap_cores:.3f}")
    console.print(table)


@contextmanager
def cluster_lock(cluster: Cluster, coordination: str | None, wait: float, *, ttl: float | None = None,
                 needed: bool = True, hv: LibvirtHypervisor | None = None,
                 settle: bool = True) -> Iterator[ClusterLock | None]:
    """The cluster's lock while the block runs (``needed=False``: a dry run, no lock); see acting.lock.

    The lock is named after the cluster's hosts — their libvirt identities, read through ``hv`` (else through
    connections opened for the purpose) — not after the file's ``name`` (hypervisor/identity.py).

    With ``hv`` (a command that changes hosts through it): once the lock is taken, in-doubt VMs are settled
    first (:func:`settle_first`, what `vcsched repair --apply` does; ``settle=False``: the caller repairs), and
    a migration that would outlive the lock's lease is aborted (``hv.lease``).
    """
    if not needed:
        yield None
        return
    from acting.lock import DEFAULT_TTL, holding, resolve_url
    from hypervisor.identity import lock_key

    url = resolve_url(coordination, cluster.coordination)
    key = lock_key(host_identities(cluster, hv).values())
    with holding(url, cluster.name, wait, ttl or cluster.lock_ttl or DEFAULT_TTL, key=key) as lock:
        if hv is not None:
            hv.lease = lock.held
            if settle:
                settle_first(hv, lock.guard)
        try:
            yield lock
        finally:
            if hv is not None:
                hv.lease = None


def note_in_doubt(inventory: Inventory) -> None:
    """For commands that only read (dry runs, observe): each in-doubt VM and what `vcsched repair --apply` would
    do about it, one note each on stderr.  Nothing is changed."""
    from hypervisor.settlement import RepairReport, plan_repair

    if not inventory.in_doubt:
        return
    for d in inventory.in_doubt:
        where = ", ".join(f"{h} ({st})" for h, st in zip(d.hosts, d.states, strict=True))
        notice(f"{d.vm} is in doubt (on {where}): nothing acts on it until `vcsched repair --apply` settles it")
    for line in RepairReport(plan_repair(inventory), applied=False).lines():
        notice(f"vcsched repair: {line}")


def settle_first(hv: LibvirtHypervisor, guard: Callable[[], None]) -> None:
    """At the start of a command that changes hosts, under its lock: settle the in-doubt VMs that can be (each
    action one note on stderr).  With a host down nothing is settled: said in one note when some VM is in doubt,
    and the command goes on (its plan leaves in-doubt VMs alone)."""
    report = hv.repair(guard)
    if report.plan.refused is not None and report.plan.in_doubt:
        notice(f"{len(report.plan.in_doubt)} in-doubt VM(s) not settled: {report.plan.refused}; `vcsched repair` "
               "settles them once every host answers")


@contextmanager
def deciding_on(cluster: Cluster, *, apply: bool, coordination: str | None, wait: float, ttl: float | None,
                quiet: bool) -> Iterator[tuple[LibvirtHypervisor, ClusterLock | None, Inventory]]:
    """The hosts of a command that decides and, with --apply, acts (place, adapt, drain): connections to them,
    the cluster lock when it applies (a dry run takes none), and the inventory read under it.  A dry run reads
    only: its in-doubt VMs are noted, never settled.  The hosts that are down are said first (unless ``quiet``:
    --json says them in its document)."""
    from hypervisor.libvirt_backend import LibvirtHypervisor

    with LibvirtHypervisor(cluster, on_notice=notice) as hv, \
            cluster_lock(cluster, coordination, wait, ttl=ttl, needed=apply, hv=hv) as lock:
        inventory = hv.inventory()
        if lock is None:
            note_in_doubt(inventory)
        if not quiet:
            render_hosts_down(inventory)
        yield hv, lock, inventory


def host_identities(cluster: Cluster, hv: LibvirtHypervisor | None = None) -> dict[str, str]:
    """Each host's identity (:meth:`hypervisor.libvirt_backend.LibvirtHypervisor.identities`), through ``hv`` or
    connections of its own."""
    if hv is not None:
        return hv.identities()
    from hypervisor.libvirt_backend import LibvirtHypervisor

    with LibvirtHypervisor(cluster, on_notice=notice) as own:
        return own.identities()


def run_apply(hv: LibvirtHypervisor, plan: Plan, *, force: bool, quiet: bool,
              lock: ClusterLock | None = None, planned_here: bool = False) -> ApplyReport:
    """Apply with a progress bar (unless ``quiet``), one line per step as it finishes; under ``lock``.

    ``planned_here``: the plan was computed by this command (``place``, ``adapt``, ``drain`` with ``--apply``)
    from a read moments earlier.  If the cluster changed in between (a host stopped answering or came back:
    seen by the lab chaos test), the command is refused (exit 1) and asked to be run again, instead of the
    saved-plan advice ("compute a new one with `vcsched adapt`, or apply anyway with --force"), which these
    commands cannot follow.

    Every step that takes effect is recorded in the definitions store of the lock's coordination backend
    (acting/definitions.py), so that the VMs it creates or moves can be restarted if their host fails.
    """
    from acting.executor import ClusterChangedMeanwhile, SnapshotMismatch

    try:
        return _run_apply(hv, plan, force=force, quiet=quiet, lock=lock)
    except SnapshotMismatch:
        if not planned_here:
            raise
        raise ClusterChangedMeanwhile(
            f"cluster {plan.cluster!r} changed while this command ran (a host stopped answering or came back, or a "
            "VM changed, between its planning read and its first step): nothing changed; run it again") from None


def _run_apply(hv: LibvirtHypervisor, plan: Plan, *, force: bool, quiet: bool,
               lock: ClusterLock | None) -> ApplyReport:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from acting.definitions import DefinitionStore, recorder
    from acting.executor import StepResult, apply_plan

    guard = lock.guard if lock is not None else None
    store = DefinitionStore.for_url(lock.url, hv.cluster.name) if lock is not None else None
    if quiet or not plan.steps:
        return apply_plan(hv, plan, force=force, guard=guard, on_step=recorder(store, notice))
    with Progress(TextColumn("applying"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  console=console, transient=True) as progress:
        task = progress.add_task("", total=len(plan.steps))

        def on_step(r: StepResult) -> None:
            progress.update(task, advance=1, description=f"{r.step.op} {r.step.vm}: {r.outcome}")

        return apply_plan(hv, plan, force=force, on_step=recorder(store, notice, on_step), guard=guard)


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
        table.add_column(col, justify="right" if col in ("#", "time") else "left", key=col in ("#", "VM"))
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
