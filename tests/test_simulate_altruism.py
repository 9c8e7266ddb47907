"""CARBYNE's altruism: leftover accounting, floors that keep a VC's fair completion, redistribution."""

from __future__ import annotations

import dataclasses

import pytest

from vcsched.simulate.altruism import Task, TaskJob, fair_span, floors, jain, leftover_accounting, redistribute
from vcsched.simulate.fluid import RunOptions, simulate
from vcsched.simulate.scenarios import scenario
from vcsched.simulate.state import VC


def test_carbyne_figure_2_leftover_accounting() -> None:
    # §2.1/§3.3: fair shares 0.5 each.  J1 must start one S1 task (0.21) and gives 0.29 (S0's two tasks, 0.08,
    # and one S1 task, 0.21); J2 must start one S0 task (0.29) and gives 0.21: L = 0.5.  SRTF starts J2's other
    # S0 task (J2 is closer to completion): 0.21 left; packing starts one more S1 task of J1: 0.
    j1 = TaskJob("J1", 0.5, remaining=3.0, tasks=(
        Task("S0a", 0.04), Task("S0b", 0.04), Task("S1a", 0.21, must_start=True), Task("S1b", 0.21)))
    j2 = TaskJob("J2", 0.5, remaining=1.0, tasks=(
        Task("S0a", 0.29, must_start=True), Task("S0b", 0.29, shortens=True)))
    steps = leftover_accounting([j1, j2])
    assert [s[0] for s in steps] == ["intra-job", "intra-job", "srtf", "pack"]
    assert steps[0][2] == pytest.approx(0.29)
    assert steps[1][2] == pytest.approx(0.29 + 0.21)
    assert steps[2][1:] == ("J2.S0b", pytest.approx(0.21))
    assert steps[3][1:] == ("J1.S1b", pytest.approx(0.0, abs=1e-12))


def two_part_vc(rem: list[float], needs: list[tuple[float, ...]]) -> VC:
    vc = VC(0, 0, 0.0, sum(rem), 1.0, False)
    vc.rem, vc.needs, vc.hosts, vc.yields = list(rem), needs, {0: 1}, [0.0] * len(rem)
    return vc


def test_a_single_part_vc_has_nothing_to_give() -> None:
    vc = two_part_vc([2.0], [(0.5, 0.5)])
    assert fair_span(vc, 0.25, [1.0, 1.0]) == pytest.approx(8.0)
    kept, _, given = floors([vc], [0.25], [True], [1.0, 1.0], 2, [1.0, 1.0])
    assert kept == [[0.25]] and given == [0.0, 0.0]
    ys, _ = redistribute([vc], [0.25], [2.0], [True], [1.0, 1.0], 2, "srtf", [1.0, 1.0])
    assert ys == [[1.0]]  # level 3 hands it the free capacity: work conservation


def test_a_short_parallel_part_is_slowed_to_end_with_the_phase() -> None:
    # cpu part (need 0.6) with 2 left, io part (need 0.6) with 0.5 left, fair yield 0.5 on its own host.
    # Fair: both at 0.5 until the io part ends (t = 1), then the cpu part alone gets the same dominant share
    # (0.3 → yield 0.5; cpu is its dominant resource either way): ends at 1 + 1.5 / 0.5 = 4.
    vc = two_part_vc([2.0, 0.5], [(0.6, 0.0), (0.0, 0.6)])
    span = fair_span(vc, 0.5, [1.0, 1.0])
    assert span == pytest.approx(4.0)
    kept, _, given = floors([vc], [0.5], [True], [0.3, 0.3], 2, [1.0, 1.0])
    assert kept == [[pytest.approx(0.5), pytest.approx(0.125)]]  # io part: 0.5 / 4, keeps pace
    assert given == [pytest.approx(0.0), pytest.approx(0.6 * (0.5 - 0.125))]
    not_altruistic, _, nothing = floors([vc], [0.5], [False], [0.3, 0.3], 2, [1.0, 1.0])
    assert not_altruistic == [[0.5, 0.5]] and nothing == [0.0, 0.0]


def test_floors_that_overload_a_pair_fall_back_to_the_fair_yields() -> None:
    # Both parts mostly cpu; fair 0.25 each until the short one ends (t = 2), then the long one alone at 0.5:
    # span 5, floors 0.4 and 0.1.  The long part's floor needs io 0.4 × 0.1 = 0.04, more than the 0.03 there:
    # the VC keeps its fair yields.
    vc = two_part_vc([2.0, 0.5], [(0.4, 0.1), (0.4, 0.0)])
    assert fair_span(vc, 0.25, [1.0, 1.0]) == pytest.approx(5.0)
    kept, _, _ = floors([vc], [0.25], [True], [0.2, 0.05], 2, [1.0, 1.0])
    assert kept == [[pytest.approx(0.4), pytest.approx(0.1)]]
    kept, _, given = floors([vc], [0.25], [True], [0.2, 0.03], 2, [1.0, 1.0])
    assert kept == [[0.25, 0.25]] and given == [0.0, 0.0]


def test_a_vc_that_is_not_altruistic_and_already_at_its_top_speed_is_left_alone() -> None:
    # P(altruism) < 1: this VC keeps its fair 0.5 on both parts; its short part is already past the pace of the
    # critical one, and the pairs are full: SRTF must raise nothing (it used to raise the critical part to 1
    # without checking capacity, or divide by zero).
    vc = two_part_vc([2.0, 0.5], [(0.6, 0.0), (0.0, 0.6)])
    ys, _ = redistribute([vc], [0.5], [2.0], [False], [0.3, 0.3], 2, "srtf", [1.0, 1.0])
    assert ys == [[0.5, 0.5]]
    # with room on cpu only, the critical part rises to what fits (0.45 / 0.6 = 0.75), the other stays
    ys, _ = redistribute([vc], [0.5], [2.0], [False], [0.45, 0.3], 2, "srtf", [1.0, 1.0])
    assert ys == [[pytest.approx(0.75), 0.5]]


def test_half_altruism_runs_and_gives_something_away() -> None:
    w = scenario("phased").scaled_to_load(0.7)
    r = simulate(w, RunOptions(policy="drf", arrivals=300, warmup=30, seed=1, altruism=0.5))
    assert sum(c.completions for c in r.classes) == 300 and max(r.given.values()) > 0


def test_jain_index() -> None:
    assert jain([1, 1, 1]) == 1.0
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)


def test_altruism_lowers_the_mean_completion_time_of_phased_vcs() -> None:
    w = scenario("phased").scaled_to_load(0.7)
    base = RunOptions(policy="drf", arrivals=1500, warmup=150, seed=3, record=True)
    fair = simulate(w, base)
    alt = simulate(w, dataclasses.replace(base, altruism=1.0))
    from vcsched.simulate.study import lateness

    late = lateness(alt, fair, 0.05)
    assert late.mean_time < 0.95 * late.reference_mean_time
    assert late.later < 0.1  # online, arrivals shrink shares: a few VCs end later (CARBYNE §3.4)
