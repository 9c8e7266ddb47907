"""``vcsched repair``: settle in-doubt VMs, the one action that may destroy a paused twin or resume an orphaned
arrival (hypervisor/settlement.py); dry run by default."""

from __future__ import annotations

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.common import cluster_lock, load_cluster
from cli.params import cluster_option, json_option, lock_options
from hypervisor.libvirt_backend import LibvirtHypervisor


@click.command("repair")
@cluster_option()
@click.option("--apply", "do_apply", is_flag=True, help="Carry the repair out (default: only say what it would do).")
@json_option("Print one JSON object: ok, in_doubt, actions, left, refused.")
@lock_options()
def repair_cmd(cluster_file: str | None, do_apply: bool, as_json: bool, wait: float, coordination: str | None,
               lock_ttl: float | None) -> int:
    """Settle VMs left in doubt by an interrupted migration (dry run unless --apply).

    \b
    Reads every host.  A VM running on exactly one host whose other copies
    are paused copies vcsched made: the paused copies are destroyed.  A lone
    paused arrival whose source host answers and has no copy: it is resumed.
    Anything else (two running copies, no running copy, a copy without
    vcsched's metadata) is left to the operator and listed.  Nothing is done
    unless every host answers: a host that does not may hold a copy.

    Without --apply nothing changes: it prints what it would do and why.
    With --apply it holds the cluster lock and reads every copy's host again
    right before each action; a copy that changed meanwhile is skipped.
    Every command that changes hosts does the same first (docs/operations.md,
    "A VM never runs twice").

    Exit codes: 0 nothing to do, done, or a dry run; 1 refused (a host
    down, the lock held), an action failed or was skipped, or a VM is left
    to the operator; 2 bad input.
    """
    cluster = load_cluster(cluster_file)
    with LibvirtHypervisor(cluster) as hv:  # what it did is printed below, once (not as notes)
        if do_apply:
            with cluster_lock(cluster, coordination, wait, ttl=lock_ttl, hv=hv, settle=False) as lock:
                assert lock is not None
                report = hv.repair(lock.guard)
        else:
            report = hv.repair(lambda: None, apply=False)
    troubled = report.plan.refused is not None or bool(report.plan.left) or not report.ok \
        or any(o != "done" for _, o, _ in report.outcomes)
    if as_json:
        emit_json({"ok": not troubled, **report.to_dict()})
    else:
        lines = report.lines()
        if not lines:
            console.print("nothing in doubt: nothing to do")
        if not do_apply and report.plan.actions:
            console.print("dry run: nothing changed (--apply carries it out)")
        for line in lines:
            console.print(line, highlight=False)
    if not troubled:
        return EXIT_OK
    return refuse(report.plan.refused or ("VMs left to the operator: " + ", ".join(report.plan.left)
                                          if report.plan.left else "an action failed or was skipped"))
