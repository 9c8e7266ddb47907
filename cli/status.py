"""``vcsched status``: hosts, VMs, caps, predicted yields and measured CPU, disk and network, live from libvirt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from cli.app import EXIT_OK, console, emit_json, refuse
from cli.common import load_cluster, notice, read_lost
from cli.params import FiniteFloatRange, cluster_option, json_option, policy_options
from cli.tables import FitTable
from hypervisor.base import Usage, measure_usage
from hypervisor.libvirt_backend import LibvirtHypervisor
from vcsched.control.observe import Estimate
from vcsched.control.status import below_floor, host_load, virtual_clusters, vm_yield
from vcsched.control.unmanaged import fills
from vcsched.formats.cluster import Cluster
from vcsched.formats.units import format_size
from vcsched.formats.words import plural
from vcsched.inventory import Inventory, VmState
from vcsched.plans.repair import RepairReport, plan_repair


def _sum(values: list[float | None]) -> float | None:
    known = [x for x in values if x is not None]
    return sum(known) if known else None


def status_dict(inv: Inventory, measured: Mapping[str, float | None], seconds: float,
                io: Mapping[str, Usage] | None = None, policy: str | None = None,
                clusters: list[dict[str, Any]] | None = None, cluster: Cluster | None = None,
                estimates: Mapping[str, Estimate] | None = None) -> dict[str, Any]:
    """The ``--json`` document.  ``measured``: cores each VM used; ``io``: its disk and network use, same window;
    ``estimates``: the controller's need estimates (``--events``), over which the yields are computed.

    Disk bytes are read + written on all its disks; network bytes are counted
    from the guest's side (``net_rx``: into the guest, ``net_tx``: out of it).
    """

    io = io or {}
    estimates = estimates or {}

    def yields(v: VmState) -> dict[str, Any]:
        y = vm_yield(v, estimates.get(v.name))
        return {"predicted_yield": None if y is None else y.value,
                "estimated_need_cores": None if y is None else y.estimated_cores,
                "yield_upper_bound": y is not None and y.upper_bound,
                "below_floor": below_floor(None if y is None else y.value, v.meta.min_yield if v.meta else None)}

    def used(v: VmState, field: str) -> float | None:
        u = io.get(v.name)
        return None if u is None else getattr(u, field)

    hosts = []
    names = set(cluster.host_names) if cluster is not None else set()
    for h in inv.hosts:
        on = inv.vms_on(h.name)
        capped = [v for v in on if v.managed and v.active]
        load = host_load(inv, h.name, measured)
        conf = cluster.host(h.name) if cluster is not None and h.name in names else None
        hosts.append({
            "name": h.name, "down": h.down, "asleep": h.asleep, "power": h.power, "uuid": h.uuid,
            "uri": conf.uri if conf else None, "address": conf.migration_address if conf else None,
            "storage": conf.storage_name if conf else None,
            "cores": h.cores, "memory_bytes": h.memory_bytes, "memory_reserved": h.memory_reserved,
            "usable_memory": h.usable_memory,
            "memory_used_bytes": load.memory_used_bytes,
            "caps_cores": load.caps_cores,
            "measured_cores": load.measured_cores if load.measured_cores is not None else 0.0,
            # What every plan keeps for its unmanaged domains (docs/introducing.md), and what they used.
            "unmanaged_reserved_cores": round(inv.unmanaged_cores(h.name), 4),
            "unmanaged_measured_cores": _sum([measured.get(v.name) for v in on if v.unmanaged]),
            **{f"unmanaged_measured_{k}": _sum([used(v, k) for v in on if v.unmanaged])
               for k in ("disk_bps", "net_rx_bps", "net_tx_bps")},
            "unmanaged_full": h.down is None and fills(inv.unmanaged_cores(h.name), h.cores),
            "disk_bps": h.disk_bps, "net_bps": h.net_bps,
            "disk_caps_bps": sum(v.io_caps.disk_bytes_sec or 0 for v in capped),
            "net_caps_bps": sum(v.io_caps.net_bytes_sec or 0 for v in capped),
            "measured_disk_bps": _sum([used(v, "disk_bps") for v in on]),
            "measured_net_rx_bps": _sum([used(v, "net_rx_bps") for v in on]),
            "measured_net_tx_bps": _sum([used(v, "net_tx_bps") for v in on]),
            "cannot_cap": dict(h.cannot_cap),
        })
    vms = [{
        "name": v.name, "host": v.host, "managed": v.managed, "cluster": v.cluster, "active": v.active,
        "vcpus": v.vcpus, "memory_bytes": v.memory_bytes,
        "cpu_need_cores": v.meta.cpu_need_cores if v.meta else None, "cap_cores": v.cap_cores,
        **yields(v), "min_yield": v.meta.min_yield if v.meta else None,
        "measured_cores": measured.get(v.name),
        "reserved_cores": v.reserved if v.unmanaged else None,
        "disks": list(v.devices.disks), "interfaces": list(v.devices.nics),
        "disk_bytes_sec": v.io_caps.disk_bytes_sec, "disk_iops_sec": v.io_caps.disk_iops_sec,
        "net_bytes_sec": v.io_caps.net_bytes_sec,
        "measured_disk_bps": used(v, "disk_bps"),
        "measured_net_rx_bps": used(v, "net_rx_bps"), "measured_net_tx_bps": used(v, "net_tx_bps"),
        "rules": _vm_rules(v),
    } for v in inv.vms]
    out: dict[str, Any] = {"cluster": inv.cluster, "sample_seconds": seconds, "hosts": hosts, "vms": vms,
                           "in_doubt": [{"vm": d.vm, "uuid": d.uuid, "hosts": list(d.hosts), "states": list(d.states),
                                         "resolved": d.resolved} for d in inv.in_doubt],
                           "repair": RepairReport(plan_repair(inv), applied=False).to_dict(),
                           "violations": floor_violations(vms)}
    if policy is not None:
        out["policy"] = policy
        out["virtual_clusters"] = [vc | {"below_floor": below_floor(vc["yield"], vc["min_yield"])}
                                   for vc in clusters or []]
    return out


def floor_violations(vms: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One ``violations`` entry per virtual cluster with a VM below the floor it was admitted with (``rule``
    ``min_yield``), beside the placement rules broken: a script reading ``violations`` sees both."""
    below: dict[str, list[dict[str, Any]]] = {}
    for v in vms:
        if v["below_floor"]:
            below.setdefault(str(v["cluster"]), []).append(v)
    return [{"cluster": vc, "rule": f"min_yield ({low[0]['min_yield']:g})",
             "problem": ", ".join(f"{v['name']} at yield {v['predicted_yield']:.3f}" for v in low)}
            for vc, low in sorted(below.items())]


def _controller_estimates(events_file: str | None) -> dict[str, Estimate]:
    """The need estimates of the controller's last ``observe`` event in its log (none without ``--events``)."""
    if events_file is None:
        return {}
    from pathlib import Path

    from acting.events import EventTail
    from vcsched.control.top import last_estimates

    tail = EventTail(Path(events_file))
    try:
        tail.poll()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {events_file}: {exc.strerror or exc}", param_hint="--events") from None
    return last_estimates(tail.events)


def _vm_rules(v: VmState) -> list[str]:
    """The placement rules recorded in a VM's metadata (docs/rules.md), as short words."""
    if v.meta is None:
        return []
    return ([f"spread{'' if v.meta.spread == 'required' else '?'}"] if v.meta.spread else []) + \
        ([f"together{'' if v.meta.together == 'required' else '?'}"] if v.meta.together else []) + \
        (["pinned"] if v.meta.pinned else [])


def _unmanaged_cell(h: Mapping[str, Any], sampled: bool) -> str:
    """``reserved (used)``: the cores kept for the host's unmanaged domains, and what they used (sampled)."""
    used = h.get("unmanaged_measured_cores")
    text = f"{h['unmanaged_reserved_cores']:.2f}" + (f" ({used:.2f})" if sampled and used is not None else "")
    return f"[red]{text}[/]" if h.get("unmanaged_full") else text


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{format_size(x)}/s"


def _shows_io(doc: dict[str, Any]) -> bool:
    """Disk and network columns only where there is something to show: a device, a cap or a capacity."""
    return any(v["disks"] or v["interfaces"] or v["disk_bytes_sec"] or v["net_bytes_sec"] for v in doc["vms"]) or \
        any(h["disk_bps"] or h["net_bps"] for h in doc["hosts"])


#: ``measured_from`` of a status whose CPU use is the controller's last window (acting/window.py).
WINDOW = "controller window"


def render_status(doc: dict[str, Any]) -> None:

    io = _shows_io(doc)
    sampled = bool(doc["sample_seconds"]) or doc.get("measured_from") == WINDOW
    table = FitTable(title=f"cluster {doc['cluster']}: hosts")
    #: column -> priority (cli/tables.py: at 80 columns the higher numbers move to a second table first)
    # Two-line headers: with the unmanaged column the one-line headers alone were wider than 80 columns.
    cols = {"host": 0, "cores": 3, "caps\n(cores)": 1, "measured\n(cores)": 2, "unmanaged\n(cores)": 2,
            "memory\nused / usable": 1}
    if io:
        cols |= {"disk caps / disk_bps": 4, "disk used": 4, "net caps / net_bps": 5, "net in / out": 5}
    for col, priority in cols.items():
        table.add_column(col, justify="left" if col == "host" else "right", priority=priority, key=col == "host")
    for h in doc["hosts"]:
        if h.get("asleep"):
            word = h.get("power") or "sleeping"
            colour = "red" if word == "wake-failed" else "blue"
            table.add_row(f"[{colour}]{h['name']} ({word})[/]", str(h["cores"]), *(["-"] * (len(cols) - 2)))
            continue
        if h["down"] is not None:  # its reason goes below the table: a long one would widen a column of numbers
            table.add_row(f"[red]{h['name']} (down)[/]", *(["?"] * (len(cols) - 1)))
            continue
        usable = h["usable_memory"]
        name = h["name"] + (" [yellow](maintenance)[/]" if h.get("maintenance") else "")
        row = [name, str(h["cores"]), f"{h['caps_cores']:.3f}",
               _num(h["measured_cores"]) if sampled else "-", _unmanaged_cell(h, sampled),
               f"{format_size(h['memory_used_bytes'])} / {format_size(usable)}"]
        if io:
            row += [f"{_rate(h['disk_caps_bps'])} / {_rate(h['disk_bps'])}", _rate(h["measured_disk_bps"]),
                    f"{_rate(h['net_caps_bps'])} / {_rate(h['net_bps'])}",
                    f"{_rate(h['measured_net_rx_bps'])} / {_rate(h['measured_net_tx_bps'])}"]
        table.add_row(*row)
    console.print(table)
    for h in doc["hosts"]:
        if h.get("unmanaged_full"):
            console.print(f"[red]host {h['name']}[/]: its unmanaged domains reserve "
                          f"{h['unmanaged_reserved_cores']:.2f} of its {h['cores']} cores; nothing is planned onto it "
                          "(docs/introducing.md)",
                          highlight=False)
    asleep = [h["name"] for h in doc["hosts"] if h.get("asleep")]
    if asleep:
        console.print(f"[blue]{plural(len(asleep), 'host')} asleep[/] ({', '.join(asleep)}): powered off by vcsched "
                      "power saving, empty; `vcsched power status` says since when, `vcsched power wake` wakes one.",
                      highlight=False)
    failed = [h["name"] for h in doc["hosts"] if h.get("power") == "wake-failed"]
    if failed:  # never chosen again (to sleep, or to be woken for room) until an operator clears it
        console.print(f"[red]{plural(len(failed), 'host')} failed to wake[/] ({', '.join(failed)}): not woken for "
                      "room until cleared; `vcsched power status` says why, `vcsched power clear HOST` once fixed.",
                      highlight=False)
    down = [h for h in doc["hosts"] if h["down"] is not None and not h.get("asleep")]
    if down:
        console.print(f"[red]{plural(len(down), 'host')} down[/] ({', '.join(h['name'] for h in down)}): "
                      + ("its VMs are unknown, and nothing is planned onto or off it until it answers again."
                         if len(down) == 1 else
                         "their VMs are unknown, and nothing is planned onto or off them until they answer again."),
                      highlight=False)
        for h in down:  # libvirt's reasons name the host already ("host h1: did not answer ...")
            reason, name = str(h["down"]), h["name"]
            said = reason if reason.startswith(f"host {name}:") else f"host {name}: {reason}"
            console.print(f"  [red]{said}[/]", highlight=False)
    for d in doc.get("in_doubt", []):
        where = ", ".join(f"{h} ({st})" for h, st in zip(d["hosts"], d["states"], strict=True))
        console.print(f"[red]in doubt[/]: {d['vm']} (uuid {d['uuid']}) is active on {where}: no plan touches it "
                      "until `vcsched repair --apply` settles it (docs/repair.md, \"A VM never runs twice\").",
                      highlight=False)
    repair = doc.get("repair") or {}
    if repair.get("refused") and doc.get("in_doubt"):
        console.print(f"  vcsched repair would do nothing now: {repair['refused']}", highlight=False)
    for a in repair.get("actions", []):
        console.print(f"  vcsched repair would {a['action']} {a['vm']} on {a['host']}: {a['why']}", highlight=False)
    for line in repair.get("left", []):
        console.print(f"  vcsched repair leaves to the operator: {line}", highlight=False)
    render_migrations(doc)
    render_lost(doc)
    if not doc["vms"]:
        console.print("no VMs")
        return
    vt = FitTable(title="VMs (cores: declared need alone, the controller's estimate (--events), cap, used over the "
                        "sample window; yield = cap / estimated need, else declared; ≤: an upper bound, the "
                        "estimate is censored; floor = the min_yield it was admitted with"
                        + ("; disk and network: cap and use per second, network from the guest's side)" if io else ")"))
    vm_cols = {"host": 2, "VM": 0, "cluster": 3, "vCPUs": 5, "memory": 4, "need": 1, "est": 2, "cap": 1, "used": 2,
               "yield": 1, "floor": 5, "rules": 6}
    if io:
        vm_cols |= {"disk cap": 7, "disk used": 7, "net cap": 8, "net in / out": 8}
    for col, priority in vm_cols.items():
        vt.add_column(col, justify="left" if col in ("host", "VM", "cluster") else "right", priority=priority,
                      key=col == "VM")
    for v in doc["vms"]:
        cluster = v["cluster"] or "[dim]unmanaged[/]"
        state = "" if v["active"] else " [dim](off)[/]"
        y, floor = v["predicted_yield"], v["min_yield"]
        shown = ("≤" if v.get("yield_upper_bound") else "") + _num(y)
        shown = f"[red]{shown} ![/]" if v["below_floor"] else shown
        row = [v["host"], v["name"] + state, cluster, str(v["vcpus"]), format_size(v["memory_bytes"]),
               _num(v["cpu_need_cores"]), _num(v.get("estimated_need_cores")), _num(v["cap_cores"]),
               _num(v["measured_cores"]), shown,
               _num(floor, "{:g}"), " ".join(v.get("rules", [])) or "-"]
        if io:
            disk_cap = "no disk" if not v["disks"] else _rate(v["disk_bytes_sec"])
            if v["disk_iops_sec"]:
                disk_cap += f", {v['disk_iops_sec']} IOPS"
            net_cap = "no NIC" if not v["interfaces"] else _rate(v["net_bytes_sec"])
            row += [disk_cap, _rate(v["measured_disk_bps"]), net_cap,
                    f"{_rate(v['measured_net_rx_bps'])} / {_rate(v['measured_net_tx_bps'])}"]
        vt.add_row(*row)
    console.print(vt)
    if io and any(v["net_bytes_sec"] for v in doc["vms"]):
        console.print("[dim]net out is what the guest sent: libvirt polices outbound traffic on the host, dropping "
                      "what exceeds the cap there, so a guest sending faster than its cap shows more than it.[/]")
    if any(v["below_floor"] for v in doc["vms"]):
        console.print("! below floor: the yield misses the min_yield the VM was admitted with", highlight=False)
    for bad in doc.get("violations", []):
        said = "[red]below floor:[/]" if bad["rule"].startswith("min_yield") else "[yellow]rule broken:[/]"
        console.print(f"{said} {bad['cluster']}: {bad['rule']}: {bad['problem']} "
                      "(`vcsched adapt --budget B` repairs it)", highlight=False)
    if doc.get("headroom"):
        render_headroom(doc)
    elif doc.get("headroom_skipped"):
        console.print(f"[dim]failover headroom not computed: {doc['headroom_skipped']}[/]", highlight=False)
    if "policy" in doc:
        render_virtual_clusters(doc)


def render_lost(doc: dict[str, Any]) -> None:
    """The recorded VMs that run nowhere (docs/failures.md), one line each, with the command that restarts them."""
    import time

    for lost in doc.get("lost") or []:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lost["since"]))
        console.print(f"[red]lost[/]: {lost['vm']} ({lost['cluster']}) runs nowhere: recorded on {lost['host']}, "
                      f"{lost['why']}, since {since} (`vcsched restart {lost['vm']} --apply`)", highlight=False)
    if doc.get("lost_unknown"):
        console.print(f"[yellow]lost VMs unknown[/]: {doc['lost_unknown']}", highlight=False)


def render_headroom(doc: dict[str, Any]) -> None:
    """For each host: would its managed VMs fit on the others if it failed, and the min yield after."""
    table = FitTable(title="failover headroom (if the host failed: do its VMs fit on the others, memory and CPU at "
                           f"their floors; failures_tolerated = {doc.get('failures_tolerated', 0)})")
    for col, priority in (("host", 0), ("its VMs", 2), ("would fit", 1), ("min yield after", 1), ("stranded", 3)):
        table.add_column(col, justify="left" if col in ("host", "stranded") else "right", priority=priority,
                         key=col == "host")
    for f in doc["headroom"]:
        fits = "yes" if f["fits"] else "[red]no[/]"
        stranded = ", ".join(sorted(f["stranded"])) or "-"
        table.add_row(f["host"], str(len(f["vms"])), fits, _num(f["min_yield_after"]), stranded)
    console.print(table)


def render_migrations(doc: dict[str, Any]) -> None:
    """Live migrations in flight (libvirt's jobs), with the cluster's throttles when it has any."""
    moving = doc.get("migrations") or []
    limits = {k: v for k, v in (doc.get("throttles") or {}).items() if v is not None}
    shown = ", ".join(f"{k} {format_size(v) + '/s' if k == 'migration_bandwidth' else f'{v:g}'}"
                      for k, v in limits.items())
    if not moving:
        if limits:
            console.print(f"no migration in flight (throttles: {shown})", highlight=False)
        return
    table = FitTable(title=f"migrations in flight (libvirt job info){f'; throttles: {shown}' if limits else ''}")
    for col in ("VM", "from", "to", "elapsed", "sent", "remaining", "rate"):
        table.add_column(col, justify="left" if col in ("VM", "from", "to") else "right", key=col == "VM")
    for m in moving:
        table.add_row(m["vm"], m["source"] or "?", m["target"] or "?", f"{m.get('elapsed_s', 0):.1f} s",
                      format_size(m.get("processed_bytes", 0)), format_size(m.get("remaining_bytes", 0)),
                      _rate(m.get("bandwidth_bps")))
    console.print(table)


def render_virtual_clusters(doc: dict[str, Any]) -> None:

    vcs = doc["virtual_clusters"]
    if not vcs:
        console.print(f"policy in force: [bold]{doc['policy']}[/]; no virtual cluster runs")
        return
    pools = "pool (host:resource)" if doc["policy"] == "drf-pools" else "dominant resource"
    table = FitTable(title=f"virtual clusters under policy {doc['policy']} (yield = the lowest cap / need of its "
                           "VMs; dominant share = yield x its share of the cluster per unit of yield)")
    for col, priority in (("virtual cluster", 0), ("VMs", 3), ("weight", 4), ("tenant", 5), ("yield", 1),
                          ("dominant share", 2), (pools, 3), ("floor", 2)):
        table.add_column(col, justify="left" if col in ("virtual cluster", "tenant", pools) else "right",
                         priority=priority, key=col == "virtual cluster")
    for vc in vcs:
        y, floor = vc["yield"], vc["min_yield"]
        shown = ("≤" if vc.get("yield_upper_bound") else "") + f"{y:.3f}"
        shown = f"[red]{shown} ![/]" if vc["below_floor"] else shown
        count = str(vc["vms"]) + (f" [red](+{vc['lost']} lost)[/]" if vc.get("lost") else "")
        table.add_row(vc["name"], count, f"{vc['weight']:g}", vc["tenant"] or "-", shown,
                      f"{vc['dominant_share']:.4f}", vc["dominant_pool"], _num(floor, "{:g}"))
    console.print(table)


@click.command("status")
@cluster_option()
@click.option("--sample", "seconds", type=FiniteFloatRange(0, 60), default=None, metavar="S",
              help="Measure each VM's CPU, disk and network use over S seconds (two samples); 0 skips measuring.  "
                   "Default: the CPU use of the controller's last window when `vcsched run` watches the cluster "
                   "from this machine, else nothing measured.")
@json_option("Print one JSON object instead of tables.")
@click.option("--headroom", "show_headroom", is_flag=True,
              help="Compute each host's failover headroom even on a cluster of more than 100 hosts.")
@click.option("--events", "events_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A `vcsched run --log` file: yields over the controller's latest need estimates (the ones it "
                   "plans with), not over the declared needs.")
@policy_options()
def status_cmd(cluster_file: str | None, seconds: float | None, as_json: bool, show_headroom: bool, policy: str | None,
               alpha: float | None, events_file: str | None = None) -> int:
    """Show every host and VM of the cluster: caps, predicted yields and measured CPU, disk and network.

    \b
    For each host: cores, the sum of caps, the cores its VMs used, the
    cores kept for its unmanaged domains ("unmanaged": every plan leaves them
    that much; in brackets what they used), memory;
    with disks or interfaces around, also its disk and network caps against
    the capacity the cluster file declares (disk_bps, net_bps) and what its
    VMs moved.
    For each VM: its virtual cluster (or "unmanaged": not created by vcsched,
    never touched; its CPU is reserved on its host, its cap or else every
    vCPU, docs/introducing.md), vCPUs, memory, CPU need and cap in cores, the cores it used
    over the sample window (libvirt CPU time, vCPUs + emulator) and the yield
    its cap gives it (cap / need, paper section 2.3: over the controller's
    estimated need with --events, shown "≤" where that estimate is censored,
    else over the declared need; docs/contention.md); its disk cap and the
    bytes per second read + written (libvirt blockStats), its network cap and
    the bytes per second received / sent (interfaceStats, the guest's side).

    A VM busy at its cap shows measured close to cap; one that idles shows less.
    Without --sample nothing is sampled: when a controller (`vcsched run`)
    watches the cluster from this machine, the CPU its last window measured
    is shown, with its age (--json: measured_from "controller window",
    window_age_s); otherwise nothing is measured ("-").

    For each virtual cluster: the policy in force (--policy, else the cluster
    file's policy, else yield), its yield, weight, tenant, dominant share and
    dominant resource (under drf-pools: its most loaded host:resource pair).

    Live migrations in flight are listed from libvirt's job info (source,
    destination, time, bytes sent and left, rate), with the cluster file's
    migration throttles.

    Placement rules (docs/rules.md): hosts in maintenance are marked, each
    VM's rules are shown (spread, together, pinned; "?" = preferred), and
    every rule the running VMs break is listed (`vcsched adapt` repairs it).

    Failover headroom (docs/capacity.md, "Room for failures"): for each host,
    whether its VMs would fit on the others if it failed (memory, and CPU at
    the virtual clusters' floors) and the minimum yield after; computed up to
    100 hosts (above, with --headroom: each host is one placement).

    A host that does not answer is shown as down, with libvirt's reason (one
    that vcsched's power saving put to sleep as sleeping, docs/power.md); the
    others are shown as usual.  Exit codes: 0 shown (even with hosts down),
    1 every host is down, 2 bad input.
    """
    from hypervisor.connections import in_background

    cluster = load_cluster(cluster_file)
    hv = LibvirtHypervisor(cluster)
    reading = in_background(hv.inventory)  # hosts are read (a hung one waited for) while the policies load
    from vcsched.control.sharing import sharing_for  # loaded (~0.3 s) while the hosts are read

    sharing = sharing_for(cluster, policy, alpha)  # bad input: exit 2 (reading only, nothing changed)
    window = None
    if seconds is None:  # no sampling asked: the controller's last window, if one runs here
        from acting.window import last_window
        from hypervisor.files import state_dir

        window = last_window(state_dir(), cluster)
    with hv:
        from acting.power import asleep_in, record_reader

        inv = asleep_in(reading(), record_reader(cluster, hv), notice)  # a host vcsched put to sleep is not down
        migrations = hv.migrations(inv)
        usage: dict[str, Usage] = {}
        if seconds and inv.vms:
            if as_json:
                usage = measure_usage(hv, inv.vms, seconds)
            else:
                with console.status(f"measuring CPU, disk and network use over {seconds:g} s ..."):
                    usage = measure_usage(hv, inv.vms, seconds)
        elif window is not None:
            usage = {v.name: Usage(window.used[v.name]) for v in inv.vms if v.name in window.used}
    estimates = _controller_estimates(events_file)
    doc = status_dict(inv, {name: u.cores for name, u in usage.items()}, seconds or 0.0, usage, sharing.policy,
                      virtual_clusters(cluster, inv, sharing, estimates), cluster, estimates)
    doc["estimates_from"] = events_file
    doc["measured_from"] = "sample" if seconds else WINDOW if window is not None else None
    doc["window_age_s"] = round(window.age(), 3) if window is not None else None
    if not as_json and window is not None:
        console.print(f"[dim]measured: the controller's last window ({window.age():.0f} s ago; --sample S "
                      "measures now)[/]", highlight=False)
    from vcsched.control.live import rule_violations

    for h in doc["hosts"]:
        h["maintenance"] = h["name"] in cluster.cordoned
    doc["migrations"] = migrations
    doc["throttles"] = cluster.throttles.to_dict()
    doc["violations"] = rule_violations(inv.up()) + doc["violations"]
    from vcsched.control.failover import HEADROOM_MAX_HOSTS, headroom

    doc["failures_tolerated"] = cluster.failures_tolerated
    up = inv.up()
    if not up.managed():
        doc["headroom"] = []
    elif len(up.hosts) > HEADROOM_MAX_HOSTS and not show_headroom:
        doc["headroom"] = None
        doc["headroom_skipped"] = (f"{len(up.hosts)} hosts answer, more than {HEADROOM_MAX_HOSTS}: each host's "
                                   "headroom is one placement of the cluster (--headroom computes it)")
    else:
        doc["headroom"] = [f.to_dict() for f in headroom(cluster, inv)]
    lost, doc["lost_unknown"] = read_lost(cluster, inv)
    doc["lost"] = [x.to_dict() for x in lost]
    for vc in doc.get("virtual_clusters", []):  # "1 VM" of a cluster of 2 whose other one runs nowhere: say so
        vc["lost"] = sum(1 for x in lost if x.cluster == vc["name"])
    doc["ok"] = any(h.down is None for h in inv.hosts)
    if as_json:
        emit_json(doc)
    else:
        render_status(doc)
    return EXIT_OK if doc["ok"] else refuse(f"every host of cluster {cluster.name!r} is down")
