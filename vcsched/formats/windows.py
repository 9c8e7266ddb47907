"""Maintenance windows: when `vcsched run` may migrate (cluster file ``windows``, ``blackouts``, ``timezone``).

::

    timezone = "Europe/Paris"                       # required with windows or blackouts (tz database name)
    windows = ["Mon-Fri 22:00-06:00", "Sat-Sun *"]  # migrations only inside one of these (none: any time)
    blackouts = ["2026-12-24..2027-01-02 *", "Fri 16:00-18:00"]   # never inside one of these

A spec is ``DAYS TIMES``:

* ``DAYS``: a weekday (``Mon`` ... ``Sun``, or the full name), a range
  (``Mon-Fri``, ``Fri-Mon`` wraps over the week-end), a comma list of those
  (``Mon,Wed,Fri-Sat``), a date (``2026-12-24``), a range of dates
  (``2026-12-24..2027-01-02``, both included), or ``*`` for every day;
* ``TIMES``: ``HH:MM-HH:MM`` in the named time zone's wall-clock time, or
  ``*`` for the whole day.  A range whose end is not after its start runs
  over midnight and belongs to the day it starts on: ``Mon-Fri 22:00-06:00``
  is Monday 22:00 to Tuesday 06:00, ..., Friday 22:00 to Saturday 06:00.
  ``24:00`` ends a day.

Migrations are allowed at an instant when no windows are given or it lies in
one, and it lies in no blackout.  Times are wall-clock times of ``timezone``
(zoneinfo): across a change of daylight-saving time a window keeps its wall
clock hours (one hour shorter or longer that night).  The zone is named, not
taken from the machine, so that a controller and its standby on machines set
to different zones agree.

Pure: the clock is the caller's (Unix seconds in, a verdict out).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from vcsched.errors import InputError

WINDOW_FIELDS = frozenset({"timezone", "windows", "blackouts"})

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_TIME = re.compile(r"([01]?[0-9]|2[0-4]):([0-5][0-9])")
_DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
_EXAMPLE = 'e.g. "Mon-Fri 22:00-06:00", "Sat-Sun *", "2026-12-24 *"'


@dataclass(frozen=True)
class Spec:
    """One window or blackout: the days it starts on, and its minutes of the day (end may pass midnight)."""

    text: str
    weekdays: frozenset[int]  # 0 = Monday; empty when the spec names dates
    dates: tuple[tuple[dt.date, dt.date], ...]  # inclusive ranges
    start: int  # minutes after midnight
    end: int  # minutes after the start day's midnight (> start; above 1440 when it runs over midnight)

    def starts_on(self, day: dt.date) -> bool:
        if self.dates:
            return any(a <= day <= b for a, b in self.dates)
        return day.weekday() in self.weekdays

    def covers(self, local: dt.datetime) -> bool:
        """Whether the wall-clock time ``local`` lies in this spec (begun today, or yesterday over midnight)."""
        minute = local.hour * 60 + local.minute + local.second / 60
        today = local.date()
        if self.starts_on(today) and self.start <= minute < self.end:
            return True
        return self.end > 1440 and self.starts_on(today - dt.timedelta(days=1)) and minute < self.end - 1440


def _day(where: str, word: str) -> int:
    w = word.lower()
    if w in _DAYS:
        return _DAYS.index(w)
    if w in _FULL:
        return _FULL.index(w)
    raise InputError(f"{where}: {word!r} is not a weekday (Mon ... Sun) ({_EXAMPLE})")


def _date(where: str, text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise InputError(f"{where}: {text!r} is not a date (YYYY-MM-DD)") from None


def _days(where: str, text: str) -> tuple[frozenset[int], tuple[tuple[dt.date, dt.date], ...]]:
    if text == "*":
        return frozenset(range(7)), ()
    if re.fullmatch(rf"{_DATE}(\.\.{_DATE})?", text):
        a, _, b = text.partition("..")
        since, until = _date(where, a), _date(where, b or a)
        if until < since:
            raise InputError(f"{where}: {text!r}: the range ends before it starts")
        return frozenset(), ((since, until),)
    days: set[int] = set()
    for part in text.split(","):
        a, dash, b = part.partition("-")
        if not a:
            raise InputError(f"{where}: {text!r} is not a list of weekdays ({_EXAMPLE})")
        first = _day(where, a)
        last = _day(where, b) if dash else first
        days |= {(first + k) % 7 for k in range((last - first) % 7 + 1)}
    return frozenset(days), ()


def _minute(where: str, text: str) -> int:
    m = _TIME.fullmatch(text)
    if not m or (m.group(1) == "24" and m.group(2) != "00"):
        raise InputError(f"{where}: {text!r} is not a time of day HH:MM (00:00 to 24:00)")
    return int(m.group(1)) * 60 + int(m.group(2))


def parse_spec(where: str, value: Any) -> Spec:
    """``DAYS TIMES`` (module docstring); an error names ``where`` and the value."""
    if not isinstance(value, str):
        raise InputError(f"{where}: expected a string such as {_EXAMPLE}, got {value!r}")
    parts = value.split()
    if len(parts) != 2:
        raise InputError(f"{where}: {value!r} is not DAYS TIMES ({_EXAMPLE})")
    weekdays, dates = _days(where, parts[0])
    if parts[1] == "*":
        return Spec(value, weekdays, dates, 0, 1440)
    a, dash, b = parts[1].partition("-")
    if not dash:
        raise InputError(f"{where}: {parts[1]!r} is not a time range HH:MM-HH:MM or * ({_EXAMPLE})")
    start, end = _minute(where, a), _minute(where, b)
    if start == 1440:
        raise InputError(f"{where}: {parts[1]!r} starts at 24:00 (write 00:00 of the next day)")
    if end == start:
        raise InputError(f"{where}: {parts[1]!r} is empty or a whole day: write * for a whole day")
    return Spec(value, weekdays, dates, start, end if end > start else end + 1440)


@dataclass(frozen=True)
class MaintenanceSchedule:
    """When migrations are allowed (module docstring).  No windows and no blackouts: always."""

    timezone: str = "UTC"
    windows: tuple[Spec, ...] = ()
    blackouts: tuple[Spec, ...] = ()

    @property
    def always(self) -> bool:
        return not self.windows and not self.blackouts

    def local(self, t: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(t, ZoneInfo(self.timezone))

    def why_closed(self, t: float) -> str | None:
        """None when migrations are allowed at Unix time ``t``; else why not, in words."""
        if self.always:
            return None
        local = self.local(t)
        stamp = f"{local:%a %H:%M} {self.timezone}"
        for b in self.blackouts:
            if b.covers(local):
                return f"{stamp} is in blackout {b.text!r}"
        if self.windows and not any(w.covers(local) for w in self.windows):
            return f"{stamp} is outside the maintenance windows ({', '.join(repr(w.text) for w in self.windows)})"
        return None

    def allows(self, t: float) -> bool:
        return self.why_closed(t) is None

    def next_change(self, t: float, horizon_days: int = 8) -> float | None:
        """The first instant after ``t`` (to the minute, within ``horizon_days``) at which :meth:`allows` changes."""
        if self.always:
            return None
        now = self.allows(t)
        tz = ZoneInfo(self.timezone)
        day0 = self.local(t).date()
        minutes = {0} | {m % 1440 for s in (*self.windows, *self.blackouts) for m in (s.start, s.end)}
        candidates = sorted({dt.datetime.combine(day0 + dt.timedelta(days=d), dt.time(m // 60, m % 60),
                                                 tzinfo=tz).timestamp()
                             for d in range(horizon_days + 1) for m in minutes})
        return next((c for c in candidates if c > t and self.allows(c) != now), None)

    def to_dict(self) -> dict[str, Any]:
        return {"timezone": self.timezone, "windows": [w.text for w in self.windows],
                "blackouts": [b.text for b in self.blackouts]}


ALWAYS = MaintenanceSchedule()


def _specs(where: str, raw: Any) -> tuple[Spec, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise InputError(f"{where}: expected a list of strings such as [{_EXAMPLE}], got {raw!r}")
    return tuple(parse_spec(f"{where}[{i}]", s) for i, s in enumerate(raw))


def check_timezone(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in value:
        raise InputError(f"{where}: {value!r} is not a time zone name (e.g. \"Europe/Paris\", \"UTC\")")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(f"{where}: {value!r} is not a time zone the tz database knows "
                         "(e.g. \"Europe/Paris\", \"UTC\")") from None
    return value


def schedule_from_dict(d: Mapping[str, Any]) -> MaintenanceSchedule:
    """The window keys of a decoded cluster file; errors name key and value."""
    windows = _specs("windows", d["windows"]) if "windows" in d else ()
    blackouts = _specs("blackouts", d["blackouts"]) if "blackouts" in d else ()
    if "timezone" not in d:
        if windows or blackouts:
            raise InputError(f"timezone: missing: {'windows' if windows else 'blackouts'} need a named time zone "
                             "(e.g. timezone = \"Europe/Paris\"), so every controller reads them alike")
        return ALWAYS
    return MaintenanceSchedule(check_timezone("timezone", d["timezone"]), windows, blackouts)
