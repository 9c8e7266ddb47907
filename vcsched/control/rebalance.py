"""When `vcsched run` re-balances: caps every interval, migrations only when they pay, and never back and forth.

Pure, like the rest of the core: an inventory and measured needs in, a
:class:`Decision` (a plan, or none, and why) out.  The controller
(:mod:`acting.controller`) observes, calls :meth:`Rebalancer.decide` once
per interval and applies what it returns.

Each interval two adaptations of the live inventory are computed with the
same measured needs (:func:`vcsched.control.live.adapt_inventory`, paper
section 6.1):

* **re-cap** (budget 0): every VM stays where it is and gets the cap its
  measured need and the common yield give it.  Cheap (no migration), so it is
  applied whenever it changes a cap: caps follow measured needs;
* **re-balance** (budget ``--budget-per-interval``): the best placement that
  migrates at most that many bytes.  Its *gain* is its predicted minimum
  yield less the re-cap's.

The re-balance is applied only when all of these hold, otherwise the re-cap is:

1. it migrates something and its gain is at least ``threshold`` (min-yield
   points) and above 0;
2. *hysteresis*: the same migrations (same VMs to the same hosts) were
   proposed, each time with that gain, in ``settle`` consecutive intervals
   (default 2).  A load that swings from one host to the other between
   intervals proposes opposite moves each time and never reaches the count,
   so it never ping-pongs; a lasting imbalance is acted on one interval late;
3. migrations are allowed now: inside one of the cluster file's maintenance
   windows and in none of its blackouts (:mod:`vcsched.formats.windows`;
   outside, the re-cap is still applied — caps are cheap and reversible — and
   the decision says why nothing migrates);
4. no VM migrated less than ``cooldown`` seconds ago is moved: it is
   *pinned* (its move costs more than the budget), known from the
   ``migrated_at`` its libvirt metadata carries (set when it arrived), so a
   restarted controller or a new leader keeps to it without a database.

With ``spare`` (the cluster file's, :mod:`vcsched.adaptation.spare`), a
re-balance whose minimum yield gains nothing (every VM is at the target
yield already) is gainful when it empties a host (``consolidate``) or
evens the hosts (``spread``, by at least its minimum gain per move), under
the same hysteresis, windows and cool-down.

The budget is per interval: one plan per interval, and a plan never moves
more than its budget (:func:`adapt_inventory` refuses an order that would).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vcsched.adaptation.spare import spare_bought
from vcsched.control.live import LiveAdaptation, adapt_inventory
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.formats.windows import ALWAYS, MaintenanceSchedule
from vcsched.inventory import Inventory
from vcsched.plans.migration import MigrationBlocked
from vcsched.plans.plan import Plan
from vcsched.plans.steps import MigrateStep
from vcsched.units import YIELD_TOLERANCE

RECAP, REBALANCE, NOTHING = "re-cap", "re-balance", "nothing"


@dataclass(frozen=True)
class RebalanceOptions:
    budget: int  # bytes per interval
    threshold: float = 0.05  # min-yield points
    settle: int = 2  # intervals the same gainful moves must be proposed in a row
    cooldown: float = 600.0  # seconds a migrated VM stays put
    algorithm: str = "heuristic"
    parallel: int = 1
    #: The cluster file, for what a move costs (memory + disks between hosts of different storage); None: memory.
    storage: Cluster | None = None
    #: When migrations are allowed (the cluster file's windows and blackouts); outside, caps only.
    schedule: MaintenanceSchedule = ALWAYS
    #: What the budget left buys once every floor and the target yield hold (the cluster file's ``spare``:
    #: "consolidate", "spread"; None: nothing).  Its moves are gainful by their own measure (module docstring).
    spare: str | None = None

    def __post_init__(self) -> None:
        if self.budget < 0:
            raise InputError(f"--budget-per-interval: {self.budget} bytes is negative")
        if not 0 <= self.threshold <= 1:
            raise InputError(f"--threshold: {self.threshold!r} is not in [0, 1] (min-yield points)")
        if self.settle < 1:
            raise InputError(f"--settle: {self.settle!r} is below 1")
        if not self.cooldown >= 0:
            raise InputError(f"--cooldown: {self.cooldown!r} is negative")


Move = tuple[str, str]  # (VM, the host it ends on)


@dataclass(frozen=True)
class Decision:
    """What to do this interval, and why (everything the controller logs as a ``decision`` event)."""

    kind: str  # RECAP, REBALANCE or NOTHING
    plan: Plan | None
    reason: str
    current_min_yield: float | None = None  # caps now over measured needs
    recap_min_yield: float | None = None
    rebalance_min_yield: float | None = None
    gain: float | None = None
    moves: tuple[Move, ...] = ()  # the re-balance's proposed moves (applied or not)
    pinned: tuple[str, ...] = ()
    streak: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Why no migration may happen now (outside the maintenance windows, in a blackout); None: allowed.
    window: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "current_min_yield": self.current_min_yield,
                "recap_min_yield": self.recap_min_yield, "rebalance_min_yield": self.rebalance_min_yield,
                "gain": self.gain, "moves": [list(m) for m in self.moves], "pinned": list(self.pinned),
                "streak": self.streak, "window": self.window,
                "steps": 0 if self.plan is None else len(self.plan.steps),
                "migrated_bytes": 0 if self.plan is None else int(self.plan.extra.get("migrated_bytes", 0))}


def cooling(inventory: Inventory, now: float, cooldown: float) -> tuple[str, ...]:
    """Managed VMs migrated less than ``cooldown`` seconds before ``now`` (a time in the future counts too)."""
    return tuple(sorted(v.name for v in inventory.managed()
                        if v.meta is not None and v.meta.migrated_at is not None
                        and now - v.meta.migrated_at < cooldown))


def moves_of(plan: Plan) -> tuple[Move, ...]:
    """Each migrated VM and the host it ends on (a relayed VM once, with its final host)."""
    ends: dict[str, str] = {}
    for s in plan.steps:
        if isinstance(s, MigrateStep):
            ends[s.vm] = s.target
    return tuple(sorted(ends.items()))


class Rebalancer:
    """The decision rule of the module docstring, with its one piece of state: the hysteresis streak.

    The streak lives in memory only: a restarted controller or a new leader
    starts counting again (one more interval of waiting, never a hasty move).
    """

    def __init__(self, options: RebalanceOptions) -> None:
        self.options = options
        self._moves: tuple[Move, ...] | None = None
        self._streak = 0

    def _reset(self) -> None:
        self._moves, self._streak = None, 0

    def plan_for(self, kind: str, inventory: Inventory, needs: Mapping[str, float],
                 pinned: Iterable[str] = ()) -> LiveAdaptation:
        """The re-cap or re-balance adaptation of ``inventory`` (no state change: for re-planning under the lock)."""
        o = self.options
        budget = o.budget if kind == REBALANCE else 0
        return adapt_inventory(inventory.cluster, inventory, budget, needs=needs, algorithm=o.algorithm,
                               parallel=o.parallel, pinned=tuple(pinned), record_needs=False, storage=o.storage,
                               spare=o.spare if kind == REBALANCE else None)

    def decide(self, inventory: Inventory, needs: Mapping[str, float], now: float,
               vetoed: Iterable[str] = ()) -> Decision:
        """This interval's decision.  ``vetoed``: VMs an operator's skipped recommendation keeps where they are
        (pinned like VMs in their cool-down)."""
        o = self.options
        if not inventory.up().managed():
            self._reset()
            return Decision(NOTHING, None, "no running managed VM")
        pinned = tuple(sorted(set(cooling(inventory, now, o.cooldown)) | set(vetoed)))
        try:
            recap = self.plan_for(RECAP, inventory, needs)
        except MigrationBlocked as exc:  # e.g. a cap below the smallest quota: the cluster is too crowded
            self._reset()
            return Decision(NOTHING, None, f"no re-cap: {exc}", pinned=pinned)
        if recap.plan is None:
            self._reset()
            return Decision(NOTHING, None, "no allocation keeps every VM where it is",
                            current_min_yield=recap.current_min_yield)
        recap_kind = RECAP if recap.plan.steps else NOTHING
        base = Decision(recap_kind, recap.plan, "", current_min_yield=recap.current_min_yield,
                        recap_min_yield=recap.plan.min_yield, pinned=pinned)
        if o.budget == 0:
            return replace(base, reason="budget 0: caps only")
        closed = o.schedule.why_closed(now)
        if closed is not None:
            self._reset()  # proposals do not accumulate while migrations are not allowed
            opens = o.schedule.next_change(now)
            when = "" if opens is None else f"; migrations allowed again at {o.schedule.local(opens):%a %Y-%m-%d %H:%M}"
            return replace(base, reason=f"no migration: {closed}{when}; caps only", window=closed)
        try:
            moved = self.plan_for(REBALANCE, inventory, needs, pinned)
        except MigrationBlocked as exc:
            self._reset()
            return replace(base, reason=f"no safe migration order: {exc}")
        if moved.plan is None or not moves_of(moved.plan):
            self._reset()
            cooling_note = f" (in their cool-down or vetoed, not moved: {', '.join(sorted(pinned))})" if pinned else ""
            return replace(base, reason="no migration improves the minimum yield within the budget" + cooling_note,
                           rebalance_min_yield=None if moved.plan is None else moved.plan.min_yield)
        gain = moved.plan.min_yield - recap.plan.min_yield
        moves = moves_of(moved.plan)
        base = replace(base, rebalance_min_yield=moved.plan.min_yield, gain=gain, moves=moves)
        what = f"gain {gain:.4f}"
        if gain <= YIELD_TOLERANCE or gain < o.threshold - YIELD_TOLERANCE:
            spare = spare_bought(moved.adapted.detail.get("spare"))
            if spare is None or gain < -YIELD_TOLERANCE:
                self._reset()
                return replace(base, reason=f"gain {gain:.4f} below the threshold {o.threshold:g}")
            what = spare  # every yield at the target already: the spare room's own gain
        else:
            what += f" >= threshold {o.threshold:g}"
        self._streak = self._streak + 1 if moves == self._moves else 1
        self._moves = moves
        streak = self._streak
        if streak < o.settle:
            return replace(base, streak=streak, reason=f"{what}: the same moves proposed {streak} of "
                           f"{o.settle} intervals in a row; waiting")
        self._reset()
        return replace(base, kind=REBALANCE, plan=moved.plan, streak=streak,
                       reason=f"{what} for {streak} intervals in a row")
