"""``vcsched place``: admission decision and plan for a virtual-cluster request; ``--apply`` carries it out.

Also holds what ``apply`` and ``status`` share: reading the cluster file and
rendering an apply report.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from cli.app import EXIT_OK, EXIT_UNSATISFIED, console, emit_json, read_text_file
from hypervisor.executor import DONE, FAILED, SKIPPED, ApplyReport, StepResult, apply_plan
from hypervisor.libvirt_backend import LibvirtHypervisor
from vcsched.control.admission import Decision, admit
from vcsched.control.inventory import Inventory
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster, cluster_from_dict
from vcsched.formats.request import Request, request_from_dict
from vcsched.formats.units import format_size
from vcsched.model import SolveOptions
from vcsched.plans.plan import Plan
from vcsched.plans.steps import CreateStep, RemoveStep
from vcsched.solvers.registry import algorithms

CLUSTER_HELP = ("Cluster file (TOML: hosts and their libvirt URIs; see docs/operations.md). "
                "Default: the running lab's (`vcsched lab up`).")


def read_toml_file(path: str | Path, what: str) -> dict[str, Any]:
    """Read and decode a TOML file, turning every failure into an InputError naming the file."""
    text = read_text_file(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{what} {path}: malformed TOML: {exc}") from None
    except RecursionError:
        raise InputError(f"{what} {path}: nested too deeply to be a {what}") from None


def load_cluster(path: str | None) -> Cluster:
    """The cluster of ``--cluster``, else the running default lab's."""
    if path is None:
        from hypervisor.lab import default_cluster_file

        found = default_cluster_file()
        if found is None:
            raise InputError("--cluster: no cluster file given and no lab is running (start one with "
                             "`vcsched lab up`, or pass --cluster FILE)")
        path = str(found)
    try:
        return cluster_from_dict(read_toml_file(path, "cluster file"))
    except InputError as exc:
        if str(exc).startswith("cluster file "):
            raise
        raise InputError(f"cluster file {path}: {exc}") from None


def load_request(path: str) -> Request:
    """A request file; a relative template/image path is taken relative to the request file."""
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


def cluster_option() -> Callable[[Any], Any]:
    return click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), default=None,
                        metavar="FILE", help=CLUSTER_HELP)


def render_plan(plan: Plan, inventory: Inventory) -> None:
    console.print(f"  predicted minimum yield [bold]{plan.min_yield:.4f}[/], average yield "
                  f"[bold]{plan.avg_yield:.4f}[/] over the whole cluster")
    if not plan.steps:
        console.print("  nothing to do: every VM already has its cap")
        return
    table = Table(title=f"plan ({len(plan.steps)} steps, in this order)")
    for col in ("#", "step", "VM", "host", "cap now", "cap after", "detail"):
        table.add_column(col, justify="right" if col in ("#", "cap now", "cap after") else "left")
    for i, step in enumerate(plan.steps):
        vm = inventory.vm(step.vm)
        now = "-" if vm is None or vm.cap_cores is None else f"{vm.cap_cores:.3f}"
        after = step.to_dict().get("cap_cores")
        detail = ""
        if isinstance(step, CreateStep):
            detail = (f"{step.vcpus} vCPU, {format_size(step.memory_bytes)}, needs {step.cpu_need_cores:.3f} "
                      f"cores, boot: {step.boot.kind}")
        elif isinstance(step, RemoveStep):
            detail = f"{step.cluster} departs"
        table.add_row(str(i + 1), step.op, step.vm, step.host, now, "-" if after is None else f"{after:.3f}", detail)
    console.print(table)


def render_decision(request: Request, decision: Decision, inventory: Inventory) -> None:
    if not decision.admitted:
        console.print(f"[red]refused[/] {request.name}: {decision.reason}")
        return
    assert decision.plan is not None
    console.print(f"[green]admitted[/] {request.name}: {request.vms} VMs of {request.vcpus} vCPU, "
                  f"{format_size(request.memory_bytes)}")
    render_plan(decision.plan, inventory)


def run_apply(hv: LibvirtHypervisor, plan: Plan, *, force: bool, quiet: bool) -> ApplyReport:
    """Apply with a progress bar (unless ``quiet``), one line per step as it finishes."""
    if quiet or not plan.steps:
        return apply_plan(hv, plan, force=force)
    with Progress(TextColumn("applying"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  console=console, transient=True) as progress:
        task = progress.add_task("", total=len(plan.steps))

        def on_step(r: StepResult) -> None:
            progress.update(task, advance=1, description=f"{r.step.op} {r.step.vm}: {r.outcome}")

        return apply_plan(hv, plan, force=force, on_step=on_step)


def render_report(report: ApplyReport) -> None:
    colour = {DONE: "green", SKIPPED: "dim", FAILED: "red"}
    table = Table(title="applied" if report.ok else "[red]stopped at a failed step[/] (every VM left running)")
    for col in ("#", "step", "VM", "host", "outcome", "time", "detail"):
        table.add_column(col, justify="right" if col in ("#", "time") else "left")
    for i, r in enumerate(report.results):
        c = colour.get(r.outcome, "yellow")
        took = "-" if r.seconds is None else f"{r.seconds:.2f} s"
        table.add_row(str(i + 1), r.step.op, r.step.vm, r.step.host, f"[{c}]{r.outcome}[/]", took, r.detail)
    console.print(table)
    if not report.snapshot_matched:
        console.print("[yellow]note:[/] applied with --force to a cluster that changed since the plan was made")
    if not report.ok:
        console.print("Fix the cause and run the same plan again: finished steps are skipped.")


@click.command("place")
@click.argument("request_file", metavar="REQUEST.toml", type=click.Path(dir_okay=False))
@cluster_option()
@click.option("-a", "--algorithm", default="mcb8", show_default=True, metavar="NAME",
              help="Placement algorithm from the registry (mcb1..mcb8, gr, sg, gb, sgb, milp, ...).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None, metavar="PLAN.json",
              help="Save the plan for `vcsched apply` (written only when the request is admitted).")
@click.option("--apply", "do_apply", is_flag=True, help="Carry the plan out now: create the VMs, set the caps.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (decision, plan, apply report).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed for randomized algorithms.")
def place_cmd(request_file: str, cluster_file: str | None, algorithm: str, output: str | None, do_apply: bool,
              as_json: bool, seed: int) -> int:
    """Decide whether a virtual cluster fits, and how: print the admission decision and the plan.

    \b
    REQUEST.toml (examples/web.toml):
      name = "web"          virtual cluster name; VMs are web-0, web-1, ...
      vms = 2               how many VMs (one parallel job: all get the same CPU share)
      vcpus = 1             per VM
      memory = "128MiB"     per VM (bytes or KiB/MiB/GiB)
      cpu_need = 0.5        CPU a VM uses alone, as a fraction of the largest host;
                            or cpu_cores = 0.5 (cores) - exactly one of the two
      template = "vm.xml"   optional domain XML (else the cluster's [guest] boot), or image = "disk.qcow2"
      min_yield = 0.3       optional: refuse if anyone's yield would fall below it

    Running VMs stay on their hosts; the new VMs go where the algorithm finds
    the highest minimum yield for the whole cluster, then spare CPU is shared
    out (average-yield phase).  Caps = yield x CPU need, in cores.  Nothing
    changes without --apply.

    Exit codes: 0 admitted (and applied), 1 refused or a step failed, 2 bad input (nothing changed).
    """
    if algorithm not in algorithms():
        raise click.BadParameter(f"unknown algorithm {algorithm!r} (known: {', '.join(sorted(algorithms()))})",
                                 param_hint="'--algorithm'")
    cluster = load_cluster(cluster_file)
    request = load_request(request_file)
    with LibvirtHypervisor(cluster) as hv:
        inventory = hv.inventory()
        decision = admit(cluster, inventory, request, algorithm, SolveOptions(seed=seed))
        report = None
        if decision.plan is not None:
            if output:
                try:
                    Path(output).write_text(_plan_json(decision.plan))
                except OSError as exc:
                    raise InputError(f"--output {output}: cannot write ({exc.strerror})") from None
            if do_apply:
                if not as_json:
                    render_decision(request, decision, inventory)
                report = run_apply(hv, decision.plan, force=False, quiet=as_json)
    if as_json:
        emit_json({"admitted": decision.admitted, "reason": decision.reason, "min_yield": decision.min_yield,
                   "avg_yield": decision.avg_yield,
                   "plan": decision.plan.to_dict() if decision.plan else None,
                   "applied": report.to_dict() if report else None})
    else:
        if report is None:
            render_decision(request, decision, inventory)
            if decision.plan is not None and not do_apply:
                console.print(f"dry run: nothing changed{f'; plan saved to {output}' if output else ''} "
                              "(--apply to carry it out)")
        else:
            render_report(report)
    if not decision.admitted or (report is not None and not report.ok):
        return EXIT_UNSATISFIED
    return EXIT_OK


def _plan_json(plan: Plan) -> str:
    import json

    return json.dumps(plan.to_dict(), indent=2) + "\n"
