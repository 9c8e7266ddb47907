"""Units and tolerances: each defined once, named for what it means.

Every comparison of floating-point quantities in vcsched absorbs some rounding; which tolerance it uses
says what it compares.  (:mod:`vcsched.formats.units` reads and writes byte sizes as users write them,
in the units below.)

Units
-----
* :data:`CPU` — the name of the one fluid resource every host and job has.
* :data:`KIB` ... :data:`TIB` — bytes.
* :data:`UNLIMITED` — a byte budget no cluster reaches (free re-placement): the largest 64-bit integer,
  so it fits numpy's int64 arithmetic and JSON alike.

Tolerances
----------
* :data:`SEARCH_PRECISION` — the default width at which a binary search on the yield or a level stops
  (``SolveOptions.precision``, ``--precision``).
* :data:`FIT_TOLERANCE` — a need fits a free capacity when ``need <= free + FIT_TOLERANCE`` (both MCB
  kernels, C and Python, and every probe that feeds them), and a total fits a total within it, relative:
  free capacities updated by subtraction carry rounding of this size.
* :data:`MEMORY_TOLERANCE` — a host's memory (fractions of the reference host, summed over its VMs) may
  exceed its capacity by this much and still fit.
* :data:`CAP_TOLERANCE` — sums of CPU caps and needs, in cores, against a host's cores and a VM's vCPUs.
* :data:`YIELD_TOLERANCE` — two yields this close are equal: a floor is met, a move raised the minimum
  yield, an incumbent reaches the bound.
* :data:`SOLVER_TOLERANCE` — what an LP or MILP solver's answer may miss by (HiGHS meets rows to 1e-9
  and integrality to about 1e-6): a sub-solve's yield, a MILP cutoff's slack.
* :data:`IO_TOLERANCE` — disk and network caps are whole bytes per second: their sums compare within float
  noise of that.
* :data:`SATURATION_TOLERANCE` — a (host, resource) pair within this fraction of its capacity is saturated.
* :data:`VALIDATION_TOLERANCE` — the validator's absolute slack on every constraint of an allocation.
"""

from __future__ import annotations

CPU = "cpu"

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
UNLIMITED = (1 << 63) - 1

SEARCH_PRECISION = 1e-4
FIT_TOLERANCE = 1e-12  # identical in the C kernel (vcsched/solvers/_mcbc.c), which receives it as an argument
MEMORY_TOLERANCE = 1e-9
CAP_TOLERANCE = 1e-9
YIELD_TOLERANCE = 1e-9
SOLVER_TOLERANCE = 1e-7
IO_TOLERANCE = 1e-6
SATURATION_TOLERANCE = 1e-9
VALIDATION_TOLERANCE = 1e-6
