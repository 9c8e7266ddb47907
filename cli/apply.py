"""``vcsched apply``: carry out a saved plan, idempotently."""

from __future__ import annotations

import click

from cli.app import console, emit_json, read_json_file
from cli.common import (
    apply_exit_code,
    cluster_lock,
    load_cluster,
    notice,
    render_hosts_down,
    render_plan,
    render_report,
    run_apply,
)
from cli.params import cluster_option, json_option, lock_options
from hypervisor.libvirt_backend import LibvirtHypervisor
from vcsched.plans.plan import plan_from_dict


@click.command("apply")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False))
@cluster_option()
@click.option("--force", is_flag=True,
              help="Apply even if the cluster changed since the plan was computed (its snapshot differs).")
@json_option("Print the apply report as one JSON object.")
@lock_options()
def apply_cmd(plan_file: str, cluster_file: str | None, force: bool, as_json: bool, wait: float,
              coordination: str | None, lock_ttl: float | None) -> int:
    """Apply a plan saved by `vcsched place -o PLAN.json` or `vcsched adapt -o PLAN.json`.

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

    The command holds the cluster lock throughout (--wait to wait for another
    holder).  Ctrl-C stops after the running step and reports what was done.

    Exit codes: 0 applied (or nothing to do), 1 refused (the cluster changed,
    the plan no longer fits, the cluster is locked; nothing done) or a step
    failed (its reason on stderr), 2 bad input (a missing or malformed plan
    or cluster file; nothing done), 130 interrupted by Ctrl-C (after the
    running step; the report says what was done).
    """
    plan = plan_from_dict(read_json_file(plan_file, "plan"))
    cluster = load_cluster(cluster_file)
    with LibvirtHypervisor(cluster, on_notice=notice) as hv, \
            cluster_lock(cluster, coordination, wait, ttl=lock_ttl, hv=hv) as lock:
        if not as_json:
            console.print(f"plan for cluster [bold]{plan.cluster}[/] ({plan.kind}, {len(plan.steps)} steps)")
            inventory = hv.inventory()
            render_hosts_down(inventory)
            render_plan(plan, inventory)
        report = run_apply(hv, plan, force=force, quiet=as_json, lock=lock)
    if as_json:
        emit_json(report.to_dict())
    else:
        render_report(report)
    return apply_exit_code(report)
