"""The instance format: what is accepted, and the one-line errors for what is not."""

from __future__ import annotations

import json

import pytest

from vcsched.errors import InputError
from vcsched.formats.instance import instance_from_dict, instance_to_dict


def doc(**job_overrides: object) -> dict[str, object]:
    job: dict[str, object] = {"name": "j0", "cpu_need": 0.5, "memory": 0.2}
    job.update(job_overrides)
    return {"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0}], "jobs": [job]}


def test_round_trip_keeps_every_field() -> None:
    raw = {"hosts": [{"name": "h0", "cpu": 2.0, "memory": 0.5}],
           "jobs": [{"name": "j0", "cpu_need": 0.5, "memory": 0.2, "tasks": 3}]}
    assert instance_to_dict(instance_from_dict(raw)) == raw


def test_tasks_default_to_one() -> None:
    assert instance_from_dict(doc()).jobs[0].tasks == 1


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"memory": -0.1}, "jobs[0].memory: -0.1 must be above 0"),
        ({"cpu_need": 1.5}, "jobs[0].cpu_need: 1.5 is above 1"),
        ({"cpu_need": 0}, "jobs[0].cpu_need: 0 must be above 0"),
        ({"cpu_need": "x"}, "jobs[0].cpu_need: expected a number"),
        ({"tasks": 0}, "jobs[0].tasks: expected a whole number >= 1"),
        ({"tasks": 1.5}, "jobs[0].tasks"),
        ({"name": ""}, "jobs[0].name"),
        ({"colour": "red"}, "jobs[0]: unknown field 'colour'"),
    ],
)
def test_bad_job_field_is_named(override: dict[str, object], fragment: str) -> None:
    with pytest.raises(InputError, match=None) as exc:
        instance_from_dict(doc(**override))
    assert fragment in str(exc.value)


def test_missing_hosts_is_an_error() -> None:
    with pytest.raises(InputError, match="hosts: at least one host"):
        instance_from_dict({"hosts": [], "jobs": []})


def test_duplicate_job_names_are_rejected() -> None:
    raw = doc()
    raw["jobs"] = [raw["jobs"][0], raw["jobs"][0]]  # type: ignore[index]
    with pytest.raises(InputError, match="duplicate name 'j0'"):
        instance_from_dict(raw)


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(InputError, match="instance: expected an object"):
        instance_from_dict([1, 2])


@pytest.mark.parametrize("field", ["cpu", "memory"])
@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_host_capacity_is_refused_naming_the_field(field: str, text: str) -> None:
    # Python's json module reads these non-standard literals; a NaN capacity would fit nothing, an infinite one
    # everything, so they never reach a solver.
    raw = json.loads(f'{{"hosts": [{{"name": "h0", "{field}": {text}}}], "jobs": []}}')
    with pytest.raises(InputError, match=rf"^hosts\[0\]\.{field}: .* is not a finite number$"):
        instance_from_dict(raw)


@pytest.mark.parametrize("field", ["cpu_need", "memory"])
def test_a_nan_job_need_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(InputError, match=rf"^jobs\[0\]\.{field}: nan is not a finite number$"):
        instance_from_dict(doc(**{field: float("nan")}))
