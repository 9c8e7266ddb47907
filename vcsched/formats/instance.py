"""Instance documents (the ``vcsched solve`` JSON format) to and from the model.

Format (kept exactly; other tools feed it)::

    {"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0}, ...],
     "jobs":  [{"name": "j0", "cpu_need": 0.5, "memory": 0.2, "tasks": 1}, ...]}

Parsing is pure (takes the decoded JSON value): reading files is the CLI's job.
Every check raises :class:`InputError` naming the field path and the value.
"""

from __future__ import annotations

from typing import Any

from vcsched.errors import InputError
from vcsched.formats.fields import check_count, check_fields, check_list, check_number, check_string
from vcsched.model import Host, Instance, Job


def _unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise InputError(f"{kind}[{i}].name: duplicate name {n!r}")
        seen.add(n)


HOST_FIELDS = {"name", "cpu", "memory"}
JOB_FIELDS = {"name", "cpu_need", "memory", "tasks"}


def parse_host(where: str, raw: Any) -> Host:
    obj = check_fields(where, raw, HOST_FIELDS, {"name"})
    return Host(
        name=check_string(f"{where}.name", obj["name"]),
        cpu=check_number(f"{where}.cpu", obj.get("cpu", 1.0), low=0.0, high=None),
        memory=check_number(f"{where}.memory", obj.get("memory", 1.0), low=0.0, high=None),
    )


def parse_job(where: str, raw: Any, extra_fields: frozenset[str] = frozenset()) -> Job:
    obj = check_fields(where, raw, JOB_FIELDS | extra_fields, {"name", "cpu_need", "memory"})
    tasks = check_count(f"{where}.tasks", obj.get("tasks", 1))
    return Job(
        name=check_string(f"{where}.name", obj["name"]),
        cpu_need=check_number(f"{where}.cpu_need", obj["cpu_need"], low=0.0, high=1.0),
        memory=check_number(f"{where}.memory", obj["memory"], low=0.0, high=1.0),
        tasks=tasks,
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
    obj = check_fields("instance", raw, {"hosts", "jobs"} | extra_top, {"hosts", "jobs"})
    hosts_raw = check_list("hosts", obj["hosts"])
    jobs_raw = check_list("jobs", obj["jobs"])
    if not hosts_raw:
        raise InputError("hosts: at least one host is needed")
    hosts = tuple(parse_host(f"hosts[{i}]", h) for i, h in enumerate(hosts_raw))
    jobs = tuple(parse_job(f"jobs[{i}]", j, extra_job) for i, j in enumerate(jobs_raw))
    _unique("hosts", [h.name for h in hosts])
    _unique("jobs", [j.name for j in jobs])
    return Instance(hosts=hosts, jobs=jobs)


def instance_to_dict(instance: Instance) -> dict[str, Any]:
    return {
        "hosts": [{"name": h.name, "cpu": h.cpu, "memory": h.memory} for h in instance.hosts],
        "jobs": [
            {"name": j.name, "cpu_need": j.cpu_need, "memory": j.memory, "tasks": j.tasks}
            for j in instance.jobs
        ],
    }
