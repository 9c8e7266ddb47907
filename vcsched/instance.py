"""Instance documents (the ``vcsched solve`` JSON format) to and from the model.

Format (kept exactly; other tools feed it)::

    {"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0}, ...],
     "jobs":  [{"name": "j0", "cpu_need": 0.5, "memory": 0.2, "tasks": 1}, ...]}

Parsing is pure (takes the decoded JSON value): reading files is the CLI's job.
Every check raises :class:`InputError` naming the field path and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vcsched.errors import InputError
from vcsched.model import Host, Instance, Job


def _number(where: str, value: Any, *, low: float, high: float | None, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: expected a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise InputError(f"{where}: {value!r} is not a finite number")
    if (low_open and x <= low) or (not low_open and x < low):
        raise InputError(f"{where}: {value!r} must be {'above' if low_open else 'at least'} {low:g}")
    if high is not None and x > high:
        raise InputError(f"{where}: {value!r} is above {high:g}")
    return x


def _name(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _object(where: str, value: Any, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: expected an object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")
    missing = sorted(required - set(value))
    if missing:
        raise InputError(f"{where}: missing field {missing[0]!r}")
    return value


def _list(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise InputError(f"{kind}[{i}].name: duplicate name {n!r}")
        seen.add(n)


HOST_FIELDS = {"name", "cpu", "memory"}
JOB_FIELDS = {"name", "cpu_need", "memory", "tasks"}


def parse_host(where: str, raw: Any) -> Host:
    obj = _object(where, raw, HOST_FIELDS, {"name"})
    return Host(
        name=_name(f"{where}.name", obj["name"]),
        cpu=_number(f"{where}.cpu", obj.get("cpu", 1.0), low=0.0, high=None),
        memory=_number(f"{where}.memory", obj.get("memory", 1.0), low=0.0, high=None),
    )


def parse_job(where: str, raw: Any, extra_fields: frozenset[str] = frozenset()) -> Job:
    obj = _object(where, raw, JOB_FIELDS | extra_fields, {"name", "cpu_need", "memory"})
    tasks = obj.get("tasks", 1)
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise InputError(f"{where}.tasks: expected a whole number >= 1, got {tasks!r}")
    return Job(
        name=_name(f"{where}.name", obj["name"]),
        cpu_need=_number(f"{where}.cpu_need", obj["cpu_need"], low=0.0, high=1.0),
        memory=_number(f"{where}.memory", obj["memory"], low=0.0, high=1.0),
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
    obj = _object("instance", raw, {"hosts", "jobs"} | extra_top, {"hosts", "jobs"})
    hosts_raw = _list("hosts", obj["hosts"])
    jobs_raw = _list("jobs", obj["jobs"])
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
