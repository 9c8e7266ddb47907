"""CARBYNE's altruism on top of any fair policy: keep what you need, give the rest, redistribute it.

Source: R. Grandl, M. Chowdhury, A. Akella, G. Ananthanarayanan, "Altruistic
Scheduling in Multi-Resource Clusters" (CARBYNE), §3.2–3.3, Pseudocode 1.
Three levels at every scheduling event:

1. **inter-job**: the fair policy's yields (any policy of the registry);
2. **intra-job**: each altruistic VC keeps only what it needs to finish no
   later than under its fair share, and gives the rest away (the *leftover*);
3. **leftover**: the leftover (and what the fair policy left unallocated) is
   redistributed, shortest-remaining-first (``srtf``: the VCs with the least
   work left are sped up first, for the average completion time; then
   packing uses what is still free, as CARBYNE does) or by packing only
   (``pack``: for utilisation, Tetris-like alignment of needs with free
   capacity).

**What a VC needs, in the fluid model.**  A VC's running parts (its current
phase, :mod:`vcsched.simulate.workload`) all move at its fair yield ``y``, so
the phase ends when its longest part does, at ``now + R / y`` with ``R`` the
most work left in any part.  A part with work ``r < R`` left needs only
``y r / R`` to end at that same time (CARBYNE's reverse packing: "as close to
``T_k`` as possible"; Varys's "finish together").  Later phases start at the
barrier either way, so under a fixed population the VC ends exactly when it
would have under its fair share (CARBYNE's Theorem 3.1, offline).  A VC of one
part has nothing to give: the smallest constant yield that finishes by then
is its fair yield itself.

**P(altruism)** (CARBYNE §5, Fig. 11): at each event each VC is altruistic
with this probability.  At 0 nothing is given and nothing redistributed: the
yields are exactly the fair policy's.

:func:`leftover_accounting` is the same three levels on discrete tasks, for
CARBYNE's Figure 2 example (tests/test_simulate_altruism.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.simulate.state import VC
from vcsched.units import FIT_TOLERANCE

LEFTOVER_MODES = ("srtf", "pack")


@dataclass
class Pass:
    """What one altruism pass did: per resource, how much the altruistic VCs gave (reference-host units)."""

    given: list[float]


def _usage(vc: VC, ys: Sequence[float], res: int) -> list[float]:
    out = [0.0] * res
    for y, need in zip(ys, vc.needs, strict=True):
        if y > 0:
            for r in range(res):
                out[r] += y * need[r]
    return out


def fair_span(vc: VC, y: float, inv_total: Sequence[float]) -> float:
    """How long the VC's current phase lasts if it keeps the dominant share its fair yield gives it now.

    All running parts move at one yield; when one ends, the same dominant
    share buys the remaining parts a higher yield (capped at 1).  Infinite if
    the fair yield is 0.
    """
    k = sum(vc.hosts.values())
    rem = {b: r for b, r in enumerate(vc.rem) if r > 0}

    def dominant(parts: Sequence[int]) -> float:
        return max(k * sum(vc.needs[b][r] for b in parts) * inv for r, inv in enumerate(inv_total))

    share = y * dominant(list(rem))
    if share <= 0:
        return math.inf
    span = 0.0
    while rem:
        d = dominant(list(rem))
        yb = min(1.0, share / d) if d > 0 else 1.0
        step = min(rem.values()) / yb
        span += step
        rem = {b: r - yb * step for b, r in rem.items() if r - yb * step > FIT_TOLERANCE * max(1.0, r)}
    return span


def floors(vcs: Sequence[VC], fair: Sequence[float], altruistic: Sequence[bool], pair_cap: Sequence[float],
           n_res: int, inv_total: Sequence[float]) -> tuple[list[list[float]], dict[int, float], list[float]]:
    """Level 2: what each VC keeps — part yields that end its phase when its fair share would.

    An altruistic VC of several running parts runs each part at the constant
    rate that ends it at :func:`fair_span` (they all end together); the others
    keep their fair yield on every part.  Returns the floors, the load they put
    on every pair, and what the altruistic VCs gave away per resource
    (reference-host units; negative where a floor takes more than the fair
    yields, which it may on the critical part's resources).
    """
    out: list[list[float]] = []
    for vc, y, alt in zip(vcs, fair, altruistic, strict=True):
        span = fair_span(vc, y, inv_total) if alt and sum(r > 0 for r in vc.rem) > 1 else math.inf
        if math.isfinite(span) and span > 0:
            out.append([min(1.0, r / span) if r > 0 else 0.0 for r in vc.rem])
        else:
            out.append([y if r > 0 else 0.0 for r in vc.rem])
    # A floor may need more than the fair yields on the critical part's resources (it must catch up with a
    # trajectory that speeds up as parts end).  Where the floors overload a pair, the altruistic VCs on it
    # fall back to their fair yields, until nothing is overloaded (at worst: everyone fair, which fits).
    fair_parts = [[y if r > 0 else 0.0 for r in vc.rem] for vc, y in zip(vcs, fair, strict=True)]
    while True:
        load: dict[int, float] = {}
        on: dict[int, list[int]] = {}
        for i, vc in enumerate(vcs):
            for p, v in _rows_of(vc, out[i], n_res).items():
                load[p] = load.get(p, 0.0) + v
                on.setdefault(p, []).append(i)
        over = [p for p, v in load.items() if v > pair_cap[p] * (1 + 1e-9) + 1e-12]
        back = {i for p in over for i in on[p] if out[i] != fair_parts[i]}
        if not back:
            break
        for i in back:
            out[i] = list(fair_parts[i])
    given = [0.0] * n_res
    for vc, f, fp in zip(vcs, out, fair_parts, strict=True):
        if f != fp:
            fair_use, floor_use = _usage(vc, fp, n_res), _usage(vc, f, n_res)
            k = sum(vc.hosts.values())
            for r in range(n_res):
                given[r] += k * (fair_use[r] - floor_use[r])
    return out, load, given


def redistribute(vcs: Sequence[VC], fair: Sequence[float], remaining: Sequence[float], altruistic: Sequence[bool],
                 pair_cap: Sequence[float], n_res: int, mode: str, inv_total: Sequence[float]
                 ) -> tuple[list[list[float]], Pass]:
    """Part yields for every VC: floors (levels 1–2, :func:`floors`), then the leftover handed out (level 3).

    ``remaining[i]``: the VC's total work left (all phases), SRTF's order;
    ``inv_total``: 1 / the cluster's capacity of each resource (dominant shares).
    Returns one list of part yields per VC.
    """
    kept, load, given = floors(vcs, fair, altruistic, pair_cap, n_res, inv_total)
    ys = [list(f) for f in kept]
    if mode == "srtf":
        for i in sorted(range(len(vcs)), key=lambda i: (remaining[i], vcs[i].id)):
            _speed_up(vcs[i], ys[i], load, pair_cap, n_res)
    _pack(vcs, ys, load, pair_cap, n_res)
    return ys, Pass(given)


def _rows_of(vc: VC, ys: Sequence[float], n_res: int) -> dict[int, float]:
    use = _usage(vc, ys, n_res)
    out: dict[int, float] = {}
    for h, c in vc.hosts.items():
        for r in range(n_res):
            if use[r] > 0:
                out[h * n_res + r] = c * use[r]
    return out


def _speed_up(vc: VC, ys: list[float], load: dict[int, float], pair_cap: Sequence[float], n_res: int) -> None:
    """Raise the VC's critical part (its parts keeping pace, ending together) as far as capacity allows.

    Part ``b``'s yield at critical speed ``θ`` is ``max(floor_b, min(1, θ r_b / R))``: piecewise linear and
    non-decreasing in ``θ``, so the largest feasible ``θ`` is found exactly by walking its breakpoints.
    """
    crit = max(vc.rem, default=0.0)
    if crit <= 0:
        return
    floor = list(ys)
    before = _rows_of(vc, floor, n_res)

    def at(theta: float) -> list[float]:
        return [max(f, min(1.0, theta * r / crit)) if r > 0 else 0.0 for f, r in zip(floor, vc.rem, strict=True)]

    def fits(theta: float) -> bool:
        after = _rows_of(vc, at(theta), n_res)
        return all(load.get(p, 0.0) - before.get(p, 0.0) + v <= pair_cap[p] * (1 + FIT_TOLERANCE) + FIT_TOLERANCE
                   for p, v in after.items())

    # θ0: the largest θ at which every part is still at its floor (at(θ0) == floor, which fits).  An altruistic
    # VC's floors keep pace (all parts give the same θ); a VC that is not altruistic, or fell back, keeps one
    # fair yield on every part, and its critical part starts rising first: the smallest θ, not the largest.
    theta0 = min((f * crit / r for f, r in zip(floor, vc.rem, strict=True) if r > 0 and f < 1.0), default=1.0)
    theta0 = min(theta0, 1.0)
    points = sorted(x for x in {min(1.0, x) for f, r in zip(floor, vc.rem, strict=True) if r > 0
                                for x in (f * crit / r, crit / r)} | {1.0} if x > theta0)
    lo = theta0
    for hi in points:
        if fits(hi):
            lo = hi
            continue
        # linear between lo and hi: the largest fitting theta, pair by pair
        a, b = _rows_of(vc, at(lo), n_res), _rows_of(vc, at(hi), n_res)
        best = hi
        for p in set(a) | set(b):
            slope = (b.get(p, 0.0) - a.get(p, 0.0)) / (hi - lo)
            room = pair_cap[p] - (load.get(p, 0.0) - before.get(p, 0.0) + a.get(p, 0.0))
            if slope > 0:
                best = min(best, lo + max(0.0, room) / slope)
        lo = max(lo, min(best, hi))
        break
    new = at(lo)
    if new != ys:
        after = _rows_of(vc, new, n_res)
        for p in set(before) | set(after):
            load[p] = load.get(p, 0.0) - before.get(p, 0.0) + after.get(p, 0.0)
        ys[:] = new


def _pack(vcs: Sequence[VC], ys: list[list[float]], load: dict[int, float], pair_cap: Sequence[float],
          n_res: int) -> None:
    """Tetris-like: parts in decreasing alignment of their needs with the free capacity, each raised to fit."""
    order = []
    for i, vc in enumerate(vcs):
        for b, (r, need) in enumerate(zip(vc.rem, vc.needs, strict=True)):
            if r > 0 and ys[i][b] < 1.0:
                score = 0.0
                for h, c in vc.hosts.items():
                    for k in range(n_res):
                        if need[k] > 0:
                            p = h * n_res + k
                            cap = pair_cap[p]
                            free = (cap - load.get(p, 0.0)) / cap if cap > 0 else 0.0
                            score += c * need[k] * free
                order.append((-score, vc.id, i, b))
    order.sort()
    for _, _, i, b in order:
        vc = vcs[i]
        need = vc.needs[b]
        room = 1.0 - ys[i][b]
        for h, c in vc.hosts.items():
            for k in range(n_res):
                if need[k] > 0:
                    p = h * n_res + k
                    room = min(room, max(0.0, pair_cap[p] - load.get(p, 0.0)) / (c * need[k]))
        if room > FIT_TOLERANCE:
            ys[i][b] += room
            for h, c in vc.hosts.items():
                for k in range(n_res):
                    if need[k] > 0:
                        p = h * n_res + k
                        load[p] = load.get(p, 0.0) + c * need[k] * room


# ---------------------------------------------------------------------------------------------- discrete tasks


@dataclass(frozen=True)
class Task:
    """A runnable task: its demand (one bottleneck resource), whether it must start now to keep the job's
    completion time ``T_k`` (reverse packing), and whether starting it now would shorten the job."""

    name: str
    demand: float
    must_start: bool = False
    shortens: bool = False


@dataclass(frozen=True)
class TaskJob:
    name: str
    share: float  # the fair share A_k
    remaining: float  # work left, SRTF's key
    tasks: tuple[Task, ...]


def leftover_accounting(jobs: Sequence[TaskJob], capacity: float = 1.0) -> list[tuple[str, str, float]]:
    """CARBYNE Pseudocode 1 on one resource: returns ``(level, what, leftover after it)`` steps.

    Level 2 (intra-job): every job starts its must-start tasks and gives
    ``A_k − Σ must-start`` to the leftover, which also holds what the fair
    shares leave unallocated.  Level 3: SRTF starts, job by job in increasing
    remaining work, the tasks that shorten the job; then packing starts the
    largest remaining tasks that fit (Tetris's alignment on one resource).
    """
    steps: list[tuple[str, str, float]] = []
    leftover = capacity - sum(j.share for j in jobs)
    for j in jobs:
        need = sum(t.demand for t in j.tasks if t.must_start)
        leftover += j.share - need
        steps.append(("intra-job", j.name, leftover))
    pending = [(j, t) for j in jobs for t in j.tasks if not t.must_start]
    started: set[tuple[str, str]] = set()
    for j in sorted(jobs, key=lambda j: j.remaining):
        for t in j.tasks:
            if not t.must_start and t.shortens and t.demand <= leftover + FIT_TOLERANCE:
                leftover -= t.demand
                started.add((j.name, t.name))
                steps.append(("srtf", f"{j.name}.{t.name}", max(0.0, leftover)))
    for j, t in sorted(pending, key=lambda jt: -jt[1].demand):
        if (j.name, t.name) not in started and t.demand <= leftover + FIT_TOLERANCE:
            leftover -= t.demand
            started.add((j.name, t.name))
            steps.append(("pack", f"{j.name}.{t.name}", max(0.0, leftover)))
    return steps


def jain(values: Sequence[float] | np.ndarray) -> float:
    """Jain's fairness index ``(Σx)² / (n Σx²)``: 1 when all equal, ``1/n`` when one gets everything."""
    x = np.asarray(values, dtype=float)
    sq = float(np.sum(x * x))
    return float(np.sum(x) ** 2 / (len(x) * sq)) if len(x) and sq > 0 else 1.0
