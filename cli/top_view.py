"""`vcsched top`'s screen as plain values: which lines, which columns (dropped by priority to fit), which order.

Everything here is a pure function of a :class:`vcsched.control.top.TopView`,
the sort the operator chose and the terminal's size, so tests check the
screen without a terminal; :mod:`cli.top` only shows the lines (rich's live
display) and reads keys.

**Fitting a narrow terminal.**  Each table column has a priority (0: always
kept).  When a table is wider than the terminal, the column with the highest
priority number (the rightmost among equals) leaves the table, and again, until
it fits: a value is never cut.  A VM's values in the columns that left are not
lost: they go on a second, indented line under its row ("floor 0.6 · vcpus 1 ·
basis measured"), so at 80 columns every value of every VM is on the screen.
Free text is wrapped (a host's reason for being down, the summary's facts:
"below floor: ..." stays at any width) or, for the controller's events, cut at a
word with "…". When the VMs do not all fit in the terminal's height, the first
ones in the chosen order are shown and a line says how many more there are.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cli.tables import keep_by_priority
from vcsched.control.top import HostRow, TopView, VmRow
from vcsched.formats.units import format_size
from vcsched.formats.words import plural

#: A piece of a line and its rich style ("" for none).
Segment = tuple[str, str]
Line = tuple[Segment, ...]

GAP = 2  # spaces between columns
MIN_EVENTS, MAX_EVENTS = 3, 20  # the controller's last events shown: at least (when there are), at most


@dataclass(frozen=True)
class Sort:
    """The VMs' order: ``key`` one of :data:`SORT_KEYS`; ``reverse`` flips it (unmeasured VMs stay last)."""

    key: str = "host"
    reverse: bool = False


#: key -> (what the footer calls it, the keyboard key).
SORT_KEYS: dict[str, tuple[str, str]] = {"yield": ("yield", "y"), "use": ("use", "u"), "host": ("host", "h")}


def on_key(sort: Sort, key: str) -> Sort | None:
    """The sort after ``key`` is pressed; None to quit (``q``); the same sort for any other key."""
    if key in ("q", "Q"):
        return None
    if key == "r":
        return Sort(sort.key, not sort.reverse)
    for name, (_, k) in SORT_KEYS.items():
        if key == k:
            return Sort(name, sort.reverse if name == sort.key else False)
    return sort


def sort_vms(vms: Sequence[VmRow], sort: Sort) -> list[VmRow]:
    """yield: lowest first (the worst off on top); use: busiest first; host: by host.  Ties by host and name;
    a VM without the value (unmanaged: no yield; not measured yet: no use) comes last either way."""
    def value(v: VmRow) -> float | None:
        if sort.key == "yield":
            return v.yield_
        if sort.key == "use":
            return None if v.used_cores is None else -v.used_cores
        return 0.0

    known = [v for v in vms if value(v) is not None]
    unknown = [v for v in vms if value(v) is None]
    by_place = sorted(known, key=lambda v: (natural(v.host), natural(v.name)))
    if sort.key == "host":
        ordered = sorted(by_place, key=lambda v: natural(v.host), reverse=sort.reverse)
    else:
        ordered = sorted(by_place, key=lambda v: value(v) or 0.0, reverse=sort.reverse)
    return ordered + sorted(unknown, key=lambda v: (natural(v.host), natural(v.name)))


def natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """``vm2`` before ``vm10``: digits compare as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


# ---------------------------------------------------------------------------------------------- columns


@dataclass(frozen=True)
class Column:
    header: str
    priority: int  # 0: never dropped; higher: dropped first
    right: bool  # right-aligned (numbers)
    cell: Callable[[Any], str]
    style: Callable[[Any], str] = lambda _row: ""


def num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def ago(seconds: float) -> str:
    """12s, 4m10s, 2h05m: how long, at a glance."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def host_marks(h: HostRow) -> str:
    marks = []
    if h.asleep is not None:  # powered off by vcsched, empty: not a failure
        marks.append(h.asleep)
    elif h.down is not None:
        marks.append("DOWN" + (f" {ago(h.down_for)}" if h.down_for is not None else ""))
    if h.cordoned:
        marks.append("cordoned")
    if h.failed is not None:
        marks.append("failed")
    if h.unmanaged_over:
        marks.append("full of unmanaged")
    marks += [f"full of unmanaged {r}" for r in h.unmanaged_io_full]
    return ", ".join(marks)


def vm_marks(v: VmRow) -> str:
    marks = []
    if v.in_doubt:
        marks.append("IN DOUBT")
    if v.migrating is not None:
        marks.append(f"migrating {v.migrating}")
    if v.paused:
        marks.append("paused")
    if not v.active:
        marks.append("off")
    if v.below_floor:  # in words as well as in red: a pipe or a file has no colours
        marks.append("below floor")
    return ", ".join(marks)


def _memory(h: HostRow) -> str:
    return "?" if h.down is not None else f"{format_size(h.memory_used_bytes)} / {format_size(h.memory_usable_bytes)}"


HOST_COLUMNS: tuple[Column, ...] = (
    Column("HOST", 0, False, lambda h: h.name, lambda h: "bold red" if h.down is not None else "bold"),
    Column("CORES", 2, True, lambda h: str(h.cores)),
    Column("CAPS", 1, True, lambda h: "?" if h.down is not None else num(h.caps_cores)),
    Column("USED", 1, True, lambda h: "?" if h.down is not None else num(h.used_cores)),
    Column("UNMANAGED", 2, True, lambda h: "?" if h.down is not None else num(h.unmanaged_cores),
           lambda h: "bold red" if h.unmanaged_over else ""),
    Column("MEMORY USED / USABLE", 3, True, _memory),
    Column("VMS", 4, True, lambda h: "?" if h.down is not None else str(h.vms)),
    Column("STATE", 0, False, host_marks, lambda h: "red" if h.down is not None or h.failed else "yellow"),
)


def _binds(v: VmRow) -> str:
    return "-" if v.saturated is None else ("yes" if v.saturated else "no")


VM_COLUMNS: tuple[Column, ...] = (
    Column("VM", 0, False, lambda v: v.name, lambda v: "red" if v.in_doubt else ""),
    Column("VC", 2, False, lambda v: v.vc or "unmanaged", lambda v: "" if v.vc else "dim"),
    Column("HOST", 1, False, lambda v: v.host),
    Column("CAP", 1, True, lambda v: num(v.cap_cores)),
    Column("USED", 1, True, lambda v: num(v.used_cores)),
    Column("BINDS", 3, True, _binds, lambda v: "yellow" if v.saturated else ""),
    Column("NEED", 4, True, lambda v: num(v.need_cores)),
    Column("EST", 3, True, lambda v: num(v.estimated_cores if v.vc else v.reserved_cores)),
    Column("YIELD", 1, True, lambda v: ("≤" if v.yield_upper_bound else "") + num(v.yield_, 3),
           lambda v: "bold red" if v.below_floor else ""),
    Column("FLOOR", 6, True, lambda v: "-" if v.floor is None else f"{v.floor:g}"),
    Column("VCPUS", 7, True, lambda v: str(v.vcpus)),
    Column("BASIS", 8, False, lambda v: v.basis or "-", lambda _v: "dim"),
    Column("STATE", 0, False, vm_marks, lambda v: "red" if v.in_doubt or v.below_floor else "yellow"),
)


def fit_columns(columns: Sequence[Column], rows: Sequence[Any], width: int) -> list[tuple[Column, int]]:
    """The columns that fit in ``width`` with each one's width (module docstring: dropped by priority, the rule
    of every vcsched table, :func:`cli.tables.keep_by_priority`)."""
    widths = [max([len(c.header), *(len(c.cell(r)) for r in rows)]) for c in columns]
    return [(columns[i], widths[i]) for i in keep_by_priority([c.priority for c in columns], widths, width, GAP)]


def table(columns: Sequence[Column], rows: Sequence[Any], width: int,
          fitted: Sequence[tuple[Column, int]] | None = None) -> list[Line]:
    """A header line and one line per row, in the columns that fit (:func:`fit_columns`, or ``fitted``)."""
    fitted = fit_columns(columns, rows, width) if fitted is None else fitted

    def line(cells: list[tuple[str, str]]) -> Line:
        out: list[Segment] = []
        for i, ((text, style), (c, w)) in enumerate(zip(cells, fitted, strict=True)):
            padded = text.rjust(w) if c.right else (text if i == len(fitted) - 1 else text.ljust(w))
            out.append((padded, style))
            if i < len(fitted) - 1:
                out.append((" " * GAP, ""))
        return tuple(out)

    lines = [line([(c.header, "bold") for c, _ in fitted])]
    lines += [line([(c.cell(r), c.style(r)) for c, _ in fitted]) for r in rows]
    return lines


def left_out(columns: Sequence[Column], row: Any, kept: Sequence[Column], width: int) -> list[Line]:
    """A row's values in the columns that did not fit, as indented lines under its row ("floor 0.6 · vcpus 1"):
    a narrow terminal moves a value, it never hides one (issue 40).  None when every column fits."""
    parts = [(f"{c.header.lower()} {c.cell(row)}", "dim") for c in columns if c not in kept]
    return [(("  ", ""), *line) for line in wrapped(parts, width - 2)] if parts else []


# ---------------------------------------------------------------------------------------------- free text


def cut(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters, cut at a word with "…" if longer."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    head = text[:max(width - 1, 0)]
    if " " in head:
        head = head[:head.rindex(" ")]
    return head + "…"


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def event_text(e: Mapping[str, Any]) -> str:
    """One controller event as a short line (docs/controller.md lists the events and their fields)."""
    kind = e.get("event", "?")
    if kind == "decision":
        return f"decision {e.get('kind')}: {e.get('reason', '')}"
    if kind == "plan":
        steps = (e.get("plan") or {}).get("steps") or []
        moves = sum(1 for s in steps if s.get("op") == "migrate")
        dry = " (dry run)" if e.get("dry_run") else ""
        return f"plan {e.get('kind')}{dry}: {plural(len(steps), 'step')}, {plural(moves, 'migration')}"
    if kind == "step":
        where = f"{e.get('from')}>{e.get('to')}" if e.get("op") == "migrate" else e.get("host", "")
        cap = f" cap {e['cap_cores']:.2f}" if isinstance(e.get("cap_cores"), int | float) else ""
        detail = f": {e['detail']}" if e.get("outcome") != "done" and e.get("detail") else ""
        return f"step {e.get('op')} {e.get('vm')} {where}{cap} {e.get('outcome')}{detail}"
    if kind == "applied":
        moved = e.get("migrated_bytes") or 0
        state = "ok" if e.get("ok") else f"STOPPED: {e.get('stopped') or 'a step failed'}"
        return f"applied {e.get('kind')}: {state}, {e.get('steps')} steps, {format_size(moved)} moved"
    if kind in ("host-down", "host-up"):
        return f"{kind} {e.get('host')}" + (f": {e['reason']}" if e.get("reason") else "")
    if kind in ("leader", "standby"):
        return f"{kind} {e.get('member')}" + (f": {e['reason']}" if e.get("reason") else "")
    if kind == "probe":
        caps = ", ".join(f"{vm} {cap:.2f}" for vm, cap in sorted((e.get("caps") or {}).items()))
        return f"probe{' (dry run)' if e.get('dry_run') else ''}: {caps}"
    if kind == "error":
        return f"error during {e.get('during')}: {e.get('error')}"
    if kind == "lock-busy":
        return f"lock busy ({e.get('action')}): {e.get('reason')}"
    return str(kind)


def _event_style(e: Mapping[str, Any]) -> str:
    kind = e.get("event")
    if kind in ("error", "host-down") or (kind == "step" and e.get("outcome") != "done") or \
            (kind == "applied" and not e.get("ok")):
        return "red"
    return "yellow" if kind in ("plan", "step", "applied", "probe") else ""


# ---------------------------------------------------------------------------------------------- the frame


@dataclass(frozen=True)
class Refresh:
    """How fresh the view is: when it was read (Unix time), the interval, and whether a read is under way."""

    read_at: float
    interval: float
    reading_for: float | None = None  # seconds the current read has taken so far (hosts being waited for)
    events_file: str | None = None


def summary(view: TopView) -> list[Segment]:
    parts: list[Segment] = [(f"cluster {view.cluster}", "bold"), (f"policy {view.policy}", "")]
    if view.min_yield is not None:
        worst = min(view.virtual_clusters, key=lambda vc: vc[1])[0]
        parts.append((f"min yield {view.min_yield:.3f} ({worst})", "bold red" if view.below_floor else "bold"))
        parts.append((f"mean yield {view.mean_yield:.3f}", ""))
        parts.append((plural(len(view.virtual_clusters), "virtual cluster"), ""))
    else:
        parts.append(("no virtual cluster runs", "dim"))
    if view.below_floor:
        parts.append((f"below floor: {', '.join(view.below_floor)}", "bold red"))
    down = sum(1 for h in view.hosts if h.down is not None and h.asleep is None)
    asleep = sum(1 for h in view.hosts if h.asleep is not None)
    parts.append((plural(len(view.hosts), "host") + (f", {down} down" if down else "")
                  + (f", {asleep} asleep" if asleep else ""), "red" if down else ""))
    running = sum(1 for v in view.vms if v.active)
    parts.append((plural(running, "VM"), ""))
    return parts


def joined(parts: Sequence[Segment], width: int, sep: str = " · ") -> Line:
    """``parts`` joined with ``sep``, as many as fit in ``width`` (the first always, cut at a word if need be)."""
    out: list[Segment] = []
    used = 0
    for i, (text, style) in enumerate(parts):
        extra = len(text) + (len(sep) if i else 0)
        if used + extra > width:
            if not out:
                out.append((cut(text, width), style))
            break
        if i:
            out.append((sep, "dim"))
        out.append((text, style))
        used += extra
    return tuple(out)


def wrapped(parts: Sequence[Segment], width: int, sep: str = " · ") -> list[Line]:
    """``parts`` joined with ``sep`` over as many lines as they take (a part never split across two, one wider
    than ``width`` cut at a word): the summary's facts are all said, whatever the width."""
    lines: list[Line] = []
    rest = list(parts)
    while rest:
        line = joined(rest, width, sep)
        lines.append(line)
        rest = rest[max(1, (len(line) + 1) // 2):]  # joined() gives part, sep, part, ...: (n + 1) // 2 parts
    return lines


def footer(sort: Sort, width: int) -> Line:
    keys = [(f"{k} {label}", "bold" if name == sort.key else "") for name, (label, k) in SORT_KEYS.items()]
    keys += [("r reverse", "bold" if sort.reverse else ""), ("q quit", "")]
    order = SORT_KEYS[sort.key][0] + (", reversed" if sort.reverse else "")
    return joined([*keys, (f"sorted by {order}", "dim")], width, sep="  ")


def frame(view: TopView, sort: Sort, width: int, height: int | None, refresh: Refresh, now: float) -> list[Line]:
    """The whole screen, at most ``height`` lines (None: as many as it takes, for a one-frame print)."""
    width = max(width, 20)
    head: list[Line] = []
    took = "" if refresh.reading_for is None else f", reading for {ago(refresh.reading_for)}"
    parts = summary(view)
    head += wrapped([("vcsched top", "bold reverse"), *parts[:2],
                     (f"{clock(refresh.read_at)} (every {refresh.interval:g}s{took})", "dim"), *parts[-2:]], width)
    head += wrapped(parts[2:-2], width)
    if view.problem:
        head.append(((cut(f"yields unknown: {view.problem}", width), "red"),))
    head.append(())
    head += table(HOST_COLUMNS, view.hosts, width)
    for h in view.hosts:
        for why in (h.down, h.failed):
            if why:  # libvirt's reasons name the host already ("host h1: did not answer ...")
                text = why if why.startswith(f"host {h.name}:") else f"host {h.name}: {why}"
                # Wrapped, not cut: why a host is down is what the operator came to read.
                head += [((line, "red"),) for line in textwrap.wrap(text, width, initial_indent="  ",
                                                                    subsequent_indent="    ")]
    for d in view.in_doubt:
        where = ", ".join(f"{h} ({st})" for h, st in zip(d.hosts, d.states, strict=True))
        text = f"IN DOUBT: {d.vm} is active on {where}" + (f"; {d.resolved}" if d.resolved else
                                                            ": no plan touches it until one copy is left")
        head.append(((cut(text, width), "bold red"),))
    for x in view.lost:
        text = (f"LOST: {x.vm} ({x.cluster}) runs nowhere: recorded on {x.host}, {x.why}, since {clock(x.since)} "
                f"(vcsched restart {x.vm} --apply)")
        head.append(((cut(text, width), "bold red"),))
    if view.lost_unknown:
        head.append(((cut(f"lost VMs unknown: {view.lost_unknown}", width), "yellow"),))
    head.append(())

    ctl = view.controller
    recent = list(ctl.recent) if ctl is not None else []
    tail: list[Line] = []
    if refresh.events_file is not None:
        tail.append(())
        if ctl is None or ctl.last_event_at is None:
            tail.append(((cut(f"controller ({refresh.events_file}): no event yet", width), "dim"),))
        else:
            state = f"leader {ctl.leader}" if ctl.leader else "no leader in this log"
            last = f"last event {ago(max(0.0, now - ctl.last_event_at))} ago"
            said: list[Segment] = [("controller", "bold"), (state, "" if ctl.leader else "red"), (last, "dim")]
            if ctl.decision is not None:
                said.append((f"last decision: {ctl.decision.get('kind')}", ""))
            tail.append(joined(said, width))
    footer_line = footer(sort, width)

    # The VMs first (at least MIN_EVENTS events stay in view), then the controller's events fill the rest.
    # The columns are fitted to every VM, shown or not, so that scrolling the sort does not move them.
    vms = sort_vms(view.vms, sort)
    fitted = fit_columns(VM_COLUMNS, vms, width)
    kept = [c for c, _ in fitted]
    rows = [(v, left_out(VM_COLUMNS, v, kept, width)) for v in vms]
    events_min = min(len(recent), MIN_EVENTS)
    room = None if height is None else max(0, height - len(head) - len(tail) - events_min - 2)  # VM header, footer
    if room is not None and sum(1 + len(extra) for _, extra in rows) > room:
        taken, used = [], 1  # the "… more VMs" line
        for v, extra in rows:
            if used + 1 + len(extra) > room:
                break
            taken.append((v, extra))
            used += 1 + len(extra)
        rows = taken
    shown_vms = [v for v, _ in rows]
    body: list[Line] = [(("no VMs", "dim"),)]
    if view.vms:
        header, *lines = table(VM_COLUMNS, shown_vms, width, fitted)
        body = [header, *(x for line, (_, extra) in zip(lines, rows, strict=True) for x in (line, *extra))]
    if len(shown_vms) < len(vms):
        more = plural(len(vms) - len(shown_vms), "more VM", "more VMs")
        body.append(((f"… {more} (a taller terminal shows them)", "dim"),))
    if tail and recent:
        free = MAX_EVENTS if height is None else height - len(head) - len(body) - len(tail) - 1
        for e in recent[-max(0, min(free, MAX_EVENTS)):] if free > 0 else []:
            tail.append(((clock(float(e.get("time", 0))) + " ", "dim"), (cut(event_text(e), width - 9),
                                                                        _event_style(e))))
    lines = head + body
    if height is not None:
        lines += [()] * max(0, height - len(lines) - len(tail) - 1)
    return [*lines, *tail, footer_line]


def plain(lines: Sequence[Line]) -> str:
    """The frame as text (tests; a one-frame print without colours), trailing spaces removed."""
    return "\n".join("".join(text for text, _ in line).rstrip() for line in lines)


def width_of(line: Line) -> int:
    return sum(len(text) for text, _ in line)

