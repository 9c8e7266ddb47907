"""``vcsched power``: each host's power state, the energy saved, the next decision; sleep, wake and clear a host.

Thin: the decision is :mod:`vcsched.control.power` (pure), the acting :mod:`acting.power` (through the unit of
work); this module parses, calls and renders (docs/power.md).
"""

from __future__ import annotations

import time
from typing import Any

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.common import acting_on, load_cluster, power_store, render_plan
from cli.params import Bytes, Duration, cluster_option, json_option, lock_options
from vcsched.formats.cluster import Cluster
from vcsched.formats.units import UNLIMITED, format_budget
from vcsched.inventory import Inventory

#: The energy window `power status` reports by default.
DEFAULT_WINDOW_S = 86400.0
J_PER_KWH = 3.6e6


@click.group("power")
def power_cmd() -> None:
    """Power saving: which hosts sleep, the energy saved, the next decision; sleep, wake or clear a host.

    \b
    A host that vcsched put to sleep was emptied by live migration, seen
    empty, powered off through its `power` agent (its `fence` agent by
    default) and seen off; it wakes through the same agent, and is used again
    only once libvirt answers there with the UUID it slept with.  A wake that
    fails marks the host wake-failed: it is never chosen again (to sleep, or to
    be woken for room) until `vcsched power clear HOST`.  docs/power.md.

    \b
    Examples:
      vcsched power status                       every host, the kWh saved today, what comes next
      vcsched power sleep h2                     dry run: the evacuation, and whether h2 may sleep
      vcsched power sleep h2 --apply             evacuate, verify empty, power off, verify off
      vcsched power wake h2 --apply              power on, wait for the same host to answer
      vcsched power clear h2                     after an operator fixed a host whose wake failed

    Exit codes (every power command): 0 done (a dry run: --apply would act),
    1 refused (the reason on stderr: the host may not sleep, its wake failed,
    the cluster is locked), 2 bad input.
    """


def _describe(h: Any) -> str:
    """A host's state in words, with since when."""
    from vcsched.control.power import ON, describe

    if h.state == ON and not h.failed:
        return ON
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.since))
    word = describe(h)
    return f"{word} since {when}" + (f": {h.reason}" if h.failed and h.reason else "")


def _utilisation(inventory: Inventory, host: str) -> float:
    """The host's CPU utilisation as vcsched estimates it: its managed VMs' needs and its unmanaged reservation,
    over its cores (the energy model of docs/power.md)."""
    h = inventory.host(host)
    if h.down is not None or h.cores <= 0:
        return 0.0
    used = sum(v.meta.cpu_need_cores for v in inventory.vms_on(host) if v.active and v.meta is not None)
    return (used + inventory.unmanaged_cores(host)) / h.cores


@power_cmd.command("status")
@cluster_option()
@click.option("--window", type=Duration(), default=DEFAULT_WINDOW_S, show_default="24h", metavar="DURATION",
              help="The energy saved is counted over this window, back from now (30m, 24h, 7d as 168h).")
@click.option("--budget", type=Bytes(unlimited=True), default=UNLIMITED, show_default="unlimited",
              help="Most bytes an evacuation may migrate, for the next decision.")
@click.option("--coordination", metavar="URL", default=None,
              help="Where the power record lives (as the lock: default $VCSCHED_COORDINATION, the cluster "
                   "file's 'coordination', else the state directory).")
@json_option("Print one JSON object: hosts, energy, decision.")
def status_cmd(cluster_file: str | None, window: float, budget: int, coordination: str | None,
               as_json: bool) -> int:
    """Each host's power state, the energy saved over --window, and the next decision with its reason.

    \b
    States: on; sleeping since T (powered off by vcsched, empty); waking
    since T (past its deadline: a wake cut short, which a wake resolves);
    wake-failed since T with the reason (never chosen again until
    `vcsched power clear`).  "wake" is the longest wake measured for the host
    (the decision plans with it; the cluster's wake_time until one was).
    "watts" is the host's draw now by the energy model (idle_watts to
    peak_watts, linear in its CPU utilisation as vcsched estimates it: the
    managed VMs' needs and the unmanaged reservation); 0 asleep.

    \b
    The energy saved is each host's idle_watts for the time it slept within
    the window (the load it shed draws the same on the hosts that took it);
    hosts without idle_watts count nothing.  The next decision is the one
    `vcsched run` would take now on this inventory (vcsched/control/power.py),
    without its demand trend and hysteresis: a host may sleep only once the
    condition has held for sleep_after; a host whose sleep was skipped
    (`vcsched skip`) is kept on until its veto ends.

    Reads only (no lock).  Exit codes: 0 shown, 1 the power record cannot be
    read, 2 bad input.
    """
    from cli.recommend import _store
    from vcsched.control.power import decide, energy_saved, overdue, watts

    cluster = load_cluster(cluster_file)
    now = time.time()
    with acting_on(cluster, apply=False, coordination=coordination, wait=0.0, ttl=None, quiet=True) as (uow, inv):
        state = power_store(cluster, uow.hv, coordination).read()
        kept_on = _store(cluster, coordination, uow.hv).read().kept_on(now)  # skipped sleeps (`vcsched skip`)
    decision = decide(cluster, inv, state, now, budget=budget, kept_on=kept_on)
    saved = energy_saved(cluster, state, now, window)
    late = overdue(cluster, state, now)
    hosts = []
    for name in cluster.host_names:
        h = state.of(name)
        conf = cluster.host(name).power
        asleep = inv.host(name).asleep
        down = None if asleep else inv.host(name).down  # recorded on, but not answering: failed, not asleep
        # Recorded asleep, yet it answers: powered on outside vcsched (by hand, its BMC, `lab up`); read as awake.
        answers = inv.host(name).down is None or inv.host(name).answers_asleep
        answers_anyway = h.state != "on" and answers
        hosts.append({"host": name, "state": _describe(h).split(" since ")[0], "since": None if h.state == "on"
                      else h.since, "failed": h.failed, "reason": h.reason, "wake_s": h.wake_s,
                      "uuid": h.uuid, "answers": answers,
                      "watts": None if conf.idle_watts is None else round(watts(conf, _utilisation(inv, name),
                                                                                  asleep=asleep), 1),
                      "overdue": name in late,
                      "text": _describe(h) + (f" (past its deadline: a wake cut short? `vcsched power wake {name} "
                                              "--apply`)" if name in late else "")
                      + (f", but down (not asleep): {down}" if down is not None else "")
                      + (f", but it answers (powered on outside vcsched? `vcsched power wake {name} --apply` records "
                         "it on)" if answers_anyway else "")})
    doc = {"cluster": cluster.name, "mode": cluster.power.mode, "hosts": hosts,
           "energy": {"window_s": window, "saved_joules": round(saved, 1), "saved_kwh": round(saved / J_PER_KWH, 3)},
           "decision": decision.to_dict(), "ok": True}
    if as_json:
        emit_json(doc)
        return EXIT_OK
    _render_status(cluster, doc, window)
    return EXIT_OK


def _render_status(cluster: Cluster, doc: dict[str, Any], window: float) -> None:
    from cli.tables import FitTable

    table = FitTable(title=f"power of cluster {cluster.name} (power_saving = {cluster.power.mode!r})")
    for col in ("host", "state", "wake", "watts"):
        table.add_column(col, key=col == "host", justify="left" if col in ("host", "state") else "right",
                         wrap=col == "state")
    for h in doc["hosts"]:
        colour = "red" if not h["answers"] and h["state"] == "on" else \
            {"on": "", "sleeping": "blue", "waking": "yellow", "wake-failed": "red"}[h["state"]]
        text = f"[{colour}]{h['text']}[/]" if colour else h["text"]
        table.add_row(h["host"], text, "-" if h["wake_s"] is None else f"{h['wake_s']:.0f} s",
                      "-" if h["watts"] is None else f"{h['watts']:.0f} W")
    console.print(table)
    e = doc["energy"]
    console.print(f"energy saved over the last {window / 3600:g} h: {e['saved_kwh']:.3f} kWh", highlight=False)
    d = doc["decision"]
    what = "nothing" if d["action"] == "none" else f"{d['action']} {d['host']}"
    console.print(f"next decision: {what}: {d['reason']}", highlight=False)
    for host, why in d["refusals"].items():
        console.print(f"  {host} may not sleep: {why}", highlight=False)


@power_cmd.command("sleep")
@click.argument("host")
@cluster_option()
@click.option("--budget", type=Bytes(unlimited=True), default=UNLIMITED, show_default="unlimited",
              help="Most bytes the evacuation may migrate.")
@click.option("--apply", "do_apply", is_flag=True,
              help="Evacuate HOST, verify it empty, power it off and verify it off (default: dry run).")
@json_option("Print one JSON object (the evacuation plan, what was done).")
@lock_options()
def sleep_cmd(host: str, cluster_file: str | None, budget: int, do_apply: bool, as_json: bool, wait: float,
              coordination: str | None, lock_ttl: float | None) -> int:
    """Put HOST to sleep: evacuate it by plan, verify it empty, power it off, verify it off.

    \b
    HOST may sleep when everything `vcsched run` checks holds now (docs/power.md
    §2): power_saving allowed on it, an agent to wake it, not in maintenance,
    not one of the last min_hosts_on, no VM vcsched may not move (unmanaged,
    pinned, in doubt, on storage no other host shares), and its evacuation
    keeps every virtual cluster at its floor, every VM at power_yield and the
    failures_tolerated room.  An operator's sleep does not wait for
    sleep_after nor for the maintenance windows.

    \b
    With --apply, under the cluster lock: the evacuation is validated whole and
    applied; HOST is read again and must hold no domain at all (managed or
    not, running, paused or only defined); its power agent runs `off` and
    `status` must then say off; HOST is recorded sleeping.  A failure before
    the power-off leaves HOST on, and says why.

    Exit codes: 0 HOST may sleep (dry run) / is asleep, 1 it may not (the
    reason), the evacuation or the power-off failed, or the cluster is
    locked, 2 bad input (an unknown HOST), 130 interrupted.  A dry run exits
    as --apply would before its power-off.
    """
    from acting.power import agents, sleep_host
    from cli.common import apply_would_refuse
    from vcsched.control.power import sleep_check

    cluster = load_cluster(cluster_file)
    cluster.host(host)
    out: dict[str, Any] = {"host": host, "applied": do_apply}
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        store = power_store(cluster, uow.hv, coordination)
        why, evacuation = sleep_check(cluster, inventory, store.read(), host, time.time(), budget)
        if why is not None or evacuation is None or evacuation.plan is None:
            reason = f"{host} may not sleep: {why}"
            if as_json:
                emit_json(out | {"ok": False, "slept": False, "reason": reason})
            return refuse(reason)
        plan = evacuation.plan
        moved = int(plan.extra.get("migrated_bytes", 0))
        out |= {"plan": plan.to_dict(), "migrated_bytes": moved}
        if not as_json and plan.steps:
            render_plan(plan, inventory)
        agent = cluster.host(host).power.agent
        agent_name = agent.agent if agent is not None else "(none)"
        if not do_apply:
            refused = apply_would_refuse(uow, plan)
            if refused is not None:
                if as_json:
                    emit_json(out | {"ok": False, "slept": False, "reason": refused})
                return refuse(f"--apply would refuse the evacuation: {refused}")
            if as_json:
                emit_json(out | {"ok": True, "slept": False})
            else:
                console.print(f"dry run: {host} may sleep: the evacuation moves {format_budget(moved)}; --apply "
                              f"verifies it empty, powers it off through {agent_name} and checks its status says "
                              "off", highlight=False)
            return EXIT_OK
        result = sleep_host(uow, cluster, host, plan, store=store, agent=agents(cluster))
    out |= result.to_dict()
    if as_json:
        emit_json(out | {"ok": result.slept})
    else:
        if result.report is not None:  # what the evacuation did, step by step, as every apply shows it
            from cli.common import render_report

            render_report(result.report)
        if result.slept and result.off is not None:
            console.print(f"[blue]{host} is asleep[/]: emptied, then powered off through {result.off.agent} "
                          "(off, then status said off)", highlight=False)
    return EXIT_OK if result.slept else refuse(result.reason)


@power_cmd.command("wake")
@click.argument("host")
@cluster_option()
@click.option("--timeout", type=Duration(), default=None, metavar="DURATION",
              help="Longest wait for HOST to answer after power on (default: twice its wake time, measured, "
                   "else the cluster's wake_time).")
@click.option("--apply", "do_apply", is_flag=True,
              help="Power HOST on and wait until it answers as the host that slept (default: dry run).")
@json_option("Print one JSON object (what was done, the seconds the wake took).")
@lock_options()
def wake_cmd(host: str, cluster_file: str | None, timeout: float | None, do_apply: bool, as_json: bool,
             wait: float, coordination: str | None, lock_ttl: float | None) -> int:
    """Wake HOST: power it on through its agent and wait until libvirt answers there as the host that slept.

    \b
    Under the cluster lock: HOST is recorded waking, its power agent runs
    `on`, and HOST is read every 2 s until libvirt answers with the UUID it
    slept with (another machine behind its URI is refused), for at most
    --timeout.  It is then on, and the seconds the wake took are recorded
    (the longest per host: the decision plans with it).  An agent that fails,
    a wait that runs out, or another UUID marks HOST wake-failed, with the
    reason: it is not chosen again until `vcsched power clear HOST` (an
    operator may still wake it by name).

    Exit codes: 0 HOST may be woken (dry run) / answers again, 1 it is on
    already, its wake failed, or the cluster is locked, 2 bad input.
    """
    from acting.power import PowerRefused, agents, wake_host
    from vcsched.control.power import wake_deadline

    cluster = load_cluster(cluster_file)
    cluster.host(host)
    out: dict[str, Any] = {"host": host, "applied": do_apply}
    with acting_on(cluster, apply=do_apply, coordination=coordination, wait=wait, ttl=lock_ttl,
                   quiet=as_json) as (uow, inventory):
        store = power_store(cluster, uow.hv, coordination)
        state = store.read()
        record = state.of(host)
        limit = timeout if timeout is not None else wake_deadline(cluster, state, host)
        if record.state == "on":
            down = inventory.host(host).down
            reason = (f"host {host} is on (not put to sleep by vcsched): nothing to wake" if down is None else
                      f"host {host} was not put to sleep by vcsched: it is down ({down}), not asleep; a power "
                      f"wake is for hosts vcsched powered off (a failed host: `vcsched recover {host}`)")
            if as_json:
                emit_json(out | {"ok": False, "woke": False, "reason": reason})
            return refuse(reason)
        if not do_apply:
            agent = cluster.host(host).power.agent
            said = (f"dry run: would power {host} on through {agent.agent if agent else '(no agent)'} and wait up "
                    f"to {limit:g} s for libvirt to answer as {record.uuid or cluster.host(host).uuid or 'it'}")
            if as_json:
                emit_json(out | {"ok": True, "woke": False, "timeout_s": limit, "reason": said})
            else:
                console.print(said, highlight=False)
            return EXIT_OK
        try:
            if as_json:
                result = wake_host(uow, cluster, host, store=store, agent=agents(cluster), timeout=limit)
            else:
                with console.status(f"waking {host} (up to {limit:g} s) ..."):
                    result = wake_host(uow, cluster, host, store=store, agent=agents(cluster), timeout=limit)
        except PowerRefused as exc:
            return refuse(str(exc))
    if as_json:
        emit_json(out | result.to_dict() | {"ok": result.woke})
    elif result.woke:
        console.print(f"[green]{result.reason}[/]", highlight=False)
    return EXIT_OK if result.woke else refuse(f"host {host} is wake-failed: {result.reason}")


@power_cmd.command("clear")
@click.argument("host")
@cluster_option()
@click.option("--coordination", metavar="URL", default=None,
              help="Where the power record lives (as the lock).")
@json_option("Print one JSON object (the host's record after).")
def clear_cmd(host: str, cluster_file: str | None, coordination: str | None, as_json: bool) -> int:
    """Clear HOST's failed wake: it may be chosen again, to sleep or to be woken for room.

    \b
    Do it once the cause is fixed (its agent, its BMC, the machine behind its
    URI); `vcsched power wake HOST --apply` proves it wakes.  The host's
    record keeps its state (a host whose wake failed stays recorded
    sleeping until it answers).  Changes only the power record.

    Exit codes: 0 cleared (or nothing to clear), 2 bad input.
    """
    from acting.power import clear_host

    cluster = load_cluster(cluster_file)
    cluster.host(host)
    store = power_store(cluster, None, coordination)
    was = store.read().of(host)
    after = clear_host(store, host).of(host) if was.failed else was
    if as_json:
        emit_json({"host": host, "cleared": was.failed, "state": after.state, "ok": True})
    else:
        console.print(f"{host}: wake failure cleared ({was.reason})" if was.failed
                      else f"{host}: no failed wake to clear", highlight=False)
    return EXIT_OK
