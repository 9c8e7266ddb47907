"""How CPU caps are realised, as far as planning must know it: the CFS bandwidth grid, and the one tolerance policy.

Every hypervisor vcsched drives (QEMU/KVM through libvirt's ``vcpu_quota``,
plain cgroups in calibration) enforces a cap as a *quota* of whole
microseconds of CPU time per *period*, per vCPU thread.  So a cap of ``c``
cores on a VM of ``v`` vCPUs can only be one of ``q * v / PERIOD_US`` for a
whole ``q``: caps live on a grid, one step per microsecond of quota.

The tolerance policy follows from the grid, and is the same everywhere:

* the core plans caps **on the grid, rounded down** (:func:`realisable_cap`),
  so a host's planned caps never sum above its cores because of rounding,
  and a cap reads back from the hypervisor as exactly what was planned;
* two caps of one VM are the same when they are the same grid point
  (:func:`same_cap`): a cap already in place needs no step, any other does;
* sums of caps are compared with host cores with :data:`CAP_TOLERANCE`, the
  floating-point noise of adding grid points, nothing more.
"""

from __future__ import annotations

import math

from vcsched.units import CAP_TOLERANCE as CAP_TOLERANCE  # re-exported: the hypervisor reads it here

PERIOD_US = 100_000  # libvirt's default vcpu_period: 100 ms
MIN_QUOTA_US = 1_000  # libvirt/CFS refuse quotas below 1 ms per period
#: The smallest cap one vCPU can be given: one minimum quota per period.
MIN_CAP_CORES = MIN_QUOTA_US / PERIOD_US
_QUOTA_EPS = 1e-6  # µs: absorbs float error when a grid cap is divided back into a quota


def quota_for(cap_cores: float, vcpus: int) -> int:
    """The per-vCPU-thread quota (µs per :data:`PERIOD_US`) that realises ``cap_cores``: rounded down, never up."""
    return math.floor(cap_cores / vcpus * PERIOD_US + _QUOTA_EPS)


def cores_from_quota(quota_us: int, period_us: int, vcpus: int) -> float:
    """The cap in cores a per-vCPU quota gives (how a hypervisor's setting reads back)."""
    return quota_us / period_us * vcpus


def realisable_cap(cap_cores: float, vcpus: int) -> float:
    """The grid point a hypervisor will realise for ``cap_cores``: the largest not above it."""
    return cores_from_quota(quota_for(cap_cores, vcpus), PERIOD_US, vcpus)


def grid_step(vcpus: int) -> float:
    """Cores between two neighbouring caps of a ``vcpus``-vCPU VM (one µs of quota per vCPU)."""
    return vcpus / PERIOD_US


def same_cap(a: float, b: float, vcpus: int) -> bool:
    """Whether two caps of a ``vcpus``-vCPU VM are the same grid point (what the hypervisor would hold)."""
    return quota_for(a, vcpus) == quota_for(b, vcpus)


def off_grid(cap: float, vcpus: int) -> bool:
    """Whether ``cap`` is not a point of a ``vcpus``-vCPU VM's quota grid (the hypervisor would hold another)."""
    return abs(realisable_cap(cap, vcpus) - cap) > CAP_TOLERANCE


def grid_problem(where: str, cap: float, vcpus: int) -> str | None:
    """Why ``cap`` cannot be held by a ``vcpus``-vCPU VM because it is off the quota grid, naming the grid and
    what the hypervisor would hold instead; None on the grid.  A hand-edited ``0.3000004`` would otherwise show
    up later as a sum of caps a hair above a host's cores, the real defect unsaid."""
    if not off_grid(cap, vcpus):
        return None
    return (f"{where}: {cap!r} cores is off the quota grid: a {vcpus}-vCPU VM's caps are multiples of "
            f"{grid_step(vcpus):g} cores (one µs of quota per {PERIOD_US} µs period per vCPU); it would hold "
            f"{realisable_cap(cap, vcpus)!r}")


def min_cap(vcpus: int) -> float:
    """The smallest cap a ``vcpus``-vCPU VM can have (the minimum quota on every vCPU thread)."""
    return cores_from_quota(MIN_QUOTA_US, PERIOD_US, vcpus)
