"""Timing the simulator against its speed target (for ``vcsched bench``, rows ``simulate``).

The target (docs/simulate.md §8): a run of 100,000 arrivals on 64 hosts with
DRF in at most 60 s, PF in at most 3 times DRF's time.  The run is the
``cluster64`` scenario at its own rates (64 hosts with CPU, disk and network,
four kinds of multi-VM virtual clusters; CPU load 0.475), one replication,
10,000 arrivals of warm-up and 90,000 measured, seed 0: the same work on
every machine.  One run per policy, whatever ``--repeat`` says: a run is
already 200,000 events, and at about a minute each, five would make the bench
too long to be run at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from vcsched.experiments import OnProgress
from vcsched.simulate.fluid import RunOptions, simulate
from vcsched.simulate.scenarios import cluster64

SIMULATE_PREFIX = "simulate"
ARRIVALS = 100_000
WARMUP = 10_000
DRF_TARGET_S = 60.0
PF_FACTOR = 3.0


@dataclass(frozen=True)
class SimBenchRow:
    policy: str
    arrivals: int
    events: int
    wall_s: float
    mean_in_progress: float  # time-average number of VCs running
    target_s: float  # DRF: 60 s; PF: 3 x DRF's measured time

    @property
    def within_target(self) -> bool:
        return self.wall_s <= self.target_s

    @property
    def name(self) -> str:
        return f"{SIMULATE_PREFIX} {self.policy}"


def bench(arrivals: int = ARRIVALS, warmup: int = WARMUP, on_progress: OnProgress | None = None
          ) -> list[SimBenchRow]:
    """DRF then PF on ``cluster64`` at its own rates: ``arrivals`` in all, ``warmup`` of them not measured."""
    if not 0 <= warmup < arrivals:
        raise ValueError(f"simulate bench: warm-up {warmup} must be below the {arrivals} arrivals")
    w = cluster64()
    rows: list[SimBenchRow] = []
    for policy in ("drf", "pf"):
        def progress(done: int, total: int, _desc: str, policy: str = policy) -> None:
            if on_progress:
                on_progress(done, total, f"{SIMULATE_PREFIX} {policy}")

        r = simulate(w, RunOptions(policy=policy, arrivals=arrivals - warmup, warmup=warmup, seed=0), None,
                     progress)
        target = DRF_TARGET_S if policy == "drf" else PF_FACTOR * rows[0].wall_s
        rows.append(SimBenchRow(policy, arrivals, r.events, r.wall_s, r.mean_in_progress, target))
    return rows


def markdown(rows: list[SimBenchRow]) -> str:
    lines = ["| row | arrivals | events | VCs in progress (mean) | time | target | within |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        target = f"≤ {r.target_s:.3g} s" + (" (3 x DRF)" if r.policy != "drf" else "")
        lines.append(f"| {r.name} | {r.arrivals:,} | {r.events:,} | {r.mean_in_progress:.1f} | {r.wall_s:.1f} s | "
                     f"{target} | {'yes' if r.within_target else 'no'} |")
    return "\n".join(lines)
