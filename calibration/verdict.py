"""Whether a calibration run can be trusted: the conditions it ran in and the signs of a disturbed measurement.

A cap is only as exact as the CPU it rations is free (calibration/cpus.py),
and a rate is only as exact as the measurement is long.  A run on a machine
whose other work already fills every CPU but the measured one shares that
CPU, so its "bare" and its capped measurements see different machines:
``calibrate --backend cgroup --duration 1`` at a load average of 14 on two
CPUs reported an overhead of −496 %.  Such a run is still printed (the
numbers are what was measured), but it ends with a verdict naming each
reason, and the command exits 1.

The reasons, each a measured fact about the run:

* **load**: the 1-minute load average at the start, less the run's own
  subjects already running then (a libvirt run's looping guests), is at
  least the machine's CPUs: on average every CPU, the measured one too, had
  other work to run;
* **busy CPU**: the measured CPU was more than :data:`MAX_BUSY` busy just
  before the run (the least busy one was chosen: every CPU was), where the
  run's subjects were not what kept it busy (the cgroup backend starts its
  workers afterwards; a libvirt run's guests loop before it pauses them);
* **too short**: a measurement of less than :data:`MIN_DURATION` seconds
  spans fewer than ten CFS periods of 100 ms; a capped worker runs in bursts
  of its quota per period, so where the measurement starts and ends within
  a period moves its rate by up to a tenth;
* **faster uncapped than bare**: a mechanism can only slow work down, so
  uncapped work running more than :data:`OVERHEAD_SLACK` faster than bare
  (a negative overhead) means the machine changed between the measurements;
* **drift**: the bare rate at the end differs from the start by more than
  :data:`MAX_DRIFT`: the CPU's capacity changed during the run.
"""

from __future__ import annotations

MAX_BUSY = 0.5
MIN_DURATION = 1.0  # s: ten CFS periods (vcsched.caps.PERIOD_US)
OVERHEAD_SLACK = 0.05
MAX_DRIFT = 0.10


def unreliable(*, load_1m: float, cpus: int, cpu: int, cpu_busy_before: float | None, duration: float,
               rate_overhead: float | None, bare_drift: float | None, own: int = 0) -> list[str]:
    """Why a run cannot be trusted (module docstring), one reason each; empty when nothing says so.

    ``own``: the run's subjects already running at the start (they count in the load, and made the CPU busy:
    then ``cpu_busy_before`` is None).  ``rate_overhead`` and ``bare_drift`` are None where the run did not
    measure them (a nominal bare rate: disk and network runs)."""
    reasons = []
    if load_1m - own >= cpus:
        mine = f" ({own} of it this run's own subjects)" if own else ""
        reasons.append(f"load: the load average was {load_1m:g} at the start{mine} on {cpus} CPUs: every CPU, "
                       f"CPU {cpu} too, had other work to run (run it on a quieter machine)")
    if cpu_busy_before is not None and cpu_busy_before > MAX_BUSY:
        reasons.append(f"busy CPU: CPU {cpu} was {100 * cpu_busy_before:.0f} % busy just before the run, the "
                       "least busy of this machine")
    if duration < MIN_DURATION:
        reasons.append(f"too short: each measurement lasted {duration:g} s, fewer than ten CFS periods of 100 ms "
                       f"(--duration {MIN_DURATION:g} or more)")
    if rate_overhead is not None and rate_overhead < -OVERHEAD_SLACK:
        reasons.append(f"faster uncapped than bare: the overhead measured {100 * rate_overhead:+.0f} %; a "
                       "mechanism only slows work down, so the machine changed between the measurements")
    if bare_drift is not None and abs(bare_drift) > MAX_DRIFT:
        reasons.append(f"drift: the bare rate changed {100 * bare_drift:+.1f} % from the start of the run to its "
                       "end")
    return reasons
