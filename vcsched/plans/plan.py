"""Plans: what vcsched will do to a cluster, as a reviewable, saveable value.

A plan is computed by the pure core (:mod:`vcsched.control.admission`,
:mod:`vcsched.control.live`) and applied by :mod:`acting.executor`.  JSON format
(version 1, the contract between the libvirt-side modules)::

    {"version": 1, "kind": "place" | "adapt" | "recover" | "adopt" | "release", "cluster": NAME,
     "snapshot": "<sha256 of the canonical inventory it was computed from>",
     "predicted": {"min_yield": .., "avg_yield": .., "per_vm": {VM: {...}}},
     "steps": [{"op": "create", "vm": .., "host": .., ...},
               {"op": "set-cap", "vm": .., "host": .., "cap_cores": ..},
               {"op": "migrate", "vm": .., "from": .., "to": .., "bytes": .., "cap_cores": ..},
               {"op": "remove", "vm": .., "host": .., "cluster": ..},
               {"op": "set-need", "vm": .., "host": .., "cpu_need_cores": ..}]}

Optional fields, by the command that wrote the plan: ``request`` (place: the
admitted request's name), ``policy`` (the sharing policy it was computed
under), ``budget`` and ``migrated_bytes`` (adapt, drain, the controller: the
byte budget and what the migrate steps move), ``needs`` (``"measured"``: the
controller's measured needs), ``drain`` and ``stays`` (drain: the host being
emptied, and ``[vm, reason, detail]`` for each VM that stays on it).  Every
plan vcsched writes is one `vcsched apply` reads (tests/test_apply_plans.py).

The step kinds are in :mod:`vcsched.plans.steps` and their safe order in
:mod:`vcsched.plans.ordering`; this module holds the plan as a whole: its
predicted yields, its steps, and the checks a loaded plan file must pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vcsched.errors import InputError
from vcsched.formats.fields import check_fields, check_number, check_string
from vcsched.plans.steps import MigrateStep, Step, step_from_dict

PLAN_VERSION = 1
PLAN_KINDS = ("place", "adapt", "recover", "adopt", "release")

_str = check_string
_num = check_number


def _fields(where: str, d: Any, required: set[str], optional: frozenset[str] | set[str] = frozenset()
            ) -> Mapping[str, Any]:
    return check_fields(where, d, optional, required)


#: ``"needs": "measured"``: the plan was computed on needs it does not record (the controller's measurements), so
#: its predictions' ``cpu_need_cores`` are those rather than the VMs' recorded needs.
MEASURED = "measured"

#: ``"below_floor": [vm, ...]``: a recovery plan (kind ``recover``) restarts these VMs below the floor their
#: ``create`` step records — the cluster file's ``on_failure = "restart"`` put running them before their floor —
#: so the whole-plan check accepts their yield (docs/failures.md).  Any other plan must meet every floor.
BELOW_FLOOR = "below_floor"

#: Optional per-VM predictions of the extra fluid resources, bytes per second.
IO_PREDICTIONS = frozenset({"disk_bytes_sec", "net_bytes_sec"})


@dataclass(frozen=True)
class VmPrediction:
    host: str
    cluster: str
    cpu_need_cores: float
    cap_cores: float
    yield_: float
    #: What the VM gets of each extra fluid resource under the plan, ``(("disk", bytes/s), ...)``; written
    #: as ``disk_bytes_sec``/``net_bytes_sec`` only when set (docs/policies.md), so CPU-only plans read as before.
    io_bytes_sec: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "cluster": self.cluster, "cpu_need_cores": self.cpu_need_cores,
                "cap_cores": self.cap_cores, "yield": self.yield_,
                **{f"{r}_bytes_sec": v for r, v in self.io_bytes_sec}}


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
        return frozenset(s.vm for s in self.steps if s.moves)

    def removed_vms(self) -> frozenset[str]:
        """VMs the plan ends: steps of a kind with ``removes = True`` (a ``remove``)."""
        return frozenset(s.vm for s in self.steps if s.removes)

    def renewed_vms(self) -> frozenset[str]:
        """VMs whose recorded CPU need the plan rewrites: steps of a kind with ``renews = True``."""
        return frozenset(s.vm for s in self.steps if s.renews)

    def owned_vms(self) -> frozenset[str]:
        """VMs the plan adopts or releases: steps of a kind with ``owns = True`` (docs/introducing.md)."""
        return frozenset(s.vm for s in self.steps if s.owns)

    def snapshot_exclusions(self) -> frozenset[str]:
        """The VMs the snapshot leaves out: what a half-applied plan has created, removed, adopted or released."""
        return self.created_vms() | self.removed_vms() | self.owned_vms()

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
                {"request", "budget", "migrated_bytes", "policy", "needs", "drain", "stays", "recover", "restart",
                 BELOW_FLOOR})
    if isinstance(d["version"], bool) or not isinstance(d["version"], int) or d["version"] != PLAN_VERSION:
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
        p = _fields(w, p, {"host", "cluster", "cpu_need_cores", "cap_cores", "yield"}, IO_PREDICTIONS)
        io = tuple((k.removesuffix("_bytes_sec"), int(_num(f"{w}.{k}", p[k], low_open=False)))
                   for k in sorted(IO_PREDICTIONS) if k in p)
        per_vm[name] = VmPrediction(_str(f"{w}.host", p["host"]), _str(f"{w}.cluster", p["cluster"]),
                                    _num(f"{w}.cpu_need_cores", p["cpu_need_cores"]),
                                    _num(f"{w}.cap_cores", p["cap_cores"]),
                                    _num(f"{w}.yield", p["yield"], low_open=False), io)
    raw_steps = d["steps"]
    if not isinstance(raw_steps, list):
        raise InputError("plan.steps: expected a list")
    steps = [step_from_dict(f"plan.steps[{i}]", s) for i, s in enumerate(raw_steps)]
    extra: dict[str, Any] = {"request": _str("plan.request", d["request"])} if "request" in d else {}
    if "policy" in d:
        extra["policy"] = _str("plan.policy", d["policy"])
    if "needs" in d:
        if d["needs"] != MEASURED:
            raise InputError(f"plan.needs: {d['needs']!r} is not {MEASURED!r}")
        extra["needs"] = MEASURED
    if "budget" in d or "migrated_bytes" in d:
        extra.update(_budget(d, steps))
    if "drain" in d or "stays" in d:
        extra.update(_drain(d))
    extra.update(_recovered(d))
    return Plan(d["kind"], _str("plan.cluster", d["cluster"]), snapshot,
                _num("plan.predicted.min_yield", pred["min_yield"], low_open=False),
                _num("plan.predicted.avg_yield", pred["avg_yield"], low_open=False), per_vm, tuple(steps),
                extra=extra)


def _recovered(d: Mapping[str, Any]) -> dict[str, Any]:
    """A recovery plan's host (``recover``), the lost VMs it restarts (``restart``) and those it runs below their
    floors (:data:`BELOW_FLOOR`): a ``recover`` plan's only, VM names each (a recommendation's plan is read back
    through here when approved)."""
    out: dict[str, Any] = {}
    for key in ("recover", "restart", BELOW_FLOOR):
        if key not in d:
            continue
        if d["kind"] != "recover":
            raise InputError(f"plan.{key}: only a recover plan has it (this one is {d['kind']!r})")
        if key == "recover":
            out[key] = _str("plan.recover", d[key])
        elif not isinstance(d[key], list) or not all(isinstance(vm, str) for vm in d[key]):
            raise InputError(f"plan.{key}: expected a list of VM names, got {d[key]!r}")
        else:
            out[key] = list(d[key])
    return out


def _drain(d: Mapping[str, Any]) -> dict[str, Any]:
    """A drain plan's host and the VMs that stay on it (``[vm, reason, detail]`` each); both or neither."""
    if "drain" not in d or "stays" not in d:
        missing = "stays" if "drain" in d else "drain"
        raise InputError(f"plan.{missing}: missing (a drain plan has both 'drain' and 'stays')")
    host = _str("plan.drain", d["drain"])
    stays = d["stays"]
    if not isinstance(stays, list):
        raise InputError(f"plan.stays: expected a list, got {stays!r}")
    out = []
    for i, s in enumerate(stays):
        if not isinstance(s, list) or len(s) != 3 or not isinstance(s[2], str):
            raise InputError(f"plan.stays[{i}]: expected [vm, reason, detail] strings, got {s!r}")
        out.append([_str(f"plan.stays[{i}][0]", s[0]), _str(f"plan.stays[{i}][1]", s[1]), s[2]])
    return {"drain": host, "stays": out}


def _budget(d: Mapping[str, Any], steps: Iterable[Step]) -> dict[str, int]:
    """An adapt plan's byte budget and total: the total must be what its steps move, and within the budget."""
    for key in ("budget", "migrated_bytes"):
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"plan.{key}: expected a byte count >= 0, got {v!r}")
    moved = sum(s.bytes for s in steps if isinstance(s, MigrateStep))
    if d["migrated_bytes"] != moved:
        raise InputError(f"plan.migrated_bytes: {d['migrated_bytes']} but the migrate steps move {moved} bytes")
    if moved > d["budget"]:
        raise InputError(f"plan.migrated_bytes: {moved} bytes is above the plan's budget of {d['budget']}")
    return {"budget": d["budget"], "migrated_bytes": moved}

