"""Every applied plan audited against its prediction (vcsched.control.audit): pure, then through the controller on
the fake-clock cluster, where the model is exact and achieved must match predicted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from tests.builders import inventory_of, managed
from tests.fake_load import FakeLocks
from tests.test_controller import Run, crowded_h0
from vcsched.control.audit import AuditRecord, achieved_yields, audits_of, pending_audit, sample_yield, settle
from vcsched.control.observe import Sample, cap_plan
from vcsched.plans.plan import VmPrediction


def test_a_sample_that_got_all_it_wanted_achieves_one_and_a_held_back_one_its_share_of_the_need() -> None:
    assert sample_yield(Sample(0, 1, 0.3, 0.8, 1, False, 0.0, 0.0), 0.5) == 1.0  # below cap, no wait
    assert sample_yield(Sample(0, 1, 0.4, 0.4), 0.8) == pytest.approx(0.5)  # at its cap
    assert sample_yield(Sample(0, 1, 0.2, 0.8, 1, False, 0.0, 0.5), 0.8) == pytest.approx(0.25)  # starved


def test_an_audit_compares_the_predicted_gain_with_the_achieved_one_over_the_samples_after_the_plan() -> None:
    inv = inventory_of([managed("a-0", "h0", "a", 0.8, 0.4)], n_hosts=1)
    plan = cap_plan(inv, {"a-0": 0.8})
    plan = type(plan)(plan.kind, plan.cluster, plan.snapshot, 1.0, 1.0,
                      {"a-0": VmPrediction("h0", "a", 0.8, 0.8, 1.0)}, plan.steps, extra=plan.extra)
    before = {"a-0": [Sample(100.0 + i, 1.0, 0.4, 0.4) for i in range(3)]}  # at its 0.4 cap: 0.5 of 0.8
    p = pending_audit("re-cap", plan, {"a-0": 0.4}, {"a-0": 0.8}, before, 103.0, 4.0)
    assert p is not None and p.achieved_before == {"a-0": 0.5} and p.predicted_before == {"a-0": 0.5}
    starved = {"a-0": [Sample(105.0 + i, 1.0, 0.3, 0.8, 1, False, 0.0, 0.5) for i in range(3)]}
    rec = settle(p, starved, 108.0)
    assert rec.predicted_gain == pytest.approx(0.5) and rec.achieved_gain == pytest.approx(0.375 - 0.5)
    assert rec.shortfall == pytest.approx(0.625)
    assert AuditRecord.from_dict(rec.to_dict()).achieved_gain == pytest.approx(-0.125)
    assert achieved_yields(starved, {"a-0": 0.8}, ["a-0"], since=106.0) == {"a-0": pytest.approx(0.375)}


def test_the_controller_audits_each_applied_plan_and_on_an_exact_model_achieves_what_it_predicted() -> None:
    hv, clock = crowded_h0()
    run = Run(hv, clock, FakeLocks(), probe_seconds=0.0)
    run.cycles(10)
    applied = [e for e in run.events("applied") if e.get("ok") and e.get("steps")]
    audits = audits_of(run.events())
    assert applied and audits, run.events("decision")
    rebalance = [a for a in audits if a.kind == "re-balance"]
    assert rebalance and rebalance[0].predicted_gain > 0.2
    for a in audits:
        assert a.achieved_gain is not None and abs(a.achieved_gain - a.predicted_gain) <= 0.05, a
    assert run.controller.metrics.audited == len(audits)


def test_vcsched_audit_lists_predicted_against_achieved_from_the_controllers_log(tmp_path: Path) -> None:
    rec = AuditRecord("re-balance", 1_700_000_000.0, 1_700_000_010.0, 0.4, 0.1,
                      {"a-0": {"predicted_after": 0.9, "achieved_after": 0.6}}, ("a-0",))
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps({"event": "interval"}) + "\n" + json.dumps({"event": "audit", **rec.to_dict()}) + "\n")
    r = CliRunner().invoke(cli, ["audit", "--events", str(log), "--json"])
    assert r.exit_code == 0, r.output
    (got,) = json.loads(r.stdout)["audits"]
    assert got["predicted_gain"] == 0.4 and got["achieved_gain"] == 0.1 and got["shortfall"] == pytest.approx(0.3)
    table = CliRunner().invoke(cli, ["audit", "--events", str(log)])
    assert "≤+0.400" in table.stdout and "+0.100" in table.stdout and "a-0" in table.stdout
    gone = CliRunner().invoke(cli, ["audit", "--events", str(tmp_path / "none.jsonl")])
    assert gone.exit_code == 1 and "cannot read" in gone.stderr
