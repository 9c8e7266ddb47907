"""``vcsched place``: admission decision and plan for a virtual-cluster request; ``--apply`` carries it out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from cli.app import console, emit_json, refuse
from cli.common import (
    acting_on,
    apply_exit_code,
    apply_would_refuse,
    check_request_boot,
    hosts_down,
    load_cluster,
    load_request,
    render_plan,
    render_report,
    run_apply,
    save_plan,
)
from cli.params import cluster_option, json_option, lock_options, output_option, policy_options
from vcsched.control.admission import Decision, admit
from vcsched.control.failover import keep_failover_room
from vcsched.formats.request import Request
from vcsched.formats.units import format_size
from vcsched.formats.words import plural
from vcsched.inventory import Inventory
from vcsched.model import SolveOptions
from vcsched.solvers.registry import algorithms

if TYPE_CHECKING:
    from acting.unit_of_work import UnitOfWork
    from vcsched.formats.cluster import Cluster


def render_decision(request: Request, decision: Decision, inventory: Inventory) -> None:
    if not decision.admitted:
        console.print(f"[red]refused[/] {request.name}: {decision.reason}")
        return
    assert decision.plan is not None
    console.print(f"[green]admitted[/] {request.name}: {plural(request.vms, 'VM')} of {plural(request.vcpus, 'vCPU')}"
                  f", {format_size(request.memory_bytes)}")
    for unmet in decision.detail.get("unmet_preferred", []):  # type: ignore[attr-defined]
        console.print(f"[yellow]note[/]: preferred rule not honoured: {unmet}", highlight=False)
    for note in decision.detail.get("fallback", []):  # type: ignore[attr-defined]
        console.print(f"[yellow]note[/]: {note}", highlight=False)
    render_plan(decision.plan, inventory)


@click.command("place")
@click.argument("request_file", metavar="REQUEST.toml", type=click.Path(dir_okay=False))
@cluster_option()
@click.option("-a", "--algorithm", default="mcb8", show_default=True, metavar="NAME",
              help="Placement algorithm from the registry (mcb1..mcb8, gr, sg, gb, sgb, milp, ...).")
@output_option("Save the plan for `vcsched apply` (written only when the request is admitted).", "PLAN.json")
@click.option("--apply", "do_apply", is_flag=True, help="Carry the plan out now: create the VMs, set the caps.")
@json_option("Print one JSON object (decision, plan, apply report).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed for randomized algorithms.")
@policy_options()
@lock_options()
def place_cmd(request_file: str, cluster_file: str | None, algorithm: str, output: str | None, do_apply: bool,
              as_json: bool, seed: int, policy: str | None, alpha: float | None, wait: float,
              coordination: str | None, lock_ttl: float | None) -> int:
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
      disk_bps = "20MiB"    optional: disk bytes/s a VM uses alone; net_bps likewise (hosts
                            declare theirs in the cluster file: disk_bps, net_bps)
      weight = 2.0          optional weight (drf, pf, hdrf); tenant = "ads" its [[tenants]] leaf (hdrf)

    Under a sharing policy (--policy, else the cluster file's policy = "...";
    docs/policies.md) the yields are the policy's, over CPU and every extra
    resource; min_yield floors stay promises in yield.

    Running VMs stay on their hosts; the new VMs go where the algorithm finds
    the highest minimum yield for the whole cluster, then spare CPU is shared
    out (average-yield phase).  Caps = yield x CPU need, in cores.  Nothing
    changes without --apply.

    With --apply the command holds the cluster lock from reading the hosts to
    the last step, so a second operator's command waits (--wait) or is refused
    naming the holder; the plan is checked whole before its first step and
    each step again right before it acts (docs/plans.md).

    When the hosts on refuse the request and waking one host that vcsched's
    power saving put to sleep would admit it (docs/power.md), --apply wakes
    that host first (the quickest to wake; never one whose wake failed), waits
    until it answers as itself, and admits on the cluster as it then is; the
    dry run names the host it would wake (its plan is not saved with -o: a
    saved plan wakes no host).  A refusal names each sleeping host no wake
    chooses, with why (its last wake failed: `vcsched power clear HOST`).

    Exit codes: 0 admitted (and applied), 1 refused, the wake failed, a step
    failed or the cluster is locked, 2 bad input (nothing changed), 130 --apply
    interrupted by Ctrl-C (after the running step).  A dry run exits as --apply
    would: 1 where --apply would refuse its plan ("--apply would refuse: ...",
    docs/cli.md, "Dry runs").
    """
    if algorithm not in algorithms():
        raise click.BadParameter(f"unknown algorithm {algorithm!r} (known: {', '.join(sorted(algorithms()))})",
                                 param_hint="'--algorithm'")
    cluster = load_cluster(cluster_file)
    request = load_request(request_file)
    check_request_boot(cluster, request, request_file)
    from vcsched.control.sharing import sharing_for

    sharing = sharing_for(cluster, policy, alpha)  # bad input before any host is read
    def decide(inventory: Inventory) -> Decision:
        return keep_failover_room(cluster, inventory,
                                  admit(cluster, inventory, request, algorithm, SolveOptions(seed=seed), sharing))

    wake: dict[str, object] | None = None
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        decision = decide(inventory)
        report = None
        would_refuse = None
        if not decision.admitted and inventory.asleep_hosts():
            decision, inventory, wake = _by_waking(cluster, uow, inventory, decision, decide, do_apply, as_json,
                                                   coordination)
        if decision.plan is not None:
            if output and wake is None:
                save_plan(decision.plan, output)
            elif output and wake is not None and not do_apply:  # a plan onto a host asleep could not be applied
                from cli.common import notice

                notice(f"plan not saved to {output}: it needs {wake['host']} woken first (`vcsched apply` wakes "
                       "no host); `vcsched place --apply` wakes it and places, or wake it with `vcsched power "
                       f"wake {wake['host']} --apply` and plan again")
            if do_apply:
                if not as_json:
                    render_decision(request, decision, inventory)
                report = run_apply(uow, decision.plan, quiet=as_json, planned_here=True)
            elif wake is None:  # the dry run exits as --apply would (docs/cli.md): the same whole-plan check,
                # reading only (a plan onto a host still asleep is checked by --apply once the host answers)
                would_refuse = apply_would_refuse(uow, decision.plan, inventory)
    if as_json:
        emit_json({"ok": decision.admitted and would_refuse is None and (report is None or report.ok),
                   "admitted": decision.admitted,
                   "reason": decision.reason, "policy": sharing.policy,
                   "detail": decision.detail, "min_yield": decision.min_yield,
                   "avg_yield": decision.avg_yield,
                   "hosts_down": hosts_down(inventory), "wake": wake,
                   "plan": decision.plan.to_dict() if decision.plan else None,
                   **({"refused": f"--apply would refuse: {would_refuse}"} if would_refuse is not None else {}),
                   "applied": report.to_dict() if report else None})
    else:
        if report is None:
            render_decision(request, decision, inventory)
            if wake is not None and not do_apply:
                console.print(f"dry run: --apply would wake {wake['host']} first (the hosts on refuse: "
                              f"{wake['refused_on']}), then create the VMs", highlight=False)
            elif decision.plan is not None and not do_apply:
                console.print(f"dry run: nothing changed{f'; plan saved to {output}' if output else ''}"
                              + (" (--apply to carry it out)" if would_refuse is None else ""))
        else:
            render_report(report)
    if not decision.admitted:
        return refuse(f"{request.name}: {decision.reason}")
    if would_refuse is not None:
        return refuse(f"--apply would refuse: {would_refuse}")
    return apply_exit_code(report)


def _by_waking(cluster: Cluster, uow: UnitOfWork, inventory: Inventory, refused: Decision,
               decide: Callable[[Inventory], Decision], do_apply: bool, quiet: bool, coordination: str | None
               ) -> tuple[Decision, Inventory, dict[str, object] | None]:
    """The decision when the hosts on refuse: with the sleeping host whose wake alone admits (docs/power.md), the
    decision on the cluster with it awake — a dry run's as it would be, --apply's on the cluster read again once
    the host answers (it is woken under this command's lock).  ``(refused, inventory, None)`` when no wake
    helps; a wake that fails is a refusal naming it (the host is then wake-failed)."""
    from acting.power import agents, wake_host
    from cli.common import power_store
    from vcsched.control.power import unwakeable, wake_to_admit, wakeable, woken

    store = power_store(cluster, uow.hv, coordination)
    state = store.read()
    found = wake_to_admit(cluster, inventory, state, decide)
    if found is None:  # said, so that no one wakes a host by hand for nothing (or wonders why none was woken)
        notes = [f"{h} is asleep: {why}" for h, why in unwakeable(cluster, inventory, state).items()]
        could = wakeable(cluster, inventory, state)
        if could:
            every = decide(woken(inventory, state, could))
            notes.append(f"it needs more than one of {', '.join(could)} woken, which place does not do: wake them "
                         "with `vcsched power wake HOST --apply`, then place again" if every.admitted else
                         f"waking {', '.join(could)} would not admit it either ({every.reason})")
        return (dataclasses.replace(refused, reason="; ".join([str(refused.reason), *notes])) if notes else refused,
                inventory, None)
    host, decision = found
    wake: dict[str, object] = {"host": host, "refused_on": refused.reason, "woke": None}
    if not do_apply:
        return decision, inventory, wake
    if not quiet:
        console.print(f"waking {host}: the hosts on refuse ({refused.reason})", highlight=False)
    result = wake_host(uow, cluster, host, store=store, agent=agents(cluster))
    wake |= result.to_dict()
    if not result.woke:
        return dataclasses.replace(refused, reason=f"{refused.reason}; waking {host} failed: {result.reason} "
                                                   f"(it is wake-failed until `vcsched power clear {host}`)"), \
            inventory, wake
    if not quiet:
        console.print(result.reason, highlight=False)  # "host h2 answers again as UUID after S s"
    fresh = uow.inventory()
    return decide(fresh), fresh, wake
