"""Every move audited (#39): the pure audit (predictions and samples in, predicted against achieved out), the
controller auditing the plans it applies and the recommendations an operator approves once they settle (in memory,
fake clock: tests/test_controller.py), its events, metrics and store, and `vcsched audit`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from acting.audits import AuditStore
from acting.executor import apply_plan
from acting.recommendations import RecommendationStore
from cli.main import cli
from tests.builders import inventory_of, managed
from tests.fake_load import FakeClock, FakeLocks, LoadedHypervisor, busy, phases
from tests.test_controller import INTERVAL, Run
from vcsched.control import audit as au
from vcsched.control import recommend as rc
from vcsched.control.observe import Sample
from vcsched.inventory import VmState
from vcsched.plans.plan import plan_from_dict

# ---------------------------------------------------------------- the audit (pure)


def used(cores: float, seconds: float = 10.0) -> list[Sample]:
    return [Sample(1000.0 + i, 1.0, cores, None) for i in range(int(seconds))]


def two_vms(a_before: float | None = 0.5) -> au.Pending:
    return au.Pending("p1", "re-balance", "run", 1000.0, 20.0, (
        au.Touched("a-0", 1.0, 0.5, 0.9, a_before),  # starved at 0.5, predicted 0.9
        au.Touched("c-0", 0.1, 1.0, 1.0, 0.05)))  # idles at half its (estimated) need: no change predicted


def test_achieved_yield_is_use_over_the_need_predicted_against() -> None:
    assert au.achieved_yield(0.45, 0.9) == pytest.approx(0.5)
    assert au.achieved_yield(2.0, 1.0) == 1.0 and au.achieved_yield(0.0, 0.0) == 1.0
    assert au.achieved_yield(None, 1.0) is None
    assert au.mean_used([Sample(1.0, 1.0, 0.2, None), Sample(4.0, 3.0, 0.6, None)]) == pytest.approx(0.5)
    assert au.mean_used([]) is None


def test_a_plan_that_does_what_it_said_is_met_although_an_idle_vm_uses_less_than_its_need() -> None:
    a = au.audit(two_vms(), {"a-0": used(0.9), "c-0": used(0.05)}, 1020.0)
    assert a.predicted_gain == pytest.approx(0.4) and a.achieved_gain == pytest.approx(0.4)
    assert a.result == au.MET
    by_vm = {v.vm: v for v in a.vms}
    assert by_vm["c-0"].achieved_after == pytest.approx(0.5) and by_vm["c-0"].achieved_gain == pytest.approx(0.0)


def test_a_plan_whose_vm_gets_less_than_predicted_is_short() -> None:
    a = au.audit(two_vms(), {"a-0": used(0.6), "c-0": used(0.05)}, 1020.0)  # a host CPU it waits for: 0.6 not 0.9
    assert a.achieved_gain == pytest.approx(0.1) and a.result == au.SHORT
    within = au.audit(two_vms(), {"a-0": used(0.9 - au.SHORT_BY + 0.01), "c-0": used(0.05)}, 1020.0)
    assert within.result == au.MET


def test_a_plan_with_no_vm_measured_is_neither_met_nor_short() -> None:
    a = au.audit(two_vms(a_before=None), {}, 1020.0)
    assert a.achieved_gain is None and a.result == au.UNMEASURED


def test_an_audit_round_trips_through_json_and_the_log_keeps_the_newest() -> None:
    a = au.audit(two_vms(), {"a-0": used(0.9), "c-0": used(0.05)}, 1020.0)
    log = au.AuditLog()
    for _ in range(au.KEEP_AUDITS + 3):
        log, _ = au.add(log, a)
    assert len(log.audits) == au.KEEP_AUDITS
    again = au.AuditLog.from_dict(json.loads(json.dumps(log.to_dict())))
    assert again == log and again.last(1)[0].to_dict() == a.to_dict()


# ---------------------------------------------------------------- the controller (in memory, fake clock)


def crowded(hog: VmState | None = None, hog_from: float = 0.0) -> tuple[LoadedHypervisor, FakeClock]:
    """a-0 and b-0 (busy, need 1 core each) share h0; c-0 idles on h1: a re-balance moves one of them to h1.
    ``hog``: an unmanaged VM on h1 that starts using a core at ``hog_from`` (contention the caps do not see)."""
    clock = FakeClock()
    vms = [managed("a-0", "h0", "a", 1.0, 0.5), managed("b-0", "h0", "b", 1.0, 0.5),
           managed("c-0", "h1", "c", 1.0, 1.0)]
    inv = inventory_of([*vms, *([hog] if hog is not None else [])])
    demand = {"a-0": busy(1.0), "b-0": busy(1.0), "c-0": busy(0.05)}
    if hog is not None:
        demand[hog.name] = phases((0.0, hog_from), (1.0, 1e9))
    return LoadedHypervisor("lab", inv.hosts, inv.vms, clock, demand), clock


def audited(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.events("audit") if e["result"] != "dropped"]


def test_the_controller_audits_its_re_balance_once_settled_and_it_is_met(tmp_path: Path) -> None:
    hv, clock = crowded()
    run = Run(hv, clock, FakeLocks())
    store = AuditStore(f"file://{tmp_path}", "k")
    run.controller.audits = store
    run.cycles(8)
    applied = [e for e in run.events("applied") if e["kind"] == "re-balance"]
    assert len(applied) == 1
    (a,) = [e for e in audited(run) if e["kind"] == "re-balance"]
    # due 2 windows (of one interval) after it was applied, audited at the interval that ends them
    assert a["audited_at"] - a["applied_at"] == pytest.approx(2 * INTERVAL)
    assert a["settle_seconds"] == 2 * INTERVAL and a["source"] == "run" and a["plan"].startswith("p")
    moved = next(v for v in a["vms"] if v["predicted_gain"] > 0.3)  # the VM that left h0
    assert moved["predicted_before"] == pytest.approx(0.5) and moved["achieved_before"] == pytest.approx(0.5, 0.02)
    assert moved["achieved_after"] == pytest.approx(moved["predicted_after"], abs=0.02)
    assert a["predicted_gain"] == pytest.approx(0.417, abs=0.01)
    assert a["achieved_gain"] == pytest.approx(a["predicted_gain"], abs=au.SHORT_BY) and a["result"] == au.MET
    log = store.read()
    assert [x.plan_id for x in log.audits if x.kind == "re-balance"] == [a["plan"]]
    m = run.controller.metrics
    assert m.audits[au.MET] >= 1 and m.plan_gain_predicted is not None and m.plan_gain_achieved is not None


def test_contention_the_caps_do_not_see_makes_the_audit_short(tmp_path: Path) -> None:
    hog = VmState("hog", "h1", 1, 128 << 20, True, None, None)  # unmanaged, uncapped: vcsched does not touch it
    hv, clock = crowded(hog, hog_from=32.0)  # it wakes after the re-balance (applied at 20 s) moved a VM to h1
    run = Run(hv, clock, FakeLocks())
    run.controller.audits = AuditStore(f"file://{tmp_path}", "k")
    run.cycles(6)
    (a,) = [e for e in audited(run) if e["kind"] == "re-balance"]
    moved = next(v for v in a["vms"] if v["predicted_gain"] > 0.3)
    assert moved["achieved_after"] < moved["predicted_after"] - 0.2  # it shares h1's core with the hog
    assert a["result"] == au.SHORT and a["achieved_gain"] < a["predicted_gain"] - au.SHORT_BY
    assert run.controller.metrics.audits[au.SHORT] == 1


def test_a_plan_touched_again_before_it_settled_is_dropped_not_misjudged() -> None:
    hv, clock = crowded()
    run = Run(hv, clock, FakeLocks(), audit_windows=20)  # longer than the re-cap that follows the re-balance
    run.cycles(8)
    dropped = [e for e in run.events("audit") if e["result"] == "dropped"]
    assert dropped and all("before it settled" in e["reason"] for e in dropped)
    assert not audited(run)


def test_an_approved_recommendation_is_audited_by_the_recommending_controller(tmp_path: Path) -> None:
    hv, clock = crowded()
    books = RecommendationStore(f"file://{tmp_path}", "k")
    store = AuditStore(f"file://{tmp_path}", "k")
    run = Run(hv, clock, FakeLocks(), recommend=True)
    run.controller.recommendations, run.controller.audits = books, store
    run.cycles(6)
    r = next(r for r in rc.open_ones(books.read(), clock.time()) if r.kind == "re-balance")
    books.update(lambda b: rc.approve(b, r.id, clock.time(), "alice"))  # as `vcsched approve` does
    assert apply_plan(hv, plan_from_dict(dict(r.plan))).ok
    books.update(lambda b: rc.settle(b, r.id, rc.APPLIED, "applied"))
    run.cycles(4)
    (a,) = [e for e in audited(run) if e["plan"] == r.id]
    assert a["source"] == "approve" and a["kind"] == "re-balance"
    assert a["predicted_gain"] == pytest.approx(r.effect["min_yield_after"] - r.effect["min_yield_before"],
                                                abs=0.01)
    assert a["result"] == au.MET, a
    assert [x.plan_id for x in store.read().audits] == [r.id]


def test_audit_after_is_validated() -> None:
    from acting.controller import RunOptions
    from vcsched.control.rebalance import RebalanceOptions
    from vcsched.errors import InputError

    with pytest.raises(InputError, match=r"^--audit-after: 0 is below 1 window$"):
        RunOptions(10.0, RebalanceOptions(0), audit_windows=0)


# ---------------------------------------------------------------- `vcsched audit`


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_vcsched_audit_lists_the_last_plans_with_both_numbers(tmp_path: Path) -> None:
    from hypervisor.identity import identity, lock_key

    path = tmp_path / "cluster.toml"
    path.write_text(f'name = "t"\ncoordination = "file://{tmp_path / "coord"}"\n'
                    '[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    store = AuditStore(f"file://{tmp_path / 'coord'}", lock_key([identity(None, "test:///default")]))
    met = au.audit(two_vms(), {"a-0": used(0.9), "c-0": used(0.05)}, 1020.0)
    short = au.audit(au.Pending("r0badc0de", "re-cap", "approve", 2000.0, 20.0, two_vms().vms),
                     {"a-0": used(0.6), "c-0": used(0.05)}, 2020.0)
    for a in (met, short):
        store.update(lambda log, a=a: au.add(log, a))  # type: ignore[misc]
    doc = invoke("audit", "--cluster", path, "--json")
    assert doc.exit_code == 0, doc.output
    audits = json.loads(doc.stdout)["audits"]
    assert [a["plan"] for a in audits] == ["r0badc0de", "p1"]  # newest first
    assert audits[0]["result"] == "short" and audits[0]["achieved_gain"] == pytest.approx(0.1)
    assert {v["vm"] for v in audits[0]["vms"]} == {"a-0", "c-0"}
    last = invoke("audit", "--cluster", path, "--json", "--last", "1")
    assert [a["plan"] for a in json.loads(last.stdout)["audits"]] == ["r0badc0de"]
    text = invoke("audit", "--cluster", path)
    assert text.exit_code == 0, text.output
    assert "r0badc0de" in text.stdout and "short" in text.stdout and "+0.400" in text.stdout
    assert "+0.100" in text.stdout and "a-0" in text.stdout
    bad = invoke("audit", "--cluster", path, "--last", "0")
    assert bad.exit_code == 2 and "--last" in bad.stderr


def test_the_audit_log_lives_beside_the_recommendations_on_etcd(etcd: Any) -> None:
    here, there = AuditStore(etcd.url, "k"), AuditStore(etcd.url, "k")
    a = au.audit(two_vms(), {"a-0": used(0.9), "c-0": used(0.05)}, 1020.0)
    here.update(lambda log: au.add(log, a))
    there.update(lambda log: au.add(log, a))
    assert [x.to_dict() for x in here.read().audits] == [a.to_dict()] * 2  # compare-and-swap: neither lost
    assert RecommendationStore(etcd.url, "k").read() == rc.Book()  # a document of its own, not the book


def test_a_plan_after_a_probe_is_audited_from_the_caps_before_the_probe() -> None:
    """The window's use was measured under the caps before the probe raised them: the predicted "before" is those
    caps too, or a plan that keeps the probe's raise would be predicted to gain nothing."""
    from tests.test_controller import loaded

    hv, clock = loaded([managed("a-0", "h0", "a", 0.3, 0.1), managed("b-0", "h0", "b", 0.3, 0.1),
                        managed("c-0", "h0", "c", 0.3, 0.3)],
                       {"a-0": busy(1.0), "b-0": busy(1.0), "c-0": busy(0.2)}, n_hosts=1)
    run = Run(hv, clock, FakeLocks())
    run.cycles(8)
    probe = run.events("probe")[0]
    a = next(e for e in audited(run) if e["applied_at"] > probe["time"])
    a0 = next(v for v in a["vms"] if v["vm"] == "a-0")
    assert a0["predicted_before"] == pytest.approx(probe["before"]["a-0"] / a0["need_cores"], abs=1e-6)
    assert a0["predicted_gain"] > 0.1 and a["result"] == au.MET


def test_an_approval_still_applying_at_an_interval_is_measured_from_before_it_was_approved(tmp_path: Path) -> None:
    """`vcsched approve` migrates for as long as it takes; the controller sees it applied an interval or more
    later, when its VMs already run under the new caps: "before" is the last window that ended before the
    approval (on the lab, the window during the migration had no sample of the moving VM at all)."""
    hv, clock = crowded()
    books = RecommendationStore(f"file://{tmp_path}", "k")
    run = Run(hv, clock, FakeLocks(), recommend=True)
    run.controller.recommendations, run.controller.audits = books, AuditStore(f"file://{tmp_path}", "k")
    run.cycles(6)
    r = next(r for r in rc.open_ones(books.read(), clock.time()) if r.kind == "re-balance")
    books.update(lambda b: rc.approve(b, r.id, clock.time(), "alice"))
    assert apply_plan(hv, plan_from_dict(dict(r.plan))).ok
    run.cycles(2)  # still "approved" in the book: the approving command has not said it is done
    books.update(lambda b: rc.settle(b, r.id, rc.APPLIED, "applied"))
    run.cycles(4)
    (a,) = [e for e in audited(run) if e["plan"] == r.id]
    moved = next(v for v in a["vms"] if v["predicted_gain"] > 0.3)
    assert moved["achieved_before"] == pytest.approx(moved["predicted_before"], abs=0.02)  # its use at cap 0.5
    assert a["result"] == au.MET, a
