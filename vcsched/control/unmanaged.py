"""What unmanaged domains use, and how much of their host vcsched keeps for them.

Every cluster vcsched meets already runs domains it did not create.  vcsched never caps or moves
them (it only touches the VMs it manages), so the CPU they use is CPU the managed VMs' caps cannot
have: each host's usable cores are its cores less its unmanaged domains' *reservation*
(:meth:`vcsched.inventory.Inventory.usable_cores`), and every plan is built on those
(:func:`vcsched.control.admission.model_hosts`).

**The reservation of one domain.**

* Measured (``vcsched run`` samples unmanaged domains with the managed ones, :mod:`acting.sampling`):
  the :data:`RESERVE_PERCENTILE`-th percentile of the cores it used over the controller's window,
  plus the estimator's headroom and margin (:class:`~vcsched.control.observe.ObserveParams`),
  rounded up to 0.01 core, never above its cap or vCPUs.  A higher percentile than a managed VM's
  need (p90): a managed VM that bursts above its estimate is held by its cap, an unmanaged one is
  not, and whatever it takes beyond its reservation comes out of the managed VMs' promised caps.
  With fewer than ``min_samples`` samples there is no measurement.
* Not measured (one-shot commands read the inventory once, so ``place``, ``adapt``, ``drain``,
  ``headroom`` and ``recover``): the most it can use, its cap or else every vCPU.  Conservative on
  purpose: a single read says nothing about its next minute, and under-reserving breaks promises.

Disk and network use of unmanaged domains is shown (``status``) but not reserved: declared disk and
network capacities are rare, and the policies that use them read the managed VMs' declared needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from vcsched.control.observe import DEFAULT_PARAMS, ObserveParams, Sample, percentile
from vcsched.inventory import Inventory, VmState

#: The percentile of an unmanaged domain's samples reserved for it (module docstring: why above p90).
RESERVE_PERCENTILE = 99.0


def reservation(vm: VmState, samples: Sequence[Sample], params: ObserveParams = DEFAULT_PARAMS) -> float | None:
    """Cores to reserve for unmanaged ``vm`` from its window of samples; None: too few to measure."""
    if len(samples) < params.min_samples:
        return None
    used = percentile([s.used_cores for s in samples], RESERVE_PERCENTILE) * (1 + params.headroom) + params.margin
    return min(math.ceil(used * 100 - 1e-9) / 100, vm.cap_or_vcpus)


def unmanaged_reserves(inventory: Inventory, windows: Mapping[str, Sequence[Sample]],
                       params: ObserveParams = DEFAULT_PARAMS) -> dict[str, float]:
    """Measured reservations of the running unmanaged domains that have enough samples (name -> cores)."""
    out = {}
    for v in inventory.vms:
        if v.unmanaged:
            r = reservation(v, windows.get(v.name, ()), params)
            if r is not None:
                out[v.name] = r
    return out


def fills(reserved_cores: float, cores: int) -> bool:
    """Whether unmanaged domains reserving ``reserved_cores`` leave a host of ``cores`` nothing to plan with."""
    return reserved_cores > 0 and reserved_cores >= cores - 1e-9


def full_hosts(inventory: Inventory) -> frozenset[str]:
    """The answering hosts whose unmanaged domains reserve all their cores.  Their usable cores are 0, so no
    placement puts a VM there at a yield above 0; failover also takes them as cordoned, because a managed VM
    already squeezed to 0 there makes 0 the cluster's minimum anyway, and a displaced VM would then be placed
    there as readily as anywhere."""
    return frozenset(h.name for h in inventory.hosts
                     if h.down is None and fills(inventory.unmanaged_cores(h.name), h.cores))
