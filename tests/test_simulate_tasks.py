"""Task-based "serve the most deprived job" (Bonald & Roberts §4)."""

from __future__ import annotations

import pytest

from vcsched.errors import InputError
from vcsched.simulate.tasks import TaskClass, TaskWorkload, isolated_service_rate, paper_workload, simulate_tasks


def test_zero_load_service_rate_of_the_papers_configuration() -> None:
    # (500/100) / (401/100 + 1/99 + ... + 1) ≈ 0.54 (printed), 0.5442 exactly
    assert isolated_service_rate(500, 100) == pytest.approx(0.5442, abs=5e-5)


def test_an_isolated_job_takes_as_long_as_its_tasks_tail() -> None:
    # Near zero load every job is alone: mean completion τ (401/100 + H_99) = 1.8375
    w = paper_workload().scaled_to_load(0.002)
    r = simulate_tasks(w, "drf", arrivals=120, warmup=0, seed=1)
    times = [c.mean_time for c in r.classes if c.mean_time is not None]
    n = [c.completions for c in r.classes]
    mean = sum(t * k for t, k in zip(times, n, strict=True)) / sum(n)
    assert mean == pytest.approx(1 / isolated_service_rate(500, 100), rel=0.05)


def test_a_single_task_job_runs_whole_tasks_within_capacity() -> None:
    w = TaskWorkload((2.0,), (TaskClass("a", 1.0, (1.0,), tasks=3, task_time=1.0),), ("cpu",)).scaled_to_load(0.3)
    r = simulate_tasks(w, "pf", arrivals=200, warmup=20, seed=3)
    assert r.classes[0].completions == 200 and r.classes[0].service_rate is not None


def test_only_drf_and_pf_serve_the_most_deprived_job() -> None:
    with pytest.raises(InputError, match="most deprived"):
        simulate_tasks(paper_workload().scaled_to_load(0.5), "asset", arrivals=1, warmup=0)


def test_a_load_outside_the_capacity_region_is_refused() -> None:
    with pytest.raises(InputError, match="capacity region"):
        paper_workload().scaled_to_load(1.0)
