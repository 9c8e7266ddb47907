"""Plans: what vcsched will do to a cluster, as a reviewable, saveable value.

A plan is computed by the pure core (:mod:`vcsched.admission`, later the
adaptation) and applied by :mod:`hypervisor.executor`.  JSON format
(version 1, the contract between the libvirt-side modules)::

    {"version": 1, "kind": "place" | "adapt", "cluster": NAME,
     "snapshot": "<sha256 of the canonical inventory it was computed from>",
     "predicted": {"min_yield": .., "avg_yield": .., "per_vm": {VM: {...}}},
     "steps": [{"op": "create", "vm": .., "host": .., ...},
               {"op": "set-cap", "vm": .., "host": .., "cap_cores": ..},
               {"op": "remove", "vm": .., "host": .., "cluster": ..},
               {"op": "set-need", "vm": .., "host": .., "cpu_need_cores": ..}]}

**Extension point.** Step kinds are registered by ``op`` with
:func:`register_step`; a kind is a frozen dataclass with ``from_dict``,
``to_dict`` and ``cap_changes`` (how it changes the caps on each host, which
is all :func:`order_steps` and :func:`cap_overruns` need); a kind that moves
its VM between hosts also sets the class attribute ``moves = True``, so the
snapshot check ignores that VM's host (:meth:`Plan.moved_vms`); a kind that
ends its VM sets ``removes = True``, so the snapshot leaves that VM out
(:meth:`Plan.removed_vms`) and a half-applied plan still matches; one that
rewrites the VM's recorded CPU need sets ``renews = True`` (the snapshot
leaves that need out, :meth:`Plan.renewed_vms`).  The adaptation
issue adds ``migrate`` this way, and registers how to execute it in
:mod:`hypervisor.executor`.

**Ordering.** Caps are what the paper's model allocates (section 2.3: the
CPU fractions on a host sum to at most its capacity).  A plan must never let a
host's caps sum above its cores, not even between two steps, or a VM
created early could take CPU promised to another.  So steps that lower a
host's total go first, then the rest in an order that keeps every prefix
within capacity (:func:`order_steps`); :func:`cap_overruns` checks any order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from vcsched.errors import InputError, VcschedError
from vcsched.fields import check_count, check_fields, check_fraction, check_number, check_string

PLAN_VERSION = 1
PLAN_KINDS = ("place", "adapt")
CAP_TOLERANCE = 1e-6


class PlanError(VcschedError):
    """A plan cannot be ordered safely (a core bug, or a cluster already over capacity)."""


class Step(Protocol):
    op: ClassVar[str]

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


StepParser = Callable[[str, Mapping[str, Any]], Step]
_STEP_PARSERS: dict[str, StepParser] = {}


def register_step(op: str, parser: StepParser) -> None:
    """Make ``op`` a known step kind for plan JSON (see the module docstring)."""
    _STEP_PARSERS[op] = parser


def step_kinds() -> tuple[str, ...]:
    return tuple(sorted(_STEP_PARSERS))


# ---------------------------------------------------------------- field checks


def _fields(where: str, d: Any, required: set[str], optional: frozenset[str] | set[str] = frozenset()
            ) -> Mapping[str, Any]:
    return check_fields(where, d, optional, required)


_str = check_string
_num = check_number
_int = check_count


# ---------------------------------------------------------------- step kinds


@dataclass(frozen=True)
class Boot:
    """How a created VM boots: ``kernel`` (direct kernel+initrd, the cluster's [guest]),
    ``template`` (a domain XML file the request names) or ``image`` (a disk image)."""

    kind: str
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str = ""
    domain_type: str = "qemu"
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "kernel":
            return {"kind": "kernel", "kernel": self.kernel, "initrd": self.initrd, "cmdline": self.cmdline,
                    "domain_type": self.domain_type}
        return {"kind": self.kind, "path": self.path, "domain_type": self.domain_type}

    @staticmethod
    def from_dict(where: str, d: Any) -> Boot:
        if not isinstance(d, Mapping) or d.get("kind") not in ("kernel", "template", "image"):
            raise InputError(f"{where}.kind: expected 'kernel', 'template' or 'image', got "
                             f"{d.get('kind') if isinstance(d, Mapping) else d!r}")
        if d["kind"] == "kernel":
            d = _fields(where, d, {"kind", "kernel", "initrd"}, {"cmdline", "domain_type"})
            return Boot("kernel", _str(f"{where}.kernel", d["kernel"]), _str(f"{where}.initrd", d["initrd"]),
                        str(d.get("cmdline", "")), _str(f"{where}.domain_type", d.get("domain_type", "qemu")))
        d = _fields(where, d, {"kind", "path"}, {"domain_type"})
        return Boot(d["kind"], path=_str(f"{where}.path", d["path"]),
                    domain_type=_str(f"{where}.domain_type", d.get("domain_type", "qemu")))


@dataclass(frozen=True)
class CreateStep:
    """Create (and start) a managed VM on ``host``, capped from its first instant."""

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

    def to_dict(self) -> dict[str, Any]:
        d = {"op": self.op, "vm": self.vm, "host": self.host, "cluster": self.cluster, "vcpus": self.vcpus,
             "memory_bytes": self.memory_bytes, "cpu_need_cores": self.cpu_need_cores,
             "cap_cores": self.cap_cores, "boot": self.boot.to_dict()}
        if self.min_yield is not None:
            d["min_yield"] = self.min_yield
        return d

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ((self.host, self.vm, self.cap_cores),)

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> CreateStep:
        d = _fields(where, d, {"op", "vm", "host", "cluster", "vcpus", "memory_bytes", "cpu_need_cores",
                               "cap_cores", "boot"}, {"min_yield"})
        step = CreateStep(_str(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                          _str(f"{where}.cluster", d["cluster"]), _int(f"{where}.vcpus", d["vcpus"]),
                          _int(f"{where}.memory_bytes", d["memory_bytes"]),
                          _num(f"{where}.cpu_need_cores", d["cpu_need_cores"]),
                          _num(f"{where}.cap_cores", d["cap_cores"]), Boot.from_dict(f"{where}.boot", d["boot"]),
                          check_fraction(f"{where}.min_yield", d["min_yield"]) if "min_yield" in d else None)
        _check_cap(where, step.cap_cores, step.vcpus)
        return step


@dataclass(frozen=True)
class SetCapStep:
    """Change the CPU cap of an existing managed VM (live, and in its persistent config if any)."""

    op: ClassVar[str] = "set-cap"
    vm: str
    host: str
    cap_cores: float

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "vm": self.vm, "host": self.host, "cap_cores": self.cap_cores}

    def cap_changes(self) -> tuple[tuple[str, str, float | None], ...]:
        return ((self.host, self.vm, self.cap_cores),)

    @staticmethod
    def from_dict(where: str, d: Mapping[str, Any]) -> SetCapStep:
        d = _fields(where, d, {"op", "vm", "host", "cap_cores"})
        return SetCapStep(_str(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                          _num(f"{where}.cap_cores", d["cap_cores"]))


@dataclass(frozen=True)
class RemoveStep:
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
        return RemoveStep(_str(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                          _str(f"{where}.cluster", d["cluster"]))


@dataclass(frozen=True)
class SetNeedStep:
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
        return SetNeedStep(_str(f"{where}.vm", d["vm"]), _str(f"{where}.host", d["host"]),
                           _num(f"{where}.cpu_need_cores", d["cpu_need_cores"]))


def _check_cap(where: str, cap: float, vcpus: int) -> None:
    if cap > vcpus + CAP_TOLERANCE:
        raise InputError(f"{where}.cap_cores: {cap:g} cores is more than the VM's {vcpus} vCPUs can use")


register_step(CreateStep.op, CreateStep.from_dict)
register_step(SetCapStep.op, SetCapStep.from_dict)
register_step(RemoveStep.op, RemoveStep.from_dict)
register_step(SetNeedStep.op, SetNeedStep.from_dict)


# ---------------------------------------------------------------- plan


@dataclass(frozen=True)
class VmPrediction:
    host: str
    cluster: str
    cpu_need_cores: float
    cap_cores: float
    yield_: float

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "cluster": self.cluster, "cpu_need_cores": self.cpu_need_cores,
                "cap_cores": self.cap_cores, "yield": self.yield_}


@dataclass(frozen=True)
class Plan:
    kind: str
    cluster: str
    snapshot: str
    min_yield: float
    avg_yield: float
    per_vm: Mapping[str, VmPrediction]
    steps: tuple[Step, ...]
    version: int = PLAN_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. the admitted request's name

    def created_vms(self) -> frozenset[str]:
        return frozenset(s.vm for s in self.steps if s.op == "create")

    def moved_vms(self) -> frozenset[str]:
        """VMs whose host the plan changes: steps of a kind with ``moves = True`` (a ``migrate``)."""
        return frozenset(s.vm for s in self.steps if getattr(s, "moves", False))

    def removed_vms(self) -> frozenset[str]:
        """VMs the plan ends: steps of a kind with ``removes = True`` (a ``remove``)."""
        return frozenset(s.vm for s in self.steps if getattr(s, "removes", False))

    def renewed_vms(self) -> frozenset[str]:
        """VMs whose recorded CPU need the plan rewrites: steps of a kind with ``renews = True``."""
        return frozenset(s.vm for s in self.steps if getattr(s, "renews", False))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version,
            "kind": self.kind,
            "cluster": self.cluster,
            "snapshot": self.snapshot,
            "predicted": {"min_yield": self.min_yield, "avg_yield": self.avg_yield,
                          "per_vm": {k: v.to_dict() for k, v in sorted(self.per_vm.items())}},
            "steps": [s.to_dict() for s in self.steps],
        }
        out.update(self.extra)
        return out


def plan_from_dict(d: Any) -> Plan:
    """Validate a decoded plan document (a saved plan may have been edited by hand)."""
    d = _fields("plan", d, {"version", "kind", "cluster", "snapshot", "predicted", "steps"},
                {"request", "budget", "migrated_bytes"})
    if d["version"] != PLAN_VERSION:
        raise InputError(f"plan.version: {d['version']!r} is not supported (this vcsched reads {PLAN_VERSION})")
    if d["kind"] not in PLAN_KINDS:
        raise InputError(f"plan.kind: {d['kind']!r} is not one of {', '.join(PLAN_KINDS)}")
    snapshot = _str("plan.snapshot", d["snapshot"])
    if len(snapshot) != 64 or any(c not in "0123456789abcdef" for c in snapshot):
        raise InputError(f"plan.snapshot: {snapshot!r} is not a sha256 hex digest")
    pred = _fields("plan.predicted", d["predicted"], {"min_yield", "avg_yield", "per_vm"})
    per_vm_raw = pred["per_vm"]
    if not isinstance(per_vm_raw, Mapping):
        raise InputError("plan.predicted.per_vm: expected an object")
    per_vm = {}
    for name, p in per_vm_raw.items():
        w = f"plan.predicted.per_vm.{name}"
        p = _fields(w, p, {"host", "cluster", "cpu_need_cores", "cap_cores", "yield"})
        per_vm[name] = VmPrediction(_str(f"{w}.host", p["host"]), _str(f"{w}.cluster", p["cluster"]),
                                    _num(f"{w}.cpu_need_cores", p["cpu_need_cores"]),
                                    _num(f"{w}.cap_cores", p["cap_cores"]),
                                    _num(f"{w}.yield", p["yield"], low_open=False))
    raw_steps = d["steps"]
    if not isinstance(raw_steps, list):
        raise InputError("plan.steps: expected a list")
    steps: list[Step] = []
    for i, s in enumerate(raw_steps):
        where = f"plan.steps[{i}]"
        op = s.get("op") if isinstance(s, Mapping) else None
        if op not in _STEP_PARSERS:
            raise InputError(f"{where}.op: {op!r} is not a known step (known: {', '.join(step_kinds())})")
        steps.append(_STEP_PARSERS[op](where, s))
    extra: dict[str, Any] = {"request": _str("plan.request", d["request"])} if "request" in d else {}
    if "budget" in d or "migrated_bytes" in d:
        extra.update(_budget(d, steps))
    return Plan(d["kind"], _str("plan.cluster", d["cluster"]), snapshot,
                _num("plan.predicted.min_yield", pred["min_yield"], low_open=False),
                _num("plan.predicted.avg_yield", pred["avg_yield"], low_open=False), per_vm, tuple(steps),
                extra=extra)


def _budget(d: Mapping[str, Any], steps: Iterable[Step]) -> dict[str, int]:
    """An adapt plan's byte budget and total: the total must be what its steps move, and within the budget."""
    for key in ("budget", "migrated_bytes"):
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"plan.{key}: expected a byte count >= 0, got {v!r}")
    moved = sum(int(getattr(s, "bytes", 0)) for s in steps if getattr(s, "moves", False))
    if d["migrated_bytes"] != moved:
        raise InputError(f"plan.migrated_bytes: {d['migrated_bytes']} but the migrate steps move {moved} bytes")
    if moved > d["budget"]:
        raise InputError(f"plan.migrated_bytes: {moved} bytes is above the plan's budget of {d['budget']}")
    return {"budget": d["budget"], "migrated_bytes": moved}


# ---------------------------------------------------------------- ordering


HostCaps = Mapping[str, Mapping[str, float]]  # host -> vm -> cap in cores


def _apply_changes(caps: dict[str, dict[str, float]], step: Step) -> None:
    for host, vm, cap in step.cap_changes():
        on = caps.setdefault(host, {})
        if cap is None:
            on.pop(vm, None)
        else:
            on[vm] = cap
        # A VM is on one host only: a step placing it here removes it elsewhere (migrations).
        if cap is not None:
            for other, vms in caps.items():
                if other != host:
                    vms.pop(vm, None)


def cap_overruns(steps: Iterable[Step], caps_now: HostCaps, host_cores: Mapping[str, float]) -> list[str]:
    """Every step after which some host's caps sum above its cores *because the step raised them*.

    A step that lowers a host's total is always fine (even if the host started
    over capacity, e.g. uncapped VMs): it moves toward the plan's target.
    """
    caps = {h: dict(v) for h, v in caps_now.items()}
    problems = []
    for i, step in enumerate(steps):
        before = {h: sum(caps.get(h, {}).values()) for h in host_cores}
        _apply_changes(caps, step)
        for h, cores in host_cores.items():
            after = sum(caps.get(h, {}).values())
            if after > before[h] + CAP_TOLERANCE and after > cores + CAP_TOLERANCE:
                problems.append(f"step {i} ({step.op} {step.vm}): host {h} caps {after:.4f} > {cores:g} cores")
    return problems


def order_steps(steps: Iterable[Step], caps_now: HostCaps, host_cores: Mapping[str, float]) -> tuple[Step, ...]:
    """Order ``steps`` so that no prefix overruns a host (see the module docstring).

    Greedy: repeatedly take the first remaining step that lowers some host's
    total without raising any, else the first one that keeps every host it
    raises within capacity.  Raises :class:`PlanError` if no safe order exists
    from this state (which a correct allocation never produces).
    """
    pending = list(steps)
    caps = {h: dict(v) for h, v in caps_now.items()}
    out: list[Step] = []

    def effect(step: Step) -> tuple[bool, bool]:
        trial = {h: dict(v) for h, v in caps.items()}
        _apply_changes(trial, step)
        raises_ok = lowers_only = True
        for h, cores in host_cores.items():
            before, after = sum(caps.get(h, {}).values()), sum(trial.get(h, {}).values())
            if after > before + CAP_TOLERANCE:
                lowers_only = False
                if after > cores + CAP_TOLERANCE:
                    raises_ok = False
        return lowers_only, raises_ok

    while pending:
        effects = [effect(s) for s in pending]
        pick = next((i for i, (low, _) in enumerate(effects) if low), None)
        if pick is None:
            pick = next((i for i, (_, ok) in enumerate(effects) if ok), None)
        if pick is None:
            names = ", ".join(f"{s.op} {s.vm}" for s in pending)
            raise PlanError(f"no order of the remaining steps keeps every host within its cores: {names}")
        step = pending.pop(pick)
        _apply_changes(caps, step)
        out.append(step)
    return tuple(out)
