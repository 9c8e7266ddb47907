"""``vcsched apply``: carry out a saved plan, idempotently."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.app import EXIT_OK, console, emit_json, read_json_file, refuse
from cli.common import (
    acting_on,
    apply_exit_code,
    apply_would_refuse,
    load_cluster,
    render_plan,
    render_report,
    run_apply,
)
from cli.params import cluster_option, json_option, lock_options
from vcsched.formats.words import plural
from vcsched.plans.plan import Plan, plan_from_dict

if TYPE_CHECKING:
    from vcsched.inventory import Inventory


@click.command("apply")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False))
@cluster_option()
@click.option("--force", is_flag=True,
              help="Apply even if the cluster changed since the plan was computed (its snapshot differs).")
@click.option("--allow-below-floor", is_flag=True,
              help="A drain plan: apply even when a virtual cluster ends below the min_yield it was admitted with.")
@click.option("--dry-run", is_flag=True,
              help="Check the plan as applying would, whole against the live cluster, and change nothing "
                   "(no lock taken): exit 1 where applying would refuse it, 0 where it would act.")
@json_option("Print the apply report as one JSON object.")
@lock_options()
def apply_cmd(plan_file: str, cluster_file: str | None, force: bool, allow_below_floor: bool, dry_run: bool,
              as_json: bool, wait: float, coordination: str | None, lock_ttl: float | None) -> int:
    """Apply a plan saved by `vcsched place`, `adapt` or `drain` with -o PLAN.json.

    \b
    Steps: create (a new VM, capped from its first instant), set-cap,
    migrate (live; a wave's migrations run at once), remove (a departed
    cluster's VM), set-need (record a new need in the VM's metadata).
    Each step checks first whether its effect is already there (then it is
    skipped), acts, and reads the result back through libvirt.  The first
    failure stops the plan; nothing is undone and every VM keeps running (a
    failed migration leaves its VM on the source).  Running the same plan
    again skips the finished steps and converges.

    The plan names the cluster state it was computed from (a hash of hosts,
    VMs, CPU needs and memory; caps and what the plan itself creates, moves,
    removes or re-records excluded).  If the cluster changed since, the plan
    is refused (exit 1) unless --force.  Either way the whole plan is then
    replayed on the live cluster before its first step: a plan that names an
    unknown or down host, caps a VM beyond its vCPUs or a host beyond its
    cores, or over-commits any host at any step is refused whole (exit 1).

    A drain plan (`vcsched drain HOST -o PLAN.json`) is applied as `drain
    --apply` would: refused (exit 1, nothing changed) when VMs would stay on
    the host, or when a virtual cluster would end below its min_yield unless
    --allow-below-floor; otherwise the plan runs and HOST is put in
    maintenance in the cluster file, before the cluster lock is released.

    The command holds the cluster lock throughout (--wait to wait for another
    holder).  Ctrl-C stops after the running step and reports what was done.

    With --dry-run nothing changes and no lock is taken: the plan is read,
    checked as above (the snapshot, a drain plan's own refusals, the same
    whole-plan check) and the command exits as applying it now would: 1
    with `vcsched: refused: --apply would refuse: ...`, else 0.

    Exit codes: 0 applied (or nothing to do), 1 refused (the cluster changed,
    the plan no longer fits, the cluster is locked, a drain plan that would
    leave VMs or break a floor; nothing done) or a step
    failed (its reason on stderr), 2 bad input (a missing or malformed plan
    or cluster file; nothing done), 130 interrupted by Ctrl-C (after the
    running step; the report says what was done).
    """
    plan = plan_from_dict(read_json_file(plan_file, "plan"))
    drain = plan.extra.get("drain")
    path = _cluster_path(cluster_file) if drain is not None else None
    cluster = load_cluster(str(path) if path is not None else cluster_file)
    if drain is not None:
        cluster.host(drain)  # a host of this cluster, or bad input naming the hosts
    with acting_on(cluster, apply=not dry_run, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        if not as_json:
            kind = plan.kind if drain is None else f"drain {drain}"  # a drain's plan is an adaptation's kind
            console.print(f"plan for cluster [bold]{plan.cluster}[/] ({kind}, {plural(len(plan.steps), 'step')})")
            render_plan(plan, inventory)
        refused = _drain_refused(plan, inventory, allow_below_floor) if drain is not None else None
        if refused is not None and dry_run:  # as drain's dry run says it (docs/cli.md, "Dry runs")
            refused = f"--apply would refuse this plan: {refused}"
        if refused is None and dry_run:  # the same whole-plan check applying runs first; it only reads
            why = apply_would_refuse(uow, plan, inventory, force=force, planned_here=False)
            refused = None if why is None else f"--apply would refuse: {why}"
        if refused is not None:
            if as_json:
                emit_json({"ok": False, "applied": None, "refused": refused, "dry_run": dry_run,
                           **({"drain": drain} if drain is not None else {})})
            else:
                console.print(f"[red]not applied[/]: {refused}", highlight=False)
            return refuse(refused)
        if dry_run:
            if as_json:
                emit_json({"ok": True, "applied": None, "dry_run": True})
            else:
                console.print("dry run: nothing changed (run it again without --dry-run to apply it)")
            return EXIT_OK
        report = run_apply(uow, plan, force=force, quiet=as_json)
        if drain is not None and path is not None:
            # Still under the lock (which every command that plans onto a host takes), so nothing landed on it
            # meanwhile; a plan refused before its first step (exit 1) leaves the file alone.
            _cordon(path, drain, as_json)
    if as_json:
        emit_json(report.to_dict())
    else:
        render_report(report)
    return apply_exit_code(report)


def _cluster_path(cluster_file: str | None) -> Path:
    from cli.maintenance import cluster_path

    return cluster_path(cluster_file)


def _drain_refused(plan: Plan, inventory: Inventory, allow_below_floor: bool) -> str | None:
    """Why a saved drain plan may not be applied now (as `drain --apply` decides it), or None."""
    from vcsched.control.admission import floors_missed
    from vcsched.control.live import drain_blocked

    missed = floors_missed(inventory.vms, {vm: p.yield_ for vm, p in plan.per_vm.items()})
    return drain_blocked(str(plan.extra["drain"]), plan.extra.get("stays", ()), missed,
                         allow_below_floor=allow_below_floor)


def _cordon(path: Path, host: str, quiet: bool) -> None:
    """The drained host in maintenance before the first step: nothing new lands on it from now on."""
    from cli.maintenance import set_maintenance

    set_maintenance(path, host, True)
    if not quiet:
        console.print(f"{host} is in maintenance ({path})", highlight=False)
