"""``vcsched experiment policies``: the instances, the runs, the tables, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vcsched.experiments import policies as P
from vcsched.experiments.generate import GeneratorSpec
from vcsched.policies.allocation import PolicyOptions
from vcsched.policies.registry import allocate_policy
from vcsched.solvers.registry import solve
from vcsched.validate import check_instance

SMALL = GeneratorSpec(hosts=8, tasks=30, slack=0.5, cv_mem=0.25, cv_cpu=0.75, parallel=True)


def test_an_instance_has_disk_and_net_weights_and_a_three_level_tree() -> None:
    inst = P.policy_instance(SMALL, 1)
    check_instance(inst)
    assert inst.resources == ("cpu", "disk", "net")
    assert set(inst.job_weight.tolist()) <= set(P.WEIGHTS)
    assert all(j.tenant is not None and j.tenant.count(".team") == 1 for j in inst.jobs)
    assert {t.parent for t in inst.tenants} == {None, *(f"org{o}" for o in range(P.ORGS))}
    assert P.policy_instance(SMALL, 1) == inst  # seeded


def test_the_unweighted_and_cpu_only_views_keep_the_jobs() -> None:
    inst = P.policy_instance(SMALL, 2)
    plain, cpu = P.unweighted(inst), P.cpu_only(inst)
    assert (plain.job_weight == 1).all() and not plain.tenants and plain.job_need.tolist() == inst.job_need.tolist()
    assert not cpu.has_extra_resources and cpu.job_alpha.tolist() == inst.job_alpha.tolist()


def test_jains_index() -> None:
    assert P.jain(np.array([0.5, 0.5, 0.5])) == pytest.approx(1.0)
    assert P.jain(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)


def test_every_policy_runs_on_every_placement_of_the_same_instance() -> None:
    item = P.work_items([SMALL], 1, 0)[0]
    records = P.run_item(item)
    assert {(r.policy, r.placement) for r in records} == {(p, pl) for p in P.POLICY_LABELS for pl in P.PLACEMENTS}
    assert all(r.feasible and r.error is None for r in records)
    assert all(r.utilisation is not None and max(r.utilisation.values()) <= 1 + 1e-9 for r in records)
    own = {r.policy: r for r in records if r.placement == "policy"}
    assert own["yield"].method == own["drf"].method == "level" and own["pf"].method == "max-min"
    # yield's own placement is the max-min one: the same numbers
    same = next(r for r in records if r.policy == "yield" and r.placement == "max-min")
    assert own["yield"].min_yield == same.min_yield


def test_run_items_reports_progress_in_this_process() -> None:
    items = P.work_items([SMALL], 2, 3)
    seen: list[tuple[int, int]] = []
    batches = list(P.run_items(items, 1, lambda done, total, _: seen.append((done, total))))
    assert len(batches) == 2 and seen == [(0, 2), (1, 2), (2, 2)]


def test_the_report_has_both_tables() -> None:
    records = P.run_item(P.work_items([SMALL], 1, 5)[0])
    text = P.report_markdown(records, {"instances": 1})
    assert "| wdrf |" in text and "cpu-only: min / avg" in text and "util disk" in text


def test_pf_on_a_placement_with_many_identical_rows_is_solved() -> None:
    # Clarabel stopped with a numerical error on this experiment instance (8 jobs, 189 rows, many identical):
    # the identical rows are merged and the answer polished to the KKT conditions.
    spec = GeneratorSpec(hosts=64, tasks=100, slack=0.5, cv_mem=0.75, cv_cpu=0.75, parallel=True)
    item = P.work_items(P.families(64, [100], [0.3, 0.5, 0.7], [0.25, 0.75]), 1, 0)[7]
    assert item.spec == spec
    inst = P.unweighted(P.policy_instance(spec, item.seed))
    hosts = solve(inst, "mcb8").allocation.hosts  # type: ignore[union-attr]
    for policy, alpha in (("pf", None), ("alpha-fair", 2.0)):
        result = allocate_policy(inst, hosts, policy, PolicyOptions(alpha=alpha))
        kkt = result.detail["kkt"]
        assert isinstance(kkt, dict) and max(kkt.values()) < 1e-8


def test_the_cli_writes_the_report_records_and_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cli.policy_experiment as E
    from cli.main import cli

    monkeypatch.setattr(E, "HOSTS", 8)
    monkeypatch.setattr(E, "SLACKS", (0.5,))
    monkeypatch.setattr(E, "CVS", (0.25,))
    r = CliRunner().invoke(cli, ["experiment", "policies", "--tasks", "30", "-n", "1", "-j", "1", "-o",
                                 str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [s["policy"] for s in doc["summary"]] == list(P.POLICY_LABELS) and doc["errors"] == 0
    assert (tmp_path / "report.md").exists() and (tmp_path / "records.json").exists()
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    assert (tmp_path / "policies.png").exists() and (tmp_path / "policies_placement.png").exists()


# --- the policies' rows of `vcsched bench` ---------------------------------------------------------------


def test_bench_rows_say_whether_each_target_is_met() -> None:
    from vcsched.experiments.policy_bench import BenchRow, target_text, within_target

    assert within_target(BenchRow("cluster", "pf", 0.9, 1.0, 0, 0, "")) is True
    assert within_target(BenchRow("tenants", "hdrf", 0.6, 0.7, 0, 0, "")) is False
    assert within_target(BenchRow("cluster", "yield", 0.6, 0.7, 0, 0, "")) is None
    assert target_text(BenchRow("cluster", "drf (weighted)", 0.2, 0.3, 0, 0, "")) == "MISSED (<= 0.1 s)"


def test_vcsched_bench_times_the_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    import vcsched.experiments.policy_bench as B
    from cli.main import cli

    monkeypatch.setattr(B, "CASES", {"cluster": lambda: B.cluster_case(hosts=8, vms=40, parallel=False),
                                     "tenants": lambda: B.tenants_case(hosts=8, leaves_per_team=2, teams=2,
                                                                       orgs=2, vms_per_job=2)})
    r = CliRunner().invoke(cli, ["bench", "-a", "policies", "-r", "1", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["policies"]
    assert [(x["case"], x["policy"]) for x in rows] == [
        ("cluster", "yield"), ("cluster", "drf"), ("cluster", "drf (weighted)"), ("cluster", "drf-pools"),
        ("cluster", "asset"), ("cluster", "pf"), ("cluster", "alpha-fair"),
        ("tenants", "drf"), ("tenants", "pf"), ("tenants", "hdrf")]
    assert {x["policy"] for x in rows if x["within_target"] is None} == {"yield", "alpha-fair"}  # no target
