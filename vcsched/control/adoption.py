"""Adopting running domains into vcsched, and releasing managed VMs: ``vcsched adopt`` and ``vcsched release``.

Pure: takes the cluster file, the live inventory and what the hypervisor read of each domain (its XML, the
devices in it vcsched cannot migrate); returns a plan (a value) or a refusal.  docs/introducing.md tells the
operator's side.

**Adopting** a domain makes it a managed VM where it runs, as if ``place`` had created it there: its
metadata (virtual cluster, CPU need, memory, vCPUs, the virtual cluster's floor and rules) is written into
it, it is capped, and its definition is recorded (a create step whose boot is the domain's own XML, so
``recover`` and the controller can define it again on another host).  The caps are the whole cluster's
yields for the placement as it stands with the domain counted as managed (:func:`vcsched.yields.allocate`
on :func:`~vcsched.control.admission.model_hosts`, as admission computes them: the default ``yield``
policy; a controller under another policy re-balances them at its next interval), so the other managed
VMs' caps are re-set too where they change.  Nothing migrates.

What can be adopted, checked before anything (each failure names the domain and the reason):

* bad input (exit 2): a name no host of the cluster file lists (a domain on a host outside the cluster file
  is unknown to vcsched: add the host first), a name vcsched cannot carry, a ``--need`` above its vCPUs;
* refused (exit 1): a domain already managed, one that is not running, one in doubt, one with a device
  vcsched cannot migrate (:func:`hypervisor.devices.unmigratable_devices`: passthrough, host directories,
  ...), one on a host that cannot cap CPU, and an adoption that would put a virtual cluster below its floor.

**Releasing** removes a managed VM's cap and metadata and deletes its record: it keeps running, unmanaged,
and its CPU is then reserved on its host like any unmanaged domain's (:mod:`vcsched.control.unmanaged`).
Nothing else changes: the others' caps are re-set by the next ``adapt`` or controller interval.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from vcsched.caps import min_cap, realisable_cap, same_cap
from vcsched.control.admission import current_caps, existing_jobs, floors_missed, model_hosts
from vcsched.control.failover import has_disk
from vcsched.control.status import predicted_yield
from vcsched.errors import InputError, VcschedError
from vcsched.formats.cluster import Cluster
from vcsched.formats.fields import check_name
from vcsched.inventory import Inventory, VmMeta, VmState, snapshot_hash
from vcsched.model import Instance
from vcsched.plans.ordering import order_steps
from vcsched.plans.plan import Plan, VmPrediction
from vcsched.plans.steps import AdoptStep, Boot, CreateStep, ReleaseStep, SetCapStep, Step
from vcsched.units import CAP_TOLERANCE, YIELD_TOLERANCE
from vcsched.yields import allocate


class Refused(VcschedError):
    """A well-formed adoption or release vcsched will not carry out (exit 1), with the reason."""

    exit_code = 1


@dataclass(frozen=True)
class Domain:
    """What the hypervisor read of one domain to adopt: its XML (what is recorded) and what in it vcsched
    cannot migrate (:func:`hypervisor.devices.unmigratable_devices`)."""

    xml: str
    unmigratable: tuple[str, ...] = ()


def _find(inventory: Inventory, name: str, cluster: Cluster) -> VmState:
    try:
        check_name("DOMAIN", name)
    except InputError:
        raise InputError(f"DOMAIN: {name!r} is not a name vcsched can manage (letters, digits, '_', '.', '-'; "
                         "at most 63)") from None
    found = [v for v in inventory.vms if v.name == name]
    if not found:
        down = [h.name for h in inventory.down_hosts()]
        also = f"; hosts down, their domains unknown: {', '.join(down)}" if down else ""
        raise InputError(f"DOMAIN: no domain {name!r} on the hosts of cluster {cluster.name!r} "
                         f"({', '.join(cluster.host_names)}); a domain on a host outside the cluster file cannot be "
                         f"adopted: add its host first{also}")
    return found[0]


def _refusal(v: VmState, domain: Domain | None, inventory: Inventory) -> str | None:
    """Why ``v`` cannot be adopted, or None."""
    if v.in_doubt:
        return f"{v.name}: in doubt (a copy on more than one host): `vcsched repair` settles it first"
    if v.meta is not None:
        return f"{v.name}: already managed by vcsched (virtual cluster {v.meta.cluster!r}, on {v.host})"
    if not v.active:
        return f"{v.name}: not running on {v.host}: vcsched adopts running domains (start it first)"
    if domain is not None and domain.unmigratable:
        return (f"{v.name}: has {'; '.join(domain.unmigratable)}: vcsched could not migrate it or restart it on "
                "another host")
    why = inventory.host(v.host).cap_problem("cpu")
    if why is not None:
        return f"{v.name}: host {v.host} cannot cap CPU ({why})"
    return None


def _floor_of(inventory: Inventory, vc: str, min_yield: float | None) -> tuple[VmMeta | None, float | None]:
    """An existing virtual cluster's metadata (the first VM's) and the floor the adopted VMs carry."""
    members = [v for v in inventory.managed() if v.meta is not None and v.meta.cluster == vc]
    if not members:
        return None, min_yield
    meta = members[0].meta
    assert meta is not None
    if min_yield is not None and (meta.min_yield is None or abs(meta.min_yield - min_yield) > YIELD_TOLERANCE):
        raise InputError(f"--min-yield: virtual cluster {vc!r} was admitted with min_yield {meta.min_yield}; "
                         f"{min_yield:g} differs (leave --min-yield out to keep its floor)")
    return meta, meta.min_yield


def plan_adoption(cluster: Cluster, inventory: Inventory, names: Sequence[str], vc: str, *,
                  need: float | None = None, min_yield: float | None = None,
                  domains: Mapping[str, Domain] | None = None) -> Plan:
    """The plan that adopts ``names`` into virtual cluster ``vc`` (module docstring); raises :class:`InputError`
    for bad input and :class:`Refused` for what vcsched will not manage, before anything is planned."""
    domains = domains or {}
    if not names:
        raise InputError("DOMAIN: name at least one domain to adopt")
    if len(set(names)) != len(names):
        raise InputError(f"DOMAIN: {sorted({n for n in names if names.count(n) > 1})[0]!r} is named twice")
    check_name("--vc", vc)
    if vc in cluster.host_names:
        raise InputError(f"--vc: {vc!r} is also a host name in cluster {cluster.name!r}")
    if inventory.vm(vc) is not None:
        raise InputError(f"--vc: {vc!r} is already a VM's name; virtual cluster and VM names must differ")
    if need is not None and not (math.isfinite(need) and need > 0):
        raise InputError(f"--need: {need!r} is not a number of cores above 0")
    if min_yield is not None and not (math.isfinite(min_yield) and 0 <= min_yield <= 1):
        raise InputError(f"--min-yield: {min_yield!r} is not in [0, 1]")
    found = [_find(inventory, n, cluster) for n in names]
    for v in found:
        if need is not None and need > v.vcpus + CAP_TOLERANCE:
            raise InputError(f"--need: {need:g} cores is more than {v.name}'s {v.vcpus} vCPUs can use")
        if v.name in inventory.clusters():
            raise InputError(f"DOMAIN: {v.name!r} is also a virtual cluster's name; VM and virtual cluster names "
                             "must differ")
    for v in found:
        why = _refusal(v, domains.get(v.name), inventory)
        if why is not None:
            raise Refused(why)
    like, floor = _floor_of(inventory, vc, min_yield)
    metas = {v.name: VmMeta(vc, need if need is not None else v.reserved, v.memory_bytes, v.vcpus, floor,
                            weight=like.weight if like else 1.0, tenant=like.tenant if like else None,
                            spread=like.spread if like else None, together=like.together if like else None)
             for v in found}
    after = Inventory(inventory.cluster, inventory.hosts,
                      tuple(replace(v, meta=metas[v.name]) if v.name in metas else v for v in inventory.vms),
                      inventory.in_doubt)
    up = after.up()
    existing = existing_jobs(up)
    instance = Instance(model_hosts(up, cordoned=cluster.cordoned), existing.jobs)
    allocation = allocate(instance, np.asarray(existing.hosts, dtype=np.int64))
    yields = allocation.yields(instance)
    per_vm: dict[str, VmPrediction] = {}
    steps: list[Step] = []
    n_ref = up.reference_cores
    for t, v in enumerate(existing.vms):
        assert v.meta is not None
        j = int(instance.task_job[t])
        cap = realisable_cap(allocation.cpu[j] * n_ref, v.vcpus)
        per_vm[v.name] = VmPrediction(v.host, v.meta.cluster, v.meta.cpu_need_cores, cap, float(yields[j]))
        if v.name in metas:
            if cap < min_cap(v.vcpus):
                raise Refused(f"{v.name}: would get a cap of {cap:g} cores, below the smallest cap of a "
                              f"{v.vcpus}-vCPU VM; host {v.host} has no CPU left for it")
            steps.append(AdoptStep(_definition(v, metas[v.name], cap, domains.get(v.name))))
        elif v.cap_cores is None or not same_cap(v.cap_cores, cap, v.vcpus):
            steps.append(SetCapStep(v.name, v.host, cap))
    below = floors_missed(existing.vms, {name: p.yield_ for name, p in per_vm.items()})
    if below:
        name, got, want = below[0]
        raise Refused(f"virtual cluster {name!r} would get a yield of {got:.4f}, below the min_yield {want:g} it "
                      "was admitted with")
    # From the caps the hosts hold now (the domains still uncapped and unmanaged: not among them).
    ordered = order_steps(steps, current_caps(inventory.up()), {h.name: float(h.cores) for h in up.hosts})
    ys = [p.yield_ for p in per_vm.values()]
    return Plan("adopt", cluster.name, snapshot_hash(inventory, exclude=frozenset(metas)), min(ys),
                sum(ys) / len(ys), per_vm, ordered)


def _definition(v: VmState, meta: VmMeta, cap: float, domain: Domain | None) -> CreateStep:
    """What is recorded of an adopted domain: a create step of its own XML (module docstring)."""
    xml = domain.xml if domain is not None else ""
    kind = "qemu"
    if xml:
        kind = ET.fromstring(xml).get("type", "qemu")
    return CreateStep(v.name, v.host, meta.cluster, v.vcpus, v.memory_bytes, meta.cpu_need_cores, cap,
                      Boot("domain", xml=xml, domain_type=kind), meta.min_yield, weight=meta.weight,
                      tenant=meta.tenant, spread=meta.spread, together=meta.together)


def plan_release(cluster: Cluster, inventory: Inventory, names: Sequence[str]) -> Plan:
    """The plan that releases managed VMs ``names`` (module docstring): one release step each."""
    if not names:
        raise InputError("VM: name at least one managed VM to release")
    steps: list[Step] = []
    for name in names:
        v = inventory.vm(name)
        if v is None:
            raise InputError(f"VM: no VM {name!r} on the hosts of cluster {cluster.name!r} "
                             f"({', '.join(cluster.host_names)})")
        if v.in_doubt:
            raise Refused(f"{name}: in doubt (a copy on more than one host): `vcsched repair` settles it first")
        if v.meta is None:
            raise Refused(f"{name}: not managed by vcsched (on {v.host}): nothing to release")
        steps.append(ReleaseStep(v.name, v.host, v.meta.cluster))
    # The managed VMs that stay keep their caps: their yields now (none left: nobody is below its need, 1).
    ys = [y for v in inventory.managed() if v.name not in names and (y := predicted_yield(v)) is not None]
    return Plan("release", cluster.name, snapshot_hash(inventory, exclude=frozenset(names)), min(ys, default=1.0),
                sum(ys) / len(ys) if ys else 1.0, {}, tuple(steps))


def adoption_report(cluster: Cluster, plan: Plan) -> list[dict[str, object]]:
    """What the dry run says of each domain: what is recorded and capped, whether it can migrate (a refusal
    otherwise) and whether ``recover`` could restart it on another host (its disks must be on storage the
    others share, the cluster file's ``storage``)."""
    out: list[dict[str, object]] = []
    for s in plan.steps:
        if not isinstance(s, AdoptStep):
            continue
        d = s.definition
        unshared = [h for h in cluster.host_names if h != d.host and not cluster.shares_storage(d.host, h)]
        restart = ("yes: no disk" if not has_disk(d) else
                   f"no: its disks are on {d.host}'s storage ({cluster.host(d.host).storage_name!r}), which "
                   f"{', '.join(unshared)} do not share" if unshared else "yes: its disks are on shared storage")
        out.append({"vm": d.vm, "host": d.host, "virtual_cluster": d.cluster, "vcpus": d.vcpus,
                    "memory_bytes": d.memory_bytes, "cpu_need_cores": d.cpu_need_cores, "cap_cores": d.cap_cores,
                    "min_yield": d.min_yield, "migrate": "yes: no device vcsched cannot migrate",
                    "restart": restart})
    return out
