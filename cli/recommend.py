"""``vcsched recommendations`` / ``approve`` / ``skip``: an operator in the loop of `vcsched run --mode recommend`
(docs/recommendations.md)."""

from __future__ import annotations

import time
from typing import Any

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.params import Duration, check_coordination, cluster_option, json_option, lock_options


def shared_at(cluster: Any, coordination: str | None, hv: Any = None) -> tuple[str, str]:
    """Where the cluster's shared documents live (recommendations, audits): the coordination URL and the key of
    its lock (the hosts' identities)."""
    from acting.lock import resolve_url
    from acting.lock_names import lock_keys
    from cli.common import host_identities

    url = resolve_url(coordination, cluster.coordination)
    return url, lock_keys(url, cluster.name, host_identities(cluster, hv), record=False)[0]


def _store(cluster: Any, coordination: str | None, hv: Any = None) -> Any:
    """The cluster's recommendations book, named like its lock (the hosts' identities)."""
    from acting.recommendations import RecommendationStore

    return RecommendationStore(*shared_at(cluster, coordination, hv))


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%m-%d %H:%M:%S", time.localtime(t))


def render_recommendation(doc: dict[str, Any]) -> None:
    from cli.tables import FitTable
    from vcsched.formats.units import format_size

    e = doc["effect"]
    # Each time starts a line of its own: wrapped at 80 columns, a line never parts a date from its hour.
    # The state is escaped: rich read "[open]" as a style and showed nothing.
    console.print(f"[bold]{doc['id']}[/] {doc['kind']} \\[{doc['state']}]", highlight=False)
    console.print(f"  made {_when(doc['made_at'])} by {doc['made_by'] or '?'}", highlight=False)
    console.print(f"  valid until {_when(doc['valid_until'])}", highlight=False)
    console.print(f"  why: {doc['reason']}", highlight=False)
    def le(key: str) -> str:  # "≤": attained by a VM whose need estimate is censored (docs/contention.md)
        return "≤" if e.get(f"{key}_upper_bound") else ""

    console.print(f"  min yield {le('min_yield_before')}{e['min_yield_before']:.3f} -> "
                  f"{le('min_yield_after')}{e['min_yield_after']:.3f}, mean yield "
                  f"{e['mean_yield_before']:.3f} -> {e['mean_yield_after']:.3f}, moves "
                  f"{format_size(e['bytes_to_move'])}", highlight=False)
    power = e.get("power")
    if power:  # a sleep or a wake (acting/power_saving.py)
        what = (f"saves {power['watts_saved']:g} W while asleep" if power.get("watts_saved") is not None
                else "no idle_watts declared") if power["action"] == "sleep" else \
            f"wakes in {power['wake_s']:.0f} s ({'measured' if power.get('measured') else 'assumed: wake_time'})"
        console.print(f"  {power['action']} host {power['host']}: {what}", highlight=False)
    if doc.get("detail"):
        console.print(f"  {doc['detail']}", highlight=False)
    if not doc["steps"]:  # a sleep of an empty host, a wake: an empty table said nothing
        console.print("  steps: none (no VM moves)", highlight=False)
        return
    table = FitTable(title=f"{doc['id']}: steps")
    for col in ("#", "step", "VM", "host", "cap", "yield before -> after", "why"):
        table.add_column(col, justify="right" if col in ("#", "cap") else "left", key=col in ("#", "VM"),
                         wrap=col == "why")
    for i, s in enumerate(doc["steps"]):
        per = e["per_vm"].get(s["vm"], {})
        host = f"{s['from']} -> {s['to']}" if s["op"] == "migrate" else str(s.get("host", ""))
        cap = s.get("cap_cores")
        yb, ya = per.get("yield_before"), per.get("yield_after")
        mark = "≤" if per.get("yield_upper_bound") else ""
        ys = "-" if yb is None or ya is None else f"{mark}{yb:.3f} -> {mark}{ya:.3f}"
        table.add_row(str(i + 1), s["op"], s["vm"], host, "-" if cap is None else f"{cap:.3f}", ys, s["reason"])
    console.print(table)


@click.command("recommendations")
@cluster_option()
@click.option("--all", "show_all", is_flag=True, help="Also those approved, applied, skipped, superseded, expired.")
@json_option("Print one JSON object: recommendations, vetoes.")
@click.option("--coordination", metavar="URL", default=None, callback=check_coordination,
              help="Where the recommendations live (as for the cluster lock; default: the cluster file's).")
def recommendations_cmd(cluster_file: str | None, show_all: bool, as_json: bool, coordination: str | None) -> int:
    """List what `vcsched run --mode recommend` proposes: reason, predicted yields, steps.

    \b
    Each recommendation has an id, the steps it would apply (caps,
    migrations), why (the controller's reason and one per step), the
    predicted effect (min and mean yield before and after, per affected VM,
    bytes to move), when it was made and until when it may be approved.
    `vcsched approve ID` applies one, `vcsched skip ID` vetoes it.  Reads
    only.  Exit codes: 0 listed, 1 the coordination service is down,
    2 bad input.
    """
    from cli.common import load_cluster
    from vcsched.control.recommend import OPEN

    cluster = load_cluster(cluster_file)
    book = _store(cluster, coordination).read()
    now = time.time()
    docs = [r.to_dict(now) for r in book.recommendations if show_all or r.state_at(now) == OPEN]
    if as_json:
        emit_json({"recommendations": docs, "vetoes": [v.to_dict() for v in book.vetoes if v.until > now]})
        return EXIT_OK
    if not docs:
        console.print("no open recommendation" + ("" if show_all else " (--all shows the others)"))
    for doc in docs:
        render_recommendation(doc)
    for v in book.vetoes:
        if v.until > now:
            console.print(f"veto {v.id}: {', '.join(v.vms)} stay put until {_when(v.until)}", highlight=False)
    return EXIT_OK


@click.command("approve")
@click.argument("rec_id", metavar="ID")
@cluster_option()
@json_option("Print one JSON object: ok, the recommendation, the apply report.")
@lock_options()
def approve_cmd(rec_id: str, cluster_file: str | None, as_json: bool, wait: float, coordination: str | None,
                lock_ttl: float | None) -> int:
    """Apply recommendation ID now, under the cluster lock, if it still holds.

    \b
    Its plan is re-validated against the live inventory first, as `vcsched
    apply` does (the snapshot, the whole plan replayed, its claims): a
    cluster that changed so that it no longer holds, a recommendation past
    its validity or already approved, skipped or superseded is refused
    (exit 1, the reason on stderr), nothing changed.  An operator's approval
    is not bound by the maintenance windows; migrations keep to the
    cluster file's throttles.  Every VM it touches is checked against its
    floor (its min_yield, at least the cluster file's) with the running
    controller's current estimates of the needs (the declared needs when no
    controller wrote any in the last 10 minutes): one that would end below
    it is refused, naming the VM.  An ID superseded by the same proposal
    made again approves that one (and says so); superseded by a different
    one, the refusal names it.

    \b
    A sleep or a wake proposed under power_saving = "recommend" is
    re-validated the same way (the host may still sleep and its
    evacuation still holds; or the host still sleeps, its wake not
    failed), then carried out as `vcsched run` would: evacuate, verify
    empty, power off and verify off; or power on and wait for the host to
    answer as itself (docs/power.md).  A sleep or wake that fails exits 1.

    Exit codes: 0 applied, 1 refused / a step failed / the cluster is
    locked, 2 bad input (an unknown ID), 130 interrupted (the running step
    finishes; the report says what was done).
    """
    from acting.approval import approve
    from acting.lock import member_id
    from acting.unit_of_work import for_cluster
    from cli.common import apply_exit_code, load_cluster, notice, power_store, render_report, reporting, run_apply
    from hypervisor.libvirt_backend import LibvirtHypervisor

    cluster = load_cluster(cluster_file)
    with LibvirtHypervisor(cluster, on_notice=notice) as hv:
        store = _store(cluster, coordination, hv)
        store.read().get(rec_id)  # an unknown id is bad input before any lock is taken
        with for_cluster(cluster, hv, apply=True, coordination=coordination, wait=wait, ttl=lock_ttl,
                         reporting=reporting()) as uow:
            done = approve(uow, cluster, store, rec_id, member=member_id(),
                           note=lambda line: None if as_json else console.print(line, highlight=False),
                           apply=lambda plan: run_apply(uow, plan, quiet=as_json),
                           power=lambda: power_store(cluster, uow.hv, coordination),
                           carrying_out=None if as_json else console.status)
    rec = done.recommendation
    if done.power is not None:  # a sleep or a wake (acting/power_saving.py)
        if as_json:
            emit_json({"ok": done.ok, "recommendation": rec.to_dict(time.time()), "power": done.power.to_dict(),
                       "note": done.note})
        else:
            console.print(f"recommendation {rec.id}: {rec.state}: {done.power.reason}", highlight=False)
        return EXIT_OK if done.ok else refuse(f"recommendation {rec.id} failed: {done.power.reason}")
    report = done.report
    assert report is not None
    if as_json:
        emit_json({"ok": report.ok, "recommendation": rec.to_dict(time.time()), "apply": report.to_dict(),
                   "note": done.note})
    else:
        render_report(report)
        console.print(f"recommendation {rec.id}: {rec.state}", highlight=False)
    return apply_exit_code(report)


@click.command("skip")
@click.argument("rec_id", metavar="ID")
@cluster_option()
@click.option("--for", "veto_s", type=Duration(), default="1h", show_default=True,
              help="How long the controller keeps the VMs it would have moved where they are (and a skipped "
                   "sleep's host on).")
@json_option("Print one JSON object: ok, the recommendation.")
@click.option("--coordination", metavar="URL", default=None, callback=check_coordination,
              help="Where the recommendations live (as for the cluster lock; default: the cluster file's).")
def skip_cmd(rec_id: str, cluster_file: str | None, veto_s: float, as_json: bool, coordination: str | None) -> int:
    """Veto recommendation ID: it is closed, and the controller does not move its VMs again for --for.

    A skipped sleep (power saving, docs/power.md) also keeps its host on for
    --for: it is not proposed, nor put to sleep, again until then.  A
    skipped wake is only closed (the room it was for comes first).  An ID
    superseded by the same proposal made again skips that one (and says so);
    superseded by a different one, the refusal names it.  Changes no host.

    Exit codes: 0 skipped, 1 already decided (approved, applied, skipped,
    superseded by a different proposal), 2 bad input (an unknown ID).
    """
    from acting.lock import member_id
    from cli.common import load_cluster
    from vcsched.control import recommend as rc

    cluster = load_cluster(cluster_file)
    store = _store(cluster, coordination)
    _, note = rc.resolve(store.read(), rec_id, time.time())
    rec = store.update(lambda book: rc.skip(book, rec_id, time.time(), member_id(), veto_s))
    if as_json:
        emit_json({"ok": True, "recommendation": rec.to_dict(time.time()), "note": note})
    else:
        if note is not None:
            console.print(note, highlight=False)
        console.print(f"recommendation {rec.id} skipped: {rec.detail}", highlight=False)
    return EXIT_OK
