"""The yield-versus-budget study: traces, records and the report (pure parts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vcsched.experiments.adaptation import (
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
