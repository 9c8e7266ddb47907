"""``vcsched repair``: settle in-doubt VMs, the one action that may destroy a paused twin or resume an orphaned
arrival (hypervisor/settlement.py); dry run by default."""

from __future__ import annotations

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.common import load_cluster
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
    Every command that changes hosts does the same first (docs/repair.md,
    "A VM never runs twice").

    It also puts back what a vcsched process killed by SIGKILL (or a crash)
    left changed for a while, from the journals under the state directory
    (hypervisor/journal.py): caps a probe of this cluster had raised (`run`,
    `observe --probe`), and the pinning, running state and caps of domains a
    `calibrate --backend libvirt` was measuring.  A journal whose process
    still runs is left to it.

    Exit codes: 0 nothing to do, done, or a dry run; 1 refused (a host
    down, the lock held), an action failed or was skipped, a VM is left
    to the operator, or a journaled setting could not be put back; 2 bad
    input.
    """
    from acting.restore import restore_journal
    from acting.unit_of_work import for_cluster
    from hypervisor.journal import JournalReport, describe_journal

    cluster = load_cluster(cluster_file)
    journal = JournalReport()
    # settle=False: settling is this command's result, printed below once, not a first step noted on stderr
    with LibvirtHypervisor(cluster) as hv, \
            for_cluster(cluster, hv, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                        settle=False) as uow:
        report = uow.settle_in_doubt()
        if do_apply:
            journal = restore_journal(hv, guard=uow.lock_guard)
            journaled = list(journal.restored) + [f"not put back: {p}" for p in journal.problems]
        else:
            journaled = describe_journal()
    troubled = report.plan.refused is not None or bool(report.plan.left) or bool(report.plan.waiting) \
        or not report.ok \
        or any(o != "done" for _, o, _ in report.outcomes) or bool(journal.problems)
    if as_json:
        emit_json({"ok": not troubled, **report.to_dict(),
                   "journal": journal.to_dict() if do_apply else {"pending": journaled}})
    else:
        lines = report.lines()
        if not lines and not journaled:
            console.print("nothing in doubt: nothing to do")
        if not do_apply and (report.plan.actions or journaled):
            console.print("dry run: nothing changed (--apply carries it out)")
        for line in lines + journaled:
            console.print(line, highlight=False, markup=False)
    if not troubled:
        return EXIT_OK
    if report.plan.refused:
        return refuse(report.plan.refused)
    if report.plan.left:
        return refuse("VMs left to the operator: " + ", ".join(report.plan.left))
    if report.plan.waiting:
        return refuse("VMs not settled yet: " + "; ".join(report.plan.waiting))
    if journal.problems:
        return refuse("journaled settings not put back: " + "; ".join(journal.problems))
    return refuse("an action failed or was skipped")
