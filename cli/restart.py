"""``vcsched restart VM...``: start lost VMs again from their definition records (docs/failures.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.params import cluster_option, json_option, lock_options

if TYPE_CHECKING:
    from vcsched.control.failover import Restart


@click.command("restart")
@click.argument("vms", nargs=-1, required=True, metavar="VM...")
@cluster_option()
@click.option("--apply", "do_apply", is_flag=True,
              help="Create the VMs on the hosts chosen (default: dry run, print the plan).")
@json_option("Print one JSON object: ok, the restart (where each VM goes, what is refused), the plan, the report.")
@lock_options()
def restart_cmd(vms: tuple[str, ...], cluster_file: str | None, do_apply: bool, as_json: bool, wait: float,
                coordination: str | None, lock_ttl: float | None) -> int:
    """Start lost VMs again from their records in the definitions store, on the best hosts.

    \b
    A VM is lost when the definitions store records it (every VM vcsched
    created) but no host that answers holds it, and its recorded host either
    answers without it or was fenced by a recovery (`vcsched status` lists
    them, with why and since when).  Each VM is created again from its
    record — the same virtual cluster, vCPUs, memory, need, boot, floor,
    rules and priority — placed like a failed host's VMs (memory, CPU at
    the virtual clusters' floors, rules, maintenance), highest `priority`
    first, and the other VMs' caps re-set around them.  Below its floor when
    the hosts cannot meet it, whatever the cluster file's on_failure says:
    naming a VM here is choosing that it runs (said, and the floor alert
    fires until room is made).

    \b
    Examples:
      vcsched restart db-1              dry run: where db-1 would run
      vcsched restart db-1 --apply      under the cluster lock: create it

    Refused (nothing changed for that VM, exit 1, the reason said): a VM
    that runs (or has a copy on a host that answers), one whose recorded
    host does not answer and was not fenced (it may still run there:
    `vcsched recover HOST` fences it first), one that boots from a disk the
    other hosts do not share, one that does not fit.  The others are
    restarted.

    Exit codes: 0 every VM named runs again (or will, dry run), 1 a VM is
    refused / a step failed / the cluster is locked, 2 bad input (a VM name
    the definitions store does not record), 130 interrupted (a running step
    finishes first).
    """
    from acting.definitions import DefinitionStore
    from acting.lock import resolve_url
    from acting.recovery import RestartRun, restart_lost
    from cli.common import acting_on, apply_exit_code, load_cluster, render_plan, render_report, steps_shown
    from vcsched.errors import InputError

    cluster = load_cluster(cluster_file)
    store = DefinitionStore.for_url(resolve_url(coordination, cluster.coordination), cluster.name)
    records = {vm: store.get(vm) for vm in dict.fromkeys(vms)}
    unknown = [vm for vm, d in records.items() if d is None]
    if unknown:
        raise InputError(f"VM {unknown[0]!r}: not recorded in the definitions store of cluster {cluster.name!r} "
                         f"({store.where}): vcsched did not create it, or it was removed")
    out: dict[str, Any] = {"vms": list(records)}
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory), steps_shown(quiet=as_json) as shown:

        def planned(run: RestartRun) -> None:  # said before anything changes
            plan = run.restart.plan
            out["restart"] = {**run.restart.to_dict(),
                              "refused": [{"vm": vm, "reason": why} for vm, why in run.not_restarted]}
            out["plan"] = None if plan is None else plan.to_dict()
            if not as_json:
                _render(run.restart, run.not_restarted)
                if plan is not None:
                    render_plan(plan, inventory)
            if do_apply and plan is not None:
                shown.start(plan)

        run = restart_lost(uow, cluster, store, inventory, [d.step for d in records.values() if d is not None],
                           below_floor_ok=True, planned=planned, on_step=shown.step)
        shown.stop()
        report, refused = run.report, run.not_restarted
        if report is not None:
            out["apply"] = report.to_dict()
            if not as_json:
                render_report(report)
        elif run.refused is not None:
            out["refused"] = f"--apply would refuse: {run.refused}; nothing created"
        elif run.restart.plan is not None and not as_json:
            console.print("dry run: nothing changed (use --apply to create)")
    code = apply_exit_code(report) if report is not None else EXIT_OK
    if "refused" in out:
        if as_json:
            emit_json({"ok": False, **out})
        else:
            console.print(f"[red]not restarted[/]: {out['refused']}", highlight=False)
        return refuse(out["refused"])
    if as_json:
        emit_json({"ok": code == EXIT_OK and not refused, **out})
    if refused:
        return refuse(f"{len(refused)} VM(s) not restarted: " + "; ".join(f"{vm}: {why}" for vm, why in refused[:3]))
    return code


def _render(restart: Restart, refused: tuple[tuple[str, str], ...]) -> None:
    for i, (vm, target) in enumerate(restart.restarts, start=1):
        console.print(f"{i}. create {vm} on {target}", highlight=False)
    for vm, got, floor in restart.below_floor:
        console.print(f"[yellow]below its floor[/]: {vm} at yield {got:.4f}, min_yield {floor:g}", highlight=False)
    for vm, why in refused:
        console.print(f"[yellow]not restarted[/]: {vm}: {why}", highlight=False)
