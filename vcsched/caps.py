"""How CPU caps are realised, as far as planning must know it: the CFS bandwidth grid.

Every hypervisor vcsched drives (QEMU/KVM through libvirt's ``vcpu_quota``,
plain cgroups in calibration) enforces a cap as a *quota* of whole
microseconds of CPU time per *period*, per vCPU thread.  The core plans caps
in cores; the hypervisor turns them into quotas with :func:`quota_for` and
reads them back with :func:`cores_from_quota`.  Both sides use these same
definitions, so a planned cap and what a host reports can be compared.
"""

from __future__ import annotations

PERIOD_US = 100_000  # libvirt's default vcpu_period: 100 ms
MIN_QUOTA_US = 1_000  # libvirt/CFS refuse quotas below 1 ms per period
#: The smallest cap one vCPU can be given: one minimum quota per period.
MIN_CAP_CORES = MIN_QUOTA_US / PERIOD_US
#: Cap sums are compared to host cores with this slack (floating-point noise of the plan's own arithmetic).
CAP_TOLERANCE = 1e-6


def quota_for(cap_cores: float, vcpus: int) -> int:
    """Per-vCPU-thread quota (µs per :data:`PERIOD_US`) for a cap of ``cap_cores`` cores over ``vcpus`` vCPUs."""
    return round(cap_cores / vcpus * PERIOD_US)


def cores_from_quota(quota_us: int, period_us: int, vcpus: int) -> float:
    """The cap in cores a per-vCPU quota gives."""
    return quota_us / period_us * vcpus
