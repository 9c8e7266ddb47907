"""The adaptation MILP of section 6.1 (docs/model.md: the exact formulation plus the budget row), solved with HiGHS.

The static MILP of section 2.5 (section 5's per-task form) plus the budget row

    sum_{t running} B_t * (1 - e_{t, current(t)})  <=  budget

i.e. the bytes of every running task that leaves its current host.  Written
as ``-sum B_t e_{t,cur} <= budget - sum B_t``.  Bytes are scaled to the
largest task size so the row's coefficients are O(1).

Variables, in this order: ``e_th`` binary (task t on host h), ``x_th`` in
[0, alpha_t] (CPU task t gets on h; the linearization of ``e_th * a_j``),
``a_j`` in [0, alpha_j], and ``Y``.  Rows: one host per task; memory and CPU
per host; ``x_th <= alpha_t e_th``; ``sum_h x_th = a_j``; ``Y alpha_j <= a_j``;
the budget.  A second solve keeps the yield at the first one's optimum and
minimizes the bytes moved, so the MILP does not migrate for nothing (a tiny
weight on bytes in one objective would fall under HiGHS's absolute gap 1e-6).
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from vcsched.adaptation.problem import AdaptProblem, move_cost
from vcsched.model import SolveOptions
from vcsched.yields import MEMORY_TOLERANCE

MIP_REL_GAP = 1e-7
Y_SLACK = 1e-7  # the second solve keeps the yield within this of the first's optimum
MAX_BUDGET_RETRIES = 3


def adapt_milp(problem: AdaptProblem, options: SolveOptions) -> tuple[np.ndarray | None, bool, dict[str, object]]:
    """Solve section 6.1 exactly: (task->host or None, proved optimal, details)."""
    inst = problem.instance
    n, n_h, n_j = inst.n_tasks, inst.n_hosts, inst.n_jobs
    if n == 0:
        return np.zeros(0, dtype=np.int64), True, {}
    nx = n * n_h
    n_var = 2 * nx + n_j + 1
    e_idx = np.arange(nx).reshape(n, n_h)
    x_idx = nx + e_idx
    a_idx = 2 * nx + np.arange(n_j)
    y_idx = 2 * nx + n_j
    t_idx = np.repeat(np.arange(n), n_h)
    h_idx = np.tile(np.arange(n_h), n)
    alpha_t, mem_t = inst.task_alpha, inst.task_mem

    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    r0 = 0

    def add(r: np.ndarray, c: np.ndarray, v: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        nonlocal r0
        rows.append(r + r0)
        cols.append(c)
        vals.append(v)
        lo.append(low)
        hi.append(high)
        r0 += len(low)

    # Each task on exactly one host.
    add(t_idx, e_idx.ravel(), np.ones(nx), np.ones(n), np.ones(n))
    # Memory per host.
    add(h_idx, e_idx.ravel(), mem_t[t_idx], np.full(n_h, -np.inf), inst.host_mem + MEMORY_TOLERANCE / 10)
    # CPU per host.
    add(h_idx, x_idx.ravel(), np.ones(nx), np.full(n_h, -np.inf), inst.host_cpu)
    # x_th <= alpha_t e_th.
    k = np.arange(nx)
    add(np.concatenate((k, k)), np.concatenate((x_idx.ravel(), e_idx.ravel())),
        np.concatenate((np.ones(nx), -alpha_t[t_idx])), np.full(nx, -np.inf), np.zeros(nx))
    # sum_h x_th = a_j(t).
    add(np.concatenate((t_idx, np.arange(n))), np.concatenate((x_idx.ravel(), a_idx[inst.task_job])),
        np.concatenate((np.ones(nx), -np.ones(n))), np.zeros(n), np.zeros(n))
    # Y alpha_j <= a_j.
    jj = np.arange(n_j)
    add(np.concatenate((jj, jj)), np.concatenate((np.full(n_j, y_idx), a_idx)),
        np.concatenate((inst.job_alpha, -np.ones(n_j))), np.full(n_j, -np.inf), np.zeros(n_j))
    # The budget row (section 6.1), only when it can bind.
    run = np.flatnonzero(problem.running)
    total = float(problem.task_bytes[run].sum())
    scale = float(problem.task_bytes[run].max()) if len(run) else 1.0
    budget_row = None
    stay_w = np.zeros(n_var)
    if len(run):
        stay_cols = e_idx[run, problem.current[run]]
        w = problem.task_bytes[run] / scale
        stay_w[stay_cols] = w
        if problem.budget < total:
            budget_row = r0
            add(np.zeros(len(run), dtype=np.int64), stay_cols, -w, np.array([-np.inf]),
                np.array([(problem.budget - total) / scale]))

    a_mat = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                       shape=(r0, n_var)).tocsr()
    row_hi = np.concatenate(hi)
    row_lo = np.concatenate(lo)
    upper = np.concatenate((np.ones(nx), np.tile(alpha_t[:, None], (1, n_h)).ravel(), inst.job_alpha, [1.0]))
    integrality = np.concatenate((np.ones(nx), np.zeros(n_var - nx)))
    deadline = None if options.time_limit is None else time.perf_counter() + options.time_limit
    detail: dict[str, object] = {"binaries": nx, "rows": r0}

    def solve(c: np.ndarray, y_low: float) -> tuple[np.ndarray | None, bool]:
        lower = np.zeros(n_var)
        lower[y_idx] = y_low
        opts: dict[str, object] = {"mip_rel_gap": MIP_REL_GAP}
        if deadline is not None:
            opts["time_limit"] = max(deadline - time.perf_counter(), 1e-3)
        res = milp(c, constraints=LinearConstraint(a_mat, row_lo, row_hi), bounds=Bounds(lower, upper),
                   integrality=integrality, options=opts)
        detail["status"], detail["message"] = int(res.status), str(res.message)
        return res.x, res.status == 0

    maximize_y = np.zeros(n_var)
    maximize_y[y_idx] = -1.0
    for _ in range(MAX_BUDGET_RETRIES):
        # Solve 1: the best yield.  Solve 2: among placements within Y_SLACK of it, the fewest bytes.
        x, optimal = solve(maximize_y, 0.0)
        if x is None:
            return None, optimal, detail
        y_star = float(x[y_idx])
        detail["milp_min_yield"] = y_star
        if len(run) and optimal and (deadline is None or time.perf_counter() < deadline):
            x2, _ = solve(-stay_w / stay_w.sum(), max(y_star - Y_SLACK, 0.0))
            if x2 is not None:
                x = x2
        hosts = np.argmax(x[:nx].reshape(n, n_h), axis=1).astype(np.int64)
        overshoot = move_cost(problem, hosts) - problem.budget
        if overshoot <= 0 or budget_row is None:
            return hosts, optimal, detail
        # HiGHS accepted the budget row within its tolerance; tighten it by what it overshot.
        row_hi[budget_row] -= (overshoot + 1) / scale
    return None, False, detail
