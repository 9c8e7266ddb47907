"""``vcsched recover HOST``: a failed host's VMs run again on the survivors, after the host is fenced."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.params import cluster_option, json_option, lock_options

if TYPE_CHECKING:
    from acting.fence import FenceResult
    from vcsched.control.failover import Recovery


@click.command("recover")
@click.argument("host")
@cluster_option()
@click.option("--apply", "do_apply", is_flag=True,
              help="Fence HOST, then create its VMs on the survivors (default: dry run, print the plan).")
@json_option("Print one JSON object: ok, the recovery, fencing, the apply report.")
@lock_options()
def recover_cmd(host: str, cluster_file: str | None, do_apply: bool, as_json: bool, wait: float,
                coordination: str | None, lock_ttl: float | None) -> int:
    """Run a failed host's VMs again on the survivors: fence it, then create them, most important first.

    \b
    The plan, in this order:
      1. fence HOST with its fence agent (cluster file: fence = {agent = ...}):
         action=off, then action=status must say off;
      2. create each of its managed VMs on the hosts that answer, from the
         definitions store (what `place` and every migration recorded), placed
         by vcsched's admission and placement (memory, CPU at least at the
         virtual clusters' floors, rules, maintenance), highest `priority`
         first, and the survivors' caps re-set around them.
    A VM is stranded (not restarted, said why) when HOST has no fence agent,
    when it boots from a disk the survivors do not share (`storage`), or
    when the survivors have no memory for it.  A VM whose floor (min_yield)
    the survivors cannot meet restarts below it, said so, with the cluster
    file's on_failure = "restart" (the default); on_failure = "strand"
    strands it instead (docs/failures.md).

    \b
    Examples:
      vcsched recover h1              dry run: the fencing and the creates
      vcsched recover h1 --apply      under the cluster lock: fence, then create

    --apply checks the plan whole against the live cluster before it fences
    (a plan refused fences nothing), and refuses to create anything when
    fencing fails or the agent does not report the host off: its VMs may
    still run there.  A HOST that
    answers is not recovered (use `vcsched drain`).  Re-running converges:
    VMs already running elsewhere are left alone.

    While another host does not answer and was not fenced, HOST's VMs
    wait (said, exit 1): one may run there, its migration cut after the
    switch-over before vcsched recorded it.  HOST is fenced all the same;
    they restart once that host is recovered too (or answers again).

    Exit codes: 0 every VM of HOST runs (or will, dry run), 1 a VM is
    stranded or waits / HOST answers or is asleep (docs/power.md) / the plan is refused / fencing failed / a step
    failed / the cluster is locked, 2 bad input, 130 interrupted (a running
    step finishes first).
    """
    from acting.definitions import DefinitionStore
    from acting.fence import fence_host
    from acting.lock import resolve_url
    from acting.recovery import NotFailed, RecoveryRun, recover_host
    from cli.common import acting_on, apply_exit_code, load_cluster, render_plan, render_report, steps_shown
    from vcsched.formats.cluster import ClusterHost

    cluster = load_cluster(cluster_file)
    cluster.host(host)
    store = DefinitionStore.for_url(resolve_url(coordination, cluster.coordination), cluster.name)
    out: dict[str, Any] = {"host": host}
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=True) as (uow, inventory), steps_shown(quiet=as_json) as shown:

        def planned(run: RecoveryRun) -> None:  # said before anything changes
            recovery = run.recovery
            out["down"] = inventory.host(host).down
            out["recovery"] = recovery.to_dict()
            out["plan"] = None if recovery.plan is None else recovery.plan.to_dict()
            if not as_json:
                _render(host, out["down"], recovery, len(run.records))
                if recovery.plan is not None:
                    render_plan(recovery.plan, inventory)
            if do_apply and recovery.plan is not None:
                shown.start(recovery.plan)

        def fence(target: ClusterHost) -> FenceResult:  # once the plan is validated whole (acting/recovery.py)
            result = fence_host(target)
            out["fence"] = result.to_dict()
            if result.fenced and not as_json:
                console.print(f"[green]fenced[/]: {result.detail} ({result.seconds:.1f} s)", highlight=False)
            return result

        try:
            run = recover_host(uow, cluster, store, inventory, host, fence=fence, planned=planned,
                               on_step=shown.step)
        except NotFailed as exc:
            advice = (f"`vcsched power wake {host} --apply` wakes it" if exc.asleep
                      else f"`vcsched drain {host}` moves its VMs")
            return _refused(out, f"{exc}; nothing changed ({advice})", as_json)
        shown.stop()
        recovery, report = run.recovery, run.report
        if run.refused is not None and do_apply:
            done = f"{host} was fenced" if run.fence is not None else "nothing fenced"
            return _refused(out, f"the recovery plan does not hold on the live cluster: {run.refused}; {done}, "
                            "nothing restarted", as_json)
        if run.refused is not None:
            return _refused(out, f"--apply would refuse: the recovery plan does not hold on the live cluster: "
                            f"{run.refused}; nothing fenced, nothing restarted", as_json)
        if run.fence is not None and not run.fence.fenced:  # its VMs may still run there
            return _refused(out, f"{run.fence.detail}: nothing restarted", as_json)
        if report is not None:
            out["apply"] = report.to_dict()
            if not as_json:
                render_report(report)
        elif recovery.plan is not None and not do_apply and not as_json:
            console.print("dry run: nothing changed (use --apply to fence and create)")
    code = apply_exit_code(report) if report is not None else EXIT_OK
    if as_json:
        emit_json({"ok": code == EXIT_OK and not recovery.stranded and not recovery.waiting, **out})
    if recovery.stranded:
        return refuse(f"{len(recovery.stranded)} VM(s) of {host} stranded: "
                      + "; ".join(f"{vm}: {why}" for vm, why in recovery.stranded[:3]))
    if recovery.waiting:
        return refuse(f"{len(recovery.waiting)} VM(s) of {host} not restarted yet: {recovery.waiting[0][1]}")
    return code


def _refused(out: dict[str, Any], reason: str, as_json: bool) -> int:
    out["refused"] = reason
    if as_json:
        emit_json({"ok": False, **out})
    else:
        console.print(f"[red]not recovered[/]: {reason}", highlight=False)
    return refuse(reason)


def _render(host: str, down: str, recovery: Recovery, recorded: int) -> None:
    console.print(f"host {host} is down ({down}); {recorded} VM(s) recorded on it", highlight=False)
    if recovery.fence and recovery.plan is not None:
        console.print(f"1. fence {host} (its fence agent: off, then status must say off)", highlight=False)
        for i, (vm, target) in enumerate(recovery.restarts, start=2):
            console.print(f"{i}. create {vm} on {target}", highlight=False)
    for vm, where in recovery.running:
        console.print(f"{vm}: already runs on {where}", highlight=False)
    for vm, why in recovery.waiting:
        console.print(f"[yellow]waits[/]: {vm}: {why}", highlight=False)
    for vm, why in recovery.stranded:
        console.print(f"[yellow]stranded[/]: {vm}: {why}", highlight=False)
    for vm, got, floor in recovery.below_floor:
        console.print(f"[yellow]below its floor[/]: {vm} at yield {got:.4f}, min_yield {floor:g} (on_failure = "
                      '"restart": running below its floor rather than not at all)', highlight=False)
    if recovery.min_yield is not None:
        console.print(f"min yield after: {recovery.min_yield:.4f}", highlight=False)
