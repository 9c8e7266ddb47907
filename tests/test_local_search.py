"""Local search on the bottleneck (vcsched.solvers.local_search): what a step may and may not do."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_instance
from vcsched.model import Host, Instance, Job
from vcsched.solvers.local_search import MEMORY_SLACK, LoadState, best_step, descend, perturb
from vcsched.yields import fits_in_memory, placement_min_yield


def never() -> bool:
    return False


def test_a_move_off_the_bottleneck_raises_the_minimum_yield() -> None:
    inst = make_instance([(0.6, 0.1), (0.6, 0.1), (0.2, 0.1)], n_hosts=2)
    state = LoadState.of(inst, np.array([0, 0, 1]))
    assert descend(state, never) >= 1
    assert state.min_yield() == 1.0  # 0.6 + 0.2 and 0.6, or 0.6 and 0.6 + 0.2


def test_a_swap_is_used_when_memory_forbids_every_move() -> None:
    # Host 0 holds the two big CPU tasks; host 1's memory is full, so only an exchange can balance.
    inst = make_instance([(0.9, 0.5), (0.8, 0.4), (0.2, 0.5), (0.1, 0.5)], n_hosts=2)
    state = LoadState.of(inst, np.array([0, 0, 1, 1]))
    step = best_step(state, 0)
    assert step is not None and step.other >= 0
    descend(state, never)
    assert placement_min_yield(inst, state.hosts) > placement_min_yield(inst, np.array([0, 0, 1, 1]))
    assert fits_in_memory(inst, state.hosts)


def test_a_step_that_only_moves_the_bottleneck_elsewhere_is_not_taken() -> None:
    inst = make_instance([(0.7, 0.1), (0.6, 0.1)], n_hosts=2)
    state = LoadState.of(inst, np.array([0, 1]))
    assert best_step(state, 0) is None and descend(state, never) == 0


def test_hosts_of_other_capacity_are_balanced_by_relative_load() -> None:
    inst = Instance((Host("big", 2.0, 1.0), Host("small", 0.5, 1.0)),
                    tuple(Job(f"j{i}", 0.5, 0.1) for i in range(5)))
    state = LoadState.of(inst, np.array([1, 1, 1, 0, 0]))
    descend(state, never)
    assert state.min_yield() == 1.0  # four on the big host, one on the small one


def test_the_clock_stops_the_descent() -> None:
    inst = make_instance([(0.5, 0.01)] * 40, n_hosts=8)
    state = LoadState.of(inst, np.zeros(40, dtype=np.int64))
    assert descend(state, lambda: True) == 0


instances = st.integers(2, 5).flatmap(lambda h: st.tuples(
    st.just(h),
    st.lists(st.tuples(st.floats(0.05, 1.0), st.floats(0.01, 0.6)), min_size=1, max_size=12),
    st.lists(st.floats(0.3, 2.0), min_size=h, max_size=h),
    st.integers(0, 2**32 - 1),
))


def _instance(h: int, jobs: list[tuple[float, float]], caps: list[float]) -> Instance:
    return Instance(tuple(Host(f"h{i}", c, 1.0 + c) for i, c in enumerate(caps)),
                    tuple(Job(f"j{i}", a, m) for i, (a, m) in enumerate(jobs)))


@settings(max_examples=80, deadline=None)
@given(instances)
def test_descent_and_kicks_keep_memory_and_their_loads_in_step(case: tuple[int, list, list, int]) -> None:
    h, jobs, caps, seed = case
    inst = _instance(h, jobs, caps)
    rng = np.random.default_rng(seed)
    hosts = rng.integers(0, h, size=inst.n_tasks)
    if not fits_in_memory(inst, hosts):
        return
    state = LoadState.of(inst, hosts)
    before = state.min_yield()
    descend(state, never)
    assert state.min_yield() >= before  # the sorted loads only decrease lexicographically
    perturb(state, rng, 3)
    descend(state, never)
    fresh = LoadState.of(inst, state.hosts)
    assert np.allclose(fresh.load, state.load) and np.allclose(fresh.mem, state.mem)
    assert np.all(fresh.mem <= inst.host_mem + MEMORY_SLACK + 1e-12)
