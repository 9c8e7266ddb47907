"""Plan steps: one frozen dataclass per kind of change vcsched makes to a host, and the table that parses them.

Every step names the VM it acts on and the host it acts on, serialises to
the plan JSON (``to_dict``/``from_dict``, which validates a hand-edited
plan), and says how it changes the caps on each host: CPU (``cap_changes``)
and disk and network (``io_changes``, :mod:`vcsched.iocaps`).  That is all
the ordering (:mod:`vcsched.plans.ordering`) needs to keep every host within
its cores, and within its declared disk and network capacity, at every
prefix of a plan.

``set-cap`` and ``create`` steps may carry ``disk_bytes_sec``,
``disk_iops_sec`` and ``net_bytes_sec`` besides ``cap_cores``; a ``set-cap``
step sets exactly the resources it names (at least one), so a plan file
written before disk and network caps existed loads and means what it meant:
CPU only.  Three class-level flags tell
the snapshot check (:mod:`vcsched.inventory`) what a half-applied
plan may already have changed: ``moves`` (the VM's host), ``removes`` (the
VM itself), ``renews`` (the VM's recorded CPU need); ``owns`` (whether
vcsched manages it: ``adopt`` and ``release``, docs/introducing.md).

How a step is carried out lives on the other side of the data flow, in
:mod:`acting.executor`, which has one runner per ``op``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from vcsched.errors import InputError
from vcsched.formats.fields import (
    MAX_VCPUS,
    check_count,
    check_fields,
    check_fraction,
    check_name,
    check_number,
    check_string,
)
from vcsched.formats.units import check_vm_memory
from vcsched.inventory import VmMeta
from vcsched.iocaps import DISK, NET, IoCaps
from vcsched.units import CAP_TOLERANCE


class Step(Protocol):
    op: ClassVar[str]
    moves: ClassVar[bool]
    removes: ClassVar[bool]
    renews: ClassVar[bool]
    owns: ClassVar[bool]

    @property
    def vm(self) -> str: ...

    @property
    def host(self) -> str:
        """The host the step acts on (for a migration: the destination)."""
        ...

    def to_dict(self) -> dict[str, Any]: ...

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        """``(host, vm, new cap in cores or None = VM leaves the host)`` for every cap this step changes."""
        ...

    def io_changes(self) -> tuple[tuple[str, str, str, float], ...]:
        """``(resource, host, vm, new cap in bytes/s)`` for every disk or network cap this step sets.

        A VM's disk and network caps travel with it: a step that places it on
        a host (``cap_changes``) moves them there, one that takes it off a
        host drops them.
        """
        ...


class _Flags:
    """The defaults of the four flags: a step changes none of host, existence, need or owner unless it says so."""

    moves: ClassVar[bool] = False
    removes: ClassVar[bool] = False
    renews: ClassVar[bool] = False
    owns: ClassVar[bool] = False

    def io_changes(self) -> tuple[tuple[str, str, str, float], ...]:
        return ()


#: The optional disk and network fields of ``set-cap`` and ``create`` steps (whole numbers per second).
IO_FIELDS = frozenset({"disk_bytes_sec", "disk_iops_sec", "net_bytes_sec"})


class _IoFields:
    """``disk_bytes_sec``, ``disk_iops_sec``, ``net_bytes_sec`` of a step, as :class:`IoCaps`."""

    host: str
    vm: str
    disk_bytes_sec: int | None
    disk_iops_sec: int | None
    net_bytes_sec: int | None

    @property
    def io_caps(self) -> IoCaps:
        return IoCaps(self.disk_bytes_sec, self.disk_iops_sec, self.net_bytes_sec)

    def io_changes(self) -> tuple[tuple[str, str, str, float], ...]:
        caps = self.io_caps
        return tuple((r, self.host, self.vm, float(a)) for r in (DISK, NET) if (a := caps.amount(r)) is not None)


def _io_from_dict(where: str, d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _int(f"{where}.{k}", d[k]) if k in d else None for k in sorted(IO_FIELDS)}


def _fields(where: str, d: Any, required: set[str], optional: frozenset[str] | set[str] = frozenset()
            ) -> Mapping[str, Any]:
    return check_fields(where, d, optional, required)


_str = check_string
_num = check_number
_int = check_count


@dataclass(frozen=True)
class Boot:
    """How a created VM boots: ``kernel`` (direct kernel+initrd, the cluster's [guest]),
    ``template`` (a domain XML file the request names), ``image`` (a disk image) or ``domain`` (an adopted
    domain's own XML, held in ``xml``: a restart elsewhere defines it again as it was, like a template)."""

    kind: str
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str = ""
    domain_type: str = "qemu"
    path: str | None = None
    xml: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "kernel":
            return {"kind": "kernel", "kernel": self.kernel, "initrd": self.initrd, "cmdline": self.cmdline,
                    "domain_type": self.domain_type}
        if self.kind == "domain":
            return {"kind": "domain", "xml": self.xml, "domain_type": self.domain_type}
        return {"kind": self.kind, "path": self.path, "domain_type": self.domain_type}

    @staticmethod
    def from_dict(where: str, d: Any) -> Boot:
        if not isinstance(d, Mapping) or d.get("kind") not in ("kernel", "template", "image", "domain"):
            raise InputError(f"{where}.kind: expected 'kernel', 'template', 'image' or 'domain', got "
                             f"{d.get('kind') if isinstance(d, Mapping) else d!r}")
        if d["kind"] == "domain":
            d = _fields(where, d, {"kind", "xml"}, {"domain_type"})
            return Boot("domain", xml=_str(f"{where}.xml", d["xml"]),
                        domain_type=_str(f"{where}.domain_type", d.get("domain_type", "qemu")))
        if d["kind"] == "kernel":
            d = _fields(where, d, {"kind", "kernel", "initrd"}, {"cmdline", "domain_type"})
            return Boot("kernel", _str(f"{where}.kernel", d["kernel"]), _str(f"{where}.initrd", d["initrd"]),
                        str(d.get("cmdline", "")), _str(f"{where}.domain_type", d.get("domain_type", "qemu")))
        d = _fields(where, d, {"kind", "path"}, {"domain_type"})
        return Boot(d["kind"], path=_str(f"{where}.path", d["path"]),
                    domain_type=_str(f"{where}.domain_type", d.get("domain_type", "qemu")))



#: A create step's optional multi-resource fields (the request's, recorded in the VM's metadata).
META_FIELDS = frozenset({"disk_bps", "net_bps", "weight", "tenant", "spread", "together", "pinned", "priority"})


def _meta_from_dict(where: str, d: Mapping[str, Any]) -> dict[str, Any]:
    return {"disk_bps": _int(f"{where}.disk_bps", d["disk_bps"]) if "disk_bps" in d else None,
            "net_bps": _int(f"{where}.net_bps", d["net_bps"]) if "net_bps" in d else None,
            "weight": _num(f"{where}.weight", d["weight"]) if "weight" in d else 1.0,
            "tenant": _str(f"{where}.tenant", d["tenant"]) if "tenant" in d else None,
            "spread": _level(f"{where}.spread", d.get("spread")), "together": _level(f"{where}.together",
                                                                                     d.get("together")),
            "pinned": _bool(f"{where}.pinned", d.get("pinned", False)),
            "priority": _priority(f"{where}.priority", d.get("priority", 0))}


def _priority(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: expected a whole number, got {value!r}")
    return value


def _level(where: str, value: Any) -> str | None:
    if value is None or value in ("required", "preferred"):
        return value
    raise InputError(f"{where}: {value!r} is not \"required\" or \"preferred\"")


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where}: expected true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class CreateStep(_IoFields, _Flags):
    """Create (and start) a managed VM on ``host``, capped from its first instant (CPU, and disk and network
    when given: the domain XML carries ``<iotune>`` and ``<bandwidth>``, so it never runs unlimited on them)."""

    op: ClassVar[str] = "create"
    vm: str
    host: str
    cluster: str
    vcpus: int
    memory_bytes: int
    cpu_need_cores: float
    cap_cores: float
    boot: Boot
    min_yield: float | None = None  # the request's floor, recorded in the VM's metadata
    # The request's multi-resource fields, recorded in the VM's metadata (docs/policies.md); written to the
    # plan only when set, so CPU-only plans read as before.
    disk_bps: int | None = None
    net_bps: int | None = None
    weight: float = 1.0
    tenant: str | None = None
    disk_bytes_sec: int | None = None
    disk_iops_sec: int | None = None
    net_bytes_sec: int | None = None
    spread: str | None = None  # the request's placement rules (docs/rules.md), recorded in the metadata
    together: str | None = None
    pinned: bool = False
    priority: int = 0  # restart order after a host failure (kept in the definitions store, not in libvirt)

    def to_dict(self) -> dict[str, Any]:
        d = {"op": self.op, "vm": self.vm, "host": self.host, "cluster": self.cluster, "vcpus": self.vcpus,
             "memory_bytes": self.memory_bytes, "cpu_need_cores": self.cpu_need_cores,
             "cap_cores": self.cap_cores, "boot": self.boot.to_dict()}
        if self.min_yield is not None:
            d["min_yield"] = self.min_yield
        for k in ("disk_bps", "net_bps", "tenant", "spread", "together"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.pinned:
            d["pinned"] = True
        if self.priority:
            d["priority"] = self.priority
        if self.weight != 1.0:
            d["weight"] = self.weight
        return {**d, **self.io_caps.to_dict()}

    def meta(self) -> VmMeta:
        """The metadata the created VM carries."""
        return VmMeta(self.cluster, self.cpu_need_cores, self.memory_bytes, self.vcpus, self.min_yield,
                      self.disk_bps, self.net_bps, self.weight, self.tenant, self.spread, self.together, self.pinned,
                      priority=self.priority)

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ((self.host, self.vm, self.cap_cores),)

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> CreateStep:
        d = _fields(where, d, {"op", "vm", "host", "cluster", "vcpus", "memory_bytes", "cpu_need_cores",
                               "cap_cores", "boot"}, {"min_yield", *META_FIELDS, *IO_FIELDS})
        step = CreateStep(check_name(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                          check_name(f"{where}.cluster", d["cluster"]), _int(f"{where}.vcpus", d["vcpus"]),
                          _int(f"{where}.memory_bytes", d["memory_bytes"]),
                          _num(f"{where}.cpu_need_cores", d["cpu_need_cores"]),
                          _num(f"{where}.cap_cores", d["cap_cores"]), Boot.from_dict(f"{where}.boot", d["boot"]),
                          check_fraction(f"{where}.min_yield", d["min_yield"]) if "min_yield" in d else None,
                          **_meta_from_dict(where, d), **_io_from_dict(where, d))
        if step.vcpus > MAX_VCPUS:
            raise InputError(f"{where}.vcpus: {step.vcpus} is more than {MAX_VCPUS}")
        check_vm_memory(f"{where}.memory_bytes", step.memory_bytes)
        _check_cap(where, step.cap_cores, step.vcpus)
        return step


@dataclass(frozen=True)
class SetCapStep(_IoFields, _Flags):
    """Change the caps of an existing managed VM (live, and in its persistent config if any).

    Each resource it names is set (CPU ``cap_cores``; ``disk_bytes_sec``,
    ``disk_iops_sec``, ``net_bytes_sec``); the others are left as they are.
    """

    op: ClassVar[str] = "set-cap"
    vm: str
    host: str
    cap_cores: float | None
    disk_bytes_sec: int | None = None
    disk_iops_sec: int | None = None
    net_bytes_sec: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "vm": self.vm, "host": self.host}
        if self.cap_cores is not None:
            d["cap_cores"] = self.cap_cores
        return {**d, **self.io_caps.to_dict()}

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return () if self.cap_cores is None else ((self.host, self.vm, self.cap_cores),)

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> SetCapStep:
        d = _fields(where, d, {"op", "vm", "host"}, {"cap_cores", *IO_FIELDS})
        if "cap_cores" not in d and not IO_FIELDS & set(d):
            raise InputError(f"{where}: a set-cap step sets at least one of cap_cores, "
                             f"{', '.join(sorted(IO_FIELDS))}")
        return SetCapStep(check_name(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                          _num(f"{where}.cap_cores", d["cap_cores"]) if "cap_cores" in d else None,
                          **_io_from_dict(where, d))


@dataclass(frozen=True)
class RemoveStep(_Flags):
    """Stop and undefine a managed VM of a departed virtual cluster.

    ``cluster`` is recorded so the executor can refuse a VM whose metadata
    names another virtual cluster (a reused name must not be destroyed by an
    old plan).  Removals free memory and CPU, so plans put them first.
    """

    op: ClassVar[str] = "remove"
    removes: ClassVar[bool] = True
    vm: str
    host: str
    cluster: str

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "vm": self.vm, "host": self.host, "cluster": self.cluster}

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ((self.host, self.vm, None),)

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> RemoveStep:
        d = _fields(where, d, {"op", "vm", "host", "cluster"})
        return RemoveStep(check_name(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                          check_name(f"{where}.cluster", d["cluster"]))


@dataclass(frozen=True)
class SetNeedStep(_Flags):
    """Record a new CPU need in a managed VM's metadata.

    Needs come from metadata on every run, so a need the operator changed
    (``vcsched adapt --set-need``) must be written back once the plan built on
    it is applied, or the next adaptation would plan with the old one.  It
    changes no cap, so it can go anywhere; plans put it last, on the VM's
    final host.
    """

    op: ClassVar[str] = "set-need"
    renews: ClassVar[bool] = True
    vm: str
    host: str
    cpu_need_cores: float

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "vm": self.vm, "host": self.host, "cpu_need_cores": self.cpu_need_cores}

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ()

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> SetNeedStep:
        d = _fields(where, d, {"op", "vm", "host", "cpu_need_cores"})
        return SetNeedStep(check_name(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                           _num(f"{where}.cpu_need_cores", d["cpu_need_cores"]))



@dataclass(frozen=True)
class MigrateStep(_Flags):
    """Plan step ``{"op": "migrate", "vm", "from", "to", "bytes", "cap_cores"}``: live-migrate a managed VM.

    ``moves = True`` tells the snapshot to leave the VM's host out, so a
    half-applied plan still matches.  ``cap_cores`` is the cap it has on
    arrival (see :func:`vcsched.plans.migration.order_changes`).
    """

    op: ClassVar[str] = "migrate"
    moves: ClassVar[bool] = True
    vm: str
    source: str
    target: str
    bytes: int
    cap_cores: float
    final: str | None = None  # on a relay hop: where the VM goes next (a re-run finding it there skips this hop)
    wave: int | None = None  # consecutive migrations of one wave may run at once (None: one at a time)
    #: It arrives below its cap for now: the destination's cores are held by a VM leaving in the same wave
    #: (a swap between full hosts); a later set-cap step restores it.
    squeezed: bool = False

    @property
    def host(self) -> str:
        return self.target

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "vm": self.vm, "from": self.source, "to": self.target,
                             "bytes": self.bytes, "cap_cores": self.cap_cores}
        if self.final is not None:
            d["final"] = self.final
        if self.wave is not None:
            d["wave"] = self.wave
        if self.squeezed:
            d["squeezed"] = True
        return d

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ((self.source, self.vm, None), (self.target, self.vm, self.cap_cores))

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> MigrateStep:
        d = _fields(where, d, {"op", "vm", "from", "to", "bytes", "cap_cores"}, {"final", "wave", "squeezed"})
        final = _str(f"{where}.final", d["final"]) if "final" in d else None
        wave = _int(f"{where}.wave", d["wave"]) if "wave" in d else None
        squeezed = d.get("squeezed", False)
        if not isinstance(squeezed, bool):
            raise InputError(f"{where}.squeezed: expected true or false, got {squeezed!r}")
        step = MigrateStep(check_name(f"{where}.vm", d["vm"]), _str(f"{where}.from", d["from"]),
                           _str(f"{where}.to", d["to"]), _int(f"{where}.bytes", d["bytes"]),
                           _num(f"{where}.cap_cores", d["cap_cores"]), final, wave, squeezed)
        if step.source == step.target:
            raise InputError(f"{where}.to: {step.target!r} is also the source host")
        return step


@dataclass(frozen=True)
class AdoptStep(_Flags):
    """Bring a running unmanaged domain under management where it runs (docs/introducing.md): write vcsched's
    metadata into it and cap it.  ``definition`` is what vcsched records of it (a create step whose boot is the
    domain's own XML): its metadata fields, its cap and its host, and what a restart elsewhere creates.

    ``owns = True`` tells the snapshot to leave the domain out: a half-applied plan has made it managed."""

    op: ClassVar[str] = "adopt"
    owns: ClassVar[bool] = True
    definition: CreateStep

    @property
    def vm(self) -> str:
        return self.definition.vm

    @property
    def host(self) -> str:
        return self.definition.host

    @property
    def cap_cores(self) -> float:
        return self.definition.cap_cores

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "vm": self.vm, "host": self.host, "definition": self.definition.to_dict()}

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ((self.host, self.vm, self.cap_cores),)

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> AdoptStep:
        d = _fields(where, d, {"op", "vm", "host", "definition"})
        inner = d["definition"]
        if not isinstance(inner, Mapping):
            raise InputError(f"{where}.definition: expected a create step, got {inner!r}")
        definition = CreateStep.from_dict(f"{where}.definition", {**inner, "op": "create"})
        if (definition.vm, definition.host) != (d["vm"], d["host"]):
            raise InputError(f"{where}.definition: names VM {definition.vm!r} on {definition.host!r}, the step "
                             f"{d['vm']!r} on {d['host']!r}")
        return AdoptStep(definition)


@dataclass(frozen=True)
class ReleaseStep(_Flags):
    """Hand a managed VM back (``vcsched release``): remove its caps and vcsched's metadata; it keeps running.

    ``cluster`` is recorded so a reused name in another virtual cluster is not released by an old plan."""

    op: ClassVar[str] = "release"
    owns: ClassVar[bool] = True
    vm: str
    host: str
    cluster: str

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "vm": self.vm, "host": self.host, "cluster": self.cluster}

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ((self.host, self.vm, None),)  # no longer among the host's managed caps

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> ReleaseStep:
        d = _fields(where, d, {"op", "vm", "host", "cluster"})
        return ReleaseStep(_str(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                           _str(f"{where}.cluster", d["cluster"]))


def _check_cap(where: str, cap: float, vcpus: int) -> None:
    if cap > vcpus + CAP_TOLERANCE:
        raise InputError(f"{where}.cap_cores: {cap:.10g} cores is more than the VM's {vcpus} vCPUs can use")



StepParser = Callable[[str, Mapping[str, Any]], Step]

#: Every step kind a plan file may hold, by ``op``: a literal table, so loading a plan never depends on which
#: modules happened to be imported before.
STEP_PARSERS: Mapping[str, StepParser] = {
    CreateStep.op: CreateStep.from_dict,
    SetCapStep.op: SetCapStep.from_dict,
    MigrateStep.op: MigrateStep.from_dict,
    RemoveStep.op: RemoveStep.from_dict,
    SetNeedStep.op: SetNeedStep.from_dict,
    AdoptStep.op: AdoptStep.from_dict,
    ReleaseStep.op: ReleaseStep.from_dict,
}


def step_kinds() -> tuple[str, ...]:
    return tuple(sorted(STEP_PARSERS))


def step_from_dict(where: str, d: Any) -> Step:
    """One step of a plan document, validated; ``where`` names it in errors (``plan.steps[3]``)."""
    op = d.get("op") if isinstance(d, Mapping) else None
    parser = STEP_PARSERS.get(op) if isinstance(op, str) else None
    if parser is None:
        raise InputError(f"{where}.op: {op!r} is not a known step (known: {', '.join(step_kinds())})")
    return parser(where, d)
