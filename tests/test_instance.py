"""The instance format: what is accepted, and the one-line errors for what is not."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from vcsched.errors import InputError
from vcsched.formats.instance import instance_from_dict, instance_to_dict
from vcsched.model import Host, Instance, Job


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


# --- multi-resource sharing fields (docs/policies.md) ----------------------------------------------------------

SHARING_DOC = {
    "hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0, "capacity": {"disk": 1.0, "net": 1.0}}],
    "jobs": [{"name": "a", "cpu_need": 0.5, "memory": 0.1, "tasks": 2, "needs": {"disk": 0.3}, "weight": 2.0,
              "tenant": "ads"}],
    "tenants": [{"name": "org", "weight": 1.0}, {"name": "ads", "weight": 3.0, "parent": "org"}],
}


def sharing_doc() -> dict[str, Any]:
    return copy.deepcopy(SHARING_DOC)


def test_the_sharing_fields_parse_and_round_trip() -> None:
    inst = instance_from_dict(sharing_doc())
    assert inst.resources == ("cpu", "disk", "net")
    assert inst.hosts[0].capacity_of("net") == 1.0 and inst.hosts[0].capacity_of("gpu") == 0.0
    job = inst.jobs[0]
    assert (job.need_of("cpu"), job.need_of("disk"), job.need_of("net")) == (0.5, 0.3, 0.0)
    assert job.weight == 2.0 and job.tenant == "ads"
    assert [(t.name, t.weight, t.parent) for t in inst.tenants] == [("org", 1.0, None), ("ads", 3.0, "org")]
    assert instance_to_dict(inst) == SHARING_DOC


def test_an_old_document_writes_back_without_any_new_field() -> None:
    out = instance_to_dict(instance_from_dict(doc()))
    assert set(out) == {"hosts", "jobs"}
    assert set(out["hosts"][0]) == {"name", "cpu", "memory"}
    assert set(out["jobs"][0]) == {"name", "cpu_need", "memory", "tasks"}


def test_old_constructors_keep_working_and_compare_equal_to_parsed_documents() -> None:
    assert instance_from_dict(doc()) == Instance((Host("h0", 1.0, 1.0),), (Job("j0", 0.5, 0.2, 1),))
    assert hash(Host("h0", 1.0, 1.0, (("net", 1.0), ("disk", 2.0)))) == hash(
        Host("h0", 1.0, 1.0, (("disk", 2.0), ("net", 1.0))))  # pairs are stored sorted


def test_weight_defaults_to_one_and_tenant_to_none() -> None:
    job = instance_from_dict(doc()).jobs[0]
    assert job.weight == 1.0 and job.tenant is None and job.needs == ()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["jobs"][0].update(weight=0), "jobs[0].weight: 0 must be above 0"),
    (lambda d: d["jobs"][0].update(weight=-2.5), "jobs[0].weight: -2.5 must be above 0"),
    (lambda d: d["jobs"][0].update(weight=float("nan")), "jobs[0].weight: nan is not a finite number"),
    (lambda d: d["tenants"][1].update(weight=0), "tenants[1].weight: 0 must be above 0"),
    (lambda d: d["jobs"][0].update(tenant="sales"), "jobs[0].tenant: unknown tenant 'sales'"),
    (lambda d: d["tenants"][0].update(parent="ads"), "tenants[0].parent: cycle org -> ads -> org"),
    (lambda d: d["tenants"][0].update(parent="org"), "tenants[0].parent: cycle org -> org"),
    (lambda d: d["tenants"][1].update(parent="nowhere"), "tenants[1].parent: unknown tenant 'nowhere'"),
    (lambda d: d["tenants"].append({"name": "org"}), "tenants[2].name: duplicate name 'org'"),
    (lambda d: d["tenants"].append({"name": "x", "colour": 1}), "tenants[2]: unknown field 'colour'"),
    (lambda d: d["jobs"][0]["needs"].update(gpu=0.5), "jobs[0].needs.gpu: no host has capacity for 'gpu'"),
    (lambda d: d["jobs"][0]["needs"].update(disk=1.5), "jobs[0].needs.disk: 1.5 is above 1"),
    (lambda d: d["jobs"][0]["needs"].update(disk=-0.1), "jobs[0].needs.disk: -0.1 must be at least 0"),
    (lambda d: d["jobs"][0]["needs"].update(cpu=0.1), "jobs[0].needs.cpu: not an extra resource"),
    (lambda d: d["hosts"][0]["capacity"].update(disk=-1), "hosts[0].capacity.disk: -1 must be at least 0"),
    (lambda d: d["hosts"][0]["capacity"].update(memory=1), "hosts[0].capacity.memory: not an extra resource"),
    (lambda d: d["hosts"][0]["capacity"].update(host=1), "hosts[0].capacity.host: not an extra resource"),
    (lambda d: d["hosts"][0].update(capacity=[1]), "hosts[0].capacity: expected an object of resource amounts"),
    (lambda d: d["hosts"][0]["capacity"].update({"b@d": 1}), "hosts[0].capacity.b@d: 'b@d' is not a name"),
    (lambda d: d.update(tenants={}), "tenants: expected a list"),
])
def test_bad_sharing_fields_are_one_line_errors_naming_the_field(edit: Any, message: str) -> None:
    raw = sharing_doc()
    edit(raw)
    with pytest.raises(InputError) as exc:
        instance_from_dict(raw)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_need_of_zero_for_a_resource_no_host_has_is_harmless() -> None:
    raw = sharing_doc()
    raw["jobs"][0]["needs"]["gpu"] = 0
    assert instance_from_dict(raw).jobs[0].need_of("gpu") == 0.0


def test_a_host_without_a_resource_has_capacity_0_there() -> None:
    raw = sharing_doc()
    raw["hosts"].append({"name": "h1"})
    inst = instance_from_dict(raw)
    assert inst.host_capacity.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
