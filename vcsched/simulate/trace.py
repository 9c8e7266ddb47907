"""Trace files: VC arrivals at given times instead of Poisson processes.

A trace is CSV text with a header line naming its columns: ``time`` and
``class`` are required, ``work`` is optional (time at full speed; when the
column or a cell is empty, the work is drawn from the class's distribution,
seeded like the rest of the run)::

    time,class,work
    0.0,web,1.5
    0.25,batch,
    0.4,web,0.8

Lines starting with ``#`` and blank lines are ignored.  Times must be finite,
at least 0 and non-decreasing; classes must be named in the workload; work,
when given, a finite number above 0.  Any mistake is one :class:`InputError`
naming the line.
"""

from __future__ import annotations

import csv
import io
import math

from vcsched.errors import InputError
from vcsched.simulate.fluid import Arrival
from vcsched.simulate.workload import Workload

COLUMNS = ("time", "class", "work")


def _number(where: str, field: str, text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise InputError(f"{where}: {field} {text!r} is not a number") from None
    if not math.isfinite(x):
        raise InputError(f"{where}: {field} {text!r} is not a finite number")
    return x


def parse_trace(text: str, workload: Workload, name: str = "trace") -> list[Arrival]:
    """The arrivals of a trace file's text, checked against the workload's classes."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InputError(f"{name}: empty (expected a header line 'time,class[,work]' and arrivals)")
    header_no, header = lines[0]
    cols = [c.strip() for c in next(csv.reader([header]))]
    unknown = [c for c in cols if c not in COLUMNS]
    if unknown:
        raise InputError(f"{name} line {header_no}: unknown column {unknown[0]!r} (columns: {', '.join(COLUMNS)})")
    for need in ("time", "class"):
        if need not in cols:
            raise InputError(f"{name} line {header_no}: missing column {need!r} in the header")
    if len(set(cols)) != len(cols):
        raise InputError(f"{name} line {header_no}: a column appears twice")
    index = {c: i for i, c in enumerate(cols)}
    classes = {c.name: k for k, c in enumerate(workload.classes)}
    out: list[Arrival] = []
    last = 0.0
    for n, line in lines[1:]:
        where = f"{name} line {n}"
        try:
            cells = [c.strip() for c in next(csv.reader(io.StringIO(line)))]
        except csv.Error as exc:  # pragma: no cover - csv accepts nearly anything on one line
            raise InputError(f"{where}: {exc}") from None
        if len(cells) != len(cols):
            raise InputError(f"{where}: {len(cells)} fields, expected {len(cols)} ({', '.join(cols)})")
        t = _number(where, "time", cells[index["time"]])
        if t < 0:
            raise InputError(f"{where}: time {t:g} is negative")
        if t < last:
            raise InputError(f"{where}: time {t:g} is before the previous arrival ({last:g}); sort the trace")
        last = t
        cls = cells[index["class"]]
        if cls not in classes:
            raise InputError(f"{where}: unknown class {cls!r} (classes: {', '.join(classes)})")
        work = None
        if "work" in index and cells[index["work"]] != "":
            work = _number(where, "work", cells[index["work"]])
            if work <= 0:
                raise InputError(f"{where}: work {work:g} must be above 0")
        out.append(Arrival(t, classes[cls], work))
    if not out:
        raise InputError(f"{name}: no arrivals after the header")
    return out


def format_trace(arrivals: list[Arrival], workload: Workload) -> str:
    """The CSV text of ``arrivals`` (the inverse of :func:`parse_trace`)."""
    rows = ["time,class,work"]
    for a in arrivals:
        work = "" if a.work is None else repr(a.work)
        rows.append(f"{a.time!r},{workload.classes[a.cls].name},{work}")
    return "\n".join(rows) + "\n"
