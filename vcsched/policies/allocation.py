"""What a sharing policy is, what it returns, and the knobs it reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vcsched.model import Allocation, Instance


@dataclass(frozen=True)
class PolicyOptions:
    """Knobs shared by all policies; each reads the ones it understands.

    ``alpha``: the exponent of ``alpha-fair`` (required there, refused elsewhere).
    ``epsilon``: H-DRF's progressive-filling step, in dominant share.
    """

    alpha: float | None = None
    epsilon: float = 1e-4


@dataclass(frozen=True)
class PolicyAllocation:
    """The yields a policy gives a fixed placement, and what they mean per resource.

    * ``yields[j]``: job j's yield, the same for all its VMs;
    * ``vm_share[j][r]``: what each VM of job j gets of fluid resource
      ``resources[r]`` (= ``yields[j] * need``), in fractions of the reference host;
    * ``dominant_share[j]`` and ``dominant_pool[j]``: j's dominant share at
      its yield and where it is taken — a resource name for cluster shares, a
      ``host:resource`` pair for ``drf-pools`` (see :mod:`vcsched.policies.shares`);
    * ``detail``: policy-specific numbers (levels, duals, KKT residuals, steps).
    """

    policy: str
    hosts: tuple[int, ...]
    yields: tuple[float, ...]
    resources: tuple[str, ...]
    vm_share: tuple[tuple[float, ...], ...]
    dominant_share: tuple[float, ...]
    dominant_pool: tuple[str, ...]
    runtime_s: float = 0.0
    detail: dict[str, object] = field(default_factory=dict, compare=False)

    def yield_of(self, instance: Instance) -> dict[str, float]:
        return {job.name: y for job, y in zip(instance.jobs, self.yields, strict=True)}

    def per_vm(self, instance: Instance) -> np.ndarray:
        """Allocation of every VM (task) and fluid resource: ``n_tasks x len(resources)``."""
        return np.asarray(self.vm_share, dtype=float).reshape(instance.n_jobs, len(self.resources))[
            instance.task_job]

    def allocation(self, instance: Instance) -> Allocation:
        """The CPU view (:class:`Allocation`) that the placement solvers' code paths read."""
        return Allocation(hosts=self.hosts,
                          cpu=tuple(float(y) * j.cpu_need for y, j in zip(self.yields, instance.jobs, strict=True)))


@dataclass(frozen=True)
class PolicyResult:
    """What a policy function returns: yields, and optionally its own dominant shares and details."""

    yields: np.ndarray
    detail: dict[str, object] = field(default_factory=dict)
    pool_shares: bool = False  # True: report per-(host, resource) dominant shares (drf-pools)


PolicyFn = Callable[[Instance, np.ndarray, PolicyOptions], PolicyResult]


@dataclass(frozen=True)
class Policy:
    """A registry entry (:mod:`vcsched.policies.registry`): a name, the function, one line, whether it takes alpha."""

    name: str
    fn: PolicyFn
    summary: str
    uses_alpha: bool = False
