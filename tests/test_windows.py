"""Maintenance windows: the cluster file's ``windows``, ``blackouts`` and ``timezone`` (pure, with a clock passed
in), and the controller migrating nothing outside a window (in memory, fake clock; and `vcsched run` on the real
clock, reading them from the cluster file)."""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from vcsched.errors import InputError
from vcsched.formats.cluster import cluster_from_dict
from vcsched.formats.windows import MaintenanceSchedule, parse_spec, schedule_from_dict

PARIS = "Europe/Paris"


def at(text: str, tz: str = PARIS) -> float:
    """Unix time of a wall-clock ``YYYY-MM-DD HH:MM`` in ``tz``."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp()


def schedule(windows: list[str] | None = None, blackouts: list[str] | None = None, tz: str = PARIS) -> Any:
    d: dict[str, Any] = {"timezone": tz}
    if windows is not None:
        d["windows"] = windows
    if blackouts is not None:
        d["blackouts"] = blackouts
    return schedule_from_dict(d)


# 2026-11-23 is a Monday.
NIGHTS = schedule(["Mon-Fri 22:00-06:00", "Sat-Sun *"])


@pytest.mark.parametrize(("when", "allowed"), [
    ("2026-11-23 21:59", False),  # Monday evening, before the window
    ("2026-11-23 22:00", True),  # it opens
    ("2026-11-23 23:59", True),
    ("2026-11-24 00:00", True),  # across midnight: Monday's window goes on into Tuesday
    ("2026-11-24 05:59", True),
    ("2026-11-24 06:00", False),  # it closes (end excluded)
    ("2026-11-24 12:00", False),  # Tuesday noon
    ("2026-11-27 23:00", True),  # Friday night
    ("2026-11-28 03:00", True),  # Saturday: Friday's night and the week-end
    ("2026-11-29 14:00", True),  # Sunday afternoon
    ("2026-11-30 03:00", False),  # Monday 03:00: Sunday's "*" ended at midnight, Monday's starts at 22:00
])
def test_weekday_ranges_and_windows_across_midnight(when: str, allowed: bool) -> None:
    assert NIGHTS.allows(at(when)) is allowed


def test_a_window_over_midnight_belongs_to_the_day_it_starts_on() -> None:
    fridays = schedule(["Fri 22:00-02:00"])
    assert fridays.allows(at("2026-11-28 01:00"))  # Saturday 01:00: Friday's window
    assert not fridays.allows(at("2026-11-27 01:00"))  # Friday 01:00: Thursday had none


def test_a_weekday_range_can_wrap_over_the_week_end() -> None:
    spec = parse_spec("w", "Fri-Mon *")
    assert spec.weekdays == frozenset({4, 5, 6, 0})


def test_a_blackout_closes_a_window() -> None:
    s = schedule(["* *"], ["2026-12-24..2026-12-26 *", "Wed 12:00-13:00"])
    assert s.allows(at("2026-12-23 23:59"))
    assert not s.allows(at("2026-12-24 00:00"))
    assert not s.allows(at("2026-12-26 23:59"))
    assert s.allows(at("2026-12-27 00:00"))
    assert not s.allows(at("2026-11-25 12:30"))  # a Wednesday
    assert "blackout 'Wed 12:00-13:00'" in (s.why_closed(at("2026-11-25 12:30")) or "")


def test_blackouts_alone_allow_everything_else() -> None:
    s = schedule(blackouts=["Mon 09:00-17:00"])
    assert s.allows(at("2026-11-24 10:00")) and not s.allows(at("2026-11-23 10:00"))


def test_no_windows_means_always() -> None:
    assert MaintenanceSchedule().allows(0.0) and cluster_from_dict(
        {"name": "c", "hosts": [{"name": "h0", "uri": "test:///default"}]}).schedule.always


def test_windows_keep_their_wall_clock_hours_across_a_change_of_daylight_saving_time() -> None:
    s = schedule(["* 01:00-04:00"])
    # 2026-03-29 in Paris: 02:00 CET jumps to 03:00 CEST; the window is 2 real hours that night.
    opens, closes = at("2026-03-29 01:00"), at("2026-03-29 04:00")
    assert closes - opens == 2 * 3600
    assert s.allows(opens) and s.allows(closes - 60) and not s.allows(closes)
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; the window is 4 real hours that night.
    opens, closes = at("2026-10-25 01:00"), at("2026-10-25 04:00")
    assert closes - opens == 4 * 3600
    assert all(s.allows(opens + k * 600) for k in range(24)) and not s.allows(closes)


def test_the_same_instant_is_judged_in_the_named_zone() -> None:
    s = schedule(["* 22:00-23:00"], tz="Asia/Tokyo")
    t = at("2026-11-23 22:30", "Asia/Tokyo")
    assert s.allows(t) and not schedule(["* 22:00-23:00"]).allows(t)  # 14:30 in Paris


def test_the_next_change_is_when_the_window_opens() -> None:
    t = at("2026-11-24 12:00")
    assert NIGHTS.next_change(t) == at("2026-11-24 22:00")
    assert NIGHTS.next_change(at("2026-11-24 23:00")) == at("2026-11-25 06:00")


@pytest.mark.parametrize(("d", "message"), [
    ({"timezone": PARIS, "windows": ["Mon-Fri"]}, r"^windows\[0\]: 'Mon-Fri' is not DAYS TIMES"),
    ({"timezone": PARIS, "windows": ["Mon-Fry 22:00-06:00"]}, r"^windows\[0\]: 'Fry' is not a weekday"),
    ({"timezone": PARIS, "windows": ["Mon 25:00-06:00"]}, r"^windows\[0\]: '25:00' is not a time of day"),
    ({"timezone": PARIS, "windows": ["Mon 10:00-10:00"]}, r"^windows\[0\]: '10:00-10:00' is empty or a whole day"),
    ({"timezone": PARIS, "windows": ["Mon 10:00"]}, r"^windows\[0\]: '10:00' is not a time range"),
    ({"timezone": PARIS, "windows": "Mon *"}, r"^windows: expected a list of strings"),
    ({"timezone": PARIS, "windows": [3]}, r"^windows\[0\]: expected a string"),
    ({"timezone": PARIS, "blackouts": ["2026-02-30 *"]}, r"^blackouts\[0\]: '2026-02-30' is not a date"),
    ({"timezone": PARIS, "blackouts": ["2026-12-26..2026-12-24 *"]}, r"^blackouts\[0\]: .*ends before it starts"),
    ({"timezone": "Mars/Olympus", "windows": ["* *"]}, r"^timezone: 'Mars/Olympus' is not a time zone"),
    ({"timezone": "../etc/passwd", "windows": ["* *"]}, r"^timezone: '../etc/passwd' is not a time zone name"),
    ({"windows": ["* *"]}, r"^timezone: missing: windows need a named time zone"),
])
def test_bad_windows_are_one_line_naming_field_and_value(d: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        cluster_from_dict({"name": "c", "hosts": [{"name": "h0", "uri": "test:///default"}], **d})


# ---------------------------------------------------------------- the controller (in memory, fake clock)


def test_outside_a_window_the_controller_recaps_but_migrates_nothing_then_migrates_once_it_opens() -> None:
    from tests.builders import inventory_of, managed
    from tests.fake_load import FakeClock, FakeLocks, LoadedHypervisor, busy
    from tests.test_controller import Run

    clock = FakeClock(start=at("2026-11-23 21:57"))  # a Monday, 3 minutes before the window opens
    inv = inventory_of([managed("a-0", "h0", "a", 1.0, 0.5), managed("b-0", "h0", "b", 1.0, 0.5),
                        managed("c-0", "h1", "c", 1.0, 1.0)])
    hv = LoadedHypervisor("lab", inv.hosts, inv.vms, clock, {"a-0": busy(1.0), "b-0": busy(1.0), "c-0": busy(0.05)})
    run = Run(hv, clock, FakeLocks(), schedule=NIGHTS)
    run.cycles(17)  # ticks at 21:57:00 ... 21:59:40: the window excludes them all
    migrations = [s for s in run.events("step") if s["op"] == "migrate"]
    assert migrations == []
    closed = [d for d in run.events("decision") if d.get("window")]
    assert closed and all("outside the maintenance windows" in d["window"] for d in closed)
    assert all("migrations allowed again at Mon 2026-11-23 22:00" in d["reason"] for d in closed)
    assert [s for s in run.events("step") if s["op"] == "set-cap" and s["outcome"] == "done"]  # caps still follow
    run.cycles(6)  # 21:59:50 ... 22:00:40: inside the window; the gain settles over 2 intervals, then it moves
    migrations = [s for s in run.events("step") if s["op"] == "migrate" and s["outcome"] == "done"]
    assert len(migrations) == 1
    assert run.at(migrations[0]) >= at("2026-11-23 22:00") - clock.start
    assert {hv.vms["a-0"].host, hv.vms["b-0"].host} == {"h0", "h1"}


@pytest.mark.parametrize(("line", "message"), [
    ('timezone = "UTC"\nwindows = ["Mon-Fry *"]', "windows[0]: 'Fry' is not a weekday"),
    ("max_migrations_per_host = -1", "max_migrations_per_host: -1 is not a whole number of migrations >= 1"),
])
def test_a_bad_window_or_throttle_stops_any_command_with_one_line_and_exit_2(tmp_path: Any, line: str,
                                                                              message: str) -> None:
    from click.testing import CliRunner

    from cli.main import cli

    path = tmp_path / "cluster.toml"
    path.write_text(f'name = "t"\n{line}\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    for argv in (["status", "--sample", "0"], ["run", "--budget-per-interval", "0"], ["drain", "h0", "--budget", "0"]):
        r = CliRunner().invoke(cli, [*argv, "--cluster", str(path)])
        assert r.exit_code == 2 and r.stdout == "", (argv, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vcsched: error: ") and message in lines[0], r.stderr


# ---------------------------------------------------------------- `vcsched run`, on the real clock


def controller_until(tmp_path: Any, cluster: Any, name: str, seen: Any) -> list[dict[str, Any]]:
    """Events of a real `vcsched run --dry-run` on ``cluster`` (in this process: its imports are paid once), run
    for longer each time until ``seen(events)`` holds: a loaded machine may need more than the first 1.5 s."""
    import json

    from click.testing import CliRunner

    from cli.main import cli

    events: list[dict[str, Any]] = []
    for i, duration in enumerate((1.5, 5, 20)):
        log = tmp_path / f"{name}-{i}.jsonl"
        r = CliRunner().invoke(cli, ["run", "--cluster", str(cluster), "--dry-run", "--interval", "0.3s", "--settle",
                                     "1", "--probe-seconds", "0", "--budget-per-interval", "4GiB", "--duration",
                                     f"{duration}s", "--log", str(log)],
                               env={"VCSCHED_STATE_DIR": str(tmp_path / "state")})
        assert r.exit_code == 0, (r.output, r.stderr)
        events = [json.loads(line) for line in log.read_text().splitlines()]
        if seen(events):
            break
    return events


def test_vcsched_run_migrates_nothing_in_a_window_that_excludes_now_and_migrates_in_one_that_includes_it(
        tmp_path: Any) -> None:
    """The cluster file's windows reach the controller `vcsched run` starts, judged on the real clock.  Two hosts
    of libvirt's test driver: h0 holds 3 VMs of 0.5 core on its 1 core, h1 none, so the controller wants to move
    some (``--dry-run``: it plans and logs, the test driver could not migrate).  With the only window on the day
    after tomorrow it migrates nothing and says why; with ``* *`` it plans the move."""
    import time

    from hypervisor.testhosts import node_xml

    (tmp_path / "h0.xml").write_text(node_xml(0, 3, cores=1))
    (tmp_path / "h1.xml").write_text(node_xml(1, 0, cores=1))
    day = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[(time.gmtime().tm_wday + 2) % 7]
    hosts = "".join(f'[[hosts]]\nname = "h{i}"\nuri = "test://{tmp_path / f"h{i}.xml"}"\n' for i in (0, 1))

    def migrating(events: list[dict[str, Any]]) -> list[Any]:
        return [s for e in events if e["event"] == "plan" for s in e["plan"]["steps"] if s["op"] == "migrate"]

    closed = tmp_path / "closed.toml"
    closed.write_text(f'name = "t"\ntimezone = "UTC"\nwindows = ["{day} *"]\n{hosts}')
    events = controller_until(tmp_path, closed, "closed",
                              lambda ev: any(e["event"] == "decision" and e.get("window") for e in ev))
    assert events[0]["schedule"]["windows"] == [f"{day} *"]
    outside = [e for e in events if e["event"] == "decision" and e.get("window")]
    assert outside and "outside the maintenance windows" in outside[0]["window"], events
    assert f"migrations allowed again at {day} " in outside[0]["reason"]
    assert not migrating(events)

    opened = tmp_path / "open.toml"
    opened.write_text(f'name = "t"\ntimezone = "UTC"\nwindows = ["* *"]\n{hosts}')
    events = controller_until(tmp_path, opened, "open", migrating)
    assert migrating(events) and all(s["from"] == "h0" and s["to"] == "h1" for s in migrating(events))
