"""A calibration says when its run cannot be trusted (issue 40: `calibrate --backend cgroup --duration 1` at a
load average of 14 reported an overhead of −496 % and no verdict).  The rules (calibration/verdict.py) on plain
numbers, and the command on a fake backend whose machine load is stubbed: the run is printed, judged
unreliable with its reasons, and exits 1."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import pytest
from click.testing import CliRunner

from calibration.verdict import unreliable
from cli.main import cli

QUIET = {"load_1m": 0.3, "cpus": 2, "cpu": 1, "cpu_busy_before": 0.05, "duration": 2.0, "rate_overhead": 0.01,
         "bare_drift": 0.02}


def test_a_quiet_long_run_is_reliable() -> None:
    assert unreliable(**QUIET) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "said"), [
    ({"load_1m": 14.0}, "load: the load average was 14 at the start on 2 CPUs: every CPU, CPU 1 too, had other "
                        "work to run"),
    ({"load_1m": 4.0, "own": 2}, "load: the load average was 4 at the start (2 of it this run's own subjects) "
                                 "on 2 CPUs"),
    ({"cpu_busy_before": 0.8}, "busy CPU: CPU 1 was 80 % busy just before the run"),
    ({"duration": 0.5}, "too short: each measurement lasted 0.5 s, fewer than ten CFS periods of 100 ms"),
    ({"rate_overhead": -4.96}, "faster uncapped than bare: the overhead measured -496 %"),
    ({"bare_drift": -0.2}, "drift: the bare rate changed -20.0 % from the start of the run to its end"),
])
def test_each_sign_of_a_disturbed_run_is_a_reason_naming_what_was_measured(change: dict[str, float],
                                                                          said: str) -> None:
    (reason,) = unreliable(**(QUIET | change))  # type: ignore[arg-type]
    assert reason.startswith(said), reason


def test_what_a_run_did_not_measure_is_not_judged() -> None:
    assert unreliable(**(QUIET | {"rate_overhead": None, "bare_drift": None})) == []  # type: ignore[arg-type]


def test_a_load_its_own_looping_guests_make_is_not_held_against_a_run() -> None:
    # docs/calibration.md's libvirt run: two guests looping on 2 CPUs, load 1.71 at the start.
    assert unreliable(**(QUIET | {"load_1m": 3.5, "own": 2, "cpu_busy_before": None})) == []  # type: ignore[arg-type]


class FakeSubjects:
    """One subject whose work advances with the clock: ``bare`` units/s bare, ``uncapped`` under the mechanism
    with no cap, ``cap x bare`` capped.  CPU seconds advance as the work does, over ``bare``."""

    unit = "work/s"
    count = 1
    nominal_bare = None
    default_window = 0.1
    resource = "cpu"

    def __init__(self, bare: float = 1.0, uncapped: float = 1.0) -> None:
        self.bare, self.uncapped = bare, uncapped
        self.rate = bare
        self.running = False
        self.work = 0.0
        self.last = time.monotonic()

    def _advance(self) -> float:
        now = time.monotonic()
        if self.running:
            self.work += (now - self.last) * self.rate
        self.last = now
        return now

    def resume(self, index: int) -> None:
        self._advance()
        self.running = True

    def pause(self, index: int) -> None:
        self._advance()
        self.running = False

    def set_cap(self, index: int, cap: float | None) -> None:
        self._advance()
        self.rate = self.uncapped if cap is None else cap * self.bare

    def make_bare(self, index: int) -> None:
        self._advance()
        self.rate = self.bare

    def poll(self, index: int) -> Sequence[tuple[float, float, float]]:
        now = self._advance()
        return [(now, self.work, self.work / self.bare)]


def calibrate(monkeypatch: pytest.MonkeyPatch, load: float, subjects: FakeSubjects, *args: str) -> Any:
    from cli import calibrate as command

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(command, "cpu_busy", lambda: {0: 0.1, 1: 0.05})
    monkeypatch.setattr(command, "open_subjects", lambda *_a, **_k: contextlib.nullcontext(subjects))
    return CliRunner().invoke(cli, ["calibrate", "--caps", "0.5", "--pairs", "1", "--window", "0.01", *args])


def test_a_run_under_a_load_of_14_on_2_cpus_is_judged_unreliable_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    r = calibrate(monkeypatch, 14.0, FakeSubjects(), "--duration", "0.05", "--json")
    assert r.exit_code == 1, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["reliable"] is False
    assert [x.split(":")[0] for x in doc["unreliable"]] == ["load", "too short"]
    assert r.stderr.strip().splitlines()[-1].startswith("vcsched: refused: calibration unreliable: load: the load "
                                                        "average was 14 at the start on 2 CPUs: every CPU")


def test_uncapped_work_faster_than_bare_is_named_in_the_table_output(monkeypatch: pytest.MonkeyPatch) -> None:
    r = calibrate(monkeypatch, 0.2, FakeSubjects(bare=1.0, uncapped=5.96), "--duration", "0.05")
    assert r.exit_code == 1, (r.stdout, r.stderr)
    said = [line for line in r.stdout.splitlines() if line.startswith("unreliable run: ")]
    assert [s.split(": ")[1] for s in said] == ["too short", "faster uncapped than bare"], r.stdout
    assert "the overhead measured -496 %" in r.stdout
