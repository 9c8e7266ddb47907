"""``vcsched solve --policy``: the placement of the chosen algorithm, the yields of the chosen policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import cli  # the group with every command registered
from vcsched.formats.instance import instance_from_dict
from vcsched.policies import PolicyOptions, allocate_policy

OLD = {
    "hosts": [{"name": "a", "cpu": 1.0, "memory": 1.0}, {"name": "b", "cpu": 1.0, "memory": 1.0}],
    "jobs": [{"name": "web", "cpu_need": 0.8, "memory": 0.4}, {"name": "db", "cpu_need": 0.9, "memory": 0.4},
             {"name": "cache", "cpu_need": 0.6, "memory": 0.3, "tasks": 2}],
}
SHARING = {
    "hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0, "capacity": {"disk": 1.0, "net": 1.0}},
              {"name": "h1", "cpu": 1.0, "memory": 1.0, "capacity": {"disk": 0.6, "net": 1.0}}],
    "jobs": [{"name": "a", "cpu_need": 0.5, "memory": 0.3, "tasks": 2, "needs": {"disk": 0.3}, "weight": 2.0,
              "tenant": "ads"},
             {"name": "b", "cpu_need": 0.9, "memory": 0.3, "tasks": 2, "needs": {"disk": 0.6, "net": 0.2},
              "tenant": "search"}],
    "tenants": [{"name": "org", "weight": 1.0}, {"name": "ads", "weight": 3.0, "parent": "org"},
                {"name": "search", "weight": 1.0, "parent": "org"}],
}


def solve(tmp_path: Path, doc: dict[str, Any], *args: str) -> Any:
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(doc))
    return CliRunner().invoke(cli, ["solve", str(path), "--json", *args])


def without_runtime(out: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in out.items() if k != "runtime_s"}


def test_without_policy_an_old_instance_prints_exactly_todays_document(tmp_path: Path) -> None:
    out = json.loads(solve(tmp_path, OLD).output)
    assert set(out) == {"ok", "algorithm", "feasible", "min_yield", "avg_yield", "runtime_s", "optimal", "placement",
                        "detail"}  # "ok": every deciding command's verdict (docs/cli.md)
    assert all(set(row) == {"job", "task", "host", "cpu"} for row in out["placement"])


def test_policy_yield_adds_policy_and_yields_and_keeps_every_other_field(tmp_path: Path) -> None:
    plain = json.loads(solve(tmp_path, OLD).output)
    with_policy = json.loads(solve(tmp_path, OLD, "--policy", "yield").output)
    assert with_policy.pop("policy") == "yield"
    yields = with_policy.pop("yields")
    assert without_runtime(with_policy) == without_runtime(plain)  # bit for bit
    cpu_need = {j["name"]: j["cpu_need"] for j in OLD["jobs"]}
    for row in plain["placement"]:
        assert row["cpu"] == pytest.approx(yields[row["job"]] * cpu_need[row["job"]], abs=1e-15)


@pytest.mark.parametrize("policy", ["drf", "drf-pools", "asset", "pf", "hdrf"])
def test_policy_rows_carry_every_extra_resource_and_the_yields_of_the_policy(tmp_path: Path, policy: str) -> None:
    result = solve(tmp_path, SHARING, "--policy", policy)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["policy"] == policy
    inst = instance_from_dict(SHARING)
    hosts = [row["host"] for row in out["placement"]]
    expected = allocate_policy(inst, np.array(hosts), policy)
    assert out["yields"] == pytest.approx(expected.yield_of(inst), abs=1e-9)
    assert out["min_yield"] == pytest.approx(min(expected.yields), abs=1e-9)
    for row in out["placement"]:
        j = next(i for i, job in enumerate(inst.jobs) if job.name == row["job"])
        y = out["yields"][row["job"]]
        assert {"disk", "net"} <= set(row)
        assert row["cpu"] == pytest.approx(y * inst.jobs[j].cpu_need)
        assert row["disk"] == pytest.approx(y * inst.jobs[j].need_of("disk"))
        assert row["net"] == pytest.approx(y * inst.jobs[j].need_of("net"))


def test_alpha_fair_takes_its_alpha(tmp_path: Path) -> None:
    out = json.loads(solve(tmp_path, SHARING, "--policy", "alpha-fair", "--alpha", "2").output)
    inst = instance_from_dict(SHARING)
    hosts = np.array([row["host"] for row in out["placement"]])
    expected = allocate_policy(inst, hosts, "alpha-fair", PolicyOptions(alpha=2.0))
    assert out["yields"] == pytest.approx(expected.yield_of(inst), abs=1e-9)


def test_an_instance_with_extra_resources_gets_them_honoured_without_a_policy(tmp_path: Path) -> None:
    out = json.loads(solve(tmp_path, SHARING).output)
    assert out["policy"] == "yield"
    load: dict[tuple[int, str], float] = {}
    for row in out["placement"]:
        for r in ("cpu", "disk", "net"):
            load[row["host"], r] = load.get((row["host"], r), 0.0) + row[r]
    caps = {(h, r): SHARING["hosts"][h].get("capacity", {}).get(r, SHARING["hosts"][h].get(r))  # type: ignore[union-attr]
            for h in range(2) for r in ("cpu", "disk", "net")}
    assert all(load[k] <= caps[k] + 1e-9 for k in load)


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "fairest"], "vcsched: error: policy: unknown policy 'fairest' (known: alpha-fair, asset, drf"),
    (["--policy", "alpha-fair"], "vcsched: error: alpha: policy 'alpha-fair' needs an alpha"),
    (["--policy", "alpha-fair", "--alpha", "0"], "vcsched: error: Invalid value for '--alpha': 0.0 is not in the "
                                                 "range 0<x<=100."),
    (["--policy", "alpha-fair", "--alpha", "nan"], "vcsched: error: Invalid value for '--alpha': 'nan' is not a "
                                                   "finite number."),
    (["--policy", "alpha-fair", "--alpha", "two"], "vcsched: error: Invalid value for '--alpha'"),
    (["--policy", "drf", "--alpha", "2"], "vcsched: error: alpha: only the alpha-fair policy takes an alpha"),
    (["--alpha", "2"], "vcsched: error: alpha: only the alpha-fair policy takes an alpha, not 'yield'"),
])
def test_bad_policy_or_alpha_exits_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = solve(tmp_path, OLD, *args)
    assert result.exit_code == 2
    assert result.output.startswith(message)
    assert result.output.count("\n") == 1


def test_the_human_output_shows_the_policys_yields_and_dominant_shares(tmp_path: Path) -> None:
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(SHARING))
    result = CliRunner().invoke(cli, ["solve", str(path), "--policy", "pf"])
    assert result.exit_code == 0, result.output
    assert "policy pf: yields and dominant shares" in result.output
    assert "KKT residuals" in result.output
