"""``vcsched repair``: settle in-doubt VMs, the one action that may destroy a paused twin or resume an orphaned
arrival (hypervisor/settlement.py); dry run by default."""

from __future__ import annotations

import click

from cli.app import EXIT_OK, EXIT_UNSATISFIED, console, emit_json
from cli.common import cluster_lock, cluster_option, load_cluster, lock_options
from hypervisor.libvirt_backend import LibvirtHypervisor


@click.command("repair")
@cluster_option()
@click.option("--apply", "do_apply", is_flag=True, help="Carry the repair out (default: only say what it would do).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: in_doubt, actions, left, refused.")
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
    from hypervisor.journal import JournalReport, describe_journal, restore_journal

    cluster = load_cluster(cluster_file)
    journal = JournalReport()
    with LibvirtHypervisor(cluster) as hv:  # what it did is printed below, once (not as notes)
        if do_apply:
            with cluster_lock(cluster, coordination, wait, ttl=lock_ttl, hv=hv, settle=False) as lock:
                assert lock is not None
                report = hv.repair(lock.guard)
                journal = restore_journal(hv, guard=lock.guard)
            journaled = list(journal.restored) + [f"not put back: {p}" for p in journal.problems]
        else:
            report = hv.repair(lambda: None, apply=False)
            journaled = describe_journal()
    if as_json:
        emit_json({**report.to_dict(), "journal": journal.to_dict() if do_apply else {"pending": journaled}})
    else:
        lines = report.lines()
        if not lines and not journaled:
            console.print("nothing in doubt: nothing to do")
        if not do_apply and (report.plan.actions or journaled):
            console.print("dry run: nothing changed (--apply carries it out)")
        for line in lines + journaled:
            console.print(line, highlight=False, markup=False)
    troubled = report.plan.refused is not None or bool(report.plan.left) or not report.ok \
        or any(o != "done" for _, o, _ in report.outcomes) or bool(journal.problems)
    return EXIT_UNSATISFIED if troubled else EXIT_OK
