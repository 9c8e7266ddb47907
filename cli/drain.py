"""``vcsched drain``: empty a host by live migration within a byte budget, for maintenance (docs/rules.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.common import (
    acting_on,
    apply_exit_code,
    apply_would_refuse,
    cluster_path,
    hosts_down,
    load_cluster,
    render_moves,
    render_plan,
    render_report,
    run_apply,
    save_plan,
    warn_floors_missed,
)
from cli.maintenance import set_maintenance
from cli.params import budget_option, cluster_option, json_option, lock_options, output_option, time_limit_option
from vcsched.adaptation.solve import ALGORITHMS
from vcsched.control.live import LiveAdaptation, adapt_inventory
from vcsched.formats.units import format_budget
from vcsched.formats.words import plural
from vcsched.model import SolveOptions
from vcsched.plans.migration import MigrationBlocked
from vcsched.plans.reasons import step_reasons

if TYPE_CHECKING:
    from acting.unit_of_work import UnitOfWork
    from vcsched.inventory import Inventory


@click.command("drain")
@click.argument("host")
@cluster_option()
@budget_option()
@click.option("-a", "--algorithm", type=click.Choice(ALGORITHMS), default="heuristic", show_default=True,
              help="heuristic, or milp (exact; small clusters).")
@click.option("--parallel", type=click.IntRange(min=1, max=16), default=1, show_default=True,
              help="Most live migrations at once between one pair of hosts (waves, as in adapt).")
@click.option("--allow-below-floor", is_flag=True,
              help="Apply even when a virtual cluster ends below the min_yield it was admitted with.")
@output_option("Save the plan for `vcsched apply`.", "PLAN.json")
@click.option("--apply", "do_apply", is_flag=True,
              help="Carry the plan out now, then cordon HOST in the cluster file (default: dry run).")
@json_option("Print one JSON object (plan, VMs that stay, apply report).")
@time_limit_option()
@lock_options()
def drain_cmd(host: str, cluster_file: str | None, budget: int, algorithm: str, parallel: int,
              allow_below_floor: bool, output: str | None, do_apply: bool, as_json: bool, time_limit: float | None,
              wait: float, coordination: str | None, lock_ttl: float | None) -> int:
    """Empty HOST by live migration within --budget bytes, for maintenance; --apply carries it out.

    \b
    HOST is treated as in maintenance (nothing moves in) and every VM on it
    must leave, to hosts that keep every rule (spread, together, pinned,
    maintenance) and every host's memory, in waves that each fit in memory
    everywhere; what the budget has left re-balances the rest as `adapt` does,
    for at most 0.5 s of planning (so a 1,000-host drain plans in about 1 s).
    When the host cannot be emptied, the plan is the best partial drain and
    every VM that stays is listed with its reason: pinned, budget, rule or no room.

    \b
    Examples:
      vcsched drain h1 --budget 1GiB              dry run: the plan, the bytes, who stays
      vcsched drain h1 --budget 1GiB --apply      migrate, then cordon h1 (under the lock)
      vcsched uncordon h1                         when the maintenance is over

    Migrations keep to the cluster file's throttles (max_migrations,
    max_migrations_per_host, migration_bandwidth, migration_timeout_per_gib).
    A drain by an operator is not bound by the maintenance windows or
    blackouts: those only hold `vcsched run` back.

    A drain never lowers a virtual cluster below the min_yield it was
    admitted with silently: a warning says so (stderr), and --apply refuses
    it unless --allow-below-floor; a dry run exits as --apply would.  A
    pinned VM on HOST is bad input with a budget above 0.

    Exit codes: 0 host emptied (plan made, or applied), 1 the host cannot be
    emptied (partial plan shown; with --apply, nothing applied) / a virtual
    cluster would end below its floor (without --allow-below-floor) / no safe
    order / a step failed / the cluster is locked, 2 bad input, 130 --apply
    interrupted by Ctrl-C (after the running step).  A dry run exits as --apply
    would: 1 where --apply would refuse its plan ("--apply would refuse: ...",
    docs/cli.md, "Dry runs").
    """
    path = cluster_path(cluster_file)
    cluster = load_cluster(str(path))
    cluster.host(host)
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        down = hosts_down(inventory)
        try:
            live = adapt_inventory(cluster.name, inventory, budget, algorithm=algorithm, parallel=parallel,
                                   options=SolveOptions(time_limit=time_limit), cluster=cluster, drain=host)
        except MigrationBlocked as exc:
            if as_json:
                emit_json({"ok": False, "host": host, "drained": False, "reason": str(exc), "hosts_down": down})
            else:
                console.print(f"[red]no safe plan[/]: {exc}")
            return refuse(f"no safe plan: {exc}")
        on_host = [v.name for v in inventory.vms_on(host) if v.managed and v.active]
        stays = [{"vm": vm, "reason": reason, "detail": detail} for vm, reason, detail in live.stays]
        out: dict[str, Any] = {"host": host, "budget": budget, "vms_on_host": on_host, "stays": stays,
                               "complete": live.drain_complete, "hosts_down": down}
        if live.plan is None:
            out["reason"] = live.infeasible
            if as_json:
                emit_json(out | {"ok": False})
            else:
                console.print(f"[red]cannot drain {host}[/]: {out['reason']}", highlight=False)
                _render_stays(stays)
            return refuse(f"cannot drain {host}: {out['reason']}")
        moved = int(str(live.plan.extra["migrated_bytes"]))
        reasons = step_reasons(live.plan, inventory, drain=host)
        out |= {"migrated_bytes": moved, "plan": live.plan.to_dict(), "min_yield": live.plan.min_yield,
                "reasons": [{"step": i, "op": st.op, "vm": st.vm, "reason": r}
                            for i, (st, r) in enumerate(zip(live.plan.steps, reasons, strict=True))],
                "floors_missed": [{"cluster": vc, "yield": got, "min_yield": floor}
                                  for vc, got, floor in live.floors_missed]}
        if output:
            save_plan(live.plan, output)
        if not as_json:
            leaving = len(on_host) - len(stays)
            console.print(f"drain {host}: {leaving} of {len(on_host)} VMs leave; the plan moves "
                          f"{format_budget(moved)} of a budget of {format_budget(budget)}", highlight=False)
            render_plan(live.plan, inventory, reasons)
            render_moves(live)
            _render_stays(stays)
            warn_floors_missed(live.floors_missed)
        report = None
        if do_apply:
            blocked = live.drain_blocked(allow_below_floor=allow_below_floor)
            if blocked is not None:
                if not as_json:
                    console.print(f"[red]not applied[/]: {blocked}")
                else:
                    emit_json(out | {"ok": False, "applied": None, "refused": blocked})
                return refuse(f"not applied: {blocked}")
            report = run_apply(uow, live.plan, quiet=as_json, planned_here=True)
            # Still under the cluster lock (which every command that plans onto a host takes), so nothing landed
            # on it meanwhile; a plan refused before its first step (exit 1) leaves the file alone, as `apply` does.
            set_maintenance(path, host, True)
            out["apply"] = report.to_dict()
            if not as_json:
                console.print(f"{host} is in maintenance ({path})", highlight=False)
                render_report(report)
        else:
            why = _dry_run_refusal(uow, live, inventory, allow_below_floor)
            if why is not None:
                out["refused"] = why
            elif not as_json:
                console.print("dry run: nothing changed (use --apply, or -o PLAN.json and `vcsched apply`)")
    code = apply_exit_code(report)
    if stays and code == EXIT_OK:
        staying = ", ".join(s["vm"] for s in stays)
        code = refuse(f"{host} cannot be emptied: {plural(len(stays), 'VM')} stay ({staying})")
    elif "refused" in out:
        code = refuse(out["refused"])
    if as_json:
        emit_json(out | {"ok": code == EXIT_OK})
    return code


def _dry_run_refusal(uow: UnitOfWork, live: LiveAdaptation, inventory: Inventory,
                     allow_below_floor: bool) -> str | None:
    """Why ``--apply`` would refuse this drain, or None (docs/cli.md: a dry run exits as --apply would): its own
    refusal first (a virtual cluster left below its floor without --allow-below-floor), then the whole-plan check
    it runs before the first step (:func:`cli.common.apply_would_refuse`)."""
    assert live.plan is not None
    blocked = live.drain_blocked(allow_below_floor=allow_below_floor)
    if blocked is not None:
        return f"--apply would refuse this plan: {blocked}"
    why = apply_would_refuse(uow, live.plan, inventory)
    return None if why is None else f"--apply would refuse: {why}"


def _render_stays(stays: list[dict[str, str]]) -> None:
    if not stays:
        return
    from cli.tables import FitTable

    table = FitTable(title="VMs that stay on the host")
    for col in ("VM", "reason", "why"):
        table.add_column(col, key=col == "VM", wrap=col == "why")
    for s in stays:
        table.add_row(s["vm"], s["reason"], s["detail"])
    console.print(table)
