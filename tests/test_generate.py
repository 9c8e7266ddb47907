"""The instance generator follows the paper's protocol (section 4.1) and Lublin-Feitelson sizes (section 5)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import truncnorm

from cli.main import cli
from vcsched.errors import InputError
from vcsched.experiments.generate import (
    MAX_TASKS_PER_JOB,
    SERIAL_PROB,
    GeneratorSpec,
    generate,
    job_sizes,
    lublin_job_size,
    truncated_normal,
)
from vcsched.formats.instance import instance_from_dict, instance_to_dict


def _truncated_mean(mean: float, cv: float) -> float:
    sd = cv * mean
    return float(truncnorm.mean((0 - mean) / sd, (1 - mean) / sd, loc=mean, scale=sd))


def test_same_seed_gives_the_same_instance() -> None:
    spec = GeneratorSpec(hosts=8, tasks=30, slack=0.4, cv_mem=0.75, cv_cpu=0.75, parallel=True)
    assert generate(spec, 7) == generate(spec, 7)


def test_different_seeds_give_different_instances() -> None:
    spec = GeneratorSpec(hosts=8, tasks=30, slack=0.4)
    assert generate(spec, 1) != generate(spec, 2)


def test_sequential_instance_has_the_requested_hosts_and_one_task_jobs() -> None:
    inst = generate(GeneratorSpec(hosts=4, tasks=12, slack=0.5), 0)
    assert inst.n_hosts == 4
    assert inst.n_jobs == 12
    assert all(j.tasks == 1 for j in inst.jobs)
    assert all(h.cpu == 1.0 and h.memory == 1.0 for h in inst.hosts)


@settings(max_examples=40, deadline=None)
@given(
    hosts=st.integers(1, 64),
    tasks=st.integers(1, 300),
    slack=st.floats(0.0, 0.95),
    cv_mem=st.sampled_from([0.0, 0.25, 0.75, 2.0]),
    cv_cpu=st.sampled_from([0.0, 0.25, 0.75, 2.0]),
    parallel=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_every_need_is_in_zero_one(hosts: int, tasks: int, slack: float, cv_mem: float, cv_cpu: float,
                                   parallel: bool, seed: int) -> None:
    if (1 - slack) * hosts / tasks > 1:
        return  # rejected by the spec; covered by its own test
    inst = generate(GeneratorSpec(hosts, tasks, slack, cv_mem, cv_cpu, parallel), seed)
    assert all(0 < j.cpu_need <= 1 and 0 < j.memory <= 1 for j in inst.jobs)
    assert inst.n_tasks == tasks
    # the document round-trips through the validating parser
    assert instance_from_dict(json.loads(json.dumps(instance_to_dict(inst)))) == inst


@pytest.mark.parametrize(("hosts", "tasks", "slack", "cv"), [(4, 12, 0.5, 0.25), (64, 500, 0.3, 0.75),
                                                             (4, 6, 0.1, 0.75)])
def test_mean_memory_is_the_truncated_protocol_mean(hosts: int, tasks: int, slack: float, cv: float) -> None:
    spec = GeneratorSpec(hosts=hosts, tasks=tasks, slack=slack, cv_mem=cv)
    rng = np.random.default_rng(123)
    mem = np.concatenate([generate(spec, rng).job_mem for _ in range(40_000 // tasks + 1)])
    expected = _truncated_mean((1 - slack) * hosts / tasks, cv)
    assert mem.mean() == pytest.approx(expected, rel=0.02)


def test_mean_memory_is_the_nominal_mean_when_truncation_is_rare() -> None:
    spec = GeneratorSpec(hosts=4, tasks=10, slack=0.5, cv_mem=0.25)
    rng = np.random.default_rng(5)
    mem = np.concatenate([generate(spec, rng).job_mem for _ in range(3000)])
    assert mem.mean() == pytest.approx((1 - 0.5) * 4 / 10, rel=0.01)


def test_cpu_need_has_mean_one_half_and_the_requested_variation() -> None:
    draws = truncated_normal(np.random.default_rng(9), 0.5, 0.25, 50_000)
    assert draws.mean() == pytest.approx(0.5, abs=0.005)
    assert draws.std() / draws.mean() == pytest.approx(0.25, rel=0.03)


def test_truncation_resamples_rather_than_clipping_to_one() -> None:
    draws = truncated_normal(np.random.default_rng(3), 0.9, 0.75, 20_000)
    assert (draws == 1.0).sum() == 0
    assert draws.max() <= 1.0 and draws.min() > 0.0


def test_spec_rejects_a_memory_mean_above_one_host() -> None:
    with pytest.raises(InputError, match="slack"):
        GeneratorSpec(hosts=4, tasks=2, slack=0.1)


def test_lublin_sizes_stay_within_one_to_sixty_four() -> None:
    rng = np.random.default_rng(0)
    sizes = [lublin_job_size(rng) for _ in range(20_000)]
    assert min(sizes) == 1
    assert max(sizes) == MAX_TASKS_PER_JOB


def test_lublin_sizes_are_biased_to_powers_of_two() -> None:
    rng = np.random.default_rng(1)
    sizes = Counter(lublin_job_size(rng) for _ in range(40_000))
    parallel = sum(n for k, n in sizes.items() if k > 1)
    pow2 = sum(n for k, n in sizes.items() if k > 1 and k & (k - 1) == 0)
    # 6 powers of two among the 63 sizes 2..64, yet most parallel jobs have one of them
    assert pow2 / parallel > 0.7
    assert sizes[1] / sum(sizes.values()) == pytest.approx(SERIAL_PROB, abs=0.01)
    # each power of two is more common than its odd neighbours
    for k in (4, 8, 16):
        assert sizes[k] > 3 * max(sizes[k - 1], sizes[k + 1])


def test_parallel_sizes_add_up_to_the_requested_total() -> None:
    sizes = job_sizes(np.random.default_rng(4), 500)
    assert sum(sizes) == 500
    assert all(1 <= k <= MAX_TASKS_PER_JOB for k in sizes)


def test_parallel_instance_shares_needs_within_a_job() -> None:
    inst = generate(GeneratorSpec(hosts=16, tasks=200, slack=0.3, parallel=True), 2)
    assert inst.n_tasks == 200
    assert inst.n_jobs < 200
    assert inst.has_parallel_jobs


def test_cli_writes_the_same_instance_for_the_same_seed(tmp_path: object) -> None:
    runner = CliRunner()
    args = ["generate", "--hosts", "64", "--tasks", "500", "--slack", "0.3", "--cv-mem", "0.75",
            "--cv-cpu", "0.75", "--seed", "1"]
    a = runner.invoke(cli, args)
    b = runner.invoke(cli, args)
    assert a.exit_code == 0, a.output
    assert a.output == b.output
    inst = instance_from_dict(json.loads(a.output))
    assert inst.n_hosts == 64 and inst.n_jobs == 500


def test_cli_output_file_is_a_solvable_instance(tmp_path: pytest.TempPathFactory) -> None:
    out = f"{tmp_path}/inst.json"
    r = CliRunner().invoke(cli, ["generate", "--hosts", "8", "--tasks", "20", "--slack", "0.4", "--seed", "1",
                                 "--parallel", "--output", out])
    assert r.exit_code == 0, r.output
    with open(out) as f:
        inst = instance_from_dict(json.load(f))
    assert inst.n_tasks == 20


@pytest.mark.parametrize(
    "bad",
    [
        ["--hosts", "0", "--tasks", "5", "--slack", "0.3"],
        ["--hosts", "4", "--tasks", "5", "--slack", "1"],
        ["--hosts", "4", "--tasks", "5", "--slack", "0.3", "--cv-mem", "-1"],
        ["--hosts", "4", "--tasks", "5", "--slack", "0.3", "--seed", "x"],
        ["--hosts", "4", "--tasks", "2", "--slack", "0.1"],
        ["--tasks", "5", "--slack", "0.3"],
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(bad: list[str]) -> None:
    r = CliRunner().invoke(cli, ["generate", *bad])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error:")
