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

**Disk and network.**  Where a host declares ``disk_bps``/``net_bps`` (the cluster file), the policies
that plan those resources take the unmanaged domains' measured I/O reservation off the declared rate
(:func:`vcsched.control.sharing.host_capacities`, never below 0).  One domain's reservation
(:func:`io_reservation`) is built like its CPU one: the :data:`RESERVE_PERCENTILE`-th percentile of its
rates over the controller's window plus the estimator's headroom, rounded up to a whole byte/s; network
is its busier direction per sample (a host's ``net_bps`` is per direction).  Unlike CPU, a domain whose
I/O was not measured (one-shot commands, too few samples) reserves *nothing*: its most possible I/O is
not bounded by anything vcsched reads, so "all it could use" would be every host's whole declared rate.
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


def io_reservation(samples: Sequence[Sample], resource: str,
                   params: ObserveParams = DEFAULT_PARAMS) -> float | None:
    """Bytes/s of ``resource`` (``disk``/``net``) to reserve for an unmanaged domain from its window of samples;
    None: fewer than ``min_samples`` samples measured that resource."""
    rates = [r for r in (getattr(s, f"{resource}_bps") for s in samples) if r is not None]
    if len(rates) < params.min_samples:
        return None
    return float(math.ceil(percentile(rates, RESERVE_PERCENTILE) * (1 + params.headroom) - 1e-9))


def unmanaged_io_reserves(inventory: Inventory, windows: Mapping[str, Sequence[Sample]],
                          params: ObserveParams = DEFAULT_PARAMS) -> dict[str, tuple[tuple[str, float], ...]]:
    """Measured disk and network reservations of the running unmanaged domains (name -> ``(resource, B/s)``).

    Not scaled like :func:`beside_managed`: the managed VMs' I/O caps are not taken back from them by it (the
    controller does not re-cap I/O), it only leaves less of the declared rate to plan with."""
    out = {}
    for v in inventory.vms:
        if v.unmanaged:
            got = tuple((r, b) for r in ("disk", "net")
                        if (b := io_reservation(windows.get(v.name, ()), r, params)) is not None)
            if got:
                out[v.name] = got
    return out


def unmanaged_reserves(inventory: Inventory, windows: Mapping[str, Sequence[Sample]],
                       params: ObserveParams = DEFAULT_PARAMS) -> dict[str, float]:
    """Measured reservations of the running unmanaged domains that have enough samples (name -> cores)."""
    out = {}
    for v in inventory.vms:
        if v.unmanaged:
            r = reservation(v, windows.get(v.name, ()), params)
            if r is not None:
                out[v.name] = r
    return beside_managed(inventory, out)


def beside_managed(inventory: Inventory, reserves: Mapping[str, float]) -> dict[str, float]:
    """Measured reservations scaled down, host by host, so that they never take the CPU that the caps of the
    managed VMs already there hold.

    A measured use of an uncapped domain is what it got *while competing* with the managed VMs beside it (it
    would take more, and they were held to their caps): it says "needs at least this", like a starved managed
    VM's samples (docs/contention.md).  Reserved whole, it squeezed the managed VMs' caps at every interval —
    the controller lowered a VM capped at 0.4 to 0.05, below its floor, handing the domain vcsched does not
    manage the CPU of one it does (tests/test_contention.py).  So it blocks what is free, never what is held:
    nothing more is planned onto the host, and what runs there keeps its caps.  (The one-shot reservation of a
    domain never measured, its cap or all its vCPUs, is not scaled: the commands that use it move VMs off a
    full host rather than re-cap them; docs/introducing.md.)"""
    out = dict(reserves)
    for h in inventory.hosts:
        here = inventory.vms_on(h.name)
        names = [v.name for v in here if v.name in reserves]
        total = sum(reserves[n] for n in names)
        if not names or total <= 0:
            continue
        held = sum(v.cap_or_vcpus for v in here if v.meta is not None and v.active)
        room = max(h.cores - held, 0.0)
        if total > room:
            for n in names:
                out[n] = reserves[n] * room / total
    return out


def fills(reserved_cores: float, cores: int) -> bool:
    """Whether unmanaged domains reserving ``reserved_cores`` leave a host of ``cores`` nothing to plan with."""
    return reserved_cores > 0 and reserved_cores >= cores - 1e-9


def io_full(inventory: Inventory) -> dict[str, tuple[str, ...]]:
    """Answering hosts whose unmanaged domains' measured I/O reserves all of a declared rate (host -> resources).

    Nothing needing that resource is placed there (its capacity is 0); VMs needing CPU alone still are, so they
    are reported, not cordoned like :func:`full_hosts`."""
    out = {}
    for h in inventory.hosts:
        full = tuple(r for r in ("disk", "net") if h.down is None
                     and (c := h.capacity(r)) is not None and fills(inventory.unmanaged_io(h.name, r), c))
        if full:
            out[h.name] = full
    return out


def full_hosts(inventory: Inventory) -> frozenset[str]:
    """The answering hosts whose unmanaged domains reserve all their cores.  Their usable cores are 0, so no
    placement puts a VM there at a yield above 0; failover also takes them as cordoned, because a managed VM
    already squeezed to 0 there makes 0 the cluster's minimum anyway, and a displaced VM would then be placed
    there as readily as anywhere."""
    return frozenset(h.name for h in inventory.hosts
                     if h.down is None and fills(inventory.unmanaged_cores(h.name), h.cores))
