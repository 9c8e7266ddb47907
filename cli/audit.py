"""``vcsched audit``: each plan a controller applied, its predicted gain against the gain it achieved."""

from __future__ import annotations

import time
from pathlib import Path

import click

from cli.app import EXIT_OK, console, emit_json
from cli.params import json_option


@click.command("audit")
@click.option("--events", "events_file", type=click.Path(dir_okay=False), required=True,
              help="The controller's event log (`vcsched run --log FILE`).")
@click.option("--last", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="How many of the latest audited plans to show.")
@json_option("Print one JSON object: audits (oldest first).")
def audit_cmd(events_file: str, last: int, as_json: bool) -> int:
    """List the last plans `vcsched run` applied with the gain each predicted and the gain it achieved.

    \b
    Once a plan has settled (`vcsched run --audit-windows`, default two
    windows), the controller measures the VMs it touched: per sample, a VM
    that neither hit its cap nor waited for a host CPU achieved yield 1; one
    that did achieved what it used over its need.  The gain is the lowest
    yield after less the lowest before, predicted (caps over the needs it
    planned with) and achieved (measured in the window before the plan and
    the window after it settled).  A shortfall (predicted less achieved)
    that lasts says the model is wrong here: a busy host, a need estimate
    that is only a lower bound ("censored", docs/contention.md), a cap that
    does not hold.  Reads the log only; changes nothing.

    Exit codes: 0 shown, 1 the log cannot be read, 2 bad input.
    """
    from acting.events import EventTail
    from cli.app import refuse
    from vcsched.control.audit import audits_of

    tail = EventTail(Path(events_file))
    try:
        tail.poll()
    except OSError as exc:
        return refuse(f"--events {events_file}: cannot read ({exc.strerror or exc})")
    audits = audits_of(tail.events)[-last:]
    if as_json:
        emit_json({"ok": True, "audits": [a.to_dict() for a in audits]})
        return EXIT_OK
    if not audits:
        console.print("no plan audited yet (each is audited once it has settled)")
        return EXIT_OK
    from cli.tables import FitTable

    table = FitTable(title="applied plans: predicted against achieved min-yield gain (≤: a need was censored)")
    for col in ("applied", "kind", "VMs", "predicted", "achieved", "shortfall"):
        table.add_column(col, justify="left" if col in ("applied", "kind", "VMs") else "right", key=col == "applied")
    for a in audits:
        mark = "≤" if a.censored else ""
        table.add_row(time.strftime("%m-%d %H:%M:%S", time.localtime(a.applied_at)), a.kind,
                      ", ".join(sorted(a.per_vm)), f"{mark}{a.predicted_gain:+.3f}",
                      "-" if a.achieved_gain is None else f"{a.achieved_gain:+.3f}",
                      "-" if a.shortfall is None else f"{a.shortfall:+.3f}")
    console.print(table)
    return EXIT_OK
