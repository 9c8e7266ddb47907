"""What arrives: the hosts, the classes of virtual clusters (VCs) and their work, and the load they make.

A **VC class** ``k`` has ``vms`` identical VMs, each with rigid memory and a
per-VM need of every fluid resource (CPU and extra ones, in fractions of the
reference host, as in :mod:`vcsched.model`).  VCs of the class arrive as a
Poisson process of rate ``rate`` (or at the times of a trace file,
:mod:`vcsched.simulate.trace`); ``permanent`` of them are there from time 0
and never leave (Bonald & Roberts' §3.4 test job).  Each brings an amount of
**work** ``W`` drawn from the class's distribution, in units of *time at full
speed*: a VC at yield ``y`` gets ``y × need`` of every fluid resource and
progresses at rate ``y`` (Bonald & Roberts' fluid model, §3.1, with ``φ_k μ_k``
the completion rate).

**Phases** (for altruism, :mod:`vcsched.simulate.altruism`): the work is a
sequence of phases separated by barriers; a phase has one or more **parts**
that run at the same time on every VM of the VC, each with its own needs and
its own share of ``W``.  The phase ends when its last part ends.  Under a fair
policy every running part of a VC moves at the VC's one yield and the VC's
need is the sum of its running parts' needs; a part that is not on the
phase's critical path can be slowed down without delaying the VC, which is
where CARBYNE's leftover comes from ("Altruistic Scheduling in Multi-Resource
Clusters", §3.3).  A class without phases has one phase of one part.

**Load and the capacity region** (Bonald & Roberts, §3.2, eq. 10): the load
of fluid resource ``r`` is ``Σ_k λ_k E[W_k] k_k need_kr / C_r``, with ``C_r`` the
cluster's total; the system is stable only if every load is below 1, for every
policy that is Pareto-efficient.  With several hosts that is necessary, not
sufficient (a VC's VMs cannot be split across hosts' leftovers at will).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vcsched.errors import InputError
from vcsched.formats.fields import check_count, check_fields, check_list, check_name, check_number, check_string
from vcsched.model import CPU, Tenant
from vcsched.units import MEMORY_TOLERANCE
from vcsched.validate import check_unique

WORK_DISTRIBUTIONS = ("exp", "det", "erlang")


@dataclass(frozen=True)
class HostSpec:
    """A host: CPU and memory (reference-host units) and extra fluid capacities, ``count`` of them alike."""

    name: str
    cpu: float = 1.0
    memory: float = 1.0
    capacity: tuple[tuple[str, float], ...] = ()
    count: int = 1

    def capacity_of(self, resource: str) -> float:
        return self.cpu if resource == CPU else dict(self.capacity).get(resource, 0.0)


@dataclass(frozen=True)
class Part:
    """Work running on every VM of a VC at the same time as the phase's other parts."""

    needs: tuple[tuple[str, float], ...]  # per VM, fraction of the reference host; cpu included by name
    fraction: float  # of the VC's work W


@dataclass(frozen=True)
class Phase:
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Work:
    """The work distribution, in time at full speed: exponential, deterministic or Erlang-``shape``."""

    mean: float = 1.0
    dist: str = "exp"
    shape: int = 1

    def draw(self, rng: np.random.Generator, n: int | None = None) -> Any:
        if self.dist == "det":
            return self.mean if n is None else np.full(n, self.mean)
        k = self.shape if self.dist == "erlang" else 1
        return rng.gamma(k, self.mean / k, size=n)


@dataclass(frozen=True)
class VCClass:
    name: str
    rate: float
    phases: tuple[Phase, ...]
    vms: int = 1
    memory: float = 0.0
    work: Work = field(default_factory=Work)
    weight: float = 1.0
    tenant: str | None = None
    permanent: int = 0

    def resources(self) -> set[str]:
        return {r for ph in self.phases for p in ph.parts for r, v in p.needs if v > 0}

    def demand(self, resources: Sequence[str]) -> np.ndarray:
        """Expected resource-time one VC consumes at full speed: ``E[W] k Σ_parts fraction × need``."""
        out = np.zeros(len(resources))
        index = {r: i for i, r in enumerate(resources)}
        for ph in self.phases:
            for p in ph.parts:
                for r, v in p.needs:
                    out[index[r]] += self.work.mean * self.vms * p.fraction * v
        return out


@dataclass(frozen=True)
class Workload:
    """Hosts, VC classes and (for H-DRF) the tenant tree.  Built by :func:`workload_from_dict` or in Python."""

    hosts: tuple[HostSpec, ...]
    classes: tuple[VCClass, ...]
    tenants: tuple[Tenant, ...] = ()

    @property
    def resources(self) -> tuple[str, ...]:
        """``cpu`` first, then every extra resource a host or class names, sorted (as ``Instance.resources``)."""
        extra = {r for h in self.hosts for r, _ in h.capacity} | {r for c in self.classes for r in c.resources()}
        return (CPU, *sorted(extra - {CPU}))

    @property
    def host_list(self) -> tuple[HostSpec, ...]:
        """One entry per host (``count`` expanded), named ``name`` or ``name-i``."""
        out = []
        for h in self.hosts:
            if h.count == 1:
                out.append(h)
            else:
                out.extend(HostSpec(f"{h.name}-{i}", h.cpu, h.memory, h.capacity) for i in range(h.count))
        return tuple(out)

    @property
    def n_hosts(self) -> int:
        return sum(h.count for h in self.hosts)

    def capacity_matrix(self) -> np.ndarray:
        """``hosts × resources`` fluid capacities."""
        res = self.resources
        return np.array([[h.capacity_of(r) for r in res] for h in self.host_list], dtype=float).reshape(
            self.n_hosts, len(res))

    def totals(self) -> np.ndarray:
        return self.capacity_matrix().sum(axis=0)

    def loads(self) -> np.ndarray:
        """Load of every fluid resource (Bonald & Roberts eq. 10's left side), cluster totals."""
        demand = sum((c.rate * c.demand(self.resources) for c in self.classes), np.zeros(len(self.resources)))
        totals = self.totals()
        return np.divide(demand, totals, out=np.zeros_like(demand), where=totals > 0)

    def with_rates(self, rates: Sequence[float]) -> Workload:
        return Workload(self.hosts, tuple(_replace_rate(c, r) for c, r in zip(self.classes, rates, strict=True)),
                        self.tenants)

    def scaled_to_load(self, load: float) -> Workload:
        """The same mix with every rate scaled so that the most loaded resource has load ``load``."""
        check_load("load", load)
        current = float(self.loads().max()) if len(self.classes) else 0.0
        if current <= 0:
            raise InputError("load: the classes have no arrivals to scale (every rate is 0)")
        return self.with_rates([c.rate * load / current for c in self.classes])

    def class_index(self, name: str) -> int:
        for i, c in enumerate(self.classes):
            if c.name == name:
                return i
        raise InputError(f"class: unknown class {name!r} (known: {', '.join(c.name for c in self.classes)})")


def _replace_rate(c: VCClass, rate: float) -> VCClass:
    return VCClass(c.name, rate, c.phases, c.vms, c.memory, c.work, c.weight, c.tenant, c.permanent)


def check_load(where: str, load: float) -> None:
    if not (isinstance(load, int | float) and math.isfinite(load) and load > 0):
        raise InputError(f"{where}: {load!r} must be a number above 0")
    if load >= 1:
        raise InputError(f"{where}: {load:g} is outside the capacity region (Bonald & Roberts eq. 10: every "
                         f"resource's load must be below 1), so the run would never be stable")


def check_stable(workload: Workload) -> None:
    """Refuse a workload whose load reaches 1 on some resource: queues would grow without bound."""
    loads = workload.loads()
    for r, rho in zip(workload.resources, loads, strict=True):
        if rho >= 1:
            raise InputError(f"load: resource {r!r} has load {rho:.4g} >= 1, outside the capacity region "
                             f"(Bonald & Roberts eq. 10: Σ_k ρ_k a_k,{r} < 1 for every resource), so the run "
                             f"would never be stable")


# ---------------------------------------------------------------------------------------------- checks


def validate(workload: Workload) -> Workload:
    """Cross-field checks; returns the workload.  Every failure is one :class:`InputError` line."""
    if not workload.hosts:
        raise InputError("hosts: at least one host is needed")
    if not workload.classes:
        raise InputError("classes: at least one class of virtual clusters is needed")
    check_unique("hosts", [h.name for h in workload.hosts])
    check_unique("classes", [c.name for c in workload.classes])
    tenants = {t.name for t in workload.tenants}
    totals = dict(zip(workload.resources, workload.totals(), strict=True))
    max_mem = max(h.memory for h in workload.hosts)
    for i, c in enumerate(workload.classes):
        where = f"classes[{i}]"
        if c.rate < 0 or not math.isfinite(c.rate):
            raise InputError(f"{where}.rate: {c.rate!r} must be a finite number at least 0")
        if not c.phases or any(not ph.parts for ph in c.phases):
            raise InputError(f"{where}: a class needs at least one phase with at least one part")
        fractions = [p.fraction for ph in c.phases for p in ph.parts]
        if abs(sum(fractions) - 1) > 1e-9:
            raise InputError(f"{where}: the parts' work fractions add up to {sum(fractions):g}, not 1")
        for j, ph in enumerate(c.phases):
            total: dict[str, float] = {}
            for p in ph.parts:
                for r, v in p.needs:
                    total[r] = total.get(r, 0.0) + v
            if not any(v > 0 for v in total.values()):
                raise InputError(f"{where}.phases[{j}]: needs nothing (every part's needs are 0)")
            for r, v in total.items():
                if v > 1 + 1e-12:
                    raise InputError(f"{where}.phases[{j}]: the parts need {v:g} of {r!r} per VM together, "
                                     f"more than a reference host (1)")
                if v > 0 and totals.get(r, 0.0) <= 0:
                    raise InputError(f"{where}.phases[{j}]: needs {r!r}, which no host has")
        if c.memory > max_mem + MEMORY_TOLERANCE:
            raise InputError(f"{where}.memory: {c.memory:g} per VM exceeds the largest host ({max_mem:g})")
        if c.vms * c.memory > sum(h.memory * h.count for h in workload.hosts) + MEMORY_TOLERANCE:
            raise InputError(f"{where}: {c.vms} VMs of memory {c.memory:g} exceed the cluster's memory")
        if c.tenant is not None and c.tenant not in tenants:
            raise InputError(f"{where}.tenant: unknown tenant {c.tenant!r}")
    if sum(c.rate for c in workload.classes) <= 0 and sum(c.permanent for c in workload.classes) == 0:
        raise InputError("classes: every rate is 0 and no VC is permanent: nothing would ever run")
    return workload


# ---------------------------------------------------------------------------------------------- the file format

HOST_FIELDS = {"name", "cpu", "memory", "capacity", "count"}
CLASS_FIELDS = {"name", "rate", "vms", "memory", "needs", "phases", "work", "weight", "tenant", "permanent"}
WORK_FIELDS = {"mean", "dist", "shape"}
PART_FIELDS = {"needs", "fraction"}
TENANT_FIELDS = {"name", "weight", "parent"}


def _amounts(where: str, raw: Any, *, high: float | None) -> tuple[tuple[str, float], ...]:
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected an object of resource amounts, got {type(raw).__name__}")
    out = []
    for name, value in raw.items():
        check_name(f"{where}.{name}", name)
        if name == "memory":
            raise InputError(f"{where}.memory: memory is rigid, not a fluid resource; use the memory field")
        out.append((name, check_number(f"{where}.{name}", value, low=0.0, low_open=False, high=high)))
    return tuple(sorted(out))


def _work(where: str, raw: Any) -> Work:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return Work(check_number(where, raw))
    obj = check_fields(where, raw, WORK_FIELDS, set())
    dist = obj.get("dist", "exp")
    if dist not in WORK_DISTRIBUTIONS:
        raise InputError(f"{where}.dist: {dist!r} is not one of {', '.join(WORK_DISTRIBUTIONS)}")
    shape = check_count(f"{where}.shape", obj.get("shape", 1))
    if shape != 1 and dist != "erlang":
        raise InputError(f"{where}.shape: only an erlang distribution has a shape")
    return Work(check_number(f"{where}.mean", obj.get("mean", 1.0)), dist, shape)


def _phases(where: str, obj: Mapping[str, Any]) -> tuple[Phase, ...]:
    if "phases" in obj and "needs" in obj:
        raise InputError(f"{where}: give either needs (one phase) or phases, not both")
    if "phases" not in obj:
        if "needs" not in obj:
            raise InputError(f"{where}: missing field 'needs' (or 'phases')")
        return (Phase((Part(_amounts(f"{where}.needs", obj["needs"], high=1.0), 1.0),)),)
    phases = []
    for j, raw_phase in enumerate(check_list(f"{where}.phases", obj["phases"])):
        parts = []
        for b, raw_part in enumerate(check_list(f"{where}.phases[{j}]", raw_phase)):
            w = f"{where}.phases[{j}][{b}]"
            p = check_fields(w, raw_part, PART_FIELDS, PART_FIELDS)
            parts.append(Part(_amounts(f"{w}.needs", p["needs"], high=1.0),
                              check_number(f"{w}.fraction", p["fraction"])))
        phases.append(Phase(tuple(parts)))
    return tuple(phases)


def workload_from_dict(raw: Any) -> Workload:
    """Validate a decoded workload document (see docs/simulate.md for the format)."""
    obj = check_fields("workload", raw, {"hosts", "classes", "tenants"}, {"hosts", "classes"})
    hosts = []
    for i, h in enumerate(check_list("hosts", obj["hosts"])):
        where = f"hosts[{i}]"
        hobj = check_fields(where, h, HOST_FIELDS, {"name"})
        hosts.append(HostSpec(
            name=check_name(f"{where}.name", hobj["name"]),
            cpu=check_number(f"{where}.cpu", hobj.get("cpu", 1.0), low=0.0, low_open=False),
            memory=check_number(f"{where}.memory", hobj.get("memory", 1.0), low=0.0, low_open=False),
            capacity=_amounts(f"{where}.capacity", hobj.get("capacity", {}), high=None),
            count=check_count(f"{where}.count", hobj.get("count", 1)),
        ))
    classes = []
    for i, c in enumerate(check_list("classes", obj["classes"])):
        where = f"classes[{i}]"
        cobj = check_fields(where, c, CLASS_FIELDS, {"name"})
        tenant = cobj.get("tenant")
        permanent = cobj.get("permanent", 0)
        if isinstance(permanent, bool) or not isinstance(permanent, int) or permanent < 0:
            raise InputError(f"{where}.permanent: expected a whole number >= 0, got {permanent!r}")
        classes.append(VCClass(
            name=check_name(f"{where}.name", cobj["name"]),
            rate=check_number(f"{where}.rate", cobj.get("rate", 0.0), low=0.0, low_open=False),
            phases=_phases(where, cobj),
            vms=check_count(f"{where}.vms", cobj.get("vms", 1)),
            memory=check_number(f"{where}.memory", cobj.get("memory", 0.0), low=0.0, low_open=False, high=1.0),
            work=_work(f"{where}.work", cobj.get("work", 1.0)),
            weight=check_number(f"{where}.weight", cobj.get("weight", 1.0)),
            tenant=None if tenant is None else check_string(f"{where}.tenant", tenant),
            permanent=permanent,
        ))
    tenants = []
    for i, t in enumerate(check_list("tenants", obj.get("tenants", []))):
        where = f"tenants[{i}]"
        tobj = check_fields(where, t, TENANT_FIELDS, {"name"})
        parent = tobj.get("parent")
        tenants.append(Tenant(check_name(f"{where}.name", tobj["name"]),
                              check_number(f"{where}.weight", tobj.get("weight", 1.0)),
                              None if parent is None else check_string(f"{where}.parent", parent)))
    return validate(Workload(tuple(hosts), tuple(classes), tuple(tenants)))
