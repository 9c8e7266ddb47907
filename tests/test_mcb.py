"""MCB1-MCB8 (paper section 3.4): the packing rules, the sort keys, the binary search, C == Python."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import cli  # the group with every command registered
from tests.conftest import make_instance
from vcsched.errors import InputError
from vcsched.model import Host, Instance, Job, SolveOptions
from vcsched.solvers import mcb
from vcsched.solvers.lpbound import lp_bound
from vcsched.solvers.registry import algorithms, solve
from vcsched.solvers.search import search
from vcsched.units import FIT_TOLERANCE
from vcsched.validate import check_allocation

# VCSCHED_REQUIRE_C=1 (set by .ci/run) turns a missing C kernel from a skip into failures: CI must not
# pass on the Python fallback alone.
REQUIRE_C = os.environ.get("VCSCHED_REQUIRE_C") == "1"
BACKENDS = sorted({*mcb.KERNELS, "c"} if REQUIRE_C else mcb.KERNELS)
needs_c = pytest.mark.skipif(
    "c" not in mcb.KERNELS and not REQUIRE_C,
    reason="C kernel vcsched.solvers._mcbc not built (run: .venv/bin/pip install -e . --no-deps)",
)


def lists(cpu: list[float], mem: list[float], cpu_heavy: list[int], mem_heavy: list[int]) -> mcb.ProbeLists:
    return mcb.ProbeLists(
        np.array(cpu), np.array(mem), np.array(cpu_heavy, dtype=np.int64), np.array(mem_heavy, dtype=np.int64)
    )


def unit_hosts(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.ones(n), np.ones(n)


# --- registry ----------------------------------------------------------------------------------


def test_the_c_kernel_is_built_when_the_environment_requires_it() -> None:
    if not REQUIRE_C:
        pytest.skip("VCSCHED_REQUIRE_C is not 1: the pure-Python fallback is allowed")
    assert "c" in mcb.KERNELS and mcb.DEFAULT_BACKEND == "c", (
        "VCSCHED_REQUIRE_C=1 but vcsched.solvers._mcbc is not importable: the C kernel was not built"
    )


def test_all_eight_variants_are_registered() -> None:
    algos = algorithms()
    assert all(f"mcb{i}" in algos for i in range(1, 9))


# --- the packing rules (kernel level, both backends) ------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_first_task_of_a_host_comes_from_the_cpu_heavy_list(backend: str) -> None:
    # The two tasks cannot share a host (CPU .6 + .5); whichever list opens host 0 decides who gets it.
    probe = lists([0.6, 0.5], [0.3, 0.6], cpu_heavy=[0], mem_heavy=[1])
    hosts = mcb.KERNELS[backend](probe, *unit_hosts(2))
    assert hosts is not None
    assert hosts.tolist() == [0, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_less_free_cpu_than_memory_scans_the_memory_heavy_list_first(backend: str) -> None:
    # Task 0 opens host 0 and leaves free CPU .4 < free memory .9, so the memory-heavy task 2 joins it
    # although the CPU-heavy task 1 fits too; then task 1 no longer fits (CPU .4 - .3 < .4).
    # Always scanning the CPU-heavy list first would have put tasks 0 and 1 together.
    probe = lists([0.6, 0.4, 0.3], [0.1, 0.1, 0.5], cpu_heavy=[0, 1], mem_heavy=[2])
    hosts = mcb.KERNELS[backend](probe, *unit_hosts(2))
    assert hosts is not None
    assert hosts.tolist() == [0, 1, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_free_cpu_than_memory_scans_the_cpu_heavy_list_first(backend: str) -> None:
    # Hosts with CPU 2, memory 1.  Task 0 leaves free CPU 1.5 > free memory .8, so the CPU-heavy task 1
    # joins it although the memory-heavy task 2 (memory .75) fits too; afterwards task 2 does not fit.
    probe = lists([0.5, 0.6, 0.1], [0.2, 0.1, 0.75], cpu_heavy=[0, 1], mem_heavy=[2])
    hosts = mcb.KERNELS[backend](probe, np.array([2.0, 2.0]), np.array([1.0, 1.0]))
    assert hosts is not None
    assert hosts.tolist() == [0, 0, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_free_cpu_and_memory_scans_the_memory_heavy_list_first(backend: str) -> None:
    # Host 0 has memory .75.  Task 0 leaves free CPU .5 == free memory .5 (exact in binary), and on a
    # tie the memory-heavy task 2 goes first; then the CPU-heavy task 1 no longer fits in memory.
    probe = lists([0.5, 0.5, 0.125], [0.25, 0.125, 0.5], cpu_heavy=[0, 1], mem_heavy=[2])
    hosts = mcb.KERNELS[backend](probe, np.array([1.0, 1.0]), np.array([0.75, 1.0]))
    assert hosts is not None
    assert hosts.tolist() == [0, 1, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_probe_fails_when_a_task_is_left_over(backend: str) -> None:
    probe = lists([0.1, 0.1, 0.1], [0.6, 0.6, 0.6], cpu_heavy=[], mem_heavy=[0, 1, 2])
    assert mcb.KERNELS[backend](probe, *unit_hosts(2)) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_task_fits_within_the_tolerance_of_the_free_capacity(backend: str) -> None:
    # 0.1 + 0.2 + 0.7 is 1.0000000000000002 in binary floating point: within EPS, it still fits.
    probe = lists([0.1, 0.2, 0.7], [0.01, 0.01, 0.01], cpu_heavy=[0, 1, 2], mem_heavy=[])
    hosts = mcb.KERNELS[backend](probe, *unit_hosts(1))
    assert hosts is not None and hosts.tolist() == [0, 0, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_task_exactly_at_the_tolerance_fits_and_one_just_above_does_not(backend: str) -> None:
    at = 0.5 + FIT_TOLERANCE  # after task 0 the free CPU is exactly .5, so this is the limit itself
    probe = lists([0.5, at], [0.1, 0.1], cpu_heavy=[0, 1], mem_heavy=[])
    hosts = mcb.KERNELS[backend](probe, *unit_hosts(1))
    assert hosts is not None and hosts.tolist() == [0, 0]
    above = lists([0.5, np.nextafter(at, 1.0)], [0.1, 0.1], cpu_heavy=[0, 1], mem_heavy=[])
    assert mcb.KERNELS[backend](above, *unit_hosts(1)) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_heterogeneous_hosts_use_their_own_capacities(backend: str) -> None:
    probe = lists([1.5, 0.5], [0.2, 0.2], cpu_heavy=[0, 1], mem_heavy=[])
    hosts = mcb.KERNELS[backend](probe, np.array([1.0, 2.0]), np.array([1.0, 1.0]))
    assert hosts is not None and hosts.tolist() == [1, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_capacity_fits_nothing(backend: str) -> None:
    # Host 0 has a NaN CPU capacity, host 1 a NaN memory capacity: every comparison with NaN is false.
    probe = lists([0.1, 0.2], [0.1, 0.2], cpu_heavy=[], mem_heavy=[0, 1])
    hosts = mcb.KERNELS[backend](probe, np.array([np.nan, 1.0, 1.0]), np.array([1.0, np.nan, 1.0]))
    assert hosts is not None and hosts.tolist() == [2, 2]
    assert mcb.KERNELS[backend](probe, np.array([np.nan]), np.array([np.nan])) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_infinite_capacity_takes_every_task_once(backend: str) -> None:
    probe = lists([0.5, 0.9, 0.2], [0.1, 0.3, 0.1], cpu_heavy=[1, 0, 2], mem_heavy=[])
    hosts = mcb.KERNELS[backend](probe, np.array([np.inf, 1.0]), np.array([1.0, 1.0]))
    assert hosts is not None and hosts.tolist() == [0, 0, 0]


@needs_c
def test_the_c_kernel_rejects_lists_that_do_not_partition_the_tasks() -> None:
    probe = lists([0.1, 0.2], [0.1, 0.1], cpu_heavy=[0, 0], mem_heavy=[])
    with pytest.raises(ValueError, match="repeated"):
        mcb.pack_c(probe, *unit_hosts(1))


@needs_c
def test_the_c_kernel_rejects_inconsistent_lengths() -> None:
    probe = lists([0.1, 0.2], [0.1], cpu_heavy=[0, 1], mem_heavy=[])
    with pytest.raises(ValueError, match="lengths"):
        mcb.pack_c(probe, *unit_hosts(1))


@needs_c
def test_the_c_kernel_rejects_arrays_of_the_wrong_type() -> None:
    from vcsched.solvers import _mcbc  # type: ignore[attr-defined]

    out = np.empty(1, dtype=np.int64)
    one = np.ones(1)
    with pytest.raises(TypeError, match="float64"):
        _mcbc.pack(one.astype(np.float32), one, np.zeros(1, np.int64), np.zeros(0, np.int64), one, one, 0.0, out)
    with pytest.raises(TypeError, match="int64"):
        _mcbc.pack(one, one, np.zeros(1, np.int32), np.zeros(0, np.int64), one, one, 0.0, out)


# --- sort keys (section 3.4) -------------------------------------------------------------------

KEYS = {
    "mcb1": (lambda c, m: m + c, False),
    "mcb2": (lambda c, m: max(m, c) - min(m, c), False),
    "mcb3": (lambda c, m: max(m, c) / min(m, c), False),
    "mcb4": (lambda c, m: max(m, c), False),
    "mcb5": (lambda c, m: m + c, True),
    "mcb6": (lambda c, m: max(m, c) - min(m, c), True),
    "mcb7": (lambda c, m: max(m, c) / min(m, c), True),
    "mcb8": (lambda c, m: max(m, c), True),
}


def expected_order(variant: str, c: list[float], m: list[float], heavy: bool) -> list[int]:
    """The paper's list order, written independently: stable by key, ties by task index."""
    key, desc = KEYS[variant]
    members = [t for t in range(len(c)) if (c[t] > m[t]) == heavy]
    return sorted(members, key=lambda t: (-key(c[t], m[t]) if desc else key(c[t], m[t]), t))


# CPU-heavy at Y = 1: (0.9, 0.1) (0.6, 0.5) (0.5, 0.05) (0.3, 0.25); memory-heavy: (0.1, 0.8) (0.2, 0.3) (0.4, 0.4)
ALPHA = [0.9, 0.6, 0.5, 0.3, 0.1, 0.2, 0.4]
MEM = [0.1, 0.5, 0.05, 0.25, 0.8, 0.3, 0.4]


@pytest.mark.parametrize("variant", sorted(KEYS))
def test_each_variant_sorts_both_lists_by_its_key(variant: str) -> None:
    inst = Instance(tuple(Host(f"h{i}") for i in range(4)),
                    tuple(Job(f"j{i}", a, m) for i, (a, m) in enumerate(zip(ALPHA, MEM, strict=True))))
    probe = mcb.probe_lists(inst, mcb.VARIANTS[variant], 1.0)
    assert probe.cpu_heavy.tolist() == expected_order(variant, ALPHA, MEM, heavy=True)
    assert probe.mem_heavy.tolist() == expected_order(variant, ALPHA, MEM, heavy=False)


def test_mcb8_orders_by_the_larger_need_descending() -> None:
    inst = Instance(tuple(Host(f"h{i}") for i in range(4)),
                    tuple(Job(f"j{i}", a, m) for i, (a, m) in enumerate(zip(ALPHA, MEM, strict=True))))
    probe = mcb.probe_lists(inst, mcb.VARIANTS["mcb8"], 1.0)
    assert probe.cpu_heavy.tolist() == [0, 1, 2, 3]  # max = .9 .6 .5 .3
    assert probe.mem_heavy.tolist() == [4, 6, 5]  # max = .8 .4 .3 (task 6: c = m = .4 is memory-heavy)


def test_mcb1_orders_by_the_sum_ascending() -> None:
    inst = Instance(tuple(Host(f"h{i}") for i in range(4)),
                    tuple(Job(f"j{i}", a, m) for i, (a, m) in enumerate(zip(ALPHA, MEM, strict=True))))
    probe = mcb.probe_lists(inst, mcb.VARIANTS["mcb1"], 1.0)
    assert probe.cpu_heavy.tolist() == [2, 3, 0, 1]  # sums .55 .55 1.0 1.1: the tie goes to the lower index
    assert probe.mem_heavy.tolist() == [5, 6, 4]  # sums .5 .8 .9


def test_the_split_depends_on_the_probed_yield() -> None:
    inst = make_instance([(0.8, 0.5)], n_hosts=1)
    assert mcb.probe_lists(inst, mcb.VARIANTS["mcb8"], 1.0).cpu_heavy.tolist() == [0]  # c .8 > m .5
    assert mcb.probe_lists(inst, mcb.VARIANTS["mcb8"], 0.5).mem_heavy.tolist() == [0]  # c .4 < m .5


def test_every_task_of_a_parallel_job_needs_the_same_cpu_and_memory() -> None:
    inst = make_instance([(0.6, 0.2, 3), (0.2, 0.4)], n_hosts=2)
    probe = mcb.probe_lists(inst, mcb.VARIANTS["mcb8"], 0.5)
    assert probe.cpu.tolist() == [0.3, 0.3, 0.3, 0.1]
    assert probe.mem.tolist() == [0.2, 0.2, 0.2, 0.4]


# --- whole algorithm on hand-made instances ----------------------------------------------------


def test_two_hosts_four_tasks_pairs_a_cpu_task_with_a_memory_task() -> None:
    # The only yield-1 placement puts one (0.8, 0.4) and one (0.2, 0.6) on each host.
    inst = make_instance([(0.8, 0.4), (0.8, 0.4), (0.2, 0.6), (0.2, 0.6)], n_hosts=2)
    res = solve(inst, "mcb8")
    assert res.feasible and res.allocation is not None
    assert res.allocation.hosts == (0, 1, 0, 1)
    assert res.min_yield == pytest.approx(1.0)


def test_mcb8_reaches_the_lp_bound_when_cpu_is_the_only_limit() -> None:
    inst = make_instance([(1.0, 0.1)] * 4, n_hosts=2)
    res = solve(inst, "mcb8")
    assert res.allocation is not None
    assert res.min_yield == pytest.approx(0.5) == lp_bound(inst)
    assert sorted(res.allocation.hosts) == [0, 0, 1, 1]


def test_memory_that_does_not_fit_in_total_fails_without_probing() -> None:
    inst = make_instance([(0.5, 0.7)] * 3, n_hosts=2)
    res = solve(inst, "mcb8")
    assert not res.feasible and res.allocation is None
    assert res.detail["probes"] == 0


def test_memory_that_fits_in_total_but_not_in_pieces_fails_after_the_search() -> None:
    inst = make_instance([(0.1, 0.6)] * 3, n_hosts=2)  # 1.8 <= 2 in total, but no host holds two
    res = solve(inst, "mcb8")
    assert not res.feasible
    probes = res.detail["probes"]
    assert isinstance(probes, int) and probes > 0
    assert res.detail["probe_yield"] is None


def test_different_keys_give_different_placements() -> None:
    inst = make_instance([(0.7, 0.2), (0.9, 0.5), (0.3, 0.2), (0.2, 0.7), (0.2, 0.1)], n_hosts=2)
    r1, r8 = solve(inst, "mcb1"), solve(inst, "mcb8")
    assert r1.allocation is not None and r8.allocation is not None
    assert r1.allocation.hosts != r8.allocation.hosts
    # MCB8: {.9, .3} and {.7, .2, .2}: the loaded host needs 1.2 -> Y = 1/1.2.
    assert r8.min_yield == pytest.approx(1 / 1.2)
    assert r1.min_yield is not None and r8.min_yield is not None and r1.min_yield < r8.min_yield


def test_no_tasks_is_trivially_feasible() -> None:
    inst = Instance((Host("h0"),), ())
    r = search(inst, "mcb8")
    assert r.hosts is not None and len(r.hosts) == 0


def test_the_search_stops_once_the_interval_is_below_the_precision() -> None:
    inst = make_instance([(0.9, 0.3), (0.7, 0.2), (0.4, 0.5), (0.6, 0.1), (0.5, 0.4)], n_hosts=2)
    fine = search(inst, "mcb8", precision=1e-4)
    coarse = search(inst, "mcb8", precision=1e-2)
    assert 0 < fine.gap < 1e-4
    assert 0 < coarse.gap < 1e-2
    assert coarse.probes < fine.probes


def test_the_precision_option_reaches_the_search() -> None:
    inst = make_instance([(0.9, 0.3), (0.7, 0.2), (0.4, 0.5)], n_hosts=2)
    res = solve(inst, "mcb8", SolveOptions(precision=1e-2))
    gap = res.detail["search_gap"]
    assert isinstance(gap, float) and gap < 1e-2


def test_the_first_probe_is_half_the_lp_bound() -> None:
    # Y_LP = 2/3; with precision .5 the search stops after one probe, which succeeds.
    inst = make_instance([(1.0, 0.1)] * 3, n_hosts=2)
    r = search(inst, "mcb8", precision=0.5)
    assert r.probes == 1
    assert r.bound == pytest.approx(2 / 3)
    assert r.level == pytest.approx(1 / 3)


def test_there_is_always_at_least_one_probe() -> None:
    # Y_LP = 2/3 is below a (silly) precision of 0.9: the search still probes Y_LP / 2 once.
    inst = make_instance([(1.0, 0.1)] * 3, n_hosts=2)
    r = search(inst, "mcb8", precision=0.9)
    assert r.probes == 1 and r.hosts is not None
    assert r.level == pytest.approx(1 / 3)


def test_unknown_variant_and_bad_precision_are_input_errors() -> None:
    inst = make_instance([(0.5, 0.5)], n_hosts=1)
    with pytest.raises(InputError, match="variant"):
        search(inst, "mcb9")
    with pytest.raises(InputError, match="precision"):
        search(inst, "mcb8", precision=0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_places_items_with_fixed_needs_into_the_capacity_left_free(backend: str) -> None:
    # Host 0 has only .3 CPU left, host 1 is empty: the .6 item must go to host 1.
    hosts = mcb.pack(np.array([0.6, 0.3]), np.array([0.1, 0.1]), np.array([0.3, 1.0]), np.array([1.0, 1.0]),
                     backend=backend)
    assert hosts is not None and hosts.tolist() == [1, 0]


def test_pack_returns_none_when_an_item_does_not_fit_anywhere() -> None:
    assert mcb.pack(np.array([0.5]), np.array([0.5]), np.array([0.4]), np.array([1.0])) is None


def test_an_unavailable_backend_is_an_input_error() -> None:
    with pytest.raises(InputError, match="backend"):
        search(make_instance([(0.5, 0.5)], n_hosts=1), "mcb8", backend="fortran")


# --- invariants (hypothesis) -------------------------------------------------------------------

# A small value grid makes ties (equal keys, c == m, exact fits) common.
GRID = st.sampled_from([0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0])


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    n_hosts = draw(st.integers(1, 5))
    hetero = draw(st.booleans())
    hosts = tuple(
        Host(f"h{i}", draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])) if hetero else 1.0,
             draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])) if hetero else 1.0)
        for i in range(n_hosts)
    )
    n_jobs = draw(st.integers(0, 12))
    uniform = st.floats(0.01, 1.0)
    jobs = tuple(
        Job(f"j{i}", draw(GRID | uniform), draw(GRID | st.floats(0.01, 0.6)), draw(st.sampled_from([1, 1, 1, 2, 3])))
        for i in range(n_jobs)
    )
    return Instance(hosts, jobs)


@needs_c
@settings(max_examples=300, deadline=None)
@given(inst=instances(), variant=st.sampled_from(sorted(mcb.VARIANTS)), y=st.floats(0.01, 1.0))
def test_the_c_kernel_packs_exactly_like_the_python_reference(inst: Instance, variant: str, y: float) -> None:
    probe = mcb.probe_lists(inst, mcb.VARIANTS[variant], y)
    got_c = mcb.pack_c(probe, inst.host_cpu, inst.host_mem)
    got_py = mcb.pack_python(probe, inst.host_cpu, inst.host_mem)
    assert (got_c is None) == (got_py is None)
    if got_c is not None and got_py is not None:
        assert got_c.tolist() == got_py.tolist()


CAPACITY = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.5, 0.25, 0.5, 1.0, 2.0])


@needs_c
@settings(max_examples=300, deadline=None)
@given(inst=instances(), variant=st.sampled_from(sorted(mcb.VARIANTS)), y=st.floats(0.01, 1.0), data=st.data())
def test_the_c_kernel_agrees_with_the_reference_on_any_capacity(inst: Instance, variant: str, y: float,
                                                                 data: st.DataObject) -> None:
    host_cpu = np.array(data.draw(st.lists(CAPACITY, min_size=inst.n_hosts, max_size=inst.n_hosts)))
    host_mem = np.array(data.draw(st.lists(CAPACITY, min_size=inst.n_hosts, max_size=inst.n_hosts)))
    probe = mcb.probe_lists(inst, mcb.VARIANTS[variant], y)
    got_c, got_py = mcb.pack_c(probe, host_cpu, host_mem), mcb.pack_python(probe, host_cpu, host_mem)
    assert (got_c is None) == (got_py is None)
    if got_c is not None and got_py is not None:
        assert got_c.tolist() == got_py.tolist()


@needs_c
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), variant=st.sampled_from(sorted(mcb.VARIANTS)))
def test_the_c_and_python_searches_agree_on_generated_instances(seed: int, variant: str) -> None:
    from vcsched.experiments.generate import GeneratorSpec, generate

    rng = np.random.default_rng(seed)
    n_hosts = int(rng.integers(2, 9))
    spec = GeneratorSpec(hosts=n_hosts, tasks=int(rng.integers(2 * n_hosts, 40)),
                         slack=float(rng.choice([0.1, 0.3, 0.5])), cv_mem=0.75, cv_cpu=0.75,
                         parallel=bool(rng.integers(2)))
    inst = generate(spec, rng)
    a, b = search(inst, variant, backend="c"), search(inst, variant, backend="python")
    assert (a.probes, a.level) == (b.probes, b.level)
    assert (a.hosts is None and b.hosts is None) or (
        a.hosts is not None and b.hosts is not None and a.hosts.tolist() == b.hosts.tolist()
    )


@needs_c
@pytest.mark.parametrize("seed", range(6))
def test_the_c_and_python_searches_agree_on_paper_sized_instances(seed: int) -> None:
    # Larger lists exercise the C kernel's early exits (cursor resumption, tail minima).
    from vcsched.experiments.generate import GeneratorSpec, generate

    inst = generate(GeneratorSpec(hosts=32, tasks=250, slack=(0.1, 0.3, 0.6)[seed % 3], cv_mem=0.75, cv_cpu=0.75,
                                  parallel=seed % 2 == 1), seed)
    for variant in ("mcb8", "mcb5", "mcb2"):
        a, b = search(inst, variant, backend="c"), search(inst, variant, backend="python")
        assert (a.probes, a.level) == (b.probes, b.level)
        assert (a.hosts is None) == (b.hosts is None)
        if a.hosts is not None and b.hosts is not None:
            assert a.hosts.tolist() == b.hosts.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=100, deadline=None)
@given(inst=instances(), variant=st.sampled_from(sorted(mcb.VARIANTS)), y=st.floats(0.01, 1.0))
def test_a_successful_probe_respects_every_host_capacity(backend: str, inst: Instance, variant: str, y: float) -> None:
    probe = mcb.probe_lists(inst, mcb.VARIANTS[variant], y)
    hosts = mcb.KERNELS[backend](probe, inst.host_cpu, inst.host_mem)
    if hosts is None:
        return
    assert hosts.min(initial=0) >= 0
    cpu = np.bincount(hosts, weights=probe.cpu, minlength=inst.n_hosts)
    mem = np.bincount(hosts, weights=probe.mem, minlength=inst.n_hosts)
    slack = 1e-12 * (inst.n_tasks + 1)
    assert np.all(cpu <= inst.host_cpu + slack) and np.all(mem <= inst.host_mem + slack)


@settings(max_examples=100, deadline=None)
@given(inst=instances(), variant=st.sampled_from(sorted(mcb.VARIANTS)))
def test_solutions_are_valid_never_above_the_lp_bound_and_at_least_the_probe(inst: Instance, variant: str) -> None:
    res = solve(inst, variant)
    bound = lp_bound(inst)
    if not res.feasible:
        return
    assert res.allocation is not None and res.min_yield is not None and bound is not None
    check_allocation(inst, res.allocation, min_yield=res.min_yield, avg_yield=res.avg_yield)
    assert res.min_yield <= bound + 1e-9
    probe_yield = res.detail["probe_yield"]
    assert isinstance(probe_yield, float)
    assert res.min_yield >= probe_yield - 1e-9
    gap = res.detail["search_gap"]
    assert isinstance(gap, float) and gap < 1e-4


# --- the CLI -----------------------------------------------------------------------------------


def test_solve_with_mcb8_prints_a_json_result(tmp_path: Path) -> None:
    doc = {
        "hosts": [{"name": "a", "cpu": 1.0, "memory": 1.0}, {"name": "b", "cpu": 1.0, "memory": 1.0}],
        "jobs": [
            {"name": "web", "cpu_need": 0.8, "memory": 0.4},
            {"name": "db", "cpu_need": 0.8, "memory": 0.4},
            {"name": "cache", "cpu_need": 0.2, "memory": 0.6, "tasks": 2},
        ],
    }
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["solve", str(path), "--algorithm", "mcb8", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["algorithm"] == "mcb8" and out["feasible"] is True
    assert out["min_yield"] == pytest.approx(1.0)
    assert len(out["placement"]) == 4
    assert {"backend", "probes", "probe_yield", "search_gap", "lp_bound"} <= set(out["detail"])


def test_solve_with_mcb8_exits_1_when_nothing_fits(tmp_path: Path) -> None:
    doc = {"hosts": [{"name": "a"}], "jobs": [{"name": "x", "cpu_need": 0.5, "memory": 0.6},
                                              {"name": "y", "cpu_need": 0.5, "memory": 0.6}]}
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["solve", str(path), "--algorithm", "mcb8", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["feasible"] is False
