"""The binary search on the minimum yield ``Y`` (paper section 3.4), written once.

Every placement that works by "fix ``Y``, then try to place" searches ``Y``
the same way: MCB's search over ``(0, Y_LP]`` or a fill level (:func:`vcsched.solvers.search.search`),
the adaptation heuristic's packing into residual capacity
(:func:`vcsched.adaptation.heuristic.pack_residual`) and admission's placement of
a request around pinned VMs (:func:`vcsched.control.admission.admit`).  They
share one predicate (:func:`vcsched.solvers.search.residual_probe`) and differ
only in the ends (and whether they are probed) and the precision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class YieldSearch(Generic[T]):
    """The outcome of :func:`bisect_yield`."""

    found: T | None  # what the predicate returned for the highest successful probe; None if none succeeded
    y: float | None  # that probe's yield (the placement's own minimum yield can be higher)
    probes: int  # how many times the predicate ran (at least 1)
    gap: float  # upper - lower at the stop: below the precision after bisecting, 0 after a successful upper probe


def bisect_yield(
    feasible: Callable[[float], T | None],
    lower: float,
    upper: float,
    precision: float,
    *,
    probe_upper: bool = False,
    probe_lower: bool = False,
) -> YieldSearch[T]:
    """Binary search for the highest ``y`` in ``[lower, upper]`` at which ``feasible(y)`` returns a placement.

    Contract:

    * ``feasible(y)`` returns a placement that reaches yield ``y``, or None.  It
      is assumed monotone (a placement at ``y`` means one at every lower
      ``y``); the heuristics used as predicates are not strictly so, and then
      the result is a successful probe, not necessarily the highest one.
    * The ends are probed only when asked, in this order.  ``probe_upper``:
      ``upper`` first, and when it succeeds the search stops there (nothing
      binds).  ``probe_lower``: then ``lower``, and when it fails the search
      stops with nothing found (by monotonicity nothing above succeeds either);
      when it succeeds it is the best so far.  Otherwise an end is a limit,
      never a probe (``lower = 0``: a yield of 0 is no placement).
    * Then each probe is the midpoint ``(lower + upper) / 2`` of the current
      interval (without end probes and with ``lower = 0`` the first probe is
      ``upper / 2``: section 3.4's first probe ``Y_LP / 2``); success raises
      ``lower`` to it, failure lowers ``upper`` to it; the search goes on while
      ``upper - lower >= precision``.
    * There is always at least one probe, even when ``upper - lower`` starts
      below the precision: an interval that small is no proof of infeasibility.

    Returns the highest successful probe and what ``feasible`` returned there,
    the number of probes and the final interval width (0 after a successful
    ``upper`` probe).
    """
    if not precision > 0.0:
        raise ValueError(f"precision {precision!r} must be above 0")
    lo, hi = lower, upper
    best: T | None = None
    best_y: float | None = None
    probes = 0
    if probe_upper:
        probes += 1
        best = feasible(hi)
        if best is not None:
            return YieldSearch(best, hi, probes, 0.0)
    if probe_lower:
        probes += 1
        best = feasible(lo)
        if best is None:
            return YieldSearch(None, None, probes, hi - lo)
        best_y = lo
    while probes == 0 or hi - lo >= precision:
        y = (lo + hi) / 2.0
        probes += 1
        found = feasible(y)
        if found is None:
            hi = y
        else:
            lo, best, best_y = y, found, y
    return YieldSearch(best, best_y, probes, hi - lo)
