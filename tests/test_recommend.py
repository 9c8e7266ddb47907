"""Recommend mode: the book's transitions (pure), its file store, the controller recording instead of acting and
respecting vetoes (in memory, fake clock), approving exactly the recorded steps, and the CLI's refusals."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from acting.executor import apply_plan
from acting.recommendations import RecommendationStore
from cli.main import cli
from tests.builders import inventory_of, managed
from tests.fake_load import FakeClock, FakeLocks, LoadedHypervisor, busy
from tests.test_controller import Run
from vcsched.control import recommend as rc
from vcsched.errors import InputError
from vcsched.plans.plan import plan_from_dict
from vcsched.plans.reasons import yield_of


def rec(kind: str = "re-balance", steps: list[dict[str, Any]] | None = None, now: float = 1000.0,
        valid: float = 600.0) -> rc.Recommendation:
    steps = steps if steps is not None else [{"op": "migrate", "vm": "a-0", "from": "h0", "to": "h1"}]
    plan = {"steps": steps, "snapshot": "s"}
    return rc.new_recommendation(kind, "lab", "because", plan, ["why"] * len(steps), {}, now, valid, "m1")


# ---------------------------------------------------------------- the book (pure)


def test_a_new_recommendation_supersedes_the_open_one_of_its_kind() -> None:
    book, first = rc.record(rc.Book(), rec(now=1000.0))
    book, second = rc.record(book, rec(steps=[{"op": "migrate", "vm": "b-0", "from": "h0", "to": "h1"}], now=1010))
    states = {r.id: r.state for r in book.recommendations}
    assert states == {first.id: rc.SUPERSEDED, second.id: rc.OPEN}
    assert [r.id for r in rc.open_ones(book, 1011)] == [second.id]


def test_the_same_steps_again_keep_the_recommendation_and_extend_it() -> None:
    book, first = rc.record(rc.Book(), rec(now=1000.0))
    book, again = rc.record(book, rec(now=1100.0))
    assert again.id == first.id and again.valid_until == 1700.0 and len(book.recommendations) == 1


def test_a_re_cap_and_a_re_balance_are_open_side_by_side() -> None:
    book, a = rc.record(rc.Book(), rec("re-cap", [{"op": "set-cap", "vm": "a-0", "host": "h0"}]))
    book, b = rc.record(book, rec())
    assert {r.id for r in rc.open_ones(book, 1001)} == {a.id, b.id}


def test_approving_twice_is_refused_naming_who_approved() -> None:
    book, r = rc.record(rc.Book(), rec())
    book, _ = rc.approve(book, r.id, 1001, "alice@x:1")
    with pytest.raises(rc.Refused, match=rf"^recommendation {r.id} is already approved by alice@x:1 at "):
        rc.approve(book, r.id, 1002, "bob@y:2")
    book, _ = rc.settle(book, r.id, rc.APPLIED, "applied")
    with pytest.raises(rc.Refused, match="is already applied"):
        rc.approve(book, r.id, 1003, "bob@y:2")


def test_approving_past_its_validity_is_refused_as_stale() -> None:
    book, r = rc.record(rc.Book(), rec(now=1000.0, valid=60))
    assert r.state_at(1061) == rc.EXPIRED
    with pytest.raises(rc.Refused, match=rf"^recommendation {r.id} is stale: it was valid until "):
        rc.approve(book, r.id, 1061, "alice")


def test_an_unknown_id_is_bad_input() -> None:
    with pytest.raises(InputError, match=r"^recommendation 'r0000': no such recommendation"):
        rc.approve(rc.Book(), "r0000", 1, "alice")


def test_a_skip_vetoes_its_vms_for_the_time_given() -> None:
    book, r = rc.record(rc.Book(), rec(now=1000.0))
    book, skipped = rc.skip(book, r.id, 1001, "alice", 3600)
    assert skipped.state == rc.SKIPPED and "a-0 stay put" in skipped.detail
    assert book.vetoed(1002) == {"a-0"} and book.vetoed(4602) == set()
    with pytest.raises(rc.Refused, match="already skipped"):
        rc.skip(book, r.id, 1003, "alice", 60)
    with pytest.raises(rc.Refused, match="already skipped"):
        rc.approve(book, r.id, 1003, "alice")


def test_the_book_round_trips_through_json() -> None:
    book, r = rc.record(rc.Book(), rec())
    book, _ = rc.skip(book, r.id, 1001, "alice", 60)
    assert rc.Book.from_dict(json.loads(json.dumps(book.to_dict()))) == book


# ---------------------------------------------------------------- the file store


def test_the_file_store_updates_atomically_under_concurrent_writers(tmp_path: Path) -> None:
    store = RecommendationStore(f"file://{tmp_path}", "k")

    def add(i: int) -> None:
        store.update(lambda book: rc.record(book, rec("re-cap" if i % 2 else "re-balance",
                                                      [{"op": "set-cap", "vm": f"v{i}", "host": "h0"}], now=i)))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    book = store.read()
    assert len(book.recommendations) == 20  # none lost: 2 open (one per kind), 18 superseded
    assert sorted(r.state for r in book.recommendations).count(rc.OPEN) == 2
    assert not list(tmp_path.glob("*.tmp"))


# ---------------------------------------------------------------- the controller (in memory, fake clock)


def crowded() -> tuple[LoadedHypervisor, FakeClock]:
    clock = FakeClock()
    inv = inventory_of([managed("a-0", "h0", "a", 1.0, 0.5), managed("b-0", "h0", "b", 1.0, 0.5),
                        managed("c-0", "h1", "c", 1.0, 1.0)])
    return LoadedHypervisor("lab", inv.hosts, inv.vms, clock, {"a-0": busy(1.0), "b-0": busy(1.0),
                                                                  "c-0": busy(0.05)}), clock


def recommending(tmp_path: Path) -> tuple[LoadedHypervisor, Run, RecommendationStore]:
    hv, clock = crowded()
    store = RecommendationStore(f"file://{tmp_path}", "k")
    run = Run(hv, clock, FakeLocks(), recommend=True)
    run.controller.recommendations = store
    return hv, run, store


def test_recommend_mode_records_a_re_balance_with_reasons_and_predictions_and_changes_nothing(
        tmp_path: Path) -> None:
    hv, run, store = recommending(tmp_path)
    before = {n: (v.host, v.cap_cores) for n, v in hv.vms.items()}
    run.cycles(6)
    assert {n: (v.host, v.cap_cores) for n, v in hv.vms.items()} == before  # nothing applied, not even a probe
    assert not run.events("step") and not run.events("probe")
    moves = [r for r in rc.open_ones(store.read(), run.clock.time()) if r.kind == "re-balance"]
    assert len(moves) == 1
    r = moves[0]
    migrate = [s for s in r.to_dict()["steps"] if s["op"] == "migrate"]
    assert len(migrate) == 1 and migrate[0]["from"] == "h0" and migrate[0]["to"] == "h1"
    assert "h0 is over-committed (its VMs need 2.00 cores of its 1)" in migrate[0]["reason"]
    assert r.reason.startswith("gain ") and r.effect["min_yield_after"] > r.effect["min_yield_before"]
    assert r.effect["bytes_to_move"] == migrate[0]["bytes"]
    assert set(r.effect["per_vm"]) >= {migrate[0]["vm"]}
    assert r.id in {e["id"] for e in run.events("recommendation")}


def test_approving_applies_exactly_its_steps_and_the_yields_predicted(tmp_path: Path) -> None:
    hv, run, store = recommending(tmp_path)
    run.cycles(6)
    r = next(r for r in rc.open_ones(store.read(), run.clock.time()) if r.kind == "re-balance")
    plan = plan_from_dict(dict(r.plan))
    before = {n: (v.host, v.cap_cores) for n, v in hv.vms.items()}
    hv.calls.clear()
    report = apply_plan(hv, plan)
    assert report.ok
    touched = {s.vm for s in plan.steps}
    assert [vm for op, vm in hv.calls if op == "migrate"] == [s.vm for s in plan.steps if s.op == "migrate"]
    assert {vm for _, vm in hv.calls} == touched
    assert all((v.host, v.cap_cores) == before[n] for n, v in hv.vms.items() if n not in touched)
    for name, p in plan.per_vm.items():
        v = hv.vms[name]
        assert v.host == p.host and v.cap_cores == pytest.approx(p.cap_cores)
        assert yield_of(v.cap_or_vcpus, p.cpu_need_cores) == pytest.approx(p.yield_, abs=1e-4)  # the quota grid


def test_approve_applies_the_recommendation_through_the_unit_of_work_and_settles_it(tmp_path: Path) -> None:
    """acting.approval.approve, the sequence `vcsched approve` and the fault simulation run: under the lock, the
    plan applied, the book settled applied and naming who approved; a second approval is refused."""
    from acting.approval import approve
    from acting.unit_of_work import UnitOfWork
    from tests.builders import cluster_of

    hv, run, store = recommending(tmp_path)
    run.cycles(6)
    r = next(r for r in rc.open_ones(store.read(), run.clock.time()) if r.kind == "re-balance")
    locks = FakeLocks()
    with UnitOfWork(hv, locks.lock("cluster", "alice")) as uow:
        done = approve(uow, cluster_of(2), store, r.id, member="alice", clock=run.clock.time, threads=False)
    assert done.ok and done.note is None and done.report is not None and done.power is None
    assert (done.recommendation.id, done.recommendation.state, done.recommendation.decided_by) == \
        (r.id, rc.APPLIED, "alice")
    assert all(hv.vms[vm].host == p.host for vm, p in plan_from_dict(dict(r.plan)).per_vm.items())
    with UnitOfWork(hv, locks.lock("cluster", "bob")) as uow, pytest.raises(rc.Refused, match="already applied by"):
        approve(uow, cluster_of(2), store, r.id, member="bob", clock=run.clock.time)


def test_approve_refuses_a_recommendation_the_cluster_changed_under_as_stale_and_changes_nothing(
        tmp_path: Path) -> None:
    from acting.approval import approve
    from acting.unit_of_work import UnitOfWork
    from tests.builders import cluster_of

    hv, run, store = recommending(tmp_path)
    run.cycles(6)
    r = next(r for r in rc.open_ones(store.read(), run.clock.time()) if r.kind == "re-balance")
    moved = {vm for vm, _ in r.moves}
    other = next(v for v in sorted(hv.vms.values(), key=lambda v: v.name) if v.name not in moved)
    hv.vms[other.name] = dataclasses.replace(other, host="h1" if other.host == "h0" else "h0")  # someone moved it
    before = dict(hv.vms)
    with UnitOfWork(hv, FakeLocks().lock("cluster", "alice")) as uow, \
            pytest.raises(rc.Refused, match=f"recommendation {r.id} is stale: the cluster changed since it was made"):
        approve(uow, cluster_of(2), store, r.id, member="alice", clock=run.clock.time)
    assert hv.vms == before
    assert store.read().get(r.id).state == rc.STALE


def test_a_skipped_move_is_not_proposed_again_within_the_veto(tmp_path: Path) -> None:
    _, run, store = recommending(tmp_path)
    run.cycles(6)
    r = next(r for r in rc.open_ones(store.read(), run.clock.time()) if r.kind == "re-balance")
    store.update(lambda book: rc.skip(book, r.id, run.clock.time(), "alice", 300))
    vetoed = {vm for vm, _ in r.moves}
    skipped_at = run.clock.time()
    run.cycles(20)  # 200 s: inside the veto
    during = [x for x in store.read().recommendations if x.kind == "re-balance" and x.made_at > skipped_at]
    assert during and all(not vetoed & {vm for vm, _ in x.moves} for x in during)  # others may move, not these
    assert any(vetoed <= set(d.get("pinned", ())) for d in run.events("decision"))  # pinned, and said so
    run.cycles(15)  # past the veto: the same move may be proposed again
    after = [x for x in store.read().recommendations if x.kind == "re-balance" and x.made_at > skipped_at + 300]
    assert any(vetoed & {vm for vm, _ in x.moves} for x in after)


# ---------------------------------------------------------------- the command line


def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(f'name = "t"\ncoordination = "file://{tmp_path / "coord"}"\n'
                    '[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    return path


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def cli_store(tmp_path: Path) -> RecommendationStore:
    from hypervisor.identity import identity, lock_key

    return RecommendationStore(f"file://{tmp_path / 'coord'}", lock_key([identity(None, "test:///default")]))


def test_the_cli_lists_skips_and_refuses(tmp_path: Path) -> None:
    path = cluster_file(tmp_path)
    store = cli_store(tmp_path)
    plan = {"version": 1, "kind": "adapt", "cluster": "t", "snapshot": "not-this-cluster",
            "predicted": {"min_yield": 1.0, "avg_yield": 1.0, "per_vm": {}}, "steps": []}
    import time

    now = time.time()
    a = rc.new_recommendation("re-cap", "t", "caps follow needs", plan, [], {"min_yield_before": 0.5,
                              "min_yield_after": 1.0, "mean_yield_before": 0.5, "mean_yield_after": 1.0,
                              "per_vm": {}, "bytes_to_move": 0}, now, 600, "m1")
    store.update(lambda book: rc.record(book, a))
    listed = invoke("recommendations", "--cluster", path, "--json")
    assert listed.exit_code == 0, listed.output
    assert [d["id"] for d in json.loads(listed.stdout)["recommendations"]] == [a.id]
    text = invoke("recommendations", "--cluster", path)
    assert a.id in text.stdout and "min yield 0.500 -> 1.000" in text.stdout

    unknown = invoke("approve", "r00000000", "--cluster", path)
    assert unknown.exit_code == 2 and "no such recommendation" in unknown.stderr
    stale = invoke("approve", a.id, "--cluster", path)  # its snapshot is not this cluster's
    assert stale.exit_code == 1, stale.output
    assert f"recommendation {a.id} is stale: the cluster changed" in stale.stderr
    assert store.read().get(a.id).state == rc.STALE
    again = invoke("approve", a.id, "--cluster", path)
    assert again.exit_code == 1 and "is already stale" in again.stderr

    b = rc.new_recommendation("re-balance", "t", "r", plan, [], a.effect, now, 600, "m1")
    store.update(lambda book: rc.record(book, b))
    skipped = invoke("skip", b.id, "--cluster", path, "--for", "10m")
    assert skipped.exit_code == 0, skipped.output
    twice = invoke("skip", b.id, "--cluster", path)
    assert twice.exit_code == 1 and "already skipped" in twice.stderr
    assert invoke("skip", "nope", "--cluster", path).exit_code == 2


# ---------------------------------------------------------------- per-step reasons of adapt and drain plans


def test_each_step_of_an_adapt_plan_says_why() -> None:
    from vcsched.control.live import adapt_inventory
    from vcsched.plans.reasons import step_reasons

    hv, _ = crowded()
    inv = hv.inventory()
    needs = {"c-0": 0.1}  # c-0 idles: h1 has room
    live = adapt_inventory("lab", inv, 4 << 30, needs=needs)
    assert live.plan is not None
    reasons = dict(zip([(s.op, s.vm) for s in live.plan.steps], step_reasons(live.plan, inv, needs), strict=True))
    moved = next(vm for op, vm in reasons if op == "migrate")
    assert reasons[("migrate", moved)].startswith("h0 is over-committed (its VMs need 2.00 cores of its 1); h1 has "
                                                  "room (its VMs need 0.10 cores of its 1); its yield 0.50 -> 0.91")
    assert all(r for r in reasons.values())


def test_a_drain_plan_says_which_vms_must_leave_the_host() -> None:
    from vcsched.control.live import adapt_inventory
    from vcsched.plans.reasons import step_reasons

    hv, _ = crowded()
    inv = hv.inventory()
    live = adapt_inventory("lab", inv, 4 << 30, drain="h1")
    assert live.plan is not None
    reasons = step_reasons(live.plan, inv, drain="h1")
    migrate = [r for s, r in zip(live.plan.steps, reasons, strict=True) if s.op == "migrate"]
    assert migrate and all(r.startswith("c-0 must leave h1, which is being drained for maintenance")
                           for r in migrate)


# ---------------------------------------------------------------- on etcd (a real one; skipped without it)


def test_two_machines_share_one_book_on_etcd_and_no_update_is_lost(etcd: Any) -> None:
    here, there = RecommendationStore(etcd.url, "k"), RecommendationStore(etcd.url, "k")

    def add(store: RecommendationStore, i: int) -> None:
        store.update(lambda book: rc.record(book, rec("re-cap", [{"op": "set-cap", "vm": f"v{i}", "host": "h0"}],
                                                      now=i)))

    threads = [threading.Thread(target=add, args=(here if i % 2 else there, i)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(there.read().recommendations) == 10  # compare-and-swap: every writer's update is in
    (newest,) = rc.open_ones(there.read(), 20)  # one open re-cap: the others superseded
    here.update(lambda b: rc.approve(b, newest.id, 20, "alice"))
    with pytest.raises(rc.Refused, match="already approved by alice"):
        there.update(lambda b: rc.approve(b, newest.id, 21, "bob"))


def test_recommend_mode_needs_a_backend_that_keeps_recommendations(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text('name = "t"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    r = invoke("run", "--cluster", path, "--budget-per-interval", "0", "--mode", "recommend",
               "--coordination", "zookeeper://127.0.0.1:2181")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == ("vcsched: error: --mode recommend: coordination zookeeper://127.0.0.1:2181 keeps no "
                                "recommendations (use file:///DIR or etcd3+http://HOST:2379)")


# ---------------------------------------------------------------- recommendations an operator can act on (#39)


def recap(cap: float, snapshot: str = "s", now: float = 1000.0, vm: str = "a-0") -> rc.Recommendation:
    plan = {"steps": [{"op": "set-cap", "vm": vm, "host": "h0", "cap_cores": cap}], "snapshot": snapshot}
    effect = {"min_yield_before": 0.5, "min_yield_after": 0.8, "mean_yield_before": 0.5, "mean_yield_after": 0.8,
              "per_vm": {}, "bytes_to_move": 0}
    return rc.new_recommendation("re-cap", "lab", "caps follow needs", plan, ["why"], effect, now, 600, "m1")


def test_the_same_proposal_keeps_its_id_when_caps_wobble_and_the_snapshot_changes() -> None:
    book, first = rc.record(rc.Book(), recap(0.400, "s1", now=1000.0))
    book, again = rc.record(book, recap(0.432, "s2", now=1010.0))  # 0.032 cores apart: estimates of a steady load
    assert again.id == first.id and again.made_at == 1000.0 and again.valid_until == 1610.0
    assert again.plan["snapshot"] == "s2" and again.plan["steps"][0]["cap_cores"] == 0.432  # approving: the newest
    assert len(book.recommendations) == 1
    book, other = rc.record(book, recap(0.600, "s3", now=1020.0))  # a different proposal: a new id
    assert other.id != first.id and book.get(first.id).superseded_by == other.id


def test_a_zero_gain_proposal_is_not_worth_an_operators_time() -> None:
    flat = {"min_yield_before": 1.0, "min_yield_after": 1.0, "mean_yield_before": 1.0, "mean_yield_after": 1.0}
    assert "under the threshold 0.05: not proposed" in str(rc.worth_proposing(flat, 0.05))
    small = {**flat, "min_yield_before": 0.5, "min_yield_after": 0.52, "mean_yield_before": 0.5,
             "mean_yield_after": 0.52}
    assert rc.worth_proposing(small, 0.05) is not None
    lifts = {**small, "mean_yield_after": 0.7}  # the lowest stays, starved VMs rise: a gain
    assert rc.worth_proposing(lifts, 0.05) is None
    lowers = {**lifts, "min_yield_after": 0.45}  # the lowest falls: no gain, whatever the mean does
    assert rc.predicted_gain(lowers) == 0.0 and rc.worth_proposing(lowers, 0.05) is not None


def test_skipping_or_approving_a_superseded_id_names_what_superseded_it() -> None:
    book, a = rc.record(rc.Book(), recap(0.400, now=1000.0))
    book, b = rc.record(book, recap(0.700, now=1010.0))
    with pytest.raises(rc.Refused, match=rf"^recommendation {a.id} was superseded by {b.id} at .*, {b.id} now open "
                                         r"and a different proposal \(set-cap a-0 0.700\); nothing changed"):
        rc.skip(book, a.id, 1011, "alice", 60)
    with pytest.raises(rc.Refused, match=rf"superseded by {b.id}"):
        rc.approve(book, a.id, 1011, "alice")
    assert book.get(b.id).state == rc.OPEN


def test_a_superseded_id_whose_proposal_is_made_again_acts_on_its_successor_and_says_so() -> None:
    book, a = rc.record(rc.Book(), recap(0.400, now=1000.0))
    book, b = rc.record(book, recap(0.700, now=1010.0))
    book, c = rc.record(book, recap(0.405, now=1020.0))  # a's proposal again, after b
    target, note = rc.resolve(book, a.id, 1021)
    assert target.id == c.id and note == (f"recommendation {a.id} was superseded by {b.id} -> {c.id}, the same "
                                          f"proposal made again: acting on {c.id}")
    skipped_book, skipped = rc.skip(book, a.id, 1021, "alice", 60)
    assert skipped.id == c.id and skipped_book.get(c.id).state == rc.SKIPPED
    _, approved = rc.approve(book, a.id, 1021, "alice")
    assert approved.id == c.id and approved.state == rc.APPROVED


def test_floors_are_checked_with_the_current_estimates_naming_the_vm() -> None:
    r = recap(0.11, vm="web-0")
    book, _ = rc.note_needs(rc.Book(), {"web-0": 0.8}, 1000.0)
    needs, source = rc.current_needs(book, {"web-0": 0.5, "db-0": 1.0}, 1100.0)
    assert needs == {"web-0": 0.8, "db-0": 1.0} and source.startswith("the controller's estimates of ")
    with pytest.raises(rc.Refused, match=rf"^recommendation {r.id} would put web-0 below its floor: cap 0.110 cores "
                                         r"over need 0.800 \(the controller's estimates of .*\) is yield 0.137, "
                                         r"under its min_yield 0.3; nothing changed$"):
        rc.check_floors(r, {"web-0": 0.11}, needs, {"web-0": 0.3}, source)
    rc.check_floors(r, {"web-0": 0.30}, needs, {"web-0": 0.3}, source)  # 0.375: above its floor
    stale, why = rc.current_needs(book, {"web-0": 0.5}, 1000.0 + rc.NEEDS_FRESH_S + 1)
    assert stale == {"web-0": 0.5} and why.startswith("the declared needs")


def test_recommend_mode_keeps_one_id_while_the_load_wobbles(tmp_path: Path) -> None:
    from tests.fake_load import phases

    hv, run, store = recommending(tmp_path)
    hv.demand["c-0"] = phases((0.06, 20.0), (0.10, 20.0))  # h1's light VM wobbles: the re-balance's caps move a bit
    run.cycles(16)
    ids = {e["id"] for e in run.events("recommendation") if e["kind"] == "re-balance"}
    made = [e for e in run.events("recommendation") if e["kind"] == "re-balance"]
    assert len(made) >= 3 and len(ids) == 1, made
    assert [r.state for r in store.read().recommendations if r.kind == "re-balance"] == [rc.OPEN]  # none superseded


def test_recommend_mode_does_not_propose_a_re_cap_that_gains_nothing(tmp_path: Path) -> None:
    _, run, store = recommending(tmp_path)
    run.controller.options = dataclasses.replace(
        run.controller.options, rebalance=dataclasses.replace(run.controller.options.rebalance, budget=0))
    run.controller.rebalancer.options = run.controller.options.rebalance
    run.cycles(6)  # caps only: c-0 (idle) would come down to its need; a-0 and b-0 stay at 0.5: min yield 0.5 -> 0.5
    assert any(d["kind"] == "re-cap" and d["steps"] for d in run.events("decision"))
    assert not store.read().recommendations
    withheld = [e for e in run.events("recommendation") if e.get("withheld")]
    assert withheld and "under the threshold 0.05: not proposed" in withheld[0]["withheld"]


def test_the_controller_writes_its_estimates_for_the_floor_check(tmp_path: Path) -> None:
    _, run, store = recommending(tmp_path)
    run.cycles(3)
    book = store.read()
    assert book.needs_at is not None and set(book.needs) == {"a-0", "b-0", "c-0"}
    assert book.needs == {n: e.estimate for n, e in run.controller.estimates.items()}
    assert book.needs["c-0"] < 0.5  # c-0 idles: measured, not its declared 1.0


def test_approve_refuses_a_recommendation_that_puts_a_vm_below_its_floor(tmp_path: Path) -> None:
    pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    import time

    from cli.common import load_cluster
    from cli.recommend import _store
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from hypervisor.testhosts import write_scale_cluster

    scale = write_scale_cluster(tmp_path / "hosts", 1, 2)  # vm0, vm1: need 0.5, cap 0.5
    text = scale.cluster_file.read_text()
    scale.cluster_file.write_text(text.replace('name = "scale"', f'name = "scale"\nmin_yield = 0.6\n'
                                                                 f'coordination = "file://{tmp_path / "coord"}"'))
    cluster = load_cluster(str(scale.cluster_file))
    with LibvirtHypervisor(cluster) as hv:
        store = _store(cluster, None, hv)
    plan = {"version": 1, "kind": "adapt", "cluster": "scale", "snapshot": "0" * 64,
            "predicted": {"min_yield": 0.2, "avg_yield": 0.6, "per_vm": {
                "vm0": {"host": "h0", "cluster": "vc0", "cpu_need_cores": 0.5, "cap_cores": 0.1, "yield": 0.2}}},
            "steps": [{"op": "set-cap", "vm": "vm0", "host": "h0", "cap_cores": 0.1}]}
    now = time.time()
    r = rc.new_recommendation("re-cap", "scale", "r", plan, ["why"], {"min_yield_before": 0.5, "min_yield_after": 1,
                              "mean_yield_before": 0.5, "mean_yield_after": 1, "per_vm": {}, "bytes_to_move": 0},
                              now, 600, "m1")
    store.update(lambda book: rc.record(book, r))
    store.update(lambda book: rc.note_needs(book, {"vm0": 0.5, "vm1": 0.5}, now))
    refused = invoke("approve", r.id, "--cluster", scale.cluster_file)
    assert refused.exit_code == 1, refused.output
    assert f"recommendation {r.id} would put vm0 below its floor: cap 0.100 cores over need 0.500" in refused.stderr
    assert store.read().get(r.id).state == rc.OPEN  # nothing changed: it may be approved when it holds


def test_the_cli_skips_the_same_proposal_that_superseded_an_id_and_says_so(tmp_path: Path) -> None:
    import time

    path = cluster_file(tmp_path)
    store = cli_store(tmp_path)
    now = time.time()
    a, b, c = recap(0.400, now=now), recap(0.700, now=now + 1), recap(0.405, now=now + 2)
    for r in (a, b, c):
        store.update(lambda book, r=r: rc.record(book, r))  # type: ignore[misc]
    skipped = invoke("skip", a.id, "--cluster", path, "--json")
    assert skipped.exit_code == 0, skipped.output
    doc = json.loads(skipped.stdout)
    assert doc["recommendation"]["id"] == c.id and doc["recommendation"]["state"] == rc.SKIPPED
    assert doc["note"] == (f"recommendation {a.id} was superseded by {b.id} -> {c.id}, the same proposal made "
                           f"again: acting on {c.id}")
    different = invoke("skip", b.id, "--cluster", path)  # b was superseded by c, which proposes something else
    assert different.exit_code == 1
    assert f"recommendation {b.id} was superseded by {c.id} at " in different.stderr
    assert "a different proposal (set-cap a-0 0.405)" in different.stderr
    again = invoke("skip", a.id, "--cluster", path)  # its successor, the same proposal, is skipped now
    assert again.exit_code == 1
    assert f"{c.id} now skipped and the same proposal made again; nothing changed" in again.stderr
