"""Instance documents (the ``vcsched solve`` JSON format) to and from the model.

Format (kept exactly; other tools feed it)::

    {"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0}, ...],
     "jobs":  [{"name": "j0", "cpu_need": 0.5, "memory": 0.2, "tasks": 1}, ...]}

Optional fields for the multi-resource sharing policies (docs/policies.md)::

    {"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0, "capacity": {"disk": 1.0, "net": 1.0}}],
     "jobs":  [{"name": "a", "cpu_need": 0.5, "memory": 0.1, "tasks": 2,
                "needs": {"disk": 0.3}, "weight": 2.0, "tenant": "ads"}],
     "tenants": [{"name": "org", "weight": 1.0}, {"name": "ads", "weight": 3.0, "parent": "org"}]}

``capacity``/``needs`` hold extra fluid resources in fractions of the
reference host (a resource a host does not list has capacity 0 there);
``weight`` defaults to 1; ``tenant`` names a node of the ``tenants`` tree
(roots have no ``parent``).  A document without them means what it always meant.

Parsing is pure (takes the decoded JSON value): reading files is the CLI's job.
Every check raises :class:`InputError` naming the field path and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vcsched.errors import InputError
from vcsched.formats.fields import (
    check_count,
    check_fields,
    check_list,
    check_name,
    check_number,
    check_string,
)
from vcsched.model import CPU, Amounts, Host, Instance, Job, Tenant
from vcsched.validate import check_instance

HOST_FIELDS = {"name", "cpu", "memory", "capacity"}
JOB_FIELDS = {"name", "cpu_need", "memory", "tasks", "needs", "weight", "tenant"}
TENANT_FIELDS = {"name", "weight", "parent"}
RESERVED_RESOURCES = {
    CPU: "the cpu/cpu_need field",
    "memory": "the memory field (memory is rigid, not shared)",
    # the other fields of a `vcsched solve --json` placement row, which gains one field per resource
    "job": "another name (reserved for the solve output)",
    "task": "another name (reserved for the solve output)",
    "host": "another name (reserved for the solve output)",
}


def _resource_amounts(where: str, raw: Any, *, high: float | None) -> Amounts:
    """``{"disk": 0.3, ...}``: extra fluid resources, each named like a host and at least 0."""
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected an object of resource amounts, got {type(raw).__name__}")
    out = []
    for name, value in raw.items():
        check_name(f"{where}.{name}", name)
        if name in RESERVED_RESOURCES:
            raise InputError(f"{where}.{name}: not an extra resource; use {RESERVED_RESOURCES[name]}")
        out.append((name, check_number(f"{where}.{name}", value, low=0.0, low_open=False, high=high)))
    return tuple(out)


def parse_host(where: str, raw: Any) -> Host:
    obj = check_fields(where, raw, HOST_FIELDS, {"name"})
    return Host(
        name=check_string(f"{where}.name", obj["name"]),
        cpu=check_number(f"{where}.cpu", obj.get("cpu", 1.0), low=0.0, high=None),
        memory=check_number(f"{where}.memory", obj.get("memory", 1.0), low=0.0, high=None),
        capacity=_resource_amounts(f"{where}.capacity", obj.get("capacity", {}), high=None),
    )


def parse_job(where: str, raw: Any, extra_fields: frozenset[str] = frozenset()) -> Job:
    obj = check_fields(where, raw, JOB_FIELDS | extra_fields, {"name", "cpu_need", "memory"})
    tasks = check_count(f"{where}.tasks", obj.get("tasks", 1))
    tenant = obj.get("tenant")
    return Job(
        name=check_string(f"{where}.name", obj["name"]),
        cpu_need=check_number(f"{where}.cpu_need", obj["cpu_need"], low=0.0, high=1.0),
        memory=check_number(f"{where}.memory", obj["memory"], low=0.0, high=1.0),
        tasks=tasks,
        needs=_resource_amounts(f"{where}.needs", obj.get("needs", {}), high=1.0),
        weight=check_number(f"{where}.weight", obj.get("weight", 1.0), low=0.0),
        tenant=None if tenant is None else check_string(f"{where}.tenant", tenant),
    )


def parse_tenant(where: str, raw: Any) -> Tenant:
    obj = check_fields(where, raw, TENANT_FIELDS, {"name"})
    parent = obj.get("parent")
    return Tenant(
        name=check_string(f"{where}.name", obj["name"]),
        weight=check_number(f"{where}.weight", obj.get("weight", 1.0), low=0.0),
        parent=None if parent is None else check_string(f"{where}.parent", parent),
    )


def instance_from_dict(
    raw: Any,
    *,
    extra_top: frozenset[str] = frozenset(),
    extra_job: frozenset[str] = frozenset(),
) -> Instance:
    """Validate and convert a decoded instance document.

    ``extra_top``/``extra_job`` let formats that extend this one (the
    adaptation instance) reuse the same checks while parsing their own fields.
    """
    obj = check_fields("instance", raw, {"hosts", "jobs", "tenants"} | extra_top, {"hosts", "jobs"})
    hosts_raw = check_list("hosts", obj["hosts"])
    jobs_raw = check_list("jobs", obj["jobs"])
    tenants_raw = check_list("tenants", obj.get("tenants", []))
    if not hosts_raw:
        raise InputError("hosts: at least one host is needed")
    hosts = tuple(parse_host(f"hosts[{i}]", h) for i, h in enumerate(hosts_raw))
    jobs = tuple(parse_job(f"jobs[{i}]", j, extra_job) for i, j in enumerate(jobs_raw))
    tenants = tuple(parse_tenant(f"tenants[{i}]", t) for i, t in enumerate(tenants_raw))
    instance = Instance(hosts=hosts, jobs=jobs, tenants=tenants)
    check_instance(instance)
    return instance


def instance_to_dict(instance: Instance) -> dict[str, Any]:
    """The document; optional fields appear only when set, so old instances write exactly as before."""
    hosts: list[dict[str, Any]] = []
    for h in instance.hosts:
        host: dict[str, Any] = {"name": h.name, "cpu": h.cpu, "memory": h.memory}
        if h.capacity:
            host["capacity"] = dict(h.capacity)
        hosts.append(host)
    jobs: list[dict[str, Any]] = []
    for j in instance.jobs:
        job: dict[str, Any] = {"name": j.name, "cpu_need": j.cpu_need, "memory": j.memory, "tasks": j.tasks}
        if j.needs:
            job["needs"] = dict(j.needs)
        if j.weight != 1.0:
            job["weight"] = j.weight
        if j.tenant is not None:
            job["tenant"] = j.tenant
        jobs.append(job)
    out: dict[str, Any] = {"hosts": hosts, "jobs": jobs}
    if instance.tenants:
        out["tenants"] = [
            {"name": t.name, "weight": t.weight, **({"parent": t.parent} if t.parent is not None else {})}
            for t in instance.tenants
        ]
    return out
