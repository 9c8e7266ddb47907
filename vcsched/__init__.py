"""vcsched core: the VCSched model and its solvers, as pure functions over plain data.

Nothing in this package performs I/O or talks to a hypervisor: it takes an
inventory and requests and returns values (allocations, plans) that other
layers print, save or apply.  Data flows one way: the CLI parses, the core
decides and returns a plan, :mod:`hypervisor` acts on it.

The modules and sub-packages, each named after what it holds, in their
dependency order (:data:`LAYERS`, lowest first; each imports only from its
own layer and the layers before it, at the top of its modules, and
``tests/test_layers.py`` checks it):

* :mod:`vcsched.errors` — the exceptions;
* :mod:`vcsched.units` — units and tolerances, each defined once;
* :mod:`vcsched.model` — hosts, jobs, instances, allocations;
* :mod:`vcsched.constraints` — the (host, resource) capacity rows of a placement;
* :mod:`vcsched.yields` — the yields of a fixed placement (both phases);
* :mod:`vcsched.rules` — placement rules, and the one rule-retry loop;
* :mod:`vcsched.validate` — the one validator (instances, allocations);
* :mod:`vcsched.caps`, :mod:`vcsched.iocaps` — what a CPU or I/O cap can be;
* :mod:`vcsched.inventory` — what a live cluster holds (hosts, VMs, caps);
* :mod:`vcsched.solvers` — the registry of placement algorithms (MCB1–8,
  greedy, rounding, MILP, LP bound) and the one placement probe;
* :mod:`vcsched.policies` — multi-resource sharing policies (DRF, PF, H-DRF,
  ...) on a placement, and placement under a policy;
* :mod:`vcsched.formats` — the input files (instance JSON, cluster and request
  TOML), their field checks and byte sizes (a cluster file names a policy);
* :mod:`vcsched.adaptation` — re-placing a running cluster under a migration
  byte budget, and draining a host;
* :mod:`vcsched.plans` — plan steps, plans, their safe order;
* :mod:`vcsched.control` — a live cluster: admission, live adaptation, status;
* :mod:`vcsched.experiments` — instance generation, the paper's experiments,
  adaptation traces, benchmarks;
* :mod:`vcsched.simulate` — the fluid and task-level simulators of the sharing policies.

The names below are the public API.  They load on first use (PEP 562), so
``import vcsched`` stays cheap for commands that need little of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The dependency order of the core, lowest first (module docstring).
LAYERS: tuple[str, ...] = (
    "errors", "units", "model", "constraints", "yields", "rules", "validate", "caps", "iocaps", "inventory",
    "solvers", "policies", "formats", "adaptation", "plans", "control", "experiments", "simulate",
)

_EXPORTS = {
    "VcschedError": "vcsched.errors",
    "InputError": "vcsched.errors",
    "AllocationError": "vcsched.errors",
    "Host": "vcsched.model",
    "Job": "vcsched.model",
    "Instance": "vcsched.model",
    "Tenant": "vcsched.model",
    "Allocation": "vcsched.model",
    "SolveOptions": "vcsched.model",
    "SolveResult": "vcsched.model",
    "allocate": "vcsched.yields",
    "check_allocation": "vcsched.validate",
    "allocation_problems": "vcsched.validate",
    "instance_from_dict": "vcsched.formats.instance",
    "instance_to_dict": "vcsched.formats.instance",
    "cluster_from_dict": "vcsched.formats.cluster",
    "request_from_dict": "vcsched.formats.request",
    "parse_size": "vcsched.formats.units",
    "format_size": "vcsched.formats.units",
    "solve": "vcsched.solvers.registry",
    "PolicyOptions": "vcsched.policies.allocation",
    "PolicyAllocation": "vcsched.policies.allocation",
    "allocate_policy": "vcsched.policies.registry",
    "policies": "vcsched.policies.registry",
    "place_policy": "vcsched.policies.placement",
    "reallocate": "vcsched.policies.placed",
    "algorithms": "vcsched.solvers.registry",
    "AdaptProblem": "vcsched.adaptation.problem",
    "solve_adapt": "vcsched.adaptation.solve",
    "Inventory": "vcsched.inventory",
    "admit": "vcsched.control.admission",
    "adapt_inventory": "vcsched.control.live",
    "Plan": "vcsched.plans.plan",
    "plan_from_dict": "vcsched.plans.plan",
    "generate": "vcsched.experiments.generate",
    "GeneratorSpec": "vcsched.experiments.generate",
}

__all__ = [
    "AdaptProblem",
    "Allocation",
    "AllocationError",
    "GeneratorSpec",
    "Host",
    "InputError",
    "Instance",
    "Inventory",
    "Job",
    "Plan",
    "PolicyAllocation",
    "PolicyOptions",
    "SolveOptions",
    "SolveResult",
    "Tenant",
    "VcschedError",
    "adapt_inventory",
    "admit",
    "algorithms",
    "allocate",
    "allocate_policy",
    "allocation_problems",
    "check_allocation",
    "cluster_from_dict",
    "format_size",
    "generate",
    "instance_from_dict",
    "instance_to_dict",
    "parse_size",
    "place_policy",
    "plan_from_dict",
    "policies",
    "reallocate",
    "request_from_dict",
    "solve",
    "solve_adapt",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vcsched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:
    from vcsched.adaptation.problem import AdaptProblem
    from vcsched.adaptation.solve import solve_adapt
    from vcsched.control.admission import admit
    from vcsched.control.live import adapt_inventory
    from vcsched.errors import AllocationError, InputError, VcschedError
    from vcsched.experiments.generate import GeneratorSpec, generate
    from vcsched.formats.cluster import cluster_from_dict
    from vcsched.formats.instance import instance_from_dict, instance_to_dict
    from vcsched.formats.request import request_from_dict
    from vcsched.formats.units import format_size, parse_size
    from vcsched.inventory import Inventory
    from vcsched.model import Allocation, Host, Instance, Job, SolveOptions, SolveResult, Tenant
    from vcsched.plans.plan import Plan, plan_from_dict
    from vcsched.policies.allocation import PolicyAllocation, PolicyOptions
    from vcsched.policies.placed import reallocate
    from vcsched.policies.placement import place_policy
    from vcsched.policies.registry import allocate_policy, policies
    from vcsched.solvers.registry import algorithms, solve
    from vcsched.validate import allocation_problems, check_allocation
    from vcsched.yields import allocate
