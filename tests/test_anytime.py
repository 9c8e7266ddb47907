"""``best``, the anytime search (vcsched.solvers.anytime): never below MCB8, valid at every stop, honest about gaps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import cli
from tests.conftest import make_instance
from vcsched.adaptation.heuristic import adapt_heuristic, mcb8_from_scratch
from vcsched.adaptation.problem import GIB, AdaptProblem
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.experiments.paper import work_items
from vcsched.formats.instance import instance_to_dict
from vcsched.formats.units import UNLIMITED
from vcsched.model import Host, Instance, Job, SolveOptions
from vcsched.solvers.anytime import DEFAULT_BUDGET_S, best_placement
from vcsched.solvers.milp import build_makespan_model, build_model, placement_from, solve_makespan, solve_model
from vcsched.solvers.registry import algorithms, solve
from vcsched.validate import check_allocation
from vcsched.yields import placement_min_yield


def test_best_is_registered_as_a_placing_heuristic() -> None:
    algo = algorithms()["best"]
    assert not algo.bound_only and not algo.exact


# ------------------------------------------------------------------ never below MCB8

instances = st.integers(1, 5).flatmap(lambda h: st.tuples(
    st.lists(st.tuples(st.floats(0.3, 2.0), st.floats(0.3, 1.5)), min_size=h, max_size=h),
    st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.01, 0.9), st.integers(1, 3)), min_size=1, max_size=9),
))


def _instance(case: tuple[list[tuple[float, float]], list[tuple[float, float, int]]]) -> Instance:
    hosts, jobs = case
    return Instance(tuple(Host(f"h{i}", c, m) for i, (c, m) in enumerate(hosts)),
                    tuple(Job(f"j{i}", a, m, k) for i, (a, m, k) in enumerate(jobs)))


@settings(max_examples=150, deadline=None)
@given(instances, st.sampled_from([0.001, 0.005, 0.03]))
def test_best_never_returns_a_lower_minimum_yield_than_mcb8(case: tuple, budget: float) -> None:
    inst = _instance(case)
    mcb8 = solve(inst, "mcb8")
    best = solve(inst, "best", SolveOptions(time_limit=budget))
    if mcb8.feasible:
        assert best.feasible and best.min_yield is not None and mcb8.min_yield is not None
        assert best.min_yield >= mcb8.min_yield
    if best.allocation is not None:
        check_allocation(inst, best.allocation, min_yield=best.min_yield, avg_yield=best.avg_yield)
        if mcb8.feasible:  # the detail has placement_min_yield; the result's is cpu / alpha, within an ulp
            assert best.detail["mcb8_min_yield"] == pytest.approx(mcb8.min_yield, rel=1e-12)
        else:
            assert best.detail["mcb8_min_yield"] is None


@settings(max_examples=40, deadline=None)
@given(instances, st.integers(0, 10), st.integers(0, 40))
def test_a_kick_limit_makes_the_search_reproducible(case: tuple, seed: int, kicks: int) -> None:
    inst = _instance(case)
    first = best_placement(inst, budget_s=60.0, seed=seed, max_kicks=kicks)
    again = best_placement(inst, budget_s=60.0, seed=seed, max_kicks=kicks)
    assert (first.hosts is None) == (again.hosts is None)
    if first.hosts is not None and again.hosts is not None:
        assert first.hosts.tolist() == again.hosts.tolist()


def test_an_instance_with_other_fluid_resources_is_searched_on_the_vector() -> None:
    """The local search judges disk and net too (it used to hand back MCB8's placement unchanged)."""
    from vcsched.experiments.generate import GeneratorSpec as Spec
    from vcsched.experiments.policies import policy_instance

    inst = policy_instance(Spec(hosts=16, tasks=60, slack=0.5, cv_mem=0.25, cv_cpu=0.75, parallel=True), 4)
    mcb8, best = solve(inst, "mcb8"), solve(inst, "best", SolveOptions(time_limit=1.0))
    assert mcb8.allocation is not None and best.allocation is not None
    check_allocation(inst, best.allocation, min_yield=best.min_yield, avg_yield=best.avg_yield)
    assert best.detail["source"] != "mcb8" and best.min_yield > mcb8.min_yield  # type: ignore[operator]


# ------------------------------------------------------------------ stopping and proving


def test_a_placement_at_the_lp_bound_stops_the_search_as_optimal() -> None:
    inst = make_instance([(0.5, 0.1)] * 8, n_hosts=4)  # MCB8 balances perfectly: Y = 1 = the bound
    result = solve(inst, "best", SolveOptions(time_limit=5.0))
    assert result.optimal is True and result.min_yield == 1.0
    assert "LP bound" in str(result.detail["stopped"])
    assert float(result.detail["search_s"]) < 1.0  # type: ignore[arg-type]
    assert result.detail["lp_gap_percent"] == 0.0


def test_the_milp_proves_a_small_instance_optimal_and_beats_mcb8() -> None:
    # The paper's small set, family 111 instance 0 (slack 0.1): memory is so tight that no move or swap
    # helps; MCB8 reaches 0.3047, the MILP optimum is 0.5557.
    item = next(i for i in work_items("small", 1, ["best"]) if i.spec_index == 111)
    inst = generate(item.spec, item.seed)
    result = solve(inst, "best", SolveOptions(time_limit=20.0))
    exact = solve(inst, "milp")
    assert result.optimal is True and result.min_yield is not None and exact.min_yield is not None
    assert result.min_yield == pytest.approx(exact.min_yield, rel=1e-6)
    assert result.detail["source"] == "milp" and result.detail["stopped"] == "HiGHS proved the placement optimal"
    assert result.min_yield > 1.5 * float(result.detail["mcb8_min_yield"])  # type: ignore[arg-type]


def test_memory_that_does_not_fit_even_fractionally_is_no_placement_proven() -> None:
    result = solve(make_instance([(0.5, 0.8)] * 3, n_hosts=2), "best")
    assert not result.feasible and result.optimal is True


def test_an_exhausted_backtracking_search_proves_there_is_no_placement() -> None:
    # Three tasks of memory 0.6 on two unit hosts: fits fractionally (1.8 <= 2), never whole.
    result = solve(make_instance([(0.5, 0.6)] * 3, n_hosts=2), "best")
    assert not result.feasible and result.optimal is True
    assert "no placement fits" in str(result.detail["stopped"])


def test_when_no_heuristic_places_the_milp_finds_a_first_placement_or_proves_there_is_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vcsched.solvers import anytime

    monkeypatch.setattr(anytime, "_start", lambda search, precision: None)  # MCB, SG and SGB "fail"
    placed = best_placement(make_instance([(0.5, 0.6), (0.5, 0.3), (0.5, 0.6)], n_hosts=2), budget_s=10.0)
    assert placed.hosts is not None and placed.optimal is True and placed.detail["source"] == "milp"
    none = best_placement(make_instance([(0.5, 0.6)] * 3, n_hosts=2), budget_s=10.0)
    assert none.hosts is None and none.optimal is True
    assert none.detail["stopped"] == "HiGHS proved that no placement fits in memory"


def test_the_detail_reports_the_gap_to_the_lp_bound_and_the_time_used() -> None:
    inst = generate(GeneratorSpec(hosts=16, tasks=120, slack=0.3, cv_mem=0.75, cv_cpu=0.75), 7)
    result = solve(inst, "best", SolveOptions(time_limit=0.05))
    d = result.detail
    assert result.min_yield is not None
    bound = float(d["lp_bound"])  # type: ignore[arg-type]
    assert d["lp_gap_percent"] == pytest.approx(100 * (bound - result.min_yield) / bound)
    assert d["budget_s"] == 0.05 and d["start"]["algorithm"].startswith("mcb")  # type: ignore[index]
    assert float(d["search_s"]) < 0.05 + 0.5  # type: ignore[arg-type]  # a shared machine: generous


def test_the_default_budget_is_used_without_a_time_limit() -> None:
    inst = generate(GeneratorSpec(hosts=8, tasks=60, slack=0.5, cv_mem=0.75, cv_cpu=0.75), 1)
    assert solve(inst, "best").detail["budget_s"] == DEFAULT_BUDGET_S


# ------------------------------------------------------------------ the makespan MILP


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_makespan_milp_has_the_optimum_of_the_papers_milp(seed: int) -> None:
    inst = generate(GeneratorSpec(hosts=3, tasks=7, slack=0.3, cv_mem=0.75, cv_cpu=0.75), seed)
    paper = solve_model(build_model(inst), None)
    compact_model = build_makespan_model(inst)
    compact = solve_makespan(compact_model, None)
    assert paper.optimal and compact.optimal and compact.x is not None
    assert compact.objective == pytest.approx(paper.objective, rel=1e-6)
    assert placement_min_yield(inst, placement_from(compact_model, compact.x)) == pytest.approx(paper.objective)


def test_a_makespan_cutoff_below_the_optimum_is_infeasible() -> None:
    inst = make_instance([(0.6, 0.1), (0.6, 0.1), (0.6, 0.1)], n_hosts=2)  # best: 1.2 on one host
    assert solve_makespan(build_makespan_model(inst, z_max=1.1), None).infeasible
    assert solve_makespan(build_makespan_model(inst, z_max=1.2 * (1 + 1e-7)), None).optimal


# ------------------------------------------------------------------ the command line, admission, adaptation


def _instance_file(tmp_path: Path) -> Path:
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(instance_to_dict(generate(GeneratorSpec(8, 40, 0.3, 0.75, 0.75), 3))))
    return path


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "nan", "inf"])
def test_a_time_limit_that_is_not_a_positive_number_is_one_line_and_exit_2(tmp_path: Path, bad: str) -> None:
    result = CliRunner().invoke(cli, ["solve", str(_instance_file(tmp_path)), "-a", "best", "--time-limit", bad])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error: ") and "--time-limit" in lines[0]


def test_solve_best_reports_its_gap_in_the_json_detail(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["solve", str(_instance_file(tmp_path)), "-a", "best", "--time-limit", "0.02",
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["algorithm"] == "best" and doc["feasible"]
    assert doc["detail"]["lp_gap_percent"] >= 0 and not math.isnan(doc["detail"]["lp_gap_percent"])


def test_the_adaptation_heuristic_can_place_from_scratch_with_best() -> None:
    rng = np.random.default_rng(3)
    jobs = tuple(Job(f"j{i}", float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.05, 0.25))) for i in range(20))
    inst = Instance(tuple(Host(f"h{i}") for i in range(6)), jobs)
    p = AdaptProblem(inst, np.array([0] * 10 + [1] * 10), np.full(20, GIB), UNLIMITED)
    hosts, detail = adapt_heuristic(p, scratch="best")
    scratch = mcb8_from_scratch(inst)
    assert hosts is not None and scratch is not None
    assert placement_min_yield(inst, hosts) >= placement_min_yield(inst, scratch) - 1e-9
    assert detail["path"] in ("scratch", "incremental")
