"""Placement rules in the core (docs/rules.md): every placing algorithm honours them, or says which one fails."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vcsched.errors import InputError
from vcsched.model import PREFERRED, REQUIRED, Host, Instance, Job
from vcsched.rules import check_rules, contract_together, rule_problems, unsatisfiable
from vcsched.solvers import mcb
from vcsched.solvers.registry import solve
from vcsched.solvers.search import residual_probe
from vcsched.validate import allocation_problems

ALGORITHMS = ["mcb1", "mcb3", "mcb5", "mcb8", "gr", "sg", "gb", "sgb", "rrnd", "rrnz", "milp", "best"]


def random_ruled(rng: np.random.Generator, *, extra: bool = False) -> Instance:
    nh = int(rng.integers(2, 5))
    cap = (("disk", 1.0),) if extra else ()
    hosts = tuple(Host(f"h{i}", maintenance=bool(rng.random() < 0.2), capacity=cap) for i in range(nh))
    jobs = []
    for j in range(int(rng.integers(1, 5))):
        r = rng.random()
        jobs.append(Job(f"j{j}", float(rng.uniform(0.05, 0.9)), float(rng.uniform(0.05, 0.3)), int(rng.integers(1, 4)),
                        needs=(("disk", 0.2),) if extra else (),
                        spread=REQUIRED if r < 0.3 else PREFERRED if r < 0.4 else None,
                        together=REQUIRED if 0.4 < r < 0.5 else PREFERRED if 0.5 < r < 0.55 else None))
    inst = Instance(hosts, tuple(jobs))
    pins = [int(rng.integers(0, nh)) if rng.random() < 0.1 else -1 for _ in range(inst.n_tasks)]
    return dataclasses.replace(inst, pinned=tuple(pins))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_honours_required_rules(algorithm: str) -> None:
    rng = np.random.default_rng(7)
    feasible = 0
    for _ in range(25):
        inst = random_ruled(rng)
        try:
            check_rules(inst)
        except InputError:
            continue
        r = solve(inst, algorithm)
        if r.feasible:
            assert r.allocation is not None
            assert allocation_problems(inst, r.allocation) == []
            feasible += 1
        else:
            assert "rules" in r.detail
    assert feasible >= 10


def test_vector_mcb_honours_rules() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        inst = random_ruled(rng, extra=True)
        try:
            check_rules(inst)
        except InputError:
            continue
        r = solve(inst, "mcb8")
        if r.feasible:
            assert r.allocation is not None and rule_problems(inst, np.asarray(r.allocation.hosts)) == []


def test_c_and_python_kernels_agree_with_spread_and_pins() -> None:
    if "c" not in mcb.KERNELS:
        pytest.skip("the C kernel is not built")
    rng = np.random.default_rng(0)
    for _ in range(150):
        inst = random_ruled(rng)
        try:
            check_rules(inst)
        except InputError:
            continue
        inst = contract_together(inst).instance
        for y in (0.3, 0.6, 0.9):
            a = residual_probe(inst, None, "mcb8", backend="python")(y)
            b = residual_probe(inst, None, "mcb8", backend="c")(y)
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert (a == b).all()


def test_spread_puts_each_vm_on_its_own_host() -> None:
    inst = Instance(tuple(Host(f"h{i}") for i in range(3)), (Job("ha", 0.1, 0.1, 3, spread=REQUIRED),))
    r = solve(inst, "mcb8")
    assert r.allocation is not None and sorted(r.allocation.hosts) == [0, 1, 2]
    # Without the rule MCB8 packs all three on the first host (they fit).
    plain = solve(Instance(inst.hosts, (Job("ha", 0.1, 0.1, 3),)), "mcb8")
    assert plain.allocation is not None and len(set(plain.allocation.hosts)) == 1


def test_together_contracts_and_expands() -> None:
    inst = Instance(tuple(Host(f"h{i}") for i in range(2)),
                    (Job("a", 0.5, 0.2, 3, together=REQUIRED), Job("b", 0.5, 0.5)))
    c = contract_together(inst)
    assert c.instance.n_tasks == 2 and c.instance.jobs[0].memory == pytest.approx(0.6)
    for algorithm in ALGORITHMS:
        r = solve(inst, algorithm)
        assert r.allocation is not None, algorithm
        assert len(set(r.allocation.hosts[:3])) == 1, algorithm


def test_maintenance_and_pins() -> None:
    hosts = (Host("h0"), Host("h1", maintenance=True), Host("h2"))
    inst = Instance(hosts, (Job("a", 0.5, 0.2, 2), Job("p", 0.5, 0.2)), pinned=(-1, -1, 1))
    for algorithm in ALGORITHMS:
        r = solve(inst, algorithm)
        assert r.allocation is not None, algorithm
        assert r.allocation.hosts[2] == 1 and 1 not in r.allocation.hosts[:2], algorithm


def test_preferred_falls_back_and_reports() -> None:
    inst = Instance((Host("h0"), Host("h1")), (Job("ha", 0.1, 0.1, 3, spread=PREFERRED),))
    r = solve(inst, "mcb8")
    assert r.feasible and r.detail.get("preferred_dropped") is True
    assert any("spread" in u for u in r.detail["unmet_preferred"])  # type: ignore[union-attr]
    ok = solve(Instance((Host("h0"), Host("h1"), Host("h2")), inst.jobs), "mcb8")
    assert ok.feasible and "unmet_preferred" not in ok.detail


def test_required_spread_on_too_few_hosts_is_infeasible_naming_the_rule() -> None:
    inst = Instance((Host("h0"), Host("h1"), Host("h2", maintenance=True)), (Job("ha", 0.1, 0.1, 3, spread=REQUIRED),))
    reason = unsatisfiable(inst)
    assert reason is not None and reason.startswith("spread: virtual cluster 'ha' has 3 VMs but only 2 hosts")
    r = solve(inst, "sg")
    assert not r.feasible and str(r.detail["infeasible"]).startswith("spread:")


@pytest.mark.parametrize("jobs,pinned,message", [
    ((Job("x", 0.1, 0.1, 2, spread=REQUIRED, together=REQUIRED),), (), "both spread"),
    ((Job("x", 0.1, 0.1, 2, spread=REQUIRED),), (0, 0), "two of its VMs are pinned to 'h0'"),
    ((Job("x", 0.1, 0.1, 2, together=REQUIRED),), (0, 1), "pinned to h0, h1"),
    ((Job("x", 0.1, 0.1, 1),), (5,), "host index 5 is not a host"),
    ((Job("x", 0.1, 0.1, 2, spread="sometimes"),), (), "'sometimes' is not"),
])
def test_contradictions_are_bad_input(jobs: tuple[Job, ...], pinned: tuple[int, ...], message: str) -> None:
    inst = Instance((Host("h0"), Host("h1")), jobs, pinned=pinned)
    with pytest.raises(InputError, match=message):
        solve(inst, "mcb8")


def test_validator_names_broken_rules() -> None:
    inst = Instance((Host("h0"), Host("h1", maintenance=True)),
                    (Job("s", 0.1, 0.1, 2, spread=REQUIRED), Job("t", 0.1, 0.1, 2, together=REQUIRED),
                     Job("p", 0.1, 0.1)), pinned=(-1, -1, -1, -1, 0))
    problems = rule_problems(inst, np.array([0, 0, 0, 1, 1]))
    text = " | ".join(problems)
    assert "spread: virtual cluster 's'" in text and "together: virtual cluster 't'" in text
    assert "pinned: task 0 of 'p'" in text and "maintenance" in text
