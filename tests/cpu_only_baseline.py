"""Every placing algorithm's answer on CPU-only instances of the paper's protocol, pinned bit for bit.

The placing algorithms learned the resource vector (disk, net, ...); an
instance whose only fluid resource is CPU must still get exactly what it got
before.  :func:`baseline` computes every algorithm's placement and CPU
fractions on a few of the paper's instances (section 4.1: the small set and a
parallel-job instance at 64 hosts), and ``tests/data/cpu_only_baseline.json``
holds what the code before the vector work (main at ``bba617f``) computed;
``test_cpu_only_baseline.py`` compares.  Regenerate (only when a change to
the CPU-only results is intended) with::

    .venv/bin/python -m tests.cpu_only_baseline > tests/data/cpu_only_baseline.json
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from vcsched.adaptation.problem import AdaptProblem
from vcsched.adaptation.solve import solve_adapt
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.model import Instance, SolveOptions
from vcsched.solvers.anytime import best_placement
from vcsched.solvers.registry import solve

ALGORITHMS = ("mcb8", "mcb5", "gr", "sg", "gb", "sgb", "rrnd", "rrnz", "milp", "lpbound")
LARGE_ALGORITHMS = ("mcb8", "gr", "sg", "gb", "sgb", "rrnz", "lpbound")


def instances() -> list[tuple[str, Instance]]:
    out = []
    for i, (tasks, slack, cv) in enumerate([(6, 0.3, 0.25), (8, 0.5, 0.75), (10, 0.7, 0.25), (12, 0.5, 0.25),
                                            (12, 0.3, 0.75), (10, 0.5, 0.75)]):
        spec = GeneratorSpec(hosts=4, tasks=tasks, slack=slack, cv_mem=cv, cv_cpu=cv)
        out.append((f"small{i}", generate(spec, 1000 + i)))
    for i, (tasks, slack) in enumerate([(100, 0.5), (100, 0.7)]):
        spec = GeneratorSpec(hosts=64, tasks=tasks, slack=slack, cv_mem=0.25, cv_cpu=0.75, parallel=True)
        out.append((f"parallel{i}", generate(spec, 2000 + i)))
    return out


def _result(instance: Instance, algorithm: str) -> dict[str, Any]:
    r = solve(instance, algorithm, SolveOptions(seed=3, max_attempts=20_000))
    if r.allocation is None:
        return {"feasible": r.feasible, "min_yield": r.min_yield}
    return {"feasible": r.feasible, "hosts": list(r.allocation.hosts), "cpu": [repr(c) for c in r.allocation.cpu]}


def baseline() -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for name, inst in instances():
        algos = ALGORITHMS if name.startswith("small") else LARGE_ALGORITHMS
        row = {a: _result(inst, a) for a in algos}
        best = best_placement(inst, budget_s=1e6, seed=1, max_kicks=30)
        row["best"] = {"hosts": None if best.hosts is None else [int(h) for h in best.hosts]}
        # The adaptation: the first half of the tasks run where MCB8 put them, half of their bytes may move.
        if row["mcb8"].get("hosts") is not None:
            current = np.array(row["mcb8"]["hosts"], dtype=np.int64)
            current[inst.n_tasks // 2:] = -1
            current = np.roll(current, 1)  # not where MCB8 would put them again
            task_bytes = np.round(inst.task_mem * (1 << 30)).astype(np.int64)
            budget = int(task_bytes[current >= 0].sum() // 2)
            for algo in ("heuristic", "milp") if name.startswith("small") else ("heuristic",):
                res = solve_adapt(AdaptProblem(inst, current, task_bytes, budget), algo).result
                row[f"adapt-{algo}"] = (
                    {"hosts": list(res.allocation.hosts), "cpu": [repr(c) for c in res.allocation.cpu]}
                    if res.allocation is not None else {"feasible": False})
        doc[name] = row
    return doc


if __name__ == "__main__":
    print(json.dumps(baseline(), indent=0, sort_keys=True))
