"""``pf`` and ``alpha-fair``: utility-based sharing, solved as conic programs (cvxpy + Clarabel).

Proportional fairness (Bonald & Roberts, "Enhanced Cluster Computing
Performance through Proportional Fairness", §2.4) maximises
``sum_j w_j log y_j``; the alpha-fair family (their §2.5, in the
Mo–Walrand form) maximises ``sum_j w_j U_alpha(y_j)`` with
``U_alpha(y) = y^(1-alpha) / (1-alpha)`` (``log`` at ``alpha = 1``): alpha -> 1
is PF, alpha -> infinity the max-min of the yields.  Both run under every
(host, resource) capacity and ``y <= 1``, on a fixed placement.

**CEEI is PF with equal weights.**  The DRF notes ("Dominant Resource
Fairness: Fair Allocation of Multiple Resource Types") define CEEI as
``max prod_j s_j``, with ``s_j = y_j D_j``; its log is ``sum_j log y_j`` plus
a constant, so it has PF's maximiser (docs/policies.md).  PF is the same
whether shares are counted in tasks, VMs or yield (scale invariance), so
it needs no choice between cluster and pool shares.

KKT (BR eq. 3–5 with the caps): ``w_j U'(y_j) = sum_p a_jp nu_p + eta_j``
where ``a_jp = n_jh need_jr / C_hr`` is the *normalised* row of pair p (so
``nu`` is BR's price per unit of capacity) and ``eta_j >= 0`` prices the cap
``y_j <= 1``.  The result's details hold ``nu`` per pair, ``eta`` per job,
the KKT residuals and the duality gap computed from those duals — so a
caller can check optimality without trusting the solver.  A job with a VM
on a pair of capacity 0 that it needs can only have yield 0; it is left
out of the objective (its log would be minus infinity).

cvxpy is imported only when one of these policies runs.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from vcsched.constraints import capacities
from vcsched.errors import VcschedError
from vcsched.model import Instance
from vcsched.policies.allocation import PolicyOptions, PolicyResult
from vcsched.units import FIT_TOLERANCE, SATURATION_TOLERANCE

if TYPE_CHECKING:  # scipy is loaded by the code that runs it: registering the policy must not cost ~0.4 s
    from scipy.sparse import csr_matrix

# Tighter than Clarabel's defaults (1e-8): the tests compare with the papers' fractions to 1e-6.
CLARABEL_SETTINGS = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10, "tol_ktratio": 1e-8}
# Clarabel sometimes stops with a numerical error at those tolerances on large placements (seen on the
# policies experiment's 64-host instances, where many jobs sit at y = 1); its own defaults then succeed, and
# the polish below brings the answer to machine precision, checked by the KKT residuals either way.
CLARABEL_FALLBACK: dict[str, float] = {}


class SolverError(VcschedError):
    """The conic solver did not return an optimal solution."""


def utility(y: np.ndarray, alpha: float) -> np.ndarray:
    """``U_alpha(y)``: ``log y`` at alpha 1, else ``y^(1-alpha) / (1-alpha)``."""
    with np.errstate(divide="ignore"):
        return np.log(y) if alpha == 1 else y ** (1 - alpha) / (1 - alpha)


def marginal(y: np.ndarray, alpha: float) -> np.ndarray:
    """``U_alpha'(y) = y^-alpha``."""
    with np.errstate(divide="ignore"):
        return y ** (-alpha)


def kkt_report(rows: Any, weights: np.ndarray, alpha: float, y: np.ndarray, nu: np.ndarray,
               eta: np.ndarray) -> dict[str, float]:
    """Residuals of the KKT conditions and the duality gap of ``max sum w U(y)``, ``rows @ y <= 1``, ``y <= 1``.

    ``stationarity``: max over jobs of ``|w U'(y) - rows^T nu - eta| / (w U'(y))``;
    ``complementarity``: max of ``nu_p (1 - load_p)`` and ``eta_j (1 - y_j)``, relative to
    the largest marginal utility ``w U'(y)`` (prices grow like ``y^-alpha``);
    ``infeasibility``: max violation of ``load <= 1``, ``0 <= y <= 1``;
    ``duality_gap``: dual function at (nu, eta) minus the objective, relative
    to ``max(1, |objective|)``; it bounds how far the objective is from optimal.
    """
    price = np.asarray(rows.T @ nu).ravel() + eta
    grad = weights * marginal(y, alpha)
    load = np.asarray(rows @ y).ravel()
    primal = float(np.sum(weights * utility(y, alpha)))
    with np.errstate(divide="ignore", invalid="ignore"):
        best = (weights / price) ** (1 / alpha)  # the y maximising w U(y) - price y
        dual = float(np.sum(weights * utility(best, alpha) - price * best) + nu.sum() + eta.sum())
    return {
        "stationarity": float(np.max(np.abs(grad - price) / grad)) if len(y) else 0.0,
        "complementarity": float(max(np.max(nu * (1 - load), initial=0.0), np.max(eta * (1 - y), initial=0.0))
                                 / max(1.0, float(np.max(grad, initial=0.0)))),
        "infeasibility": float(max(np.max(load - 1, initial=0.0), np.max(y - 1, initial=0.0),
                                   np.max(-y, initial=0.0))),
        "duality_gap": (dual - primal) / max(1.0, abs(primal)),
    }


ACTIVE_TOL = 1e-6  # slack (in capacity fractions) below which a row is taken as binding when polishing
DENSE_POLISH_ENTRIES = 250_000  # binding rows x free jobs up to which the polish works in dense arrays (2 MB)


def _proportional_duplicates(b: csr_matrix) -> np.ndarray:
    """Rows that are a positive multiple of an earlier row (same jobs, same ratios): redundant equalities."""
    seen: dict[tuple[tuple[int, ...], tuple[float, ...]], int] = {}
    dup = np.zeros(b.shape[0], dtype=bool)
    for i in range(b.shape[0]):
        lo, hi = b.indptr[i], b.indptr[i + 1]
        if hi == lo:
            continue
        vals = b.data[lo:hi]
        key = (tuple(b.indices[lo:hi].tolist()), tuple(np.round(vals / vals.max(), 12).tolist()))
        dup[i] = key in seen
        seen.setdefault(key, i)
    return dup


def polish(rows: csr_matrix, w: np.ndarray, alpha: float, scale: float,
           y0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Newton on the active set: the interior-point answer made exact, or None when it cannot be.

    Interior point converges slowly where strict complementarity fails (a
    binding row whose price is 0, as in BR's Prop. 5 lie, where the error is
    ~1e-6 even at tight tolerances).  Here the rows within ``ACTIVE_TOL`` of
    capacity become equalities and the yields within it of 1 are fixed at 1;
    a few Newton steps on ``max sum w U(y)`` s.t. those equalities (a
    diagonal Hessian, so one sparse solve of ``B D^-1 B^T`` per step) give the
    optimum to machine precision *if* the active set was right.  That is
    checked, not assumed: prices must come out >= 0, the other rows and caps
    must hold, and stationarity must be ~1e-12; otherwise None.
    Works in units of ``scale`` (``y / scale``) for conditioning at large alpha.
    """
    from scipy.sparse import diags  # lazy: scipy costs ~0.4 s to import
    from scipy.sparse.linalg import spsolve  # lazy: scipy costs ~0.4 s to import

    load = np.asarray(rows @ y0).ravel()
    active = np.flatnonzero(load >= 1 - ACTIVE_TOL)
    capped = y0 >= 1 - ACTIVE_TOL
    free = np.flatnonzero(~capped)
    b_all = rows[active]
    b = b_all[:, free].tocsr()
    useful = np.diff(b.indptr) > 0  # a binding row over capped jobs only holds by itself
    useful &= ~_proportional_duplicates(b)  # e.g. a host's CPU and disk rows over one job: one of them suffices
    active, b_all, b = active[useful], b_all[useful], b[useful]
    if len(active) == 0 or len(free) == 0:
        if len(free):
            return None  # a job below its cap on no binding row: the interior-point answer was not near optimal
        # Every job at its cap: prices 0 on the rows and eta = w is a KKT point (the rows are not what limits).
        return np.ones_like(y0), np.zeros(rows.shape[0]), w.astype(float).copy()
    rhs = 1 - np.asarray(b_all[:, np.flatnonzero(capped)] @ np.ones(int(capped.sum()))).ravel()
    x = y0[free] / scale
    wf = w[free]
    bs = (b * scale).tocsr()  # rows in scaled units: bs @ x = b @ y
    # The same Newton steps in dense arrays when they are small: scipy.sparse costs ~50 us an operation whatever
    # the size, 1.3 ms a step here, where numpy takes 20 us on the binding rows of a few hosts.
    dense = bs.shape[0] * bs.shape[1] <= DENSE_POLISH_ENTRIES
    bd = bs.toarray() if dense else None
    nu = np.zeros(len(active))
    for _ in range(30):
        grad = wf * x ** (-alpha)  # marginal utility in scaled units (a positive multiple of the true one)
        d_inv = x ** (alpha + 1) / (alpha * wf)  # inverse of the (diagonal) curvature
        # Binding rows may be dependent (a host whose CPU and disk rows bind over the same jobs): a tiny
        # ridge keeps the solve defined; the Newton iterations absorb the error it makes.
        if bd is not None:
            resid = bd @ x - rhs
            md = (bd * d_inv) @ bd.T
            md[np.diag_indices_from(md)] *= 1 + 1e-14
            try:
                nu = np.linalg.solve(md, bd @ (d_inv * grad) + resid)
            except np.linalg.LinAlgError:
                return None
        else:
            resid = np.asarray(bs @ x).ravel() - rhs
            m = (bs @ diags(d_inv) @ bs.T).tocsc()
            m = m + diags(1e-14 * m.diagonal())
            try:
                nu = np.atleast_1d(spsolve(m, np.asarray(bs @ (d_inv * grad)).ravel() + resid))
            except (RuntimeError, ValueError):
                return None
        if not np.all(np.isfinite(nu)):
            return None
        dx = d_inv * (grad - (bd.T @ nu if bd is not None else np.asarray(bs.T @ nu).ravel()))
        step = 1.0
        neg = dx < 0
        if neg.any():
            step = min(1.0, 0.99 * float(np.min(-x[neg] / dx[neg])))
        x = x + step * dx
        if np.max(np.abs(dx)) <= 1e-15 * max(1.0, float(np.max(x))) and np.max(np.abs(resid)) <= 1e-15:
            break
    y = np.ones_like(y0)  # the capped ones sit at exactly 1, as the equalities assumed
    y[free] = x * scale
    # w U'(y) = grad / scale^alpha and bs = b * scale, so nu = nu_scaled / scale^(alpha - 1)
    factor = scale ** (alpha - 1)
    nu_full = np.zeros(rows.shape[0])
    nu_full[active] = nu / factor
    if not (np.all(np.asarray(rows @ y).ravel() <= 1 + FIT_TOLERANCE) and np.all((y > 0) & (y <= 1 + FIT_TOLERANCE))):
        return None
    y = np.minimum(y, 1.0)
    eta = np.zeros(len(y))
    if capped.any():
        eta[capped] = w[capped] - np.asarray(rows[:, np.flatnonzero(capped)].T @ nu_full).ravel()
    if not (np.all(nu_full >= -1e-9 * max(1.0, float(np.max(np.abs(nu_full)))))
            and np.all(eta >= -1e-9 * max(1.0, float(np.max(w))))):
        # The yields are right but the prices of dependent binding rows were split wrongly (e.g. one
        # free job binding two hosts' rows, each also holding capped jobs): pick valid ones by an LP.
        prices = _prices_by_lp(rows, w, alpha, y, capped)
        if prices is None:
            return None
        nu_full, eta = prices
    nu_full, eta = np.maximum(nu_full, 0.0), np.maximum(eta, 0.0)
    if kkt_report(rows, w, alpha, y, nu_full, eta)["stationarity"] > 1e-9:
        return None
    return y, nu_full, eta


def _prices_by_lp(rows: csr_matrix, w: np.ndarray, alpha: float, y: np.ndarray,
                  capped: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """KKT prices for known optimal yields: nu >= 0 on the binding rows with ``rows^T nu = w U'(y)`` for the
    jobs below their cap and ``<=`` for the capped ones (their eta takes the rest).  An LP (HiGHS), then
    a least-squares solve on the rows it priced, to bring the equalities to machine precision."""
    from scipy.optimize import linprog  # lazy: scipy costs ~0.4 s to import
    from scipy.sparse.linalg import lsqr  # lazy: scipy costs ~0.4 s to import

    tight = np.flatnonzero(np.asarray(rows @ y).ravel() >= 1 - SATURATION_TOLERANCE)
    free = np.flatnonzero(~capped)
    grad = w * marginal(y, alpha)
    top = float(grad.max())
    a_eq = rows[tight][:, free].T.tocsr()
    a_ub = rows[tight][:, np.flatnonzero(capped)].T.tocsr()
    res = linprog(np.ones(len(tight)), A_eq=a_eq, b_eq=grad[free] / top,
                  A_ub=a_ub if capped.any() else None, b_ub=grad[capped] / top if capped.any() else None,
                  bounds=(0, None), method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    if res.status != 0:
        return None
    priced = np.flatnonzero(res.x > 1e-12)
    nu_t = np.zeros(len(tight))
    nu_t[priced] = lsqr(a_eq[:, priced], grad[free] / top, atol=1e-15, btol=1e-15)[0] if len(priced) else []
    nu = np.zeros(rows.shape[0])
    nu[tight] = nu_t * top
    eta = np.zeros(len(y))
    eta[capped] = grad[capped] - np.asarray(rows[:, np.flatnonzero(capped)].T @ nu).ravel()
    if np.any(nu < -1e-12 * top) or np.any(eta < -1e-9 * top):
        return None
    return nu, eta


def utility_allocation(instance: Instance, hosts: np.ndarray, alpha: float) -> PolicyResult:
    import cvxpy as cp  # heavy; only when a conic policy runs
    from scipy.sparse import diags  # lazy: scipy costs ~0.4 s to import

    caps = capacities(instance, hosts)
    n = instance.n_jobs
    zero_rows = caps.capacity <= 0
    pinned = np.zeros(n, dtype=bool)
    if zero_rows.any():
        pinned[caps.matrix[zero_rows].indices] = True
    free = np.flatnonzero(~pinned)
    y = np.zeros(n)
    detail: dict[str, object] = {"alpha": alpha,
                                 "pinned_at_zero": [instance.jobs[j].name for j in np.flatnonzero(pinned)]}
    if len(free) == 0:  # nothing to optimise: every job is pinned at 0
        detail.update({"status": "trivial", "solver": None, "polished": False, "feasibility_repair": 1.0,
                       "kkt": {"stationarity": 0.0, "complementarity": 0.0, "infeasibility": 0.0,
                               "duality_gap": 0.0}, "nu": {}, "eta": {}})
        return PolicyResult(y, detail)
    keep = ~zero_rows
    rows = (diags(1.0 / caps.capacity[keep]) @ caps.matrix[keep][:, free]).tocsr()  # a_jp, normalised rows
    rows_nz = np.diff(rows.indptr) > 0
    rows = rows[rows_nz]
    w = instance.job_weight[free]
    # Scale for conditioning: y / s with s the max-min yield (the first water-filling level,
    # min(1, min_p 1 / load_p at y = 1)), so the powers stay near 1 for any alpha.
    full = np.asarray(rows @ np.ones(len(free))).ravel()
    s = float(min(1.0, 1.0 / full.max())) if len(full) and full.max() > 0 else 1.0
    x = cp.Variable(len(free), pos=True)

    def problem(a: csr_matrix) -> tuple[Any, list[Any], float]:
        cons = [a @ x <= 1, x <= 1]
        if alpha == 1:
            return cp.Problem(cp.Maximize(w @ cp.log(x)), cons), cons, 1.0
        if alpha < 1:
            return (cp.Problem(cp.Maximize(w @ cp.power(x / s, 1 - alpha, approx=False)), cons), cons,
                    (1 - alpha) * s ** (alpha - 1))
        return (cp.Problem(cp.Minimize(w @ cp.power(x / s, 1 - alpha, approx=False)), cons), cons,
                (alpha - 1) * s ** (alpha - 1))

    # Clarabel sometimes stops with a numerical error on placements with many identical rows (a job's VMs on
    # several hosts of equal load: seen on the policies experiment's 64-host instances).  Then the identical
    # rows are merged (their price goes to the first of them, which satisfies the same KKT conditions), and
    # last Clarabel's own tolerances are tried; the polish below restores machine precision either way.
    first_of = unique_rows(rows)
    merged = rows[np.unique(first_of)]
    attempts = [(rows, CLARABEL_SETTINGS), (merged, CLARABEL_SETTINGS), (merged, CLARABEL_FALLBACK)]
    for attempt, (a, settings) in enumerate(attempts):
        prob, cons, k = problem(a)
        try:
            with warnings.catch_warnings():  # "optimal_inaccurate" is reported in the details and polished below
                warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                prob.solve(solver=cp.CLARABEL, **settings)
            break
        except cp.error.SolverError as exc:  # solver failure is reported, not hidden
            if attempt == len(attempts) - 1:
                raise SolverError(f"policy alpha-fair (alpha={alpha}): Clarabel failed: {exc}") from None
    retried = attempt > 0
    if prob.status not in ("optimal", "optimal_inaccurate") or x.value is None:
        raise SolverError(f"policy alpha-fair (alpha={alpha}): Clarabel returned {prob.status!r}")
    yf = np.clip(np.asarray(x.value, dtype=float), 0.0, 1.0)
    nu = np.maximum(np.asarray(cons[0].dual_value, dtype=float).ravel(), 0.0) / k
    if retried:  # prices of the merged rows, each on the first of its identical rows
        full_nu = np.zeros(rows.shape[0])
        full_nu[np.unique(first_of)] = nu
        nu = full_nu
    eta = np.maximum(np.asarray(cons[1].dual_value, dtype=float).ravel(), 0.0) / k
    polished = polish(rows, w, alpha, s, yf)
    if polished is not None:
        yf, nu, eta = polished
    # Interior-point answers sit a hair outside the rows; scale back so every row holds exactly.
    load = np.asarray(rows @ yf).ravel()
    repair = float(min(1.0, 1.0 / load.max())) if len(load) and load.max() > 0 else 1.0
    yf = yf * repair
    y[free] = yf
    pair_ids = np.flatnonzero(keep)[rows_nz]
    detail.update({
        "status": prob.status,
        "solver": "CLARABEL",
        "rows_merged": retried,
        "polished": polished is not None,
        "feasibility_repair": repair,
        "kkt": kkt_report(rows, w, alpha, yf, nu, eta),
        "nu": {caps.pair_name(instance, int(p)): float(v) for p, v in zip(pair_ids, nu, strict=True) if v > 1e-9},
        "eta": {instance.jobs[int(j)].name: float(v) for j, v in zip(free, eta, strict=True) if v > 1e-9},
    })
    return PolicyResult(y, detail)


def unique_rows(rows: csr_matrix) -> np.ndarray:
    """For each row, the index of the first row identical to it (itself when it is the first)."""
    seen: dict[tuple[tuple[int, ...], tuple[float, ...]], int] = {}
    out = np.empty(rows.shape[0], dtype=np.int64)
    for i in range(rows.shape[0]):
        lo, hi = rows.indptr[i], rows.indptr[i + 1]
        key = (tuple(rows.indices[lo:hi].tolist()), tuple(rows.data[lo:hi].tolist()))
        out[i] = seen.setdefault(key, i)
    return out


def pf(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    return utility_allocation(instance, hosts, 1.0)


def alpha_fair(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    assert options.alpha is not None  # the registry checked it
    return utility_allocation(instance, hosts, float(options.alpha))
