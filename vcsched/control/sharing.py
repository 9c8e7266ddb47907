"""Sharing policies on a live cluster: extra fluid resources, weights and tenants in the whole-cluster instance.

The multi-resource model (docs/policies.md) meets the live cluster here:

* **Units.**  Like CPU (``n_ref`` = the most cores of any host), each extra
  resource has a reference: the largest capacity any host of the cluster file
  declares (``disk_bps``, ``net_bps``, bytes per second).  A host's capacity
  is its declared rate, less what its unmanaged domains were measured to use
  (docs/introducing.md), over the reference; a host that declares none has
  capacity 0 there (nothing needing it is placed on it).  A VM needing
  ``disk_bps`` bytes/s alone needs ``disk_bps / reference`` of the resource.
* **Which resources.**  Only the resources some VM (running or requested)
  needs enter the instance, so a cluster whose VMs need CPU alone is planned
  exactly as before, whatever its hosts declare.
* **The policy in force.**  ``--policy`` if given, else the cluster file's
  ``policy``, else ``yield`` (vcsched's own objective).  ``yield`` with no
  extra resource needed is today's admission and adaptation, unchanged.
* **Floors stay promises in yield.**  A ``min_yield`` (cluster, request, or
  recorded in a VM's metadata) is checked against the yields the policy
  gives, whatever the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import numpy as np

from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.inventory import Inventory, VmMeta, VmState
from vcsched.model import Amounts
from vcsched.policies.allocation import PolicyOptions
from vcsched.policies.registry import check_options, get

#: The extra fluid resources a live cluster knows, and the cluster-file / request / metadata field of each.
IO_FIELDS = {"disk": "disk_bps", "net": "net_bps"}


@dataclass(frozen=True)
class Sharing:
    """The policy in force and its options."""

    policy: str
    options: PolicyOptions

    @property
    def is_default(self) -> bool:
        """``yield``: vcsched's own objective, today's code paths when no extra resource is needed."""
        return self.policy == "yield"


def sharing_for(cluster: Cluster, policy: str | None = None, alpha: float | None = None) -> Sharing:
    """The policy in force (module docstring); an unknown policy or a misplaced alpha is bad input (exit 2)."""
    name = policy if policy is not None else (cluster.policy or "yield")
    if alpha is None and policy is None:
        alpha = cluster.alpha
    pol = get(name)
    options = PolicyOptions(alpha=alpha)
    check_options(pol, options)
    return Sharing(pol.name, options)


def needed_resources(metas: Iterable[VmMeta], extra: Mapping[str, int] | None = None) -> tuple[str, ...]:
    """The extra resources some VM (or the request, ``extra``) needs, sorted."""
    needed = {r for m in metas for r in m.io_needs()} | set(extra or {})
    return tuple(sorted(needed))


def references(cluster: Cluster, inventory: Inventory, needed: Iterable[str]) -> dict[str, int]:
    """The reference rate of each needed resource: the largest any host of ``inventory`` declares."""
    refs: dict[str, int] = {}
    names = {h.name for h in inventory.hosts}
    for r in needed:
        key = IO_FIELDS[r]
        declared = [getattr(h, key) for h in cluster.hosts if h.name in names and getattr(h, key) is not None]
        if not declared:
            raise InputError(f"{key}: VMs need {r} but no host of cluster {cluster.name!r} declares {key} "
                             f"(add {key} = \"...\" to its [[hosts]])")
        refs[r] = max(declared)
    return refs


def host_capacities(cluster: Cluster, inventory: Inventory, refs: Mapping[str, int]) -> dict[str, Amounts]:
    """Each host's extra capacities in model units: its declared rate less its unmanaged domains' measured I/O
    reservation (:meth:`vcsched.inventory.Inventory.unmanaged_io`, never below 0), over the reference;
    undeclared: absent (0).  The reference stays the largest *declared* rate, like ``n_ref`` for CPU."""
    out: dict[str, Amounts] = {}
    for h in inventory.hosts:
        ch = cluster.host(h.name)
        out[h.name] = tuple((r, max(rate - inventory.unmanaged_io(h.name, r), 0.0) / ref)
                            for r, ref in sorted(refs.items())
                            if (rate := getattr(ch, IO_FIELDS[r])) is not None)
    return out


def model_needs(io: Mapping[str, int], refs: Mapping[str, int], who: str) -> Amounts:
    """A VM's extra needs in model units; more than the largest host declares is bad input."""
    out = []
    for r, v in sorted(io.items()):
        key = IO_FIELDS[r]
        if r not in refs:  # references() refuses this first; kept for callers that pass their own refs
            raise InputError(f"{key}: {who} needs {r} but no host declares {key}")
        if v > refs[r]:
            raise InputError(f"{key}: {v} B/s per VM of {who} is more than the largest host declares "
                             f"({refs[r]} B/s)")
        out.append((r, v / refs[r]))
    return tuple(out)


def check_tenant(cluster: Cluster, tenant: str | None, who: str) -> None:
    """A virtual cluster's tenant must be a node of the cluster file's tree."""
    if tenant is None:
        return
    names = [t.name for t in cluster.tenants]
    if tenant not in names:
        raise InputError(f"tenant: {who} names {tenant!r}, which is not in cluster {cluster.name!r}'s [[tenants]] "
                         f"({', '.join(names) or 'none'})")


def check_vms(cluster: Cluster, vms: Iterable[VmState]) -> None:
    """Running VMs' recorded tenants must still be in the tree (the cluster file may have changed)."""
    for v in vms:
        if v.meta is not None:
            check_tenant(cluster, v.meta.tenant, f"virtual cluster {v.meta.cluster!r}")


def io_amounts(yield_: float, io: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """What a VM at ``yield_`` gets of each extra resource, whole bytes/s rounded down."""
    return tuple((r, int(np.floor(yield_ * v))) for r, v in sorted(io.items()))


def io_step_fields(step_class: type, io: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The per-resource caps as keyword arguments of a plan step, for the step fields that exist.

    Enforcing disk and network caps is the hypervisor's business: where the
    step kinds have ``disk_bytes_sec``/``net_bytes_sec`` the plan carries the
    caps; where they do not, the caps are planned, validated and reported in
    the plan's predictions only.
    """
    names = {f.name for f in fields(step_class)}
    return {f"{r}_bytes_sec": v for r, v in io if f"{r}_bytes_sec" in names}
