"""The one placement probe, and MCB's binary search on the yield or on a fill level (paper section 3.4).

Every placement in vcsched that works by "fix a level, then try to pack"
asks the same question at each probe: with the tasks that are already
somewhere (*fixed*: pinned tasks, running VMs) at their yields, can the other
tasks (the *pool*) be packed at theirs, honouring the placement rules?  That
question is answered here once, by :func:`residual_probe`, for

* MCB1-8 (:func:`search`, registered as ``mcb1`` ... ``mcb8``): the pinned
  tasks fixed, the others the pool, on CPU and memory or on the whole
  resource vector (:mod:`vcsched.solvers.mcb_vector`);
* the sharing policies' placement on their fill level
  (:mod:`vcsched.policies.placement`): :func:`search` with the policy's rates;
* the adaptation heuristic's packing around running tasks
  (:func:`vcsched.adaptation.heuristic.pack_residual`);
* admission of a request around the running VMs (:mod:`vcsched.control.admission`).

**Levels.**  A job ``j`` at level ``L`` runs at ``y_j(L) = min(1, rho_j L)``:
``rho_j = 1`` for every job (*uniform*: the level is the common minimum
yield, the paper's search), or a sharing policy's rates (docs/policies.md
§5.3: ``w_j / D_j`` for weighted DRF, ``w_j / A_j`` for asset fairness),
scaled so that the largest is 1 (:func:`normalised_rates`), so the level
reads as the fastest-filling job's yield and the precision means the same.

**One probe at level L.**

1. The fixed tasks take ``y_j(L) * need`` of every fluid resource and their
   memory off their hosts; when they alone overflow a host the probe fails
   (they would run below ``L``); what is left is never below 0.
2. A host in maintenance takes nothing new (capacity -1); a spread job's
   pool tasks skip the hosts where its fixed tasks are (the kernels' groups).
3. The pool is packed with needs ``y_j(L) * need`` by the variant's kernel:
   the 2-D kernel (C when built) when CPU is the only fluid resource, else the
   vector kernel.  ``together`` never reaches a probe: the rule loop
   (:func:`vcsched.rules.place_preferred_first`) contracts such a job into one task.

With uniform rates the fixed load at ``L`` is ``L`` times the load at yield
1, exactly the arithmetic the paper's search and the heuristic always did,
so their results are unchanged bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.model import Instance, SolveOptions
from vcsched.rules import HostGroups, spread_groups
from vcsched.solvers.algorithm import Placement, Placer
from vcsched.solvers.lpbound import lp_bound
from vcsched.solvers.mcb import KERNELS, VARIANTS, KernelRules, kernel_backend, sorted_lists
from vcsched.solvers.mcb_vector import pack_vector, vector_lists
from vcsched.solvers.yield_search import bisect_yield
from vcsched.units import FIT_TOLERANCE, SEARCH_PRECISION
from vcsched.yields import common_yield

Probe = Callable[[float], "np.ndarray | None"]


# --- levels ------------------------------------------------------------------------------------


def normalised_rates(rates: np.ndarray) -> np.ndarray:
    """Rates scaled so the largest is 1 (the level is then the fastest job's uncapped yield)."""
    r = np.asarray(rates, dtype=float)
    if not len(r):
        return r
    top = float(r.max())
    if not (top > 0 and np.isfinite(top)) or (r <= 0).any() or not np.isfinite(r).all():
        raise InputError(f"rates: every fill rate must be a finite number above 0 (got {r.min()!r}..{top!r})")
    return r / top


def level_yields(rates: np.ndarray, level: float) -> np.ndarray:
    """``y_j(L) = min(1, rho_j L)``."""
    return np.minimum(1.0, rates * level)


def _uniform(rho: np.ndarray | None) -> bool:
    return rho is None or bool(np.all(rho == 1.0))


def level_bound(instance: Instance, rates: np.ndarray) -> float | None:
    """``L_LP``: the highest level at which every fluid resource fits in total, or None if memory does not.

    Section 3.1's bound ``min(1, sum C / sum k alpha)`` with one row per fluid
    resource and a rate per job; above ``max_j 1 / rho_j`` every job is at
    yield 1 and nothing grows, so the level stops there.
    """
    if instance.n_tasks == 0:
        return 1.0
    if float(instance.task_mem.sum()) > float(instance.host_mem.sum()) + FIT_TOLERANCE:
        return None
    top = float(np.max(1.0 / rates))
    demand = instance.job_need * instance.job_tasks[:, None]  # jobs x resources, per unit of yield
    total = instance.host_capacity.sum(axis=0)

    def fits(level: float) -> bool:
        return bool(np.all(level_yields(rates, level) @ demand <= total * (1 + FIT_TOLERANCE)))

    return highest_level(fits, top)


def highest_level(fits: Callable[[float], bool], top: float) -> float:
    """The highest level in ``[0, top]`` at which the monotone ``fits`` holds, to machine precision."""
    if fits(top):
        return top
    lo, hi = 0.0, top
    for _ in range(100):  # loads are piecewise linear in the level: bisect until the interval stops shrinking
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# --- the probe ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Room:
    """What one probe has to pack into: per host the fluid capacity and memory left, and the pool's needs."""

    fluid: np.ndarray  # hosts (CPU alone) or hosts x fluid resources; -1 on hosts in maintenance
    memory: np.ndarray  # hosts; -1 on hosts in maintenance
    need: np.ndarray  # pool tasks (CPU alone) or pool tasks x fluid resources, at the level's yields


class ResidualRoom:
    """The room the fixed tasks leave at each level (module docstring, step 1 and 2), with the pool's needs.

    ``fixed_hosts``: per task its host when fixed, -1 when in the pool; None: the instance's pins.  ``rho``:
    normalised rates (None: uniform).  On an instance whose only fluid resource is CPU everything is a vector
    over hosts (or pool tasks), the paper's 2-D arithmetic; otherwise a matrix over fluid resources.
    """

    def __init__(self, instance: Instance, fixed_hosts: np.ndarray | None = None,
                 rho: np.ndarray | None = None) -> None:
        self.instance = instance
        at = instance.task_pinned if fixed_hosts is None else np.asarray(fixed_hosts, dtype=np.int64)
        self.fixed_at = at
        self.fixed = np.flatnonzero(at >= 0)
        self.pool = np.flatnonzero(at < 0)
        self.rho = None if _uniform(rho) else rho
        self.vector = instance.has_extra_resources
        everything = not len(self.fixed)
        if self.vector:
            self.capacity = instance.host_capacity
            need = instance.job_need[instance.task_job]
        else:
            self.capacity = instance.host_cpu
            need = instance.task_alpha
        self.pool_need = need if everything else need[self.pool]  # at yield 1
        self.pool_mem = instance.task_mem if everything else instance.task_mem[self.pool]
        fixed_hosts_ = at[self.fixed]
        self.fixed_load = None
        memory = instance.host_mem
        if not everything:
            memory = instance.host_mem - np.bincount(fixed_hosts_, weights=instance.task_mem[self.fixed],
                                                     minlength=instance.n_hosts)
            if self.rho is None:  # uniform: the load at L is L times the load at yield 1
                self.fixed_load = self._load(need[self.fixed])
        self.cordoned = instance.host_cordoned if instance.host_cordoned.any() else None
        if self.cordoned is not None:
            memory = np.where(self.cordoned, -1.0, memory)
        self.memory = memory
        groups = spread_groups(instance) if instance.has_rules else None
        self.rules = None if groups is None else KernelRules(
            groups[self.pool], HostGroups.of(instance.n_hosts, fixed_hosts_, groups[self.fixed]))

    def _load(self, need: np.ndarray) -> np.ndarray:
        """Per host (x resource) the summed ``need`` of the fixed tasks."""
        h, n = self.fixed_at[self.fixed], self.instance.n_hosts
        if not self.vector:
            return np.bincount(h, weights=need, minlength=n)
        return np.stack([np.bincount(h, weights=need[:, r], minlength=n) for r in range(need.shape[1])],
                        axis=1).reshape(n, need.shape[1]).astype(float)

    def yields(self, level: float) -> np.ndarray | float:
        """The level's yield: one number when uniform, else one per job."""
        return min(1.0, level) if self.rho is None else level_yields(self.rho, level)

    def fixed_load_at(self, level: float) -> np.ndarray | None:
        """The fixed tasks' fluid load per host (x resource) at ``level``; None when nothing is fixed."""
        if not len(self.fixed):
            return None
        y = self.yields(level)
        if isinstance(y, float):
            assert self.fixed_load is not None
            return y * self.fixed_load
        inst = self.instance
        per_task = y[inst.task_job[self.fixed]]
        if self.vector:
            return self._load(per_task[:, None] * inst.job_need[inst.task_job[self.fixed]])
        return self._load(per_task * inst.task_alpha[self.fixed])

    def ceiling(self) -> float | None:
        """The highest level worth probing: the bound of section 3.1 (with rates), and no higher than the fixed
        tasks allow by themselves (they alone would overflow a host above it); None when memory does not fit."""
        inst = self.instance
        if self.rho is None:
            bound = lp_bound(inst)
            if bound is None or self.fixed_load is None:
                return bound
            return min(common_yield(self.capacity, self.fixed_load), bound)
        bound = level_bound(inst, self.rho)
        if bound is None or not len(self.fixed):
            return bound
        capacity = self.capacity

        def fixed_fit(level: float) -> bool:
            load = self.fixed_load_at(level)
            return load is None or bool(np.all(load <= capacity + FIT_TOLERANCE))

        return highest_level(fixed_fit, bound)

    def at(self, level: float) -> Room | None:
        """The room at ``level``; None when the fixed tasks alone overflow a host there."""
        y = self.yields(level)
        inst = self.instance
        if isinstance(y, float):
            need = y * self.pool_need
        else:
            per_task = y[inst.task_job] if not len(self.fixed) else y[inst.task_job[self.pool]]
            need = per_task[:, None] * self.pool_need if self.vector else per_task * self.pool_need
        load = self.fixed_load_at(level)
        fluid = self.capacity
        if load is not None:
            fluid = self.capacity - load
            if (fluid < -FIT_TOLERANCE).any():  # the fixed tasks alone miss this level
                return None
            fluid = np.maximum(fluid, 0.0)
        if self.cordoned is not None:
            fluid = np.where(self.cordoned[:, None] if self.vector else self.cordoned, -1.0, fluid)
        return Room(fluid, self.memory, need)

    def hosts(self, placed: np.ndarray) -> np.ndarray:
        """Hosts of every task: the fixed tasks' own, ``placed`` for the pool."""
        if not len(self.fixed):
            return placed
        hosts = self.fixed_at.copy()
        hosts[self.pool] = placed
        return hosts

    def probe(self, variant: str = "mcb8", backend: str | None = None) -> Probe:
        """The probe (module docstring): at a level, hosts for every task, or None.  ``variant``: the MCB list
        order; ``backend``: the 2-D kernel (``c`` or ``python``; the vector kernel is C when built)."""
        if variant not in VARIANTS:
            raise InputError(f"variant: unknown MCB variant {variant!r} (known: {', '.join(VARIANTS)})")
        var = VARIANTS[variant]
        kernel = KERNELS[kernel_backend(backend)]
        rules, mem = self.rules, self.pool_mem

        def probe(level: float) -> np.ndarray | None:
            room = self.at(level)
            if room is None:
                return None
            if self.vector:
                placed = pack_vector(vector_lists(variant, np.column_stack((room.need, mem))),
                                     np.column_stack((room.fluid, room.memory)), rules)
            else:
                placed = kernel(sorted_lists(var, room.need, mem), room.fluid, room.memory, rules)
            return None if placed is None else self.hosts(placed)

        return probe


def residual_probe(instance: Instance, fixed_hosts: np.ndarray | None = None, variant: str = "mcb8",
                   rho: np.ndarray | None = None, backend: str | None = None) -> Probe:
    """The probe (module docstring) of :class:`ResidualRoom` ``(instance, fixed_hosts, rho)``."""
    return ResidualRoom(instance, fixed_hosts, rho).probe(variant, backend)


# --- the search --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Search:
    hosts: np.ndarray | None  # placement of the highest successful probe, or None
    level: float | None  # that probe's level (uniform: its yield; the placement's own can be higher)
    bound: float | None  # Y_LP (uniform) or L_LP
    probes: int
    gap: float  # hi - lo when the search stopped (< precision unless the bound was None)
    backend: str  # the kernel: "c" or "python" (2-D), "vector"


def search(instance: Instance, variant: str, rates: np.ndarray | None = None, precision: float = SEARCH_PRECISION,
           backend: str | None = None) -> Search:
    """Binary search on the level in ``(0, bound]``, first probe ``bound / 2`` (section 3.4, with rates).

    ``rates`` (one per job; default all 1: the minimum yield, bounded by ``Y_LP``) are normalised so the
    largest is 1 and bounded by ``L_LP`` (:func:`level_bound`).  Pinned tasks are the probe's fixed tasks.
    """
    if variant not in VARIANTS:
        raise InputError(f"variant: unknown MCB variant {variant!r} (known: {', '.join(VARIANTS)})")
    if not precision > 0.0:
        raise InputError(f"precision: {precision!r} must be above 0")
    name = "vector" if instance.has_extra_resources else kernel_backend(backend)
    rho = None if rates is None else normalised_rates(rates)
    bound = lp_bound(instance) if _uniform(rho) else level_bound(instance, rho)  # type: ignore[arg-type]
    if bound is None:  # memory does not fit even fractionally: no probe can succeed
        return Search(None, None, None, 0, 0.0, name)
    # Over (0, bound], first probe bound / 2; at least one probe, even when the bound itself is below the
    # precision (a huge, CPU-starved instance), which otherwise would be declared infeasible without a try.
    s = bisect_yield(residual_probe(instance, None, variant, rho, backend), 0.0, bound, precision)
    return Search(s.found, s.y, bound, s.probes, s.gap, name)


def mcb_placer(variant: str) -> Placer:
    """MCB ``variant`` as a registry placer: :func:`search` for the minimum yield."""

    def place(instance: Instance, options: SolveOptions) -> Placement:
        r = search(instance, variant, None, options.precision)
        detail: dict[str, object] = {"backend": r.backend, "probes": r.probes, "probe_yield": r.level,
                                     "search_gap": r.gap, "lp_bound": r.bound}
        return Placement(hosts=r.hosts, detail=detail)

    place.__name__ = place.__qualname__ = f"place_{variant}"
    place.__doc__ = f"{variant.upper()} (section 3.4): lists sorted by {VARIANTS[variant].summary}."
    return place
