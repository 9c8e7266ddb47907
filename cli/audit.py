"""``vcsched audit``: each plan vcsched applied, and each recommendation an operator approved, predicted against
achieved once it settled (docs/audit.md)."""

from __future__ import annotations

import time
from typing import Any

import click

from cli.app import EXIT_OK, console, emit_json
from cli.params import check_coordination, cluster_option, json_option


def _when(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t))


def _gain(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"


def _yield(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render_audits(docs: list[dict[str, Any]]) -> None:
    from cli.tables import FitTable

    plans = FitTable(title="plans audited (newest first): gain of the lowest yield among the VMs each touched")
    for col in ("plan", "kind", "by", "applied", "settled", "predicted gain", "achieved gain", "result"):
        plans.add_column(col, justify="right" if "gain" in col else "left", key=col == "plan")
    for d in docs:
        plans.add_row(d["plan"], d["kind"], d["source"], _when(d["applied_at"]), f"{d['settle_seconds']:g} s",
                      _gain(d["predicted_gain"]), _gain(d["achieved_gain"]), d["result"])
    console.print(plans)
    vms = FitTable(title="per VM: yield before -> after, predicted (cap over need) and achieved (use over need)")
    for col in ("plan", "VM", "need", "predicted", "achieved", "predicted gain", "achieved gain"):
        vms.add_column(col, justify="left" if col in ("plan", "VM") else "right", key=col in ("plan", "VM"))
    for d in docs:
        for v in d["vms"]:
            vms.add_row(d["plan"], v["vm"], f"{v['need_cores']:.3f}",
                        f"{_yield(v['predicted_before'])} -> {_yield(v['predicted_after'])}",
                        f"{_yield(v['achieved_before'])} -> {_yield(v['achieved_after'])}",
                        _gain(v["predicted_gain"]), _gain(v["achieved_gain"]))
    console.print(vms)


@click.command("audit")
@cluster_option()
@click.option("--last", "last", type=click.IntRange(min=1), default=10, show_default=True, metavar="N",
              help="How many of the newest audited plans to show.")
@json_option("Print one JSON object: audits (newest first), each with its VMs.")
@click.option("--coordination", metavar="URL", default=None, callback=check_coordination,
              help="Where the audits live, beside the recommendations (default: the cluster file's).")
def audit_cmd(cluster_file: str | None, last: int, as_json: bool, coordination: str | None) -> int:
    """Show how the last plans did: predicted against achieved yield, per plan and per VM.

    \b
    `vcsched run` audits every plan it applies, and every recommendation
    an operator approves (`--mode recommend`), once it has settled
    (`run --audit-after`, default 2 windows): each VM the plan touched is
    measured over the window that ends then.  Its achieved yield is the
    CPU it used over the need the plan predicted against, before and
    after; the plan's predicted gain is that of the lowest yield among its
    VMs, and so is its achieved gain.  "short": achieved under predicted by
    more than 0.05 (the model is wrong here: contention the caps do not
    see, a need misjudged); "unmeasured": no VM had samples.  Reads only.

    Exit codes: 0 listed, 1 the coordination service is down, 2 bad input.
    """
    from acting.audits import AuditStore
    from cli.common import load_cluster
    from cli.recommend import shared_at

    cluster = load_cluster(cluster_file)
    log = AuditStore(*shared_at(cluster, coordination)).read()
    docs = [a.to_dict() for a in log.last(last)]
    if as_json:
        emit_json({"audits": docs})
        return EXIT_OK
    if not docs:
        console.print("no plan audited yet (`vcsched run` audits each plan --audit-after windows after applying it)")
        return EXIT_OK
    render_audits(docs)
    return EXIT_OK
