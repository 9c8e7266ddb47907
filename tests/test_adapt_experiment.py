"""The yield-versus-budget study: traces, records and the report (pure parts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vcsched.experiments.adaptation import (
    BUDGET_FRACTIONS,
    Change,
    StepRecord,
    TraceSpec,
    apply_change,
    curves,
    initial_state,
    milp_gaps,
    problem_for,
    random_change,
    report_markdown,
    run_trace,
    run_traces,
    trace_items,
    trace_meta,
)
from vcsched.model import Job

TINY = TraceSpec(hosts=3, tasks=6, slack=0.5, steps=3)


def test_a_change_drops_departed_jobs_keeps_the_rest_in_place_and_adds_arrivals_as_new() -> None:
    instance, hosts, _ = initial_state(TINY, 1)
    gone = instance.jobs[0].name
    change = Change(frozenset({gone}), (Job("new", 0.5, 0.1),), ((instance.jobs[1].name, 0.9),))
    after, current = apply_change(instance, hosts, change)
    assert [j.name for j in after.jobs] == [j.name for j in instance.jobs[1:]] + ["new"]
    assert current.tolist() == [*hosts[1:].tolist(), -1]
    assert after.jobs[0].cpu_need == 0.9


def test_budget_is_a_fraction_of_the_running_bytes() -> None:
    instance, hosts, _ = initial_state(TINY, 1)
    p = problem_for(instance, hosts, 0.5)
    assert p.budget == int(0.5 * p.task_bytes.sum())
    assert problem_for(instance, hosts, math.inf).budget >= p.task_bytes.sum()


def test_traces_are_reproducible_from_their_seed() -> None:
    a = run_trace(TINY, 7, 0.2, ["none", "heuristic", "scratch"])
    b = run_trace(TINY, 7, 0.2, ["none", "heuristic", "scratch"])
    strip = [{**r.to_dict(), "results": {m: {**x.__dict__, "runtime_s": 0} for m, x in r.results.items()}}
             for r in a]
    strip_b = [{**r.to_dict(), "results": {m: {**x.__dict__, "runtime_s": 0} for m, x in r.results.items()}}
               for r in b]
    assert strip == strip_b


def test_every_step_respects_the_budget_and_none_never_migrates() -> None:
    for r in run_trace(TINY, 3, 0.1, ["none", "heuristic"]):
        assert r.results["none"].migrated_bytes == 0
        assert r.results["heuristic"].migrated_bytes <= int(0.1 * r.running_bytes)


def test_random_changes_draw_from_the_protocol_distributions() -> None:
    spec = TraceSpec(hosts=8, tasks=40, slack=0.3, arrive=0.5)
    instance, _, rng = initial_state(spec, 0)
    change = random_change(spec, instance, 1, rng)
    assert all(0 < j.cpu_need <= 1 and 0 < j.memory <= 1 for j in change.arrived)
    assert change.departed <= {j.name for j in instance.jobs}


def test_records_round_trip_through_json_dicts() -> None:
    (r, *_) = run_trace(TINY, 2, math.inf, ["heuristic", "milp"])
    assert StepRecord.from_dict(r.to_dict()) == r


def test_curves_and_gaps_summarize_per_method_and_budget() -> None:
    records = run_trace(TINY, 2, 0.0, ["none", "heuristic", "milp"]) + run_trace(TINY, 2, math.inf,
                                                                                 ["none", "heuristic", "milp"])
    points = curves(records, ["none", "heuristic", "milp"])
    assert {(p.method, p.budget_fraction) for p in points} == {
        (m, b) for m in ("none", "heuristic", "milp") for b in (0.0, math.inf)}
    zero = {p.method: p for p in points if p.budget_fraction == 0.0}
    assert zero["heuristic"].mean_min_yield == pytest.approx(zero["none"].mean_min_yield)
    assert zero["none"].mean_migrated_fraction == 0.0
    for g in milp_gaps(records):
        assert g.mean_percent >= -1e-3  # the MILP is exact: the heuristic never beats it


def test_report_has_the_yield_byte_and_gap_tables() -> None:
    records = run_trace(TINY, 2, 0.1, ["none", "heuristic", "milp", "scratch"])
    meta = {"set": "tiny", "methods": ["none", "heuristic", "milp", "scratch"], "traces": 1, "steps": 3,
            "hosts": 3, "tasks": 6, "slack": 0.5, "depart": 0.1, "arrive": 0.1, "change": 0.1, "seed": 2,
            "wall_s": 1.0}
    text = report_markdown(records, meta)
    for heading in ("## Mean minimum yield", "## Bytes migrated", "## Heuristic vs MILP"):
        assert heading in text
    assert "| 10 % |" in text or "| method | 10 % |" in text


def test_initial_state_is_a_fitting_placement() -> None:
    instance, hosts, _ = initial_state(TINY, 5)
    mem = np.bincount(hosts, weights=instance.task_mem, minlength=instance.n_hosts)
    assert np.all(mem <= instance.host_mem + 1e-9)


# ------------------------------------------------------------------ the study as a library call (no CLI)


TINY_SET = (("tiny", TraceSpec(hosts=3, tasks=6, slack=0.5, steps=2), ("none", "heuristic")),)


def _without_times(records: dict[str, list[StepRecord]]) -> dict[str, list[dict[str, object]]]:
    return {name: [{**r.to_dict(), "results": {m: {**x.__dict__, "runtime_s": 0} for m, x in r.results.items()}}
                   for r in recs] for name, recs in records.items()}


def test_trace_items_give_every_budget_the_same_traces() -> None:
    items = trace_items(TINY_SET, 2, seed=3, time_limit=5.0)
    assert len(items) == 2 * len(BUDGET_FRACTIONS)
    assert {i.seed for i in items} == {3 * 1_000_003, 3 * 1_000_003 + 1}
    assert sorted({i.budget_fraction for i in items}) == sorted(BUDGET_FRACTIONS)
    assert all(i.set_name == "tiny" and i.time_limit == 5.0 for i in items)


def test_run_traces_reports_progress_after_each_trace() -> None:
    calls: list[tuple[int, int, str]] = []
    items = trace_items(TINY_SET, 1)
    records = run_traces(items, on_progress=lambda done, total, what: calls.append((done, total, what)))
    n = len(items)
    assert calls == [(done, n, "traces") for done in range(n + 1)]
    assert list(records) == ["tiny"] and len(records["tiny"]) == n * 2  # two steps per trace
    keys = [(r.budget_fraction, r.seed, r.step) for r in records["tiny"]]
    assert keys == sorted(keys)


def test_run_traces_gives_the_same_records_in_worker_processes() -> None:
    items = trace_items(TINY_SET, 1, seed=5)
    calls: list[tuple[int, int, str]] = []
    in_workers = run_traces(items, jobs=2, on_progress=lambda *a: calls.append(a))
    assert _without_times(in_workers) == _without_times(run_traces(items))
    assert [c[0] for c in calls] == list(range(len(items) + 1))  # called in this process, once per trace


def test_trace_meta_is_what_the_report_reads() -> None:
    name, spec, methods = TINY_SET[0]
    meta = trace_meta(name, spec, methods, 1, 0, None) | {"wall_s": 1.0}
    records = run_traces(trace_items(TINY_SET, 1))["tiny"]
    assert "3 hosts, 6 initial tasks" in report_markdown(records, meta)
