"""``vcsched solve-adapt``: output format, budget parsing and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli

GIB = 1 << 30
LOPSIDED: dict[str, Any] = {
    "hosts": [{"name": "h0"}, {"name": "h1"}],
    "host_memory_bytes": "4GiB",
    "jobs": [{"name": "a", "cpu_need": 0.8, "memory": 0.25, "current": [0]},
             {"name": "b", "cpu_need": 0.8, "memory": 0.25, "current": [0]},
             {"name": "c", "cpu_need": 0.2, "memory": 0.25, "current": [1]}],
}


def run(tmp_path: Path, doc: Any, *args: str) -> Any:
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(doc))
    return CliRunner().invoke(cli, ["solve-adapt", str(path), *args])


def test_json_output_has_the_solve_fields_plus_migrations(tmp_path: Path) -> None:
    r = run(tmp_path, LOPSIDED, "--budget", "1GiB", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    for key in ("algorithm", "feasible", "min_yield", "avg_yield", "runtime_s", "optimal", "placement",
                "migrations", "migrated_bytes"):
        assert key in out
    assert out["min_yield"] == pytest.approx(1.0)
    assert out["migrated_bytes"] == GIB
    (m,) = out["migrations"]
    assert m["from"] == 0 and m["to"] == 1 and m["bytes"] == GIB and m["task"] == 0


def test_budget_zero_reports_no_migrations(tmp_path: Path) -> None:
    r = run(tmp_path, LOPSIDED, "--budget", "0", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["migrations"] == [] and out["migrated_bytes"] == 0
    assert out["min_yield"] == pytest.approx(1 / 1.6)


def test_milp_is_selectable_and_reports_optimality(tmp_path: Path) -> None:
    r = run(tmp_path, LOPSIDED, "--budget", "1GiB", "-a", "milp", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["optimal"] is True and out["min_yield"] == pytest.approx(1.0)


def test_table_output_names_the_migration(tmp_path: Path) -> None:
    r = run(tmp_path, LOPSIDED, "--budget", "unlimited")
    assert r.exit_code == 0, r.output
    assert "live migrations" in r.output and "h0" in r.output


def test_no_placement_within_the_budget_exits_one(tmp_path: Path) -> None:
    doc = {"hosts": [{"name": "h0", "memory": 0.5}, {"name": "h1"}],
           "jobs": [{"name": "a", "cpu_need": 0.3, "memory": 0.4, "current": [0]},
                    {"name": "b", "cpu_need": 0.3, "memory": 0.4, "current": [0]}]}
    r = run(tmp_path, doc, "--budget", "0", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["feasible"] is False
    assert r.stderr.startswith("vcsched: refused: heuristic: no placement within the budget of 0 B")


@pytest.mark.parametrize(("args", "message"), [
    (["--budget", "2XB"], "--budget"),
    (["--budget", "-1"], "--budget"),
    (["--budget", "1GiB", "-a", "mcb8"], "--algorithm"),
    (["--budget", "1GiB", "--time-limit", "0"], "--time-limit"),
])
def test_bad_flags_exit_two_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    r = run(tmp_path, LOPSIDED, *args)
    assert r.exit_code == 2
    assert message in r.output


def test_bad_current_host_exits_two_naming_the_field(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(LOPSIDED))
    doc["jobs"][0]["current"] = [5]
    r = run(tmp_path, doc, "--budget", "0")
    assert r.exit_code == 2
    assert "jobs[0].current[0]: 5 is not a host index" in r.output


def test_experiment_adapt_writes_report_records_and_json(tmp_path: Path) -> None:
    from cli.experiment_adapt import adapt_experiment
    from vcsched.experiments.adaptation import TraceSpec

    tiny = (("tiny", TraceSpec(hosts=3, tasks=6, slack=0.5, steps=2), ("none", "heuristic", "milp", "scratch")),)
    code = adapt_experiment(1, str(tmp_path), 5.0, 0, 1, True, sets=tiny)
    assert code == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Mean minimum yield" in report and "unlimited" in report
    records = json.loads((tmp_path / "records_tiny.json").read_text())
    assert len(records["records"]) == 2 * 8  # two steps at each of the eight budget levels


def test_experiment_help_lists_the_adapt_set() -> None:
    r = CliRunner().invoke(cli, ["experiment", "--help"])
    assert r.exit_code == 0 and "adapt" in r.output


def test_adapt_set_need_must_be_vm_equals_cores() -> None:
    r = CliRunner().invoke(cli, ["adapt", "--budget", "1GiB", "--set-need", "web-0=-1"])
    assert r.exit_code == 2 and "--set-need: 'web-0=-1'" in r.output


def test_adapt_set_need_given_twice_for_one_vm_is_refused() -> None:
    r = CliRunner().invoke(cli, ["adapt", "--budget", "1GiB", "--set-need", "web-0=0.3", "--set-need", "web-0=0.5",
                                 "--cluster", "/nonexistent"])
    assert r.exit_code == 2 and "'web-0' is given twice (0.3 and 0.5 cores)" in r.output


def test_adapt_set_need_also_in_the_changes_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "changes.json"
    f.write_text(json.dumps({"set_need": {"web-0": 0.4}}))
    r = CliRunner().invoke(cli, ["adapt", "--budget", "1GiB", "--set-need", "web-0=0.3", "--changes", str(f),
                                 "--cluster", "/nonexistent"])
    assert r.exit_code == 2 and "'web-0' also has a need in --changes" in r.output


@pytest.mark.parametrize(("doc", "message"), [
    ({"arrive": ["web"]}, 'only "set_need" and "depart"'),
    ({"depart": "web"}, "depart: expected a list of virtual cluster names"),
    ({"depart": [""]}, "depart: expected a list of virtual cluster names"),
    ({"set_need": {"web-0": 0}}, "set_need.web-0: 0 must be above 0"),
    ({"set_need": {"web-0": "0.3"}}, "set_need.web-0: expected a number, got '0.3'"),
])
def test_adapt_changes_file_is_validated_before_any_host_is_read(tmp_path: Path, doc: Any, message: str) -> None:
    f = tmp_path / "changes.json"
    f.write_text(json.dumps(doc))
    r = CliRunner().invoke(cli, ["adapt", "--budget", "1GiB", "--changes", str(f), "--cluster", "/nonexistent"])
    assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1


def test_adapt_budget_is_required() -> None:
    r = CliRunner().invoke(cli, ["adapt"])
    assert r.exit_code == 2 and "--budget" in r.output
