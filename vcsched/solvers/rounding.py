"""Randomized rounding of the MILP's LP relaxation: RRND and RRNZ (paper section 3.2).

We solve the relaxation of the section-2.5 MILP itself (same rows as
:mod:`vcsched.solvers.milp`, ``e`` continuous in [0, 1]) with HiGHS, not the closed
form of :mod:`vcsched.solvers.lpbound`: the closed form spreads every task evenly
over all hosts, which would make the rounding a uniform random placement.
HiGHS returns a vertex of the relaxation, whose ``e`` rows are mostly
concentrated on one or two hosts.  Symmetry-breaking rows are left out: they
would tilt the probabilities toward low host indices.

Then, task by task in the given order (a parallel job's tasks each have
their own ``e`` row, section 5), a host is drawn with probability
proportional to ``e[t, h]``; if the task's memory does not fit there, that
host's probability is zeroed, the rest renormalized, and the draw repeated.
The placement fails when no host is left.  RRNZ first replaces every zero
``e[t, h]`` by ``epsilon = 0.01`` so that every host stays possible, which
rescues tasks whose LP hosts filled up.

On the resource vector (extra fluid resources, docs/policies.md) the
relaxation has the MILP's rows for every resource.  Placement rules
(docs/rules.md): the relaxation has ``e[t, h] = 0`` where a rule forbids the
host (maintenance, pins).  A host a task may not use, for a rule or for lack
of a fluid resource it needs (it would run at yield 0 there), is never drawn:
one mask, :func:`vcsched.rules.allowed_matrix`, RRNZ's epsilon included.  A
draw that would put a second task of a spread job on one host is rejected
like one without memory.

The draws use ``numpy.random.default_rng(options.seed)``: one seed, one
placement.  ``options.time_limit`` bounds the LP solve.
"""

from __future__ import annotations

import numpy as np

from vcsched.model import Instance, SolveOptions
from vcsched.rules import allowed_matrix, spread_groups
from vcsched.solvers.algorithm import Placement, Placer
from vcsched.solvers.milp import assignment_matrix, build_model, solve_model
from vcsched.units import MEMORY_TOLERANCE

EPSILON = 0.01
# HiGHS returns values like 1e-12 for variables at zero; treat those as zero.
ZERO = 1e-9


def relaxation_probabilities(
    instance: Instance, time_limit: float | None
) -> tuple[np.ndarray | None, dict[str, object]]:
    """The ``e`` block (tasks x hosts) of an optimal LP relaxation, or None with the reason in the detail."""
    model = build_model(instance, symmetry_breaking=False).relaxed()
    sol = solve_model(model, time_limit)
    detail: dict[str, object] = {
        "lp_status": sol.message,
        "lp_variables": sol.detail["variables"],
        "lp_constraints": sol.detail["constraints"],
    }
    if sol.infeasible:
        detail["stopped"] = "the LP relaxation is infeasible: total memory does not fit"
        return None, detail
    if not sol.optimal or sol.x is None:
        detail["stopped"] = "LP relaxation not solved" + (" within the time limit" if sol.status == 1 else "")
        return None, detail
    detail["lp_objective"] = sol.objective
    e = np.clip(assignment_matrix(model, sol.x), 0.0, 1.0)
    e[e < ZERO] = 0.0
    return e, detail


def round_randomly(
    instance: Instance, e: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray | None, int]:
    """Draw a host for every task from its row of ``e``, skipping hosts without memory or closed to it.

    Returns ``(hosts or None, number of draws rejected for lack of memory)``.
    """
    free = (instance.host_mem + MEMORY_TOLERANCE).copy()
    mem = instance.task_mem
    closed = ~allowed_matrix(instance) if instance.has_rules or instance.has_extra_resources else None
    hosts = np.empty(instance.n_tasks, dtype=np.int64)
    rejected = 0
    groups = spread_groups(instance)
    on: dict[int, set[int]] = {}
    for t in range(instance.n_tasks):
        p = e[t].copy()
        if closed is not None:  # rules and fluid resources (RRNZ's epsilon included)
            p[closed[t]] = 0.0
        if groups[t] >= 0:
            p[list(on.get(int(groups[t]), ()))] = 0.0
        while True:
            total = p.sum()
            if total <= 0.0:
                return None, rejected
            cum = np.cumsum(p)
            h = int(np.searchsorted(cum, rng.random() * total, side="right"))
            h = min(h, len(p) - 1)
            if p[h] > 0.0 and free[h] >= mem[t]:
                break
            if p[h] > 0.0:
                rejected += 1
            p[h] = 0.0
        hosts[t] = h
        free[h] -= mem[t]
        if groups[t] >= 0:
            on.setdefault(int(groups[t]), set()).add(h)
    return hosts, rejected


def rounding_placer(epsilon: float | None) -> Placer:
    """RRND (``epsilon`` None) or RRNZ (zero LP values raised to ``epsilon``) as a registry placer."""
    def place(instance: Instance, options: SolveOptions) -> Placement:
        if instance.n_tasks == 0:
            return Placement(hosts=np.empty(0, dtype=np.int64))
        e, detail = relaxation_probabilities(instance, options.time_limit)
        if e is None:
            return Placement(hosts=None, detail=detail)
        if epsilon is not None:
            e = np.where(e > 0.0, e, epsilon)
        hosts, rejected = round_randomly(instance, e, np.random.default_rng(options.seed))
        detail["rejected_draws"] = rejected
        detail["seed"] = options.seed
        if hosts is None:
            detail["stopped"] = "a task found no host with memory left among its LP hosts"
        return Placement(hosts=hosts, detail=detail)

    return place

