"""The adaptation MILP of section 6.1 (docs/model.md: the exact formulation plus the budget row), solved with HiGHS.

The static MILP of section 2.5 (section 5's per-task form), built by
:func:`vcsched.solvers.milp.build_model` without symmetry breaking (tasks
already run on particular hosts, so hosts of equal capacity are not
interchangeable), plus the budget row appended with
:meth:`~vcsched.solvers.milp.MilpModel.with_rows`:

    sum_{t running} B_t * (1 - e_{t, current(t)})  <=  budget

i.e. the bytes of every running task that leaves its current host.  Written
as ``-sum B_t e_{t,cur} <= budget - sum B_t``.  Bytes are scaled to the
largest task size so the row's coefficients are O(1).

Solved by :func:`vcsched.solvers.milp.solve_model`, the static MILP's own
path (which also keeps HiGHS's stray C-level prints off stdout).  A second
solve keeps the yield at the first one's optimum and minimizes the bytes
moved, so the MILP does not migrate for nothing (a tiny weight on bytes in
one objective would fall under HiGHS's absolute gap 1e-6).

Placement rules (docs/rules.md) come with the static model's bounds and
spread rows, on the adaptation's mask (:func:`vcsched.adaptation.problem.allowed_matrix`:
a task may stay on a host in maintenance it runs on, unless it must leave).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from vcsched.adaptation.problem import AdaptProblem, allowed_matrix, move_cost
from vcsched.model import SolveOptions
from vcsched.solvers.milp import MilpModel, build_model, placement_from, solve_model
from vcsched.units import SOLVER_TOLERANCE
from vcsched.yields import placement_min_yield

MIP_REL_GAP = 1e-7
MAX_BUDGET_RETRIES = 3


def adapt_milp(problem: AdaptProblem, options: SolveOptions) -> tuple[np.ndarray | None, bool, dict[str, object]]:
    """Solve section 6.1 exactly: (task->host or None, proved optimal, details)."""
    from scipy.sparse import coo_array  # lazy: scipy costs ~0.4 s to import; `place` and `status` never solve this

    inst = problem.instance
    if inst.n_tasks == 0:
        return np.zeros(0, dtype=np.int64), True, {}
    allowed = allowed_matrix(problem) if inst.has_rules or problem.leave else None
    model = build_model(inst, symmetry_breaking=False, allowed=allowed)
    # The static model maximizes OBJECTIVE_SCALE * Y, to prove Y to ~1e-9; the adaptation works to 1e-7
    # (MIP_REL_GAP, SOLVER_TOLERANCE) and maximizes Y itself: the same answers on small problems, ~1.4x faster.
    maximize_y = np.zeros(model.n_vars)
    maximize_y[model.y_index] = -1.0
    model = replace(model, c=maximize_y)
    # The budget row (section 6.1), only when it can bind; the same weights, as an objective, count bytes kept.
    run = np.flatnonzero(problem.running)
    total = float(problem.task_bytes[run].sum())
    scale = float(problem.task_bytes[run].max()) if len(run) else 1.0
    stay_w = np.zeros(model.n_vars)
    budget_row: int | None = None
    if len(run) and problem.copies_disks:
        # A move's bytes depend on its destination (disks copied between storage groups): the budget row sums
        # C[t, h] * e[t, h] over every host but the current one, and the second solve minimizes the same sum.
        hosts_all = np.arange(inst.n_hosts)
        cost = problem.move_bytes(run[:, None], hosts_all[None, :])
        cost[np.arange(len(run)), problem.current[run]] = 0.0
        scale = float(cost.max()) or 1.0
        cols = (run[:, None] * inst.n_hosts + hosts_all[None, :]).ravel()
        stay_w[cols] = -cost.ravel() / scale  # "kept" weight: minus what is moved, so -stay_w is the cost
        if problem.budget < float(cost.max(axis=1).sum()):
            row = coo_array((cost.ravel() / scale, (np.zeros(len(cols), dtype=np.int64), cols)),
                            shape=(1, model.n_vars))
            model = model.with_rows(row, np.array([-np.inf]), np.array([problem.budget / scale]))
            budget_row = model.a.shape[0] - 1
    elif len(run):
        stay_cols = run * inst.n_hosts + problem.current[run]  # model.e_index(t, current[t])
        w = problem.task_bytes[run] / scale
        stay_w[stay_cols] = w
        if problem.budget < total:
            row = coo_array((-w, (np.zeros(len(run), dtype=np.int64), stay_cols)), shape=(1, model.n_vars))
            model = model.with_rows(row, np.array([-np.inf]), np.array([(problem.budget - total) / scale]))
            budget_row = model.a.shape[0] - 1
    deadline = None if options.time_limit is None else time.perf_counter() + options.time_limit
    detail: dict[str, object] = {"binaries": inst.n_tasks * inst.n_hosts, "rows": int(model.a.shape[0])}

    def solve(m: MilpModel) -> tuple[np.ndarray | None, bool]:
        limit = None if deadline is None else max(deadline - time.perf_counter(), 1e-3)
        sol = solve_model(m, limit, mip_rel_gap=MIP_REL_GAP)
        detail["status"], detail["message"] = sol.status, sol.message
        return sol.x, sol.optimal

    for _ in range(MAX_BUDGET_RETRIES):
        # Solve 1: the best yield.  Solve 2: among placements within SOLVER_TOLERANCE of it, the fewest bytes.
        x, optimal = solve(model)
        if x is None:
            return None, optimal, detail
        y_star = float(x[model.y_index])
        detail["milp_min_yield"] = y_star
        if len(run) and optimal and (deadline is None or time.perf_counter() < deadline):
            # HiGHS's Y can exceed what its placement really allows by its feasibility tolerance (~1e-6 here,
            # more than SOLVER_TOLERANCE); keep the second solve's floor at or below the placement's own yield, or the
            # first placement itself would be cut off and the second solve turn infeasible.
            y_first = min(y_star, placement_min_yield(inst, placement_from(model, x)))
            lower = model.lower.copy()
            lower[model.y_index] = max(y_first - SOLVER_TOLERANCE, 0.0)
            weight = abs(stay_w.sum()) or 1.0
            x2, _ = solve(replace(model, c=-stay_w / weight, lower=lower))
            if x2 is not None:
                x = x2
        hosts = placement_from(model, x)
        overshoot = move_cost(problem, hosts) - problem.budget
        if overshoot <= 0 or budget_row is None:
            return hosts, optimal, detail
        # HiGHS accepted the budget row within its tolerance; tighten it by what it overshot.
        row_upper = model.row_upper.copy()
        row_upper[budget_row] -= (overshoot + 1) / scale
        model = replace(model, row_upper=row_upper)
    return None, False, detail
