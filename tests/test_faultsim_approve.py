"""The fault simulation's approve schedules (index 6 modulo 32, faultsim/approve.py): `vcsched run --mode
recommend`'s controller proposes, and `vcsched approve` processes run :func:`acting.approval.approve` — the
sequence the command runs — under every fault; an approval of a recommendation the cluster changed under (a VM
placed since) is refused, changing nothing, and the switch that approves without the whole-plan check is caught."""

from __future__ import annotations

from faultsim.approve import APPROVE_AT, APPROVE_EVERY
from faultsim.simulation import Extras, hazards_on, replay, run_schedules, workload_of
from hypervisor import hazards

#: Seed 1, schedule 230: the final process places late1-0 between the controller's proposal and its approval; with
#: the switch on, the stale re-balance is applied all the same (migrations, caps: 13 host changes).
STALE_APPLIED = (1, 230)


def test_approve_schedules_apply_proposals_and_refuse_stale_ones_with_no_violation() -> None:
    summary = run_schedules(APPROVE_EVERY * 30, 1, extras=Extras(only=frozenset({"approve"})))
    assert summary.schedules == 30 and dict(summary.workloads) == {"approve": 30}
    assert summary.violations == [], summary.violations
    approvals = summary.approvals
    assert approvals["applied"] > 0 and approvals["stale"] > 0, approvals
    assert approvals["stale_checked"] > 0, approvals  # approvals after a placement, checked to change nothing
    assert approvals["killed"] + approvals["failed"] > 0, approvals  # and faults met in the middle of some


def test_a_stale_recommendation_is_refused_and_nothing_changes() -> None:
    seed, index = STALE_APPLIED
    assert workload_of(index) == "approve" and index % APPROVE_EVERY == APPROVE_AT
    out = replay(seed, index)
    assert out.violations == [], out.violations
    refused = [line for line in out.trace if "(approve " in line and "is stale: the cluster changed" in line]
    assert refused and out.approvals["stale_checked"] >= 1, out.approvals


def test_approving_without_the_whole_plan_check_is_caught_on_its_schedule() -> None:
    with hazards_on((hazards.APPROVE_UNVALIDATED,)):
        out = replay(*STALE_APPLIED)
    assert any("placed since it was made), was not refused: ok, 13 host change(s), left applied" in v
               for v in out.violations), out.violations
