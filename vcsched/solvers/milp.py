"""The exact MILP (paper section 2.5; section 5 for parallel jobs), solved with HiGHS.

The model is built as data (:class:`MilpModel`) by :func:`build_model` and
solved by :func:`solve_model`; :func:`placement_from` reads the task->host
placement back.  Keeping the three apart lets other formulations reuse them:
the LP relaxation behind RRND/RRNZ (:mod:`vcsched.solvers.rounding`) is the same
model with integrality dropped, and the adaptation MILP (:mod:`vcsched.adaptation.milp`)
is the same model with one more row, the migration byte budget, appended
with :meth:`MilpModel.with_rows`.

Formulation (docs/model.md, the exact formulation).  Tasks ``t`` (a parallel job's tasks are
separate tasks of the same job ``j(t)``), hosts ``h``:

- ``e[t, h]`` in {0, 1}: task ``t`` runs on host ``h``;
- ``x[t, h]`` in [0, alpha_j(t)]: CPU task ``t`` gets on host ``h``;
- ``a[j]`` in [0, alpha_j]: the CPU fraction every task of job ``j`` gets;
- ``Y`` in [0, 1]: the minimum yield, maximized.

Rows: ``sum_h e[t, h] = 1``; ``sum_t m_t e[t, h] <= M_h``;
``sum_t x[t, h] <= C_h``; ``x[t, h] - alpha_t e[t, h] <= 0`` and
``sum_h x[t, h] - a[j(t)] = 0`` (the linearization of the bilinear
``sum_t a_j e[t, h] <= C_h``: ``x`` is non-zero only on the chosen host, where
it equals ``a_j``); ``alpha_j Y - a[j] <= 0`` (``Y <= a_j / alpha_j``).

The resource vector (extra fluid resources, docs/policies.md): a job at
yield ``y_j = a_j / alpha_j`` uses ``y_j need_jr`` of every other fluid
resource ``r``, so each (host, r) gets the linear row
``sum_t x[t, h] need_jr / alpha_j <= C_hr``, and ``e[t, h]`` is fixed at 0
where the task needs a resource the host has none of (it would run at yield
0 there).  The makespan form gets ``sum_t need_tr e[t, h] - C_hr Z <= 0``
and the same bounds.  Instances whose only fluid resource is CPU get none of
this: the same model as before.

Symmetry breaking for identical hosts.  Hosts with equal (C_h, M_h) are
interchangeable, so a placement has up to ``g!`` relabelled copies per group
of ``g`` identical hosts, and branch-and-bound would otherwise prove the same
bound once per copy.  We keep only the copy where, inside each group, hosts
are used in order of the lowest-numbered task they hold: task ``t`` may go to
the ``k``-th host of a group only if some task before ``t`` is on the
``(k-1)``-th one, ``e[t, g_k] <= sum_{t' < t} e[t', g_{k-1}]``.  Every placement
can be relabelled into that form (sort the group's used hosts by their first
task), so the optimum is unchanged.  The rows cost ``O(T^2 g)`` non-zeros, so
above :data:`SYMMETRY_NONZERO_LIMIT` only their cheap consequence is kept as
variable bounds: task ``t`` cannot use the ``k``-th host of a group for ``k > t``.
Formulations where hosts are *not* interchangeable even at equal capacity
(the adaptation MILP: tasks already run on particular hosts) must build with
``symmetry_breaking=False``; so must the LP relaxation behind RRND, whose
``e`` values are read as probabilities and would be skewed to low indices.

Placement rules (docs/rules.md) are variable bounds and rows: ``e[t, h] = 0``
where the task may not go (a host in maintenance, any host but a pinned
task's own), from the same mask that closes the hosts without a fluid
resource the task needs (:func:`vcsched.rules.allowed_matrix`; ``allowed``
overrides it, for the adaptation where a task may stay on a cordoned host it
runs on), and for a spread job ``j`` one row
per host, ``sum_{t in j} e[t, h] <= 1``.  Symmetry breaking then only groups
hosts that are also equal in maintenance and hold no pinned task (relabelling
them keeps every rule), and spread rows are themselves invariant under it.
(Required ``together`` jobs never get here: the registry contracts them to
one task, :func:`vcsched.rules.contract_together`.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from vcsched.model import Instance, SolveOptions
from vcsched.rules import allowed_matrix, spread_groups
from vcsched.solvers.algorithm import Placement, Placer
from vcsched.solvers.greedy import backtracking_placer
from vcsched.solvers.lpbound import lp_bound
from vcsched.solvers.search import mcb_placer
from vcsched.units import SOLVER_TOLERANCE, YIELD_TOLERANCE
from vcsched.yields import fits, placement_min_yield

if TYPE_CHECKING:  # scipy is imported where a model is built or solved: importing it costs ~0.4 s (see registry)
    from scipy.sparse import coo_array, csr_array

SYMMETRY_NONZERO_LIMIT = 200_000
# scipy's default relative gap is HiGHS's 1e-4, which would call a Y up to
# 0.01% short of the optimum "optimal"; the experiments compare heuristics to
# the optimum to 1e-6, so ask for (almost) zero gap.  HiGHS also stops at an
# *absolute* gap of 1e-6 that scipy does not expose; scaling the objective
# (maximize 1000 Y) turns that into 1e-9 on Y.
MIP_REL_GAP = 1e-9
OBJECTIVE_SCALE = 1e3
INCUMBENT_ATTEMPTS = 10_000


@dataclass(frozen=True)
class HighsModel:
    """A MILP ``min c x  s.t.  row_lower <= A x <= row_upper,  lower <= x <= upper`` over an instance's tasks and hosts.

    What :class:`MilpModel` and :class:`MakespanModel` share: the data HiGHS
    takes, and the task and host counts the ``e`` block is laid out by
    (``e[t, h]`` at ``t * H + h``).
    """

    instance: Instance
    c: np.ndarray
    a: csr_array
    row_lower: np.ndarray
    row_upper: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integrality: np.ndarray
    symmetry: str = "none"

    @property
    def n_tasks(self) -> int:
        return self.instance.n_tasks

    @property
    def n_hosts(self) -> int:
        return self.instance.n_hosts

    @property
    def n_vars(self) -> int:
        return len(self.c)


@dataclass(frozen=True)
class MilpModel(HighsModel):
    """The section-2.5 MILP.  Variable layout (``T`` tasks, ``H`` hosts, ``J`` jobs), use the index helpers:

    - ``e[t, h]`` at ``e_index(t, h) = t * H + h`` (binary unless relaxed),
    - ``x[t, h]`` at ``x_index(t, h) = T * H + t * H + h``,
    - ``a[j]``    at ``a_index(j) = 2 * T * H + j``,
    - ``Y``       at ``y_index = 2 * T * H + J``  (the objective is ``-OBJECTIVE_SCALE * Y``).

    To add constraints (e.g. the adaptation's migration budget), build the
    extra rows as a sparse matrix with ``n_vars`` columns and call
    :meth:`with_rows`; then :func:`solve_model` and :func:`placement_from`.
    """

    def e_index(self, t: int, h: int) -> int:
        return t * self.n_hosts + h

    def x_index(self, t: int, h: int) -> int:
        return self.n_tasks * self.n_hosts + t * self.n_hosts + h

    def a_index(self, j: int) -> int:
        return 2 * self.n_tasks * self.n_hosts + j

    @property
    def y_index(self) -> int:
        return 2 * self.n_tasks * self.n_hosts + self.instance.n_jobs

    def with_rows(self, rows: csr_array | coo_array, lower: np.ndarray, upper: np.ndarray) -> MilpModel:
        """A copy with ``lower <= rows @ vars <= upper`` appended (use ``-inf``/``inf`` for one-sided rows)."""
        from scipy.sparse import csr_array, vstack  # lazy: scipy costs ~0.4 s to import

        rows = csr_array(rows)
        if rows.shape[1] != self.n_vars:
            raise ValueError(f"extra rows have {rows.shape[1]} columns, the model has {self.n_vars} variables")
        return replace(
            self,
            a=csr_array(vstack([self.a, rows], format="csr")),
            row_lower=np.concatenate([self.row_lower, np.asarray(lower, dtype=float)]),
            row_upper=np.concatenate([self.row_upper, np.asarray(upper, dtype=float)]),
        )

    def relaxed(self) -> MilpModel:
        """The LP relaxation: every ``e`` continuous in [0, 1]."""
        return replace(self, integrality=np.zeros_like(self.integrality))


def identical_host_groups(instance: Instance) -> list[list[int]]:
    """Groups (of size >= 2) of host indices with equal capacities (CPU, memory, every other fluid resource).

    With placement rules, hosts must also be equal in maintenance and hold no pinned task.
    """
    groups: dict[tuple[object, ...], list[int]] = {}
    pinned_hosts = set(instance.task_pinned[instance.task_pinned >= 0].tolist()) if instance.has_rules else set()
    for h, host in enumerate(instance.hosts):
        if h in pinned_hosts:
            continue
        groups.setdefault((host.cpu, host.memory, host.capacity, host.maintenance), []).append(h)
    return [g for g in groups.values() if len(g) > 1]


def _close_pairs(instance: Instance, upper: np.ndarray, allowed: np.ndarray | None) -> None:
    """``e[t, h] <= 0`` (bounds on the ``e`` block at ``t * H + h``) where task ``t`` may not be on host ``h``.

    One mask for the rules and the resource vector (:func:`vcsched.rules.allowed_matrix`): a host in
    maintenance or another host than a pinned task's own, and a host with none of a fluid resource the
    task needs (it would run at yield 0 there; without the bound the MILP would call such a placement
    feasible).  ``allowed`` (tasks x hosts) replaces the mask, for the adaptation
    (:func:`vcsched.adaptation.problem.allowed_matrix`, which closes the same pairs by its own reading
    of maintenance).
    """
    if allowed is None and not (instance.has_rules or instance.has_extra_resources):
        return
    mask = allowed_matrix(instance) if allowed is None else np.asarray(allowed, dtype=bool)
    upper[: instance.n_tasks * instance.n_hosts][~mask.ravel()] = 0.0


def _spread_rows(instance: Instance, rows: _Rows) -> None:
    """For each spread job, one row per host on the ``e`` block: ``sum_{t in j} e[t, h] <= 1``."""
    if not instance.has_rules:
        return
    n_h = instance.n_hosts
    groups = spread_groups(instance)
    spread_tasks = np.flatnonzero(groups >= 0)
    if not len(spread_tasks):
        return
    ids = {g: i for i, g in enumerate(sorted(set(groups[spread_tasks].tolist())))}
    gi = np.array([ids[int(groups[t])] for t in spread_tasks], dtype=np.int64)
    r = np.repeat(gi * n_h, n_h) + np.tile(np.arange(n_h), len(spread_tasks))
    c = np.repeat(spread_tasks * n_h, n_h) + np.tile(np.arange(n_h), len(spread_tasks))
    n = len(ids) * n_h
    rows.add(r, c, np.ones(len(c)), n, np.full(n, -np.inf), np.ones(n))


class _Rows:
    """Sparse constraint rows collected block by block, with each row's bounds."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.n = 0

    def add(self, r: np.ndarray, c: np.ndarray, v: np.ndarray, n: int, lower: np.ndarray, upper: np.ndarray) -> None:
        """``n`` rows; ``r`` numbers them from 0 within the block."""
        self.rows.append(r + self.n)
        self.cols.append(c)
        self.vals.append(v)
        self.lo.append(lower)
        self.hi.append(upper)
        self.n += n

    def matrix(self, n_vars: int) -> csr_array:
        from scipy.sparse import coo_array, csr_array  # lazy: scipy costs ~0.4 s to import

        data = (np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols)))
        return csr_array(coo_array(data, shape=(self.n, n_vars)))


def _break_symmetry(instance: Instance, rows: _Rows, upper: np.ndarray) -> str:
    """Symmetry breaking for identical hosts (module docstring) on the ``e`` block at ``t * H + h``.

    Sets the variable bounds in ``upper`` and adds the rows when they are few
    enough; returns what was done: ``"rows"``, ``"bounds"`` or ``"none"``.
    """
    n_t, n_h = instance.n_tasks, instance.n_hosts
    groups = identical_host_groups(instance)
    nonzeros = sum(n_t * (n_t + 1) // 2 * (len(g) - 1) for g in groups)
    for g in groups:
        for k, h in enumerate(g):
            upper[np.arange(min(k, n_t)) * n_h + h] = 0.0  # task t < k cannot open the k-th host
    if not groups:
        return "none"
    if nonzeros > SYMMETRY_NONZERO_LIMIT:
        return "bounds"
    for g in groups:
        for k in range(1, len(g)):
            prev, cur = g[k - 1], g[k]
            # row for task t: e[t, cur] - sum_{t' < t} e[t', prev] <= 0
            r_idx = [np.array([t]) for t in range(n_t)]
            c_idx = [np.array([t * n_h + cur]) for t in range(n_t)]
            v_idx = [np.ones(1) for _ in range(n_t)]
            for t in range(n_t):
                r_idx.append(np.full(t, t))
                c_idx.append(np.arange(t) * n_h + prev)
                v_idx.append(-np.ones(t))
            rows.add(np.concatenate(r_idx), np.concatenate(c_idx), np.concatenate(v_idx), n_t,
                     np.full(n_t, -np.inf), np.zeros(n_t))
    return "rows"


def _placement_rows(instance: Instance, rows: _Rows) -> None:
    """The rows every formulation shares: each task on exactly one host, and host memory."""
    n_t, n_h = instance.n_tasks, instance.n_hosts
    n_th = n_t * n_h
    t_of = np.repeat(np.arange(n_t), n_h)  # task of each (t, h) pair, t-major
    h_of = np.tile(np.arange(n_h), n_t)
    e_col = np.arange(n_th)
    rows.add(t_of, e_col, np.ones(n_th), n_t, np.ones(n_t), np.ones(n_t))
    rows.add(h_of, e_col, instance.task_mem[t_of], n_h, np.full(n_h, -np.inf), instance.host_mem)


def _extra_fluid_rows(instance: Instance, rows: _Rows, first_col: int, per_task: np.ndarray,
                      z_col: int | None = None) -> None:
    """One row per host and extra fluid resource ``r`` (not CPU, whose rows each form writes its own way).

    ``sum_t per_task[t, r] v[t, h] <= C_hr`` over the ``(t, h)`` block of
    variables ``v`` starting at ``first_col`` (``t * H + h``), or
    ``<= C_hr Z`` when ``z_col`` names ``Z`` (the makespan form).
    """
    n_t, n_h = instance.n_tasks, instance.n_hosts
    t_of = np.repeat(np.arange(n_t), n_h)
    h_of = np.tile(np.arange(n_h), n_t)
    for r in range(1, len(instance.resources)):
        w = per_task[t_of, r]
        nz = np.flatnonzero(w > 0)
        cap = instance.host_capacity[:, r]
        if z_col is None:
            rows.add(h_of[nz], first_col + nz, w[nz], n_h, np.full(n_h, -np.inf), cap)
        else:
            rows.add(np.concatenate([h_of[nz], np.arange(n_h)]),
                     np.concatenate([first_col + nz, np.full(n_h, z_col)]),
                     np.concatenate([w[nz], -cap]), n_h, np.full(n_h, -np.inf), np.zeros(n_h))


def build_model(instance: Instance, *, symmetry_breaking: bool = True,
                allowed: np.ndarray | None = None) -> MilpModel:
    """The section-2.5 MILP of ``instance`` as a :class:`MilpModel` (see the module docstring).

    ``allowed`` (tasks x hosts): where each task may go, instead of what the instance's rules and
    resources say (:func:`_close_pairs`).
    """
    n_t, n_h, n_j = instance.n_tasks, instance.n_hosts, instance.n_jobs
    n_th = n_t * n_h
    n_vars = 2 * n_th + n_j + 1
    alpha_t = instance.task_alpha
    task_job = instance.task_job
    t_of = np.repeat(np.arange(n_t), n_h)  # task of each (t, h) pair, t-major
    h_of = np.tile(np.arange(n_h), n_t)
    e_col = np.arange(n_th)
    x_col = n_th + np.arange(n_th)
    a_col = 2 * n_th + np.arange(n_j)
    y_col = 2 * n_th + n_j

    rows = _Rows()
    # each task on exactly one host; host memory
    _placement_rows(instance, rows)
    # host CPU (linearized)
    rows.add(h_of, x_col, np.ones(n_th), n_h, np.full(n_h, -np.inf), instance.host_cpu)
    # x[t, h] <= alpha_t e[t, h]
    link = np.arange(n_th)
    rows.add(
        np.concatenate([link, link]),
        np.concatenate([x_col, e_col]),
        np.concatenate([np.ones(n_th), -alpha_t[t_of]]),
        n_th,
        np.full(n_th, -np.inf),
        np.zeros(n_th),
    )
    # sum_h x[t, h] = a[j(t)]
    rows.add(
        np.concatenate([t_of, np.arange(n_t)]),
        np.concatenate([x_col, a_col[task_job]]),
        np.concatenate([np.ones(n_th), -np.ones(n_t)]),
        n_t,
        np.zeros(n_t),
        np.zeros(n_t),
    )
    # alpha_j Y - a[j] <= 0
    rows.add(
        np.concatenate([np.arange(n_j), np.arange(n_j)]),
        np.concatenate([np.full(n_j, y_col), a_col]),
        np.concatenate([instance.job_alpha, -np.ones(n_j)]),
        n_j,
        np.full(n_j, -np.inf),
        np.zeros(n_j),
    )

    lower = np.zeros(n_vars)
    upper = np.concatenate([np.ones(n_th), alpha_t[t_of], instance.job_alpha, [1.0]])
    if instance.has_extra_resources:
        # sum_t x[t, h] need_jr / alpha_j <= C_hr: x = y_j alpha_j on the chosen host, so y_j need_jr there.
        with np.errstate(divide="ignore", invalid="ignore"):
            per_cpu = np.where(instance.job_alpha[:, None] > 0,
                               instance.job_need / instance.job_alpha[:, None], 0.0)[task_job]
        _extra_fluid_rows(instance, rows, n_th, per_cpu)
    _close_pairs(instance, upper, allowed)
    _spread_rows(instance, rows)
    symmetry = _break_symmetry(instance, rows, upper) if symmetry_breaking else "none"
    c = np.zeros(n_vars)
    c[y_col] = -OBJECTIVE_SCALE
    integrality = np.concatenate([np.ones(n_th), np.zeros(n_vars - n_th)]).astype(np.int64)
    return MilpModel(
        instance=instance,
        c=c,
        a=rows.matrix(n_vars),
        row_lower=np.concatenate(rows.lo),
        row_upper=np.concatenate(rows.hi),
        lower=lower,
        upper=upper,
        integrality=integrality,
        symmetry=symmetry,
    )


@dataclass(frozen=True)
class MilpSolution:
    """What HiGHS said.  ``status`` is scipy's: 0 optimal, 1 limit reached, 2 infeasible, 3 unbounded, 4 other.

    ``x`` is the best solution found (None when there is none); ``objective``
    is that solution's ``Y`` (read from ``x``, so it stays meaningful when a
    caller changes ``c``); ``optimal`` is True only when HiGHS proved it
    optimal; ``infeasible`` when it proved there is no solution at all.
    """

    status: int
    message: str
    x: np.ndarray | None
    objective: float | None
    optimal: bool
    infeasible: bool
    detail: dict[str, object] = field(default_factory=dict)


def scipy_milp(**kwargs: Any) -> Any:
    """``scipy.optimize.milp`` (HiGHS), imported on first use; a function of its own so that tests can stand in."""
    from scipy.optimize import milp  # lazy: scipy costs ~0.4 s to import

    return milp(**kwargs)


def _solve_highs(c: np.ndarray, a: csr_array, row_lower: np.ndarray, row_upper: np.ndarray, lower: np.ndarray,
                 upper: np.ndarray, integrality: np.ndarray, time_limit: float | None,
                 mip_rel_gap: float) -> tuple[Any, dict[str, object]]:
    """One HiGHS run: scipy's result, and the detail every caller reports.

    HiGHS may ``printf()`` a debug line on the process's stdout; the CLI, which owns the process's
    descriptors, keeps such lines off its own output (:func:`cli.app.stdout_for_vcsched_only`).
    """
    from scipy.optimize import Bounds, LinearConstraint  # lazy: scipy costs ~0.4 s to import

    opts: dict[str, object] = {"mip_rel_gap": mip_rel_gap}
    if time_limit is not None:
        opts["time_limit"] = float(time_limit)
    res = scipy_milp(
        c=c,
        constraints=LinearConstraint(a, row_lower, row_upper),
        bounds=Bounds(lower, upper),
        integrality=integrality,
        options=opts,
    )
    detail: dict[str, object] = {"status": res.message, "variables": len(c), "constraints": int(a.shape[0])}
    mip_gap = getattr(res, "mip_gap", None)
    if mip_gap is not None and np.isfinite(mip_gap):
        detail["mip_gap"] = float(mip_gap)
    nodes = getattr(res, "mip_node_count", None)
    if nodes is not None:
        detail["nodes"] = int(nodes)
    return res, detail


def solve_model(model: MilpModel, time_limit: float | None, *, mip_rel_gap: float = MIP_REL_GAP) -> MilpSolution:
    """Solve with HiGHS (``scipy.optimize.milp``); ``time_limit`` in seconds, None for no limit.

    The static MILP, its LP relaxation (RRND/RRNZ) and the adaptation MILP all solve here.
    """
    res, detail = _solve_highs(model.c, model.a, model.row_lower, model.row_upper, model.lower, model.upper,
                               model.integrality, time_limit, mip_rel_gap)
    detail["symmetry_breaking"] = model.symmetry
    bound = getattr(res, "mip_dual_bound", None)
    if bound is not None and np.isfinite(bound):
        detail["dual_bound"] = float(-bound / OBJECTIVE_SCALE)
    x = None if res.x is None else np.asarray(res.x, dtype=float)
    return MilpSolution(
        status=int(res.status),
        message=str(res.message),
        x=x,
        objective=None if x is None else float(x[model.y_index]),
        optimal=res.status == 0,
        infeasible=res.status == 2,
        detail=detail,
    )


# ---------------------------------------------------------------- the same problem in makespan form


@dataclass(frozen=True)
class MakespanModel(HighsModel):
    """The minimum-yield MILP in makespan form: ``e[t, h]`` binary at ``t * H + h``, then ``Z`` at :attr:`z_index`.

    With the placement fixed, the best common yield is
    ``min(1, min_h C_h / L_h)`` (:mod:`vcsched.yields`), ``L_h`` the CPU need
    placed on ``h``, so maximizing the minimum yield is minimizing
    ``Z = max_h L_h / C_h``::

        minimize Z  s.t.  sum_h e[t, h] = 1,  sum_t m_t e[t, h] <= M_h,  sum_t alpha_t e[t, h] - C_h Z <= 0

    and ``Y = min(1, 1 / Z)``.  That holds for parallel jobs too (a common
    ``Y`` does not care which host a task is on).  It is the section-2.5
    problem without the ``x``/``a`` linearization: ``T H + 1`` variables
    instead of ``2 T H + J + 1``, and a tighter relaxation.  Measured on 28
    twelve-task instances of the small set, each with the best heuristic's
    value as a cutoff: 8.4 s in all against 55 s for :func:`build_model`'s
    form.  :mod:`vcsched.solvers.anytime` uses it; ``milp`` keeps the
    paper's formulation (its experiments reproduce the paper's).
    """

    @property
    def z_index(self) -> int:
        return self.n_tasks * self.n_hosts


def build_makespan_model(instance: Instance, *, z_max: float | None = None,
                         symmetry_breaking: bool = True) -> MakespanModel:
    """The makespan form of ``instance`` (:class:`MakespanModel`); ``z_max`` bounds ``Z`` from above (a cutoff)."""
    n_t, n_h = instance.n_tasks, instance.n_hosts
    n_th = n_t * n_h
    n_vars = n_th + 1
    rows = _Rows()
    _placement_rows(instance, rows)
    # sum_t alpha_t e[t, h] - C_h Z <= 0
    t_of = np.repeat(np.arange(n_t), n_h)
    h_of = np.tile(np.arange(n_h), n_t)
    rows.add(np.concatenate([h_of, np.arange(n_h)]), np.concatenate([np.arange(n_th), np.full(n_h, n_th)]),
             np.concatenate([instance.task_alpha[t_of], -instance.host_cpu]), n_h,
             np.full(n_h, -np.inf), np.zeros(n_h))
    lower = np.zeros(n_vars)
    upper = np.ones(n_vars)
    upper[n_th] = np.inf if z_max is None else float(z_max)
    if instance.has_extra_resources:  # sum_t need_tr e[t, h] - C_hr Z <= 0 for every other fluid resource
        _extra_fluid_rows(instance, rows, 0, instance.job_need[instance.task_job], z_col=n_th)
    _close_pairs(instance, upper, None)
    _spread_rows(instance, rows)
    symmetry = _break_symmetry(instance, rows, upper) if symmetry_breaking else "none"
    c = np.zeros(n_vars)
    c[n_th] = OBJECTIVE_SCALE  # HiGHS's absolute gap of 1e-6 becomes 1e-9 on Z, as for build_model's Y
    integrality = np.concatenate([np.ones(n_th), [0]]).astype(np.int64)
    return MakespanModel(instance, c, rows.matrix(n_vars), np.concatenate(rows.lo), np.concatenate(rows.hi),
                         lower, upper, integrality, symmetry)


def _yield_of_makespan(z: float) -> float:
    return 1.0 if z <= 1.0 else 1.0 / z


def solve_makespan(model: MakespanModel, time_limit: float | None) -> MilpSolution:
    """Solve :class:`MakespanModel` with HiGHS; ``objective`` is the solution's ``Y = min(1, 1 / Z)``.

    ``detail["dual_bound"]`` is then an upper bound on the minimum yield
    (from HiGHS's lower bound on ``Z``), valid also when the time limit stopped it.
    """
    res, detail = _solve_highs(model.c, model.a, model.row_lower, model.row_upper, model.lower, model.upper,
                               model.integrality, time_limit, MIP_REL_GAP)
    detail["symmetry_breaking"] = model.symmetry
    bound = getattr(res, "mip_dual_bound", None)
    if bound is not None and np.isfinite(bound) and bound > 0:
        detail["dual_bound"] = _yield_of_makespan(float(bound / OBJECTIVE_SCALE))
    x = None if res.x is None else np.asarray(res.x, dtype=float)
    return MilpSolution(
        status=int(res.status),
        message=str(res.message),
        x=x,
        objective=None if x is None else _yield_of_makespan(float(x[model.z_index])),
        optimal=res.status == 0,
        infeasible=res.status == 2,
        detail=detail,
    )


def assignment_matrix(model: MilpModel | MakespanModel, x: np.ndarray) -> np.ndarray:
    """The ``e`` block of a solution as a (tasks x hosts) array."""
    return x[: model.n_tasks * model.n_hosts].reshape(model.n_tasks, model.n_hosts)


def placement_from(model: MilpModel | MakespanModel, x: np.ndarray) -> np.ndarray:
    """Host index of every task: the host with the largest ``e`` (1 in an integral solution)."""
    if model.n_tasks == 0:
        return np.empty(0, dtype=np.int64)
    return np.argmax(assignment_matrix(model, x), axis=1).astype(np.int64)


#: The heuristics whose best placement is the MILP's incumbent.
INCUMBENT_SOURCES: dict[str, Placer] = {"mcb8": mcb_placer("mcb8"), "sgb": backtracking_placer(True),
                                        "gb": backtracking_placer(False)}


def heuristic_incumbent(instance: Instance, options: SolveOptions) -> tuple[np.ndarray, float, str] | None:
    """The best placement of a few fast heuristics: ``(hosts, its min yield, algorithm)``, or None.

    MCB8 (section 3.2) and the backtracking greedies
    with a small attempt bound take milliseconds on the instances the MILP
    can solve, and their yield prunes much of the branch-and-bound tree.
    """
    quick = replace(options, max_attempts=min(options.max_attempts, INCUMBENT_ATTEMPTS))
    best: tuple[np.ndarray, float, str] | None = None
    for name, placer in INCUMBENT_SOURCES.items():
        hosts = placer(instance, quick).hosts
        if hosts is None or not fits(instance, hosts):
            continue
        y = placement_min_yield(instance, hosts)
        if best is None or y > best[1]:
            best = (np.asarray(hosts, dtype=np.int64), y, name)
    return best


def solve_exact(instance: Instance, options: SolveOptions) -> Placement:
    """Optimal placement by the MILP, with a heuristic incumbent as a cutoff.

    HiGHS through scipy takes no starting solution, so the incumbent enters
    as the bound ``Y >= y_heuristic - SOLVER_TOLERANCE`` (the slack keeps HiGHS's tolerances from cutting
    off the heuristic's own placement): it removes every part of
    the tree that cannot beat the heuristic, and since the heuristic's own
    placement satisfies it, the MILP's optimum is unchanged (measured: about
    half the CPU time at 4 hosts x 12 tasks).  If HiGHS stops without a
    solution of its own (time limit, or a numerical "infeasible" under the
    cutoff), the heuristic placement is returned with ``optimal=False``.
    Without an incumbent an "infeasible" answer is HiGHS's proof that no
    placement fits in memory.  When the incumbent already reaches the closed-form
    LP bound (section 3.1) it is optimal and HiGHS is not called at all.
    """
    if instance.n_tasks == 0:
        return Placement(hosts=np.empty(0, dtype=np.int64), optimal=True)
    started = time.perf_counter()
    incumbent = heuristic_incumbent(instance, options)
    bound = lp_bound(instance)
    if incumbent is not None and bound is not None and incumbent[1] >= bound - YIELD_TOLERANCE:
        # The heuristic reaches the LP relaxation's bound (section 3.1): nothing can beat it.
        detail: dict[str, object] = {
            "incumbent": {"algorithm": incumbent[2], "min_yield": incumbent[1]},
            "proof": "the incumbent reaches the LP bound; HiGHS not needed",
        }
        return Placement(hosts=incumbent[0], optimal=True, detail=detail)
    model = build_model(instance)
    if incumbent is not None:
        lower = model.lower.copy()
        lower[model.y_index] = max(0.0, incumbent[1] - SOLVER_TOLERANCE)
        model = replace(model, lower=lower)
    # The limit covers the whole call: what the heuristics used is taken off HiGHS's share.
    remaining = None if options.time_limit is None else max(0.0, options.time_limit - (time.perf_counter() - started))
    sol = solve_model(model, remaining)
    detail = dict(sol.detail)
    if incumbent is not None:
        detail["incumbent"] = {"algorithm": incumbent[2], "min_yield": incumbent[1]}
    hosts: np.ndarray | None = None
    if sol.x is not None:
        hosts = placement_from(model, sol.x)
        if not fits(instance, hosts):
            # HiGHS accepts integrality and rows to ~1e-6; a rounded solution could
            # then overcommit memory by that much.  Report it rather than hide it.
            detail["rejected"] = "solver solution overcommits memory after rounding (numerical tolerance)"
            hosts = None
    if hosts is not None:
        detail["objective"] = sol.objective
        if incumbent is not None and incumbent[1] > placement_min_yield(instance, hosts):
            hosts = incumbent[0]  # only within the solver's tolerances; keep the better placement
        return Placement(hosts=hosts, optimal=sol.optimal, detail=detail)
    if sol.infeasible and incumbent is None:
        detail["infeasible"] = "HiGHS proved that no placement fits " + (
            "on every resource (memory, and a host with each fluid resource a task needs)"
            if instance.has_extra_resources else "in memory")
        return Placement(hosts=None, optimal=True, detail=detail)
    detail["stopped"] = "no placement found within the time limit" if sol.status == 1 else sol.message
    if incumbent is not None:
        detail["stopped"] = f"{detail['stopped']}; returning the {incumbent[2]} incumbent"
        return Placement(hosts=incumbent[0], optimal=False, detail=detail)
    return Placement(hosts=None, optimal=False, detail=detail)

