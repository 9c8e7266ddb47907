"""A virtual-cluster request: k identical VMs that run one parallel job (paper section 5).

Format (TOML; examples/web.toml)::

    name = "web"          # virtual cluster name; its VMs are web-0, web-1, ...
    vms = 2               # number of VMs (tasks of the job)
    vcpus = 1             # per VM
    memory = "128MiB"     # per VM: a whole number of MiB, at least 16 MiB (vcsched/formats/units.py)
    cpu_need = 0.5        # CPU a VM uses when alone, as a fraction of the reference host ...
    # cpu_cores = 0.5     # ... or in cores (exactly one of the two)
    template = "vm.xml"   # optional domain XML template (else the cluster's [guest] boot) ...
    # image = "disk.qcow2"  # ... or a disk image to boot from (at most one of the two)
    min_yield = 0.3       # optional: refuse admission if anyone's yield would drop below it
    disk_bps = "20MiB"    # optional: disk bytes/s a VM uses alone (fluid, like CPU: docs/policies.md)
    net_bps = "10MiB"     # optional: network bytes/s a VM uses alone (each direction)
    weight = 2.0          # optional: the virtual cluster's weight (weighted DRF, PF, H-DRF; default 1)
    tenant = "ads"        # optional: its leaf in the cluster file's [[tenants]] tree (hdrf)
    spread = true         # optional: no two of its VMs on one host (anti-affinity); "preferred": when possible
    together = true       # optional: all its VMs on one host (affinity); "preferred": when possible
    pinned = true         # optional: its VMs are never migrated once placed
    priority = 10         # optional: after a host failure, higher priorities restart first (default 0)

Validation here is what needs no cluster; the checks against the cluster
(vCPUs, largest host) are in :mod:`vcsched.control.admission`, where the reference
host is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vcsched.errors import InputError
from vcsched.formats.fields import MAX_VCPUS, check_fields, check_fraction, check_name, check_number, check_string
from vcsched.formats.units import parse_memory, parse_size
from vcsched.model import PREFERRED, REQUIRED

MAX_VMS = 1024


@dataclass(frozen=True)
class Request:
    name: str
    vms: int
    vcpus: int
    memory_bytes: int
    cpu_need: float | None = None  # fraction of the reference host
    cpu_cores: float | None = None  # or absolute cores
    template: str | None = None
    image: str | None = None
    min_yield: float | None = None
    disk_bps: int | None = None  # bytes/s per VM when alone (an extra fluid resource, docs/policies.md)
    net_bps: int | None = None
    weight: float = 1.0
    tenant: str | None = None
    spread: str | None = None  # REQUIRED / PREFERRED (docs/rules.md)
    together: str | None = None
    pinned: bool = False
    #: Restart order after a host failure (docs/failures.md, "Priority"): higher first.
    priority: int = 0

    def io_needs(self) -> dict[str, int]:
        """``{"disk": bytes/s, "net": bytes/s}`` for the extra resources the request needs."""
        return {r: v for r, v in (("disk", self.disk_bps), ("net", self.net_bps)) if v is not None}

    def vm_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{i}" for i in range(self.vms))

    def need_cores(self, reference_cores: int) -> float:
        """The CPU need of one VM in cores, whichever way the request gave it."""
        if self.cpu_cores is not None:
            return self.cpu_cores
        assert self.cpu_need is not None  # request_from_dict guarantees exactly one
        return self.cpu_need * reference_cores


def _count(where: str, value: Any, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InputError(f"{where}: {value!r} is not a whole number in [1, {high}]")
    return value


def request_from_dict(d: Any) -> Request:
    """Validate a decoded request; every error names the field and the value."""
    allowed = {"name", "vms", "vcpus", "memory", "cpu_need", "cpu_cores", "template", "image", "min_yield",
               "disk_bps", "net_bps", "weight", "tenant", "spread", "together", "pinned", "priority"}
    d = check_fields("request", d, allowed, {"name", "vms", "vcpus", "memory"}, kind="table")
    name = check_name("name", d["name"])
    vms = _count("vms", d["vms"], MAX_VMS)
    vcpus = _count("vcpus", d["vcpus"], MAX_VCPUS)
    memory = parse_memory("memory", d["memory"])
    if ("cpu_need" in d) == ("cpu_cores" in d):
        raise InputError("cpu_need/cpu_cores: give exactly one (cpu_need as a fraction of the reference host, "
                         "cpu_cores in cores)")
    cpu_need = cpu_cores = None
    if "cpu_need" in d:
        cpu_need = check_fraction("cpu_need", d["cpu_need"], low_open=True)
    else:
        c = d["cpu_cores"]
        if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c <= 0:
            raise InputError(f"cpu_cores: {c!r} is not a positive number of cores")
        cpu_cores = float(c)
        if cpu_cores > vcpus:
            raise InputError(f"cpu_cores: {cpu_cores:g} cores is more than the {vcpus} vCPUs of a VM can use")
    if "template" in d and "image" in d:
        raise InputError("template/image: give at most one (a domain XML template or a disk image)")
    template = check_string("template", d["template"]) if "template" in d else None
    image = check_string("image", d["image"]) if "image" in d else None
    min_yield = check_fraction("min_yield", d["min_yield"]) if "min_yield" in d else None
    io = {k: parse_size(k, d[k]) if k in d else None for k in ("disk_bps", "net_bps")}
    weight = check_number("weight", d["weight"]) if "weight" in d else 1.0
    tenant = check_name("tenant", d["tenant"]) if "tenant" in d else None
    spread, together = rule_level("spread", d.get("spread")), rule_level("together", d.get("together"))
    if spread and together and vms > 1:
        raise InputError(f"spread/together: virtual cluster {name!r} cannot be both spread ({spread}) and together "
                         f"({together})")
    pinned = d.get("pinned", False)
    if not isinstance(pinned, bool):
        raise InputError(f"pinned: expected true or false, got {pinned!r}")
    priority = d.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -1000 <= priority <= 1000:
        raise InputError(f"priority: {priority!r} is not a whole number in [-1000, 1000]")
    return Request(name, vms, vcpus, memory, cpu_need, cpu_cores, template, image, min_yield,
                   io["disk_bps"], io["net_bps"], weight, tenant, spread, together, pinned, priority)


def rule_level(where: str, value: Any) -> str | None:
    """``true`` / ``"required"`` -> required, ``"preferred"`` -> preferred, ``false`` / absent -> no rule."""
    if value is None or value is False:
        return None
    if value is True or value == REQUIRED:
        return REQUIRED
    if value == PREFERRED:
        return PREFERRED
    raise InputError(f"{where}: {value!r} is not true, false, \"required\" or \"preferred\"")


#: The keys of a VM shape (``vcsched headroom --vm``): a request's per-VM fields.
SHAPE_KEYS = ("cpu_cores", "cpu_need", "memory", "vcpus", "disk_bps", "net_bps")


def _value(text: str) -> Any:
    """A shape value as a request file would hold it: a whole number, a number, else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_vm_shape(where: str, text: str) -> Request:
    """``cpu_cores=1,memory=2GiB[,vcpus=2][,disk_bps=20MiB]`` as a one-VM request (vcpus default 1).

    Validated by the request's own checks (:func:`vcsched.formats.request.request_from_dict`): the sizes and rates
    by the one size parser; errors name ``where``, the field and the value (bad input, exit 2)."""
    fields: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, value = (p.strip() for p in item.partition("="))
        if not eq or not key or not value:
            raise InputError(f"{where}: {item.strip()!r} is not KEY=VALUE (keys: {', '.join(SHAPE_KEYS)})")
        if key not in SHAPE_KEYS:
            raise InputError(f"{where}: unknown key {key!r} (keys: {', '.join(SHAPE_KEYS)})")
        if key in fields:
            raise InputError(f"{where}: {key} is given twice")
        fields[key] = value if key in ("memory", "disk_bps", "net_bps") else _value(value)
    if "memory" not in fields:
        raise InputError(f"{where}: memory is missing (e.g. memory=2GiB)")
    try:
        return request_from_dict({"name": "shape", "vms": 1, "vcpus": 1, **fields})
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
