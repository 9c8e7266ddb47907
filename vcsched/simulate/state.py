"""A virtual cluster while it is in the system: where its VMs run, how much work each part has left."""

from __future__ import annotations


class VC:
    """One VC in the simulation (mutable, one per arrival; ``__slots__`` because there are many).

    ``rem[b]`` is part ``b``'s remaining work (time at full speed) at time
    ``t_upd``; between events it falls at rate ``yields[b]``, so it is only
    brought up to date when the yields change or a part ends.  ``fair`` is the
    policy's yield for the whole VC; ``yields`` are what its parts actually get
    (the same unless altruism moved them).  ``rows``: ``(pair, n_VMs × need)``
    for the sum of the running parts' needs, ``pair = host × R + resource``.
    """

    __slots__ = ("agg", "alone", "arrival", "cls", "dom", "eff", "fair", "hosts", "id", "key", "measured",
                 "needs", "permanent", "phase", "rate", "rem", "rows", "started", "t_upd", "use", "version",
                 "weight", "work", "yields")

    def __init__(self, vc_id: int, cls: int, arrival: float, work: float, weight: float, measured: bool,
                 permanent: bool = False) -> None:
        self.id = vc_id
        self.cls = cls
        self.arrival = arrival
        self.work = work
        self.weight = weight
        self.measured = measured
        self.permanent = permanent
        self.started = -1.0  # admission time (memory found); -1 while queued
        self.phase = 0
        self.rem: list[float] = []
        self.needs: list[tuple[float, ...]] = []
        self.yields: list[float] = []
        self.fair = 0.0
        self.hosts: dict[int, int] = {}
        self.agg: tuple[float, ...] = ()
        self.dom = 0  # index of the resource it needs most
        self.rows: tuple[tuple[int, float], ...] = ()
        self.key: tuple[float, tuple[tuple[int, float], ...]] = (weight, ())
        self.rate = -1.0  # the engine's filling rate for its rows (max-min policies), -1: not computed yet
        self.t_upd = arrival
        self.version = 0
        self.alone = 0.0  # time it would take alone at full speed
        self.use: tuple[float, ...] = ()  # what it gets of every fluid resource, all VMs together
        self.eff = 0.0  # its yield on its dominant resource: what it gets there over what it would use alone

    def sync(self, t: float) -> None:
        """Bring ``rem`` up to time ``t`` at the current yields."""
        dt = t - self.t_upd
        if dt > 0:
            self.rem = [r - y * dt if r > 0 else 0.0 for r, y in zip(self.rem, self.yields, strict=True)]
        self.t_upd = t

    def next_end(self) -> float:
        """When the next running part ends at the current yields (inf if none moves)."""
        best = float("inf")
        for r, y in zip(self.rem, self.yields, strict=True):
            if r > 0 and y > 0:
                end = r / y
                if end < best:
                    best = end
        return self.t_upd + best

