"""``vcsched cordon`` / ``uncordon`` / ``drain``: a host out for maintenance and back (docs/rules.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cli.adapt import ByteSize, _human, render_moves
from cli.app import EXIT_OK, EXIT_UNSATISFIED, console, emit_json
from cli.common import cluster_lock, lock_options
from vcsched.adaptation.solve import ALGORITHMS
from vcsched.errors import InputError


def cluster_path(path: str | None) -> Path:
    """The cluster file of ``--cluster``, else the running default lab's."""
    if path is not None:
        return Path(path)
    from hypervisor.lab import default_cluster_file

    found = default_cluster_file()
    if found is None:
        raise InputError("--cluster: no cluster file given and no lab is running (start one with "
                         "`vcsched lab up`, or pass --cluster FILE)")
    return found


def set_maintenance(path: Path, host: str, on: bool) -> bool:
    """Write ``maintenance = true`` into (or drop it from) ``host``'s table, keeping the rest of the file as it is.

    Returns whether the file changed.  tomlkit keeps comments, order and formatting.
    """
    import tomlkit

    from cli.common import load_cluster

    cluster = load_cluster(str(path))  # the whole file is valid before it is touched
    cluster.host(host)  # unknown host: InputError naming the hosts
    doc = tomlkit.parse(path.read_text())
    hosts = doc["hosts"]
    assert isinstance(hosts, list)
    for table in hosts:
        if table.get("name") != host:
            continue
        if bool(table.get("maintenance", False)) == on:
            return False
        if on:
            table["maintenance"] = True
        else:
            del table["maintenance"]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomlkit.dumps(doc))
    tmp.replace(path)  # atomic: a reader sees the old file or the new one
    return True


def _cordon(host: str, cluster_file: str | None, on: bool, as_json: bool, wait: float, coordination: str | None,
            lock_ttl: float | None) -> int:
    from cli.common import load_cluster

    path = cluster_path(cluster_file)
    cluster = load_cluster(str(path))
    cluster.host(host)
    with cluster_lock(cluster, coordination, wait, ttl=lock_ttl):
        changed = set_maintenance(path, host, on)
    state = "in maintenance" if on else "back in service"
    if as_json:
        emit_json({"host": host, "maintenance": on, "changed": changed, "cluster_file": str(path)})
    else:
        console.print(f"{host} {'is now' if changed else 'was already'} {state} ({path})", highlight=False)
        if on:
            console.print(f"  no new VM and no migration will land on it; `vcsched drain {host} --budget B` empties it")
    return EXIT_OK


def _maintenance_options(command: Any) -> Any:
    """HOST, --cluster, --json and the lock options: what cordon and uncordon both take."""
    for option in reversed((click.argument("host"),
                            click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False, exists=True),
                                         default=None, metavar="FILE",
                                         help="Cluster file (TOML) to edit.  Default: the running lab's "
                                         "(`vcsched lab up`)."),
                            click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
                            lock_options())):
        command = option(command)
    return command


@click.command("cordon")
@_maintenance_options
def cordon_cmd(host: str, cluster_file: str | None, as_json: bool, wait: float, coordination: str | None,
               lock_ttl: float | None) -> int:
    """Put HOST in maintenance: no new VM and no migration lands on it (its VMs keep running).

    \b
    Writes maintenance = true into HOST's [[hosts]] table of the cluster file
    (the rest of the file is kept as it is), holding the cluster lock.  Every
    later place, adapt and drain reads it.  Then empty the host with
    `vcsched drain HOST --budget B --apply`, and bring it back with
    `vcsched uncordon HOST`.

    Exit codes: 0 done (or already so), 1 the cluster is locked, 2 bad input.
    """
    return _cordon(host, cluster_file, True, as_json, wait, coordination, lock_ttl)


@click.command("uncordon")
@_maintenance_options
def uncordon_cmd(host: str, cluster_file: str | None, as_json: bool, wait: float, coordination: str | None,
                 lock_ttl: float | None) -> int:
    """Take HOST out of maintenance: it receives VMs again (`vcsched adapt` can move some back).

    Removes maintenance = true from HOST's table of the cluster file, holding
    the cluster lock.  Exit codes: 0 done, 1 the cluster is locked, 2 bad input.
    """
    return _cordon(host, cluster_file, False, as_json, wait, coordination, lock_ttl)


@click.command("drain")
@click.argument("host")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False, exists=True), default=None, metavar="FILE",
              help="Cluster file (TOML).  Default: the running lab's (`vcsched lab up`).")
@click.option("--budget", type=ByteSize(), required=True,
              help="Most bytes the live migrations may move in all: 0, 512MiB, 2GiB, unlimited.")
@click.option("-a", "--algorithm", type=click.Choice(ALGORITHMS), default="heuristic", show_default=True,
              help="heuristic, or milp (exact; small clusters).")
@click.option("--parallel", type=click.IntRange(min=1, max=16), default=1, show_default=True,
              help="Most live migrations at once between one pair of hosts (waves, as in adapt).")
@click.option("--allow-below-floor", is_flag=True,
              help="Apply even when a virtual cluster ends below the min_yield it was admitted with.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None, metavar="PLAN.json",
              help="Save the plan for `vcsched apply`.")
@click.option("--apply", "do_apply", is_flag=True,
              help="Cordon HOST in the cluster file and carry the plan out now (default: dry run).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (plan, VMs that stay, apply report).")
@click.option("--time-limit", type=float, default=None, metavar="S", help="Wall-clock limit in seconds for milp.")
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
      vcsched drain h1 --budget 1GiB --apply      cordon h1, then migrate
      vcsched uncordon h1                         when the maintenance is over

    A drain never lowers a virtual cluster below the min_yield it was
    admitted with silently: the plan says so, and --apply refuses it unless
    --allow-below-floor.  A pinned VM on HOST is bad input with a budget above 0.

    Exit codes: 0 host emptied (plan made, or applied), 1 the host cannot be
    emptied (partial plan shown; with --apply, nothing applied) / no safe
    order / a step failed / the cluster is locked, 2 bad input.
    """
    from cli.common import (
        apply_exit_code,
        hosts_down,
        load_cluster,
        note_in_doubt,
        notice,
        render_hosts_down,
        render_plan,
        render_report,
        run_apply,
    )
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.control.live import adapt_inventory
    from vcsched.model import SolveOptions
    from vcsched.plans.migration import MigrationBlocked

    path = cluster_path(cluster_file)
    cluster = load_cluster(str(path))
    cluster.host(host)
    with LibvirtHypervisor(cluster, on_notice=notice) as hv, \
            cluster_lock(cluster, coordination, wait, ttl=lock_ttl, needed=do_apply, hv=hv) as lock:
        inventory = hv.inventory()
        if lock is None:  # a dry run reads only: in-doubt VMs are reported, never settled
            note_in_doubt(inventory)
        down = hosts_down(inventory)
        if not as_json:
            render_hosts_down(inventory)
        try:
            live = adapt_inventory(cluster.name, inventory, budget, algorithm=algorithm, parallel=parallel,
                                   options=SolveOptions(time_limit=time_limit), cluster=cluster, drain=host)
        except MigrationBlocked as exc:
            if as_json:
                emit_json({"host": host, "drained": False, "reason": str(exc), "hosts_down": down})
            else:
                console.print(f"[red]no safe plan[/]: {exc}")
            return EXIT_UNSATISFIED
        on_host = [v.name for v in inventory.vms_on(host) if v.managed and v.active]
        stays = [{"vm": vm, "reason": reason, "detail": detail} for vm, reason, detail in live.stays]
        out: dict[str, Any] = {"host": host, "budget": budget, "vms_on_host": on_host, "stays": stays,
                               "complete": live.drain_complete, "hosts_down": down}
        if live.plan is None:
            out["reason"] = live.infeasible
            if as_json:
                emit_json(out)
            else:
                console.print(f"[red]cannot drain {host}[/]: {out['reason']}", highlight=False)
                _render_stays(stays)
            return EXIT_UNSATISFIED
        moved = int(str(live.plan.extra["migrated_bytes"]))
        out |= {"migrated_bytes": moved, "plan": live.plan.to_dict(), "min_yield": live.plan.min_yield,
                "floors_missed": [{"cluster": vc, "yield": got, "min_yield": floor}
                                  for vc, got, floor in live.floors_missed]}
        if output:
            try:
                Path(output).write_text(json.dumps(live.plan.to_dict(), indent=1) + "\n")
            except OSError as exc:
                raise InputError(f"--output {output}: cannot write ({exc.strerror})") from None
        if not as_json:
            leaving = len(on_host) - len(stays)
            console.print(f"drain {host}: {leaving} of {len(on_host)} VMs leave; the plan moves {_human(moved)} of a "
                          f"budget of {_human(budget)}", highlight=False)
            render_plan(live.plan, inventory)
            render_moves(live)
            _render_stays(stays)
            for vc, got, floor in live.floors_missed:
                console.print(f"[yellow]warning:[/] virtual cluster {vc!r} gets a yield of {got:.4f}, below the "
                              f"min_yield {floor:g} it was admitted with", highlight=False)
        report = None
        if do_apply:
            blocked = live.drain_blocked(allow_below_floor=allow_below_floor)
            if blocked is not None:
                if not as_json:
                    console.print(f"[red]not applied[/]: {blocked}")
                else:
                    emit_json(out if stays else out | {"applied": None, "refused": blocked})
                return EXIT_UNSATISFIED
            set_maintenance(path, host, True)  # nothing new lands there from now on
            report = run_apply(hv, live.plan, force=False, quiet=as_json, lock=lock, planned_here=True)
            out["apply"] = report.to_dict()
            if not as_json:
                console.print(f"{host} is in maintenance ({path})", highlight=False)
                render_report(report)
        elif not as_json:
            console.print("dry run: nothing changed (use --apply, or -o PLAN.json and `vcsched apply`)")
    if as_json:
        emit_json(out)
    if stays:
        return EXIT_UNSATISFIED
    return apply_exit_code(report)


def _render_stays(stays: list[dict[str, str]]) -> None:
    if not stays:
        return
    from rich.table import Table

    table = Table(title="VMs that stay on the host")
    for col in ("VM", "reason", "why"):
        table.add_column(col)
    for s in stays:
        table.add_row(s["vm"], s["reason"], s["detail"])
    console.print(table)
