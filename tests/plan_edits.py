"""Random edits of a plan file's numbers, and what an accepted plan must have done: shared by the in-memory property
test (tests/test_plan_claims.py) and the lab one (tests/test_inputs_lab.py).

A plan file is user input.  Edit any number of a valid plan and either the
edit changed nothing (the same bytes), or ``apply`` refuses the plan whole
with no host changed, or — the edit made another valid plan (a created VM
with 2 vCPUs instead of 1, a larger budget) — ``apply`` does exactly what
the edited plan claims: :func:`claims_hold` checks every claim against the
hosts after the fact, independently of :mod:`vcsched.plans.claims`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from vcsched.caps import CAP_TOLERANCE, realisable_cap
from vcsched.inventory import Inventory

Path = tuple[str | int, ...]


def number_paths(doc: Any, path: Path = ()) -> Iterator[Path]:
    """Every number in a decoded JSON document (booleans are not numbers here), by its path."""
    if isinstance(doc, bool):
        return
    if isinstance(doc, int | float):
        yield path
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from number_paths(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from number_paths(v, (*path, i))


def get(doc: Any, path: Path) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def edited(doc: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return out


def new_values(old: int | float) -> st.SearchStrategy[Any]:
    """What a careless or hostile operator writes instead of ``old``: off by one, doubled, halved, nudged, zero,
    negative, another type, anything."""
    near = [old + 1, old - 1, old * 2, old / 2, 0, -old, old + 1e-6, old - 1e-6, old * 1.01, 1, 0.5, 1.0]
    if isinstance(old, int):
        near += [old // 2, float(old), 2**31, 2**63]
    return st.one_of(st.sampled_from(near), st.integers(-(2**40), 2**40),
                     st.floats(min_value=-10.0, max_value=10.0, allow_nan=False))


def same_bytes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def claims_hold(doc: dict[str, Any], before: Inventory, after: Inventory) -> list[str]:
    """What an applied plan ``doc`` claims that the cluster does not show (``before`` and ``after`` applying it)."""
    wrong: list[str] = []
    now = {v.name: v for v in after.vms if v.active}
    was = {v.name: v for v in before.vms if v.active}
    hosts = {h.name: h for h in before.hosts}
    for name, p in doc["predicted"]["per_vm"].items():
        v = now.get(name)
        if v is None or v.meta is None:
            wrong.append(f"{name}: predicted, not running managed")
            continue
        if v.host != p["host"] or v.meta.cluster != p["cluster"]:
            wrong.append(f"{name}: on {v.host} of {v.meta.cluster}, predicted {p['host']} of {p['cluster']}")
        if v.cap_cores is None or abs(v.cap_cores - realisable_cap(p["cap_cores"], v.vcpus)) > CAP_TOLERANCE \
                or abs(v.cap_cores - p["cap_cores"]) > CAP_TOLERANCE:
            wrong.append(f"{name}: cap {v.cap_cores}, predicted {p['cap_cores']}")
        need = min(p["cpu_need_cores"], max(h.cores for h in before.hosts))
        given = p["yield"] * need  # cap = yield x need, rounded down on the quota grid (a step: vcpus / 100000)
        if v.cap_cores is None or not v.cap_cores - 1e-9 <= given < v.cap_cores + v.vcpus * 1e-5 + 1e-9:
            wrong.append(f"{name}: yield {p['yield']} on a need of {need} is not its cap {v.cap_cores}")
        if doc.get("needs") != "measured" and abs(v.meta.cpu_need_cores - p["cpu_need_cores"]) > 1e-9:
            wrong.append(f"{name}: need {v.meta.cpu_need_cores}, predicted {p['cpu_need_cores']}")
    ys = [p["yield"] for p in doc["predicted"]["per_vm"].values()]
    if ys and abs(min(ys) - doc["predicted"]["min_yield"]) > 1e-9:
        wrong.append(f"min_yield {doc['predicted']['min_yield']}, least predicted {min(ys)}")
    moved = 0
    for s in doc["steps"]:
        if s["op"] == "create":
            v = now.get(s["vm"])
            if v is None or v.meta is None or (v.host, v.vcpus, v.memory_bytes, v.meta.cluster) != (
                    s["host"], s["vcpus"], s["memory_bytes"], s["cluster"]):
                wrong.append(f"{s['vm']}: not created as claimed: {v}")
        if s["op"] == "migrate":
            v = was[s["vm"]]
            real = v.memory_bytes + (0 if hosts[s["from"]].storage == hosts[s["to"]].storage else v.disk_bytes)
            moved += real
            if s["bytes"] != real:
                wrong.append(f"{s['vm']}: claimed {s['bytes']} bytes, moved {real}")
    if "budget" in doc and (moved > doc["budget"] or doc["migrated_bytes"] != moved):
        wrong.append(f"moved {moved}, claimed {doc['migrated_bytes']} within {doc['budget']}")
    for h in after.hosts:
        on = [v for v in after.vms_on(h.name) if v.active]
        caps = sum(v.cap_or_vcpus for v in on if v.managed)
        if caps > h.cores + CAP_TOLERANCE and caps > sum(v.cap_or_vcpus for v in before.vms_on(h.name)
                                                         if v.active and v.managed) + CAP_TOLERANCE:
            wrong.append(f"host {h.name}: caps {caps} on {h.cores} cores")
        if sum(v.memory_bytes for v in on) > h.usable_memory:
            wrong.append(f"host {h.name}: memory over")
    return wrong
