"""``vcsched adapt``: re-balance a running cluster within a migration byte budget (re-cap, live-migrate a few)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import click

from cli.app import EXIT_OK, console, emit_json, read_json_file, refuse
from cli.params import (
    budget_option,
    cluster_option,
    json_option,
    lock_options,
    output_option,
    policy_options,
    time_limit_option,
)
from cli.solve_adapt import adapt_result_to_dict
from vcsched.adaptation.solve import ALGORITHMS
from vcsched.control.live import adapt_inventory
from vcsched.errors import InputError
from vcsched.formats.fields import check_number
from vcsched.formats.power import SPARE_MODES
from vcsched.formats.units import format_budget
from vcsched.model import SolveOptions


def _parse_needs(items: tuple[str, ...]) -> dict[str, float]:
    needs: dict[str, float] = {}
    for item in items:
        vm, sep, value = item.partition("=")
        try:
            cores = float(value)
        except ValueError:
            cores = math.nan
        if not sep or not vm or not math.isfinite(cores) or cores <= 0:
            raise InputError(f"--set-need: {item!r} is not VM=CORES with CORES above 0 (e.g. web-0=0.3)")
        if vm in needs:
            raise InputError(f"--set-need: {vm!r} is given twice ({needs[vm]:g} and {cores:g} cores); "
                             "give each VM once")
        needs[vm] = cores
    return needs


@dataclass(frozen=True)
class Changes:
    """What ``vcsched adapt`` plans for besides the recorded state: new CPU needs and departed virtual clusters."""

    needs: dict[str, float]
    depart: tuple[str, ...]


def _changes_file(path: str | None) -> Changes:
    """``--changes FILE``: ``{"set_need": {"VM": cores, ...}, "depart": ["VC", ...]}`` (JSON, both optional)."""
    if path is None:
        return Changes({}, ())
    doc = read_json_file(path, "changes")
    if not isinstance(doc, dict) or set(doc) - {"set_need", "depart"}:
        raise InputError(f"changes {path}: expected an object with only \"set_need\" and \"depart\" "
                         f"(got {doc!r:.80})")
    raw = doc.get("set_need", {})
    if not isinstance(raw, dict):
        raise InputError(f"changes {path}: set_need: expected an object VM -> cores")
    depart = doc.get("depart", [])
    if not isinstance(depart, list) or not all(isinstance(vc, str) and vc for vc in depart):
        raise InputError(f"changes {path}: depart: expected a list of virtual cluster names (got {depart!r:.80})")
    needs = {vm: check_number(f"changes {path}: set_need.{vm}", cores) for vm, cores in raw.items()}
    return Changes(needs, tuple(depart))


@click.command("adapt")
@cluster_option()
@budget_option()
@click.option("--set-need", "set_need", multiple=True, metavar="VM=CORES",
              help="Plan with a new CPU need for a VM, in cores (repeatable).  Needs are read from each VM's "
                   "metadata; applying the plan records the new one there (a set-need step).")
@click.option("--depart", "depart", multiple=True, metavar="VC",
              help="A virtual cluster that leaves: its VMs are stopped and removed first, and the others share "
                   "what they held (repeatable).")
@click.option("--changes", "changes_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help='JSON {"set_need": {"VM": cores, ...}, "depart": ["VC", ...]}: the file form of --set-need '
                   "and --depart (for a need, the command line wins).")
@click.option("-a", "--algorithm", type=click.Choice(ALGORITHMS), default="heuristic", show_default=True,
              help="heuristic; heuristic-best (its re-placement by the anytime search `best`, 0.1 s); "
                   "or milp (section 6.1; small clusters).")
@click.option("--spare", type=click.Choice([*SPARE_MODES, "none"]), default=None,
              help="What the budget left buys once every floor and the target yield (power_yield) hold: "
                   "consolidate (empty hosts), spread (even the hosts' free memory and CPU) or none.  Default: "
                   "the cluster file's spare when it sets one or power_saving is on, else none (docs/power.md, "
                   "\"Spread or consolidate\").")
@click.option("--parallel", type=click.IntRange(min=1, max=16), default=1, show_default=True,
              help="Most live migrations running at once between one pair of hosts.  The plan groups migrations "
                   "into waves that fit in memory together; apply runs each wave's migrations at once.")
@output_option("Save the plan for `vcsched apply`.", "PLAN.json")
@click.option("--apply", "do_apply", is_flag=True, help="Carry the plan out now (default: dry run, print it).")
@json_option("Print one JSON object (result, plan, apply report).")
@time_limit_option()
@policy_options()
@lock_options()
def adapt_cmd(cluster_file: str | None, budget: int, set_need: tuple[str, ...], depart: tuple[str, ...],
              changes_file: str | None,
              algorithm: str, spare: str | None, parallel: int, output: str | None, do_apply: bool, as_json: bool,
              time_limit: float | None, policy: str | None, alpha: float | None, wait: float,
              coordination: str | None, lock_ttl: float | None) -> int:
    """Re-balance a running cluster: re-cap every managed VM and live-migrate a few, within --budget bytes.

    \b
    Reads the live inventory (hosts, managed VMs, their recorded CPU needs
    and memory), drops the VMs of departed virtual clusters (--depart: they
    are removed first, which only frees room), solves the section 6.1 problem (the highest minimum yield
    reachable moving at most --budget bytes; moving a VM costs its memory),
    and prints the plan.  The plan is ordered so that no host ever runs out
    of memory (a migrating VM counts on both hosts until it lands), caps go
    down before others go up, and swaps between full hosts are relayed
    through a host with room (their extra bytes count against the budget).

    \b
    Examples:
      vcsched adapt --budget 0                   re-cap only
      vcsched adapt --budget 2GiB --set-need web-0=0.3
      vcsched adapt --budget 1GiB --depart batch   batch leaves; the rest grow
      vcsched adapt --budget 2GiB -o plan.json && vcsched apply plan.json
      vcsched adapt --budget 2GiB --apply
      vcsched adapt --budget 64GiB --spare spread   every VM at yield 1: even the hosts

    Under a sharing policy (--policy, else the cluster file's policy = "...")
    or when VMs need disk or network bandwidth, the byte-budgeted search
    places on every resource (CPU, memory and the hosts' declared disk_bps /
    net_bps) and the policy then allocates every resource on that placement
    (docs/policies.md).

    Once every floor and the target yield hold, the budget left buys what
    --spare (else the cluster file's spare) asks: consolidate empties hosts,
    spread evens their free memory and CPU (the score, the standard deviations
    of the hosts' free fractions, is printed before and after); no VM's yield
    goes down and the failures_tolerated room is kept.

    Applying is idempotent and stops at the first failure with every VM
    running (a failed migration leaves its VM on the source); run it again to
    continue.  With --apply the command holds the cluster lock from reading
    the hosts to the last step (--wait to wait for another holder).
    Migrations keep to the cluster file's throttles (max_migrations,
    max_migrations_per_host, migration_bandwidth, migration_timeout_per_gib);
    an operator's --apply is not bound by its maintenance windows or
    blackouts, which only hold `vcsched run` back.

    Exit codes: 0 planned (and applied), 1 nothing within the budget / no
    safe order / a step failed / the cluster is locked, 2 bad input, 130
    --apply interrupted by Ctrl-C (after the running step).  A dry run exits as
    --apply would: 1 where --apply would refuse its plan ("--apply would
    refuse: ...", docs/cli.md, "Dry runs").
    """
    from cli.common import (
        acting_on,
        apply_exit_code,
        apply_would_refuse,
        hosts_down,
        load_cluster,
        render_moves,
        render_plan,
        render_report,
        render_spare,
        run_apply,
        save_plan,
        warn_floors_missed,
    )
    from vcsched.plans.migration import MigrationBlocked
    from vcsched.plans.reasons import step_reasons

    changes = _changes_file(changes_file)
    flags = _parse_needs(set_need)
    both = sorted(set(flags) & set(changes.needs))
    if both:
        raise InputError(f"--set-need: {both[0]!r} also has a need in --changes {changes_file}; give each VM once")
    needs = {**changes.needs, **flags}
    departing = tuple(dict.fromkeys(changes.depart + depart))
    cluster = load_cluster(cluster_file)
    from vcsched.control.sharing import sharing_for

    sharing = sharing_for(cluster, policy, alpha)  # bad input before any host is read
    goal = cluster.power.spare_goal if spare is None else None if spare == "none" else spare
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        down = hosts_down(inventory)
        try:
            live = adapt_inventory(cluster.name, inventory, budget, needs=needs, depart=departing, algorithm=algorithm,
                                   parallel=parallel, options=SolveOptions(time_limit=time_limit), cluster=cluster,
                                   sharing=sharing, spare=goal)
        except MigrationBlocked as exc:
            if as_json:
                emit_json({"ok": False, "feasible": False, "reason": str(exc), "hosts_down": down})
            else:
                console.print(f"[red]no safe plan[/]: {exc}")
            return refuse(f"no safe plan: {exc}")
        out: dict[str, Any] = adapt_result_to_dict(live.problem, live.adapted)
        out["policy"] = sharing.policy
        out["spare"] = live.adapted.detail.get("spare")
        out["hosts_down"] = down
        if live.plan is None:
            if as_json:
                emit_json(out | {"ok": False})
            else:
                console.print(f"[red]no placement within the budget[/] of {format_budget(budget)}")
            return refuse(f"no placement within the budget of {format_budget(budget)}: {live.infeasible}")
        out["current_min_yield"] = live.current_min_yield
        plan_doc = live.plan.to_dict()
        out["plan"] = plan_doc
        reasons = step_reasons(live.plan, inventory, needs)
        out["reasons"] = [{"step": i, "op": st.op, "vm": st.vm, "reason": r}
                          for i, (st, r) in enumerate(zip(live.plan.steps, reasons, strict=True))]
        out["floors_missed"] = [{"cluster": vc, "yield": got, "min_yield": floor}
                                for vc, got, floor in live.floors_missed]
        if output:
            save_plan(live.plan, output)
        if not as_json:
            removed = live.plan.removed_vms()
            leaving = f", {len(removed)} of them leaving ({', '.join(departing)})" if departing else ""
            moved = live.plan.extra["migrated_bytes"]
            console.print(f"cluster {cluster.name!r}: {len(inventory.managed())} managed VMs{leaving}; plan moves "
                          f"{format_budget(moved)} of a budget of {format_budget(budget)}", highlight=False)
            if live.current_min_yield is not None:
                console.print(f"  minimum yield now {live.current_min_yield:.4f} (caps / needs), planned "
                              f"{live.plan.min_yield:.4f}", highlight=False)
            render_spare(live.adapted.detail.get("spare"))
            render_plan(live.plan, inventory, reasons)
            render_moves(live)
            warn_floors_missed(live.floors_missed, " (the best within this budget: raise --budget, or --depart "
                                                   "a cluster)")
        report = None
        if do_apply:
            report = run_apply(uow, live.plan, quiet=as_json, planned_here=True)
            out["apply"] = report.to_dict()
            if not as_json:
                render_report(report)
        else:
            why = apply_would_refuse(uow, live.plan, inventory)  # the dry run exits as --apply would (docs/cli.md)
            if why is not None:
                out["refused"] = f"--apply would refuse: {why}"
            elif not as_json:
                console.print("dry run: nothing changed (use --apply, or -o PLAN.json and `vcsched apply`)")
    code = apply_exit_code(report) if "refused" not in out else refuse(out["refused"])
    if as_json:
        emit_json(out | {"ok": code == EXIT_OK})
    return code
