"""``vcsched adopt DOMAIN...`` and ``vcsched release VM...``: running domains brought under management and back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.params import FiniteFloatRange, cluster_option, json_option, lock_options

if TYPE_CHECKING:
    from acting.executor import ApplyReport
    from acting.unit_of_work import UnitOfWork
    from vcsched.inventory import Inventory
    from vcsched.plans.plan import Plan


@click.command("adopt")
@click.argument("domains", nargs=-1, required=True, metavar="DOMAIN...")
@cluster_option()
@click.option("--vc", "vc", required=True, metavar="NAME",
              help="The virtual cluster the domains join: an existing one (its floor and rules apply) or a new one.")
@click.option("--need", type=FiniteFloatRange(min=0, min_open=True), default=None, metavar="CORES",
              help="Each domain's CPU need in cores (default: what it can use now, its cap or else every vCPU; "
                   "`vcsched observe` or `run` measures it afterwards).")
@click.option("--min-yield", "min_yield", type=FiniteFloatRange(0, 1), default=None, metavar="Y",
              help="The floor of a new virtual cluster (an existing one keeps its own).")
@click.option("--apply", "do_apply", is_flag=True,
              help="Under the cluster lock: write the metadata, record the definitions, set the caps "
                   "(default: dry run, print the plan).")
@json_option("Print one JSON object: ok, the plan, what was refused and why, the apply report.")
@lock_options()
def adopt_cmd(domains: tuple[str, ...], cluster_file: str | None, vc: str, need: float | None,
              min_yield: float | None, do_apply: bool, as_json: bool, wait: float, coordination: str | None,
              lock_ttl: float | None) -> int:
    """Bring running domains that vcsched did not create under management, where they run.

    \b
    What --apply does, under the cluster lock, for each DOMAIN:
      1. writes vcsched's metadata into it (virtual cluster, CPU need,
         memory, vCPUs, the virtual cluster's floor and rules);
      2. records its definition (its own domain XML) in the definitions
         store, so `recover` and `run` can start it on another host if its
         host fails;
      3. caps it, and re-sets the other managed VMs' caps where the whole
         cluster's yields change (nothing migrates).
    Afterwards it is a managed VM like one `place` created.

    \b
    Refused, naming the reason, nothing changed (exit 1): a domain already
    managed, not running, in doubt, on a host that cannot cap CPU, with a
    device vcsched cannot migrate (host devices passed through, host
    directories, redirected USB, host smartcards, shared memory), or an
    adoption that puts a virtual cluster below its floor.  Bad input (exit 2):
    a name no host of the cluster file has (a domain on a host outside the
    cluster file is unknown: add its host first), a --need above its vCPUs.

    \b
    Examples:
      vcsched adopt legacy --vc old              dry run: what would be recorded and capped
      vcsched adopt legacy db1 --vc old --apply  under the cluster lock
      vcsched release legacy --apply             hand it back (it keeps running)

    docs/introducing.md walks through introducing vcsched into a running
    cluster.  Exit codes: 0 adopted (or would be, dry run), 1 refused / a step
    failed / the cluster is locked, 2 bad input, 130 interrupted.
    """
    from cli.common import acting_on, load_cluster
    from hypervisor.devices import unmigratable_devices
    from vcsched.control.adoption import Domain, Refused, adoption_report, plan_adoption
    from vcsched.formats.units import format_size

    cluster = load_cluster(cluster_file)
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        read: dict[str, Domain] = {}
        for name in domains:
            v = inventory.vm(name)
            if v is not None and v.active and v.meta is None:
                xml = uow.hv.domain_definition(v.host, name)
                read[name] = Domain(xml, tuple(unmigratable_devices(xml)))
        try:
            plan = plan_adoption(cluster, inventory, list(domains), vc, need=need, min_yield=min_yield, domains=read)
        except Refused as exc:
            return _refused(str(exc), as_json)
        said = adoption_report(cluster, plan)
        if not as_json:
            for d in said:
                console.print(f"{d['vm']} on {d['host']}: joins virtual cluster {d['virtual_cluster']}, "
                              f"{d['vcpus']} vCPU, {format_size(int(str(d['memory_bytes'])))}, need "
                              f"{d['cpu_need_cores']:.3f} cores, cap {d['cap_cores']:.3f}, floor "
                              f"{'-' if d['min_yield'] is None else d['min_yield']}; its domain XML is recorded\n"
                              f"  migrate: {d['migrate']}; restart on another host: {d['restart']}", highlight=False)
        return _carry_out(uow, inventory, plan, do_apply, as_json, "adopted", {"domains": said})


@click.command("release")
@click.argument("vms", nargs=-1, required=True, metavar="VM...")
@cluster_option()
@click.option("--apply", "do_apply", is_flag=True,
              help="Under the cluster lock: lift the caps, remove the metadata and the records (default: dry run).")
@json_option("Print one JSON object: ok, the plan, what was refused and why, the apply report.")
@lock_options()
def release_cmd(vms: tuple[str, ...], cluster_file: str | None, do_apply: bool, as_json: bool, wait: float,
                coordination: str | None, lock_ttl: float | None) -> int:
    """Hand managed VMs back: remove their caps, vcsched's metadata and their records; they keep running.

    \b
    Each VM then runs uncapped where it is, unmanaged: vcsched never touches
    it again, and reserves its CPU on its host like any unmanaged domain's
    (docs/introducing.md).  The other VMs' caps stay until the next `adapt`
    or controller interval.

    \b
    Examples:
      vcsched release legacy            dry run
      vcsched release legacy --apply    under the cluster lock

    Exit codes: 0 released (or would be, dry run), 1 a VM is not managed /
    in doubt / a step failed / the cluster is locked, 2 bad input (a name no
    host has), 130 interrupted.
    """
    from cli.common import acting_on, load_cluster
    from vcsched.control.adoption import Refused, plan_release

    cluster = load_cluster(cluster_file)
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        try:
            plan = plan_release(cluster, inventory, list(vms))
        except Refused as exc:
            return _refused(str(exc), as_json)
        return _carry_out(uow, inventory, plan, do_apply, as_json, "released")


def _refused(reason: str, as_json: bool) -> int:
    if as_json:
        emit_json({"ok": False, "refused": reason, "plan": None})
    else:
        console.print(f"[red]refused[/]: {reason}; nothing changed", highlight=False)
    return refuse(reason)


def _carry_out(uow: UnitOfWork, inventory: Inventory, plan: Plan, do_apply: bool, as_json: bool,
               done: str, said: dict[str, Any] | None = None) -> int:
    """Print the plan, apply it with --apply (its steps recorded in the definitions store), say the outcome."""
    from cli.common import apply_exit_code, apply_would_refuse, render_plan, render_report, run_apply

    if not as_json:
        render_plan(plan, inventory)
    report: ApplyReport | None = None
    if do_apply:
        report = run_apply(uow, plan, quiet=as_json, planned_here=True)
        if not as_json:
            render_report(report)
    else:
        why = apply_would_refuse(uow, plan)  # the dry run exits as --apply would (docs/cli.md)
        if why is not None:
            return _refused(f"--apply would refuse: {why}", as_json)
        if not as_json:
            console.print(f"dry run: nothing changed (use --apply to have them {done})")
    code = apply_exit_code(report) if report is not None else EXIT_OK
    if as_json:
        emit_json({"ok": code == EXIT_OK, **(said or {}), "plan": plan.to_dict(),
                   "apply": report.to_dict() if report is not None else None})
    return code
