"""The experiment machinery: families, seeds, records, the report's arithmetic, and the CLI end to end."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import cli
from vcsched.errors import InputError
from vcsched.experiments.paper import (
    Record,
    anytime_summary,
    bound_gap_by_slack,
    budget_label,
    degradation,
    failures_by_slack,
    in_run_order,
    milp_gaps,
    missing_items,
    parse_label,
    ranking,
    report_markdown,
    resumable_records,
    run_item,
    run_items,
    specs,
    work_items,
)
from vcsched.model import Instance, SolveOptions
from vcsched.solvers import registry


def rec(instance: int, algorithm: str, min_yield: float | None, *, slack: float = 0.5,
        optimal: bool | None = None, error: str | None = None) -> Record:
    """A hand-made record: instance ``instance`` of family 0, 4 hosts x 6 tasks."""
    return Record(set_name="small", spec_index=0, instance=instance, seed=instance, hosts=4, tasks=6, jobs=6,
                  slack=slack, cv_mem=0.25, cv_cpu=0.25, algorithm=algorithm,
                  feasible=min_yield is not None and error is None, min_yield=min_yield,
                  avg_yield=None if min_yield is None else min(1.0, min_yield + 0.1), runtime_s=0.01,
                  optimal=optimal, error=error)


# ------------------------------------------------------------------ families and seeds


def test_small_set_has_the_papers_144_families() -> None:
    fams = specs("small")
    assert len(fams) == 144
    assert {f.hosts for f in fams} == {4}
    assert {f.tasks for f in fams} == {6, 8, 10, 12}
    assert {f.slack for f in fams} == {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}
    assert {(f.cv_mem, f.cv_cpu) for f in fams} == {(0.25, 0.25), (0.25, 0.75), (0.75, 0.25), (0.75, 0.75)}


def test_large_and_parallel_sets_have_108_families_on_64_hosts() -> None:
    for name in ("large", "parallel"):
        fams = specs(name)
        assert len(fams) == 108
        assert {f.hosts for f in fams} == {64}
        assert {f.tasks for f in fams} == {100, 250, 500}
        assert all(f.parallel == (name == "parallel") for f in fams)


def test_a_reduced_set_keeps_only_the_requested_task_counts() -> None:
    assert {f.tasks for f in specs("large", [100, 250])} == {100, 250}
    with pytest.raises(InputError, match="tasks: 7"):
        specs("small", [7])


def test_every_instance_gets_its_own_reproducible_seed() -> None:
    items = work_items("small", 3, ["lpbound"], seed=11)
    assert len(items) == 144 * 3
    assert len({i.seed for i in items}) == len(items)
    assert [i.seed for i in work_items("small", 3, ["lpbound"], seed=11)] == [i.seed for i in items]
    assert items[0].seed != work_items("small", 3, ["lpbound"], seed=12)[0].seed


def test_a_reduced_run_is_a_subset_of_the_full_run() -> None:
    full = {(i.spec_index, i.instance): i.seed for i in work_items("large", 3, ["lpbound"])}
    part = work_items("large", 2, ["lpbound"], tasks=[250])
    assert {i.spec.tasks for i in part} == {250}
    assert all(full[(i.spec_index, i.instance)] == i.seed for i in part)


# ------------------------------------------------------------------ degradation arithmetic


def test_degradation_is_measured_from_the_best_placing_algorithm() -> None:
    records = [rec(0, "a", 0.8), rec(0, "b", 0.6), rec(1, "a", 0.5), rec(1, "b", 0.5)]
    table = degradation(records)
    assert table["a"].avg == 0.0 and table["a"].max == 0.0
    assert table["b"].max == pytest.approx(25.0)  # (0.8 - 0.6) / 0.8
    assert table["b"].avg == pytest.approx(12.5)  # instance 1 is a tie


def test_degradation_among_a_group_ignores_algorithms_outside_it() -> None:
    # the paper's Tables 1 and 7 compare the MCB variants among themselves
    records = [rec(0, "mcb8", 0.8), rec(0, "mcb1", 0.4), rec(0, "milp", 1.0)]
    table = degradation(records, among=["mcb8", "mcb1"])
    assert set(table) == {"mcb8", "mcb1"}
    assert table["mcb8"].avg == 0.0 and table["mcb1"].avg == pytest.approx(50.0)
    assert degradation(records)["mcb8"].avg == pytest.approx(20.0)


def test_the_lp_bound_is_never_the_best() -> None:
    records = [rec(0, "a", 0.5), rec(0, "lpbound", 1.0)]
    table = degradation(records)
    assert "lpbound" not in table
    assert table["a"].avg == 0.0


def test_failures_are_excluded_from_the_average_and_counted() -> None:
    records = [rec(0, "a", 0.8), rec(0, "b", None), rec(1, "a", 0.4), rec(1, "b", 0.2)]
    d = degradation(records)["b"]
    assert d.succeeded == 1 and d.failed == 1
    assert d.avg == pytest.approx(50.0)


def test_instances_nobody_placed_count_as_failures_for_nobody() -> None:
    records = [rec(0, "a", None), rec(0, "b", None), rec(1, "a", 0.5), rec(1, "b", 0.5)]
    assert degradation(records)["a"].failed == 0
    assert failures_by_slack(records) == {}


def test_an_invalid_allocation_counts_as_a_failure() -> None:
    records = [rec(0, "a", 0.8), rec(0, "b", 0.9, error="invalid allocation: host 'h0': CPU 1.2 exceeds 1")]
    table = degradation(records)
    assert table["a"].avg == 0.0  # b's bad 0.9 is not the best
    assert table["b"].failed == 1


def test_ranking_orders_by_average_degradation() -> None:
    records = [rec(0, "a", 0.5), rec(0, "b", 0.8), rec(0, "c", 0.7)]
    assert ranking(degradation(records), ["a", "b", "c"]) == ["b", "c", "a"]


def test_failures_by_slack_groups_by_the_instance_slack() -> None:
    records = [rec(0, "a", 0.5, slack=0.1), rec(0, "b", None, slack=0.1),
               rec(1, "a", 0.5, slack=0.9), rec(1, "b", None, slack=0.9), rec(2, "a", 0.5, slack=0.9),
               rec(2, "b", None, slack=0.9)]
    assert failures_by_slack(records) == {"b": {0.1: 1, 0.9: 2}}


def test_milp_gaps_use_only_proven_optima() -> None:
    records = [
        rec(0, "milp", 0.8, optimal=True), rec(0, "mcb8", 0.6), rec(0, "lpbound", 1.0),
        rec(1, "milp", 0.5, optimal=False), rec(1, "mcb8", 0.1), rec(1, "lpbound", 1.0),
    ]
    gaps = milp_gaps(records)
    assert gaps["heuristic_below_milp"].count == 1
    assert gaps["heuristic_below_milp"].mean == pytest.approx(25.0)
    assert gaps["bound_above_milp"].mean == pytest.approx(25.0)  # (1.0 - 0.8) / 0.8


def test_bound_gap_by_slack_is_relative_to_the_bound() -> None:
    records = [rec(0, "mcb8", 0.9, slack=0.2), rec(0, "lpbound", 1.0, slack=0.2)]
    g = bound_gap_by_slack(records)[0.2]
    assert g.mean == pytest.approx(10.0) and g.count == 1


def test_records_round_trip_through_json_even_without_a_runtime() -> None:
    r = Record(**{**rec(0, "a", None).to_dict(), "runtime_s": math.nan, "error": "RuntimeError: boom"})
    back = Record.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.error == r.error and math.isnan(back.runtime_s)
    assert Record.from_dict(json.loads(json.dumps(rec(3, "a", 0.5).to_dict()))) == rec(3, "a", 0.5)


def test_report_names_the_papers_numbers_next_to_ours() -> None:
    records = [rec(0, "mcb8", 0.8), rec(0, "mcb1", 0.6), rec(0, "lpbound", 0.9)]
    text = report_markdown(records, {"set": "small", "algorithms": ["mcb8", "mcb1", "lpbound"]})
    row = next(line for line in text.splitlines() if line.startswith("| mcb1 |"))
    assert "25.00" in row and "14.90" in row  # ours, then the paper's average


# ------------------------------------------------------------------ running instances


def _first_fit(instance: Instance, options: SolveOptions) -> registry.Placement:
    """Memory first fit in job order: a deliberately simple placer for machinery tests."""
    free = instance.host_mem.copy()
    hosts = np.empty(instance.n_tasks, dtype=np.int64)
    for t, m in enumerate(instance.task_mem):
        fits = np.flatnonzero(free >= m - 1e-12)
        if not len(fits):
            return registry.Placement(hosts=None)
        hosts[t] = fits[0]
        free[fits[0]] -= m
    return registry.Placement(hosts=hosts)


def _overcommit(instance: Instance, options: SolveOptions) -> registry.Placement:
    """Everything on host 0: memory overcommitted, which the registry must refuse."""
    return registry.Placement(hosts=np.zeros(instance.n_tasks, dtype=np.int64))


@pytest.fixture
def toy_algorithms() -> Iterator[None]:
    """Register two test placers for the duration of one test (the registry is global)."""
    registry.ALGORITHMS["test-ff"] = registry.Algorithm("test-ff", _first_fit, "first fit (test only)")
    registry.ALGORITHMS["test-bad"] = registry.Algorithm("test-bad", _overcommit, "overcommits memory (test only)")
    yield
    for name in ("test-ff", "test-bad"):
        registry.ALGORITHMS.pop(name, None)


def test_run_item_records_every_algorithm_on_the_instance(toy_algorithms: None) -> None:
    item = work_items("small", 1, ["test-ff", "lpbound"], seed=3, tasks=[6])[32]
    assert item.spec.slack == 0.9  # plenty of memory: first fit must place it
    records = run_item(item)
    assert [r.algorithm for r in records] == ["test-ff", "lpbound"]
    assert all(r.key == (item.set_name, item.spec_index, item.instance) for r in records)
    ff, bound = records
    assert ff.feasible and ff.error is None
    assert ff.min_yield is not None and bound.min_yield is not None
    assert 0 < ff.min_yield <= bound.min_yield <= 1


def test_run_item_turns_a_solver_error_into_a_failed_record(toy_algorithms: None) -> None:
    item = work_items("small", 1, ["test-bad", "test-ff"], seed=1, tasks=[12])[0]
    bad, good = run_item(item)
    assert not bad.feasible and bad.error is not None and "overcommits memory" in bad.error
    assert good.error is None


# ------------------------------------------------------------------ running and resuming as library calls (no CLI)


def _without_times(batches: list[list[Record]]) -> list[list[dict[str, object]]]:
    return [[{k: v for k, v in r.to_dict().items() if k != "runtime_s"} for r in batch] for batch in batches]


def test_run_items_reports_progress_before_the_first_instance_and_after_each(toy_algorithms: None) -> None:
    items = work_items("small", 1, ["test-ff", "lpbound"], seed=3, tasks=[6])[:4]
    calls: list[tuple[int, int, str]] = []
    batches = list(run_items(items, on_progress=lambda done, total, what: calls.append((done, total, what))))
    assert calls == [(done, 4, "instances") for done in range(5)]
    assert _without_times(batches) == _without_times([run_item(i) for i in items])


def test_run_items_in_worker_processes_gives_the_same_records(toy_algorithms: None) -> None:
    items = work_items("small", 1, ["test-ff"], seed=3, tasks=[6])[:6]
    calls: list[tuple[int, int, str]] = []
    batches = list(run_items(items, jobs=2, on_progress=lambda *a: calls.append(a)))
    def by_instance(bs: list[list[dict[str, object]]]) -> dict[object, list[dict[str, object]]]:
        return {(b[0]["spec_index"], b[0]["instance"]): b for b in bs}  # batches come in completion order

    assert by_instance(_without_times(batches)) == by_instance(_without_times([run_item(i) for i in items]))
    assert [c[0] for c in calls] == list(range(7))  # called in this process, once per instance


def _meta(**changes: object) -> dict[str, object]:
    return {"set": "small", "seed": 0, "algorithms": ["a", "b"], "time_limit": 60.0, "instances_per_spec": 2,
            "tasks": [6], **changes}


def test_a_saved_run_keeps_only_whole_instances_of_this_runs_task_counts() -> None:
    whole, half = [rec(0, "a", 0.5), rec(0, "b", 0.4)], [rec(1, "a", 0.5)]
    other_tasks = [replace(r, instance=2, tasks=8) for r in whole]
    doc = {"meta": {**_meta(), "wall_s": 12.5}, "records": [r.to_dict() for r in whole + half + other_tasks]}
    kept = resumable_records(doc, _meta(), "records.json")
    assert kept.records == whole and kept.wall_s == 12.5


@pytest.mark.parametrize(("saved", "message"), [
    (_meta(seed=5), "records.json was made with seed=5, this run has seed=0"),
    (_meta(algorithms=["a"]), "was made with algorithms=['a']"),
    (_meta(instances_per_spec=3), "records.json has 3 instances per family, more than this run's 2"),
    ({}, "was made with set=None"),
])
def test_a_saved_run_with_other_parameters_is_refused(saved: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        resumable_records({"meta": saved, "records": []}, _meta(), "records.json")


def test_missing_items_are_the_instances_without_records() -> None:
    items = work_items("small", 2, ["a"], tasks=[6])
    done = [replace(rec(i.instance, "a", 0.5), spec_index=i.spec_index) for i in items[::2]]
    assert missing_items(items, done) == items[1::2]
    assert missing_items(items, []) == items


def test_records_come_back_in_run_order_whatever_the_workers_did() -> None:
    shuffled = [rec(1, "b", 0.5), rec(0, "b", 0.5), rec(1, "a", 0.5), rec(0, "a", 0.5)]
    ordered = in_run_order(shuffled, ["a", "b"])
    assert [(r.instance, r.algorithm) for r in ordered] == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]


def test_cli_runs_a_tiny_experiment_end_to_end(tmp_path: Path, toy_algorithms: None) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["experiment", "small", "--instances", "1", "--tasks", "6",
                                 "--algorithms", "test-ff,lpbound", "--jobs", "1", "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["meta"]["families"] == 36 and doc["errors"] == 0
    saved = json.loads((out / "records.json").read_text())
    assert len(saved["records"]) == 36 * 2
    assert {Record.from_dict(x).algorithm for x in saved["records"]} == {"test-ff", "lpbound"}
    report = (out / "report.md").read_text()
    assert "% degradation from best" in report and "| test-ff |" in report


def test_cli_exits_1_and_says_so_when_a_solver_misbehaves(tmp_path: Path, toy_algorithms: None) -> None:
    r = CliRunner().invoke(cli, ["experiment", "small", "-n", "1", "--tasks", "6", "-a", "test-bad,test-ff",
                                 "-j", "1", "-o", str(tmp_path)])
    assert r.exit_code == 1
    assert "solver errors" in r.stderr
    assert "## Errors" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    "bad",
    [
        ["huge"],
        ["small", "--instances", "0"],
        ["small", "--jobs", "0"],
        ["small", "--algorithms", "nosuch"],
        ["small", "--exclude", "nosuch"],
        ["small", "--tasks", "7"],
        ["small", "--tasks", "six"],
        ["small", "--time-limit", "0"],
        ["small", "-a", "lpbound", "-x", "lpbound"],
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(bad: list[str], tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["experiment", *bad, "-o", str(tmp_path)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error:")


def test_resume_runs_only_the_instances_missing_from_records(tmp_path: Path, toy_algorithms: None) -> None:
    args = ["experiment", "small", "-n", "1", "--tasks", "6", "-a", "test-ff,lpbound", "-j", "1", "-o", str(tmp_path)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    path = tmp_path / "records.json"
    doc = json.loads(path.read_text())
    first = doc["records"]
    doc["records"] = first[: 2 * 20 + 1]  # 20 whole instances and half of the 21st
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(cli, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    assert "16 instances run" in r.stdout
    again = json.loads(path.read_text())
    assert again["meta"]["complete"] is True
    def results(rs: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in r.items() if k != "runtime_s"} for r in rs]

    assert results(again["records"]) == results(first)  # same seeds, same deterministic placer, same order
    assert again["records"][:40] == first[:40]  # the kept instances were not re-run


def test_resume_extends_a_run_with_more_instances_per_family(tmp_path: Path, toy_algorithms: None) -> None:
    args = ["experiment", "small", "--tasks", "6", "-a", "test-ff", "-j", "1", "-o", str(tmp_path)]
    assert CliRunner().invoke(cli, [*args, "-n", "1"]).exit_code == 0
    r = CliRunner().invoke(cli, [*args, "-n", "2", "--resume"])
    assert r.exit_code == 0, r.output
    assert "36 instances run" in r.stdout
    doc = json.loads((tmp_path / "records.json").read_text())
    assert sorted({(x["spec_index"], x["instance"]) for x in doc["records"]}) == sorted(
        (i.spec_index, i.instance) for i in work_items("small", 2, ["test-ff"], tasks=[6]))
    fewer = CliRunner().invoke(cli, [*args, "-n", "1", "--resume"])
    assert fewer.exit_code == 2 and "instances per family" in fewer.stderr


def test_resume_refuses_records_of_a_different_run(tmp_path: Path, toy_algorithms: None) -> None:
    args = ["experiment", "small", "-n", "1", "--tasks", "6", "-a", "test-ff", "-j", "1", "-o", str(tmp_path)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    r = CliRunner().invoke(cli, [*args, "--seed", "5", "--resume"])
    assert r.exit_code == 2
    assert "seed" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_results_do_not_depend_on_the_number_of_worker_processes(tmp_path: Path, toy_algorithms: None) -> None:
    docs = []
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        r = CliRunner().invoke(cli, ["experiment", "small", "-n", "1", "--tasks", "8", "-a", "test-ff,lpbound",
                                     "-j", jobs, "-o", str(out)])
        assert r.exit_code == 0, r.output
        docs.append([{k: v for k, v in x.items() if k != "runtime_s"}
                     for x in json.loads((out / "records.json").read_text())["records"]])
    assert docs[0] == docs[1]


def test_plots_are_written_when_matplotlib_is_installed(tmp_path: Path, toy_algorithms: None) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    r = CliRunner().invoke(cli, ["experiment", "small", "-n", "1", "--tasks", "6", "-a", "test-ff,lpbound",
                                 "-j", "1", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    for name in ("min_yield_vs_slack.png", "avg_yield_vs_slack.png", "runtime_s_vs_tasks.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
        assert f"({name})" in (tmp_path / "report.md").read_text()


def test_cli_runs_the_real_solvers_end_to_end(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["experiment", "small", "-n", "1", "--tasks", "8", "-a", "mcb8,mcb1,sg,lpbound",
                                 "-j", "1", "-o", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["errors"] == 0
    assert set(doc["degradation"]) == {"mcb8", "mcb1", "sg"}
    records = [Record.from_dict(x) for x in json.loads((tmp_path / "records.json").read_text())["records"]]
    assert len(records) == 36 * 4
    bounds = {r.key: r.min_yield for r in records if r.algorithm == "lpbound"}
    for rec_ in records:  # no placement beats the LP relaxation's bound
        if rec_.algorithm != "lpbound" and rec_.feasible:
            assert rec_.min_yield is not None and bounds[rec_.key] is not None
            assert rec_.min_yield <= bounds[rec_.key] + 1e-9
    report = (tmp_path / "report.md").read_text()
    assert "## MCB variants" in report and "paper avg %" in report


# ------------------------------------------------------------------ budgeted labels and the anytime summary


def test_a_label_with_a_budget_names_the_algorithm_and_its_time_limit() -> None:
    assert parse_label("best@0.1") == ("best", 0.1)
    assert parse_label("milp") == ("milp", None)
    assert budget_label("best", 1.0) == "best@1"


@pytest.mark.parametrize("label", ["best@", "best@0", "best@-1", "best@soon", "best@nan"])
def test_a_bad_budget_in_a_label_is_refused_before_anything_runs(label: str) -> None:
    with pytest.raises(InputError, match="must be a number above 0"):
        work_items("small", 1, [label])


def test_a_budgeted_label_runs_its_algorithm_with_its_own_time_limit(toy_algorithms: None) -> None:
    seen: list[float | None] = []

    def spy(instance: Instance, options: SolveOptions) -> registry.Placement:
        seen.append(options.time_limit)
        return _first_fit(instance, options)

    registry.ALGORITHMS["test-spy"] = registry.Algorithm("test-spy", spy, "records its time limit (test only)")
    try:
        item = work_items("small", 1, ["test-spy@0.25", "test-spy"], time_limit=60.0, tasks=[6])[32]
        records = run_item(item)
    finally:
        registry.ALGORITHMS.pop("test-spy", None)
    assert seen == [0.25, 60.0]
    assert [r.algorithm for r in records] == ["test-spy@0.25", "test-spy"]


def test_the_anytime_summary_compares_with_mcb8_the_milp_and_the_bound() -> None:
    records = [
        rec(0, "best@0.1", 0.9), rec(0, "mcb8", 0.8), rec(0, "milp", 0.9, optimal=True), rec(0, "lpbound", 1.0),
        rec(1, "best@0.1", 0.5), rec(1, "mcb8", 0.5), rec(1, "milp", 0.6, optimal=True), rec(1, "lpbound", 0.6),
        rec(2, "best@0.1", None), rec(2, "mcb8", None), rec(2, "milp", 0.4, optimal=True), rec(2, "lpbound", 0.5),
    ]
    s = anytime_summary(records, "best@0.1")
    assert s.instances == 3 and s.failed_milp_feasible == 1 and s.failed_reference_placed == 0
    assert s.below_milp.mean == pytest.approx((0 + 100 * 0.1 / 0.6) / 2)
    assert (s.better, s.worse) == (1, 0)
    assert s.gain.mean == pytest.approx((12.5 + 0) / 2)
    assert s.below_bound.mean == pytest.approx((10 + 100 * 0.1 / 0.6) / 2)
    assert s.reference_below_bound.mean == pytest.approx((20 + 100 * 0.1 / 0.6) / 2)
    assert s.closed == pytest.approx(1 - s.below_bound.mean / s.reference_below_bound.mean)
    assert s.closed_each == pytest.approx((0.5 + 0.0) / 2)
    text = report_markdown(records, {"set": "small", "algorithms": ["best@0.1", "mcb8", "milp", "lpbound"]})
    assert "## Anytime search against MCB8" in text
