"""Exact proportional fairness (and α-fair) at every event: projected Newton on the dual, warm-started.

The registry's ``pf`` builds a conic program with cvxpy and solves it with
Clarabel (tens of milliseconds); a simulation re-allocates at every arrival
and departure, hundreds of thousands of times, on problems that change by
one VC.  So here the same optimum is found from the *dual* (Bonald &
Roberts, "Enhanced Cluster Computing Performance through Proportional
Fairness", §2.4, KKT (3)–(5), and the dual gradient (9) of §3.1), by Newton's
method instead of their small gradient steps, from the previous event's
prices:

    max Σ_g m_g w_g U(y_g)   s.t.  Σ_g m_g a_gp y_g ≤ 1 (every pair p),  0 ≤ y_g ≤ 1

with ``a_gp = coef_gp / C_p`` and ``U = log`` (α = 1) or ``y^(1-α)/(1-α)``.  For
prices ``ν ≥ 0`` each group's best yield is ``y_g(ν) = min(1, (w_g / s_g)^(1/α))``,
``s_g = Σ_p a_gp ν_p``; the dual ``D(ν) = Σ_p ν_p + Σ_g m_g [w_g U(y_g) − s_g y_g]``
is convex and differentiable with gradient ``1 − load_p`` and Hessian
``Σ_g m_g (y_g / (α s_g)) a_g a_gᵀ`` over the groups below their cap.  Projected
Newton (Bertsekas) with an Armijo search along the projection arc minimises
it under ``ν ≥ 0``; it stops when every priced pair is within ``TOL`` of
capacity and no pair exceeds it by more, i.e. at a KKT point to machine
precision.  The yields are then scaled down by the largest load if it is
above 1, so capacities hold exactly.  :func:`solve` returns ``None`` when
Newton does not converge; the caller then falls back to the registry's
conic solver (the tests compare the two on random problems).
"""

from __future__ import annotations

import math

import numpy as np

from vcsched.simulate.rows import Groups

TOL = 1e-12  # on loads: a priced pair within TOL of capacity, no pair above 1 + TOL
MAX_ITER = 200


def best_yields(s: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """``min(1, (w / s)^(1/α))``; 1 where the price is at most the weight (cap binds)."""
    out = np.ones_like(s)
    under = s > w
    if alpha == 1.0:
        out[under] = w[under] / s[under]
    else:
        out[under] = (w[under] / s[under]) ** (1.0 / alpha)
    return out


def dual_value(nu: np.ndarray, s: np.ndarray, y: np.ndarray, m: np.ndarray, w: np.ndarray, alpha: float) -> float:
    u = np.log(y) if alpha == 1.0 else y ** (1 - alpha) / (1 - alpha)
    return float(nu.sum() + (m * (w * u - s * y)).sum())


def solve(groups: Groups, alpha: float = 1.0, warm: dict[int, float] | None = None,
          stats: dict[str, int] | None = None) -> tuple[list[float], dict[int, float]] | None:
    """Yields of the groups and the prices per pair, or None if Newton did not converge.

    ``warm``: prices of an earlier solve (pairs absent start at 0); ``stats["newton"]`` counts iterations.
    """
    n = groups.n
    cap = groups.capacity
    y_out = [0.0] * n
    # A group needing a pair of capacity 0 can only have yield 0: pinned, and out of the problem.
    live = [g for g in range(n) if all(cap[p] > 0 or c <= 0 for p, c in groups.entries[g])]
    if not live:
        return y_out, {}
    a = np.zeros((len(live), len(groups.pairs)))
    for i, g in enumerate(live):
        for p, c in groups.entries[g]:
            if c > 0:
                a[i, p] = c / cap[p]
    keep = a.any(axis=0)
    a = a[:, keep]
    pairs = [groups.pairs[i] for i in np.flatnonzero(keep).tolist()]
    m = np.array([groups.mult[g] for g in live], dtype=float)
    w = np.array([groups.weight[g] for g in live], dtype=float)
    ma = a * m[:, None]
    n_p = len(pairs)
    nu = np.array([max(0.0, warm.get(p, 0.0)) for p in pairs]) if warm else np.zeros(n_p)
    if n_p and not nu.any():  # cold start: prices that make the loads about 1 if one pair bound every group
        nu = np.full(n_p, float(np.sum(m * w)) / n_p)
    s = a @ nu
    y = best_yields(s, w, alpha)
    value = dual_value(nu, s, y, m, w, alpha)
    for it in range(MAX_ITER):
        if stats is not None:
            stats["newton"] = stats.get("newton", 0) + (it > 0)
        load = y @ ma
        grad = 1.0 - load
        at_bound = (nu <= 0.0) & (grad > 0)
        if (np.abs(grad[~at_bound]) <= TOL).all() and (load <= 1 + TOL).all():
            break
        free = ~at_bound
        under = s > w
        curv = np.zeros(len(live))
        curv[under] = m[under] * y[under] / (alpha * s[under])
        af = a[:, free]
        h = (af * curv[:, None]).T @ af
        gf = grad[free]
        # Levenberg-Marquardt damping, proportional to the gradient: the Hessian is singular when fewer groups
        # than priced pairs are below their cap (the prices are then not unique), and a pair that only capped
        # groups use has no curvature at all.  The damping vanishes at the optimum: Newton's fast convergence.
        scale = max(float(h.diagonal().max(initial=0.0)), 1e-12)
        mu = scale * min(1.0, float(np.abs(gf).max(initial=0.0)))
        h.flat[:: len(h) + 1] += mu + 1e-13 * scale  # the diagonal (the method calls: tiny arrays, every event)
        d = np.zeros(n_p)
        try:
            d[free] = -np.linalg.solve(h, gf)
        except np.linalg.LinAlgError:  # pragma: no cover - the damping keeps it definite
            d[free] = -np.linalg.lstsq(h, gf, rcond=None)[0]
        d[at_bound] = -nu[at_bound]
        step = 1.0
        accepted = False
        for _ls in range(60):
            cand = np.maximum(nu + step * d, 0.0)
            s_c = a @ cand
            y_c = best_yields(s_c, w, alpha)
            v_c = dual_value(cand, s_c, y_c, m, w, alpha)
            if v_c <= value + 1e-4 * float(grad @ (cand - nu)) + 1e-15 * max(1.0, abs(value)):
                accepted = True
                break
            step *= 0.5
        if not accepted:
            return None
        moved = float(np.max(np.abs(cand - nu))) if n_p else 0.0
        nu, s, y, value = cand, s_c, y_c, v_c
        if moved <= 1e-300:  # pragma: no cover - stuck
            return None
    else:
        return None
    load = y @ ma
    top = float(load.max()) if n_p else 0.0
    if top > 1.0:
        y = y / top
    for i, g in enumerate(live):
        y_out[g] = float(y[i])
    prices = {p: float(v) for p, v in zip(pairs, nu, strict=True) if v > 0}
    if not all(math.isfinite(v) for v in y_out):  # pragma: no cover
        return None
    return y_out, prices
