"""Power saving's decision (vcsched/control/power.py), on plain data: which host may sleep, which must wake."""

from __future__ import annotations

import dataclasses

import pytest

from tests.builders import MiB, cluster_of, inventory_of, managed, request
from vcsched.control.power import (
    NONE,
    ON,
    SLEEP,
    SLEEPING,
    WAKE,
    WAKING,
    Demand,
    HostPower,
    PowerState,
    cleared,
    decide,
    slept,
    wake_failed,
    waking,
    watts,
    woke,
)
from vcsched.formats.cluster import Cluster, FenceConfig
from vcsched.formats.power import HostPower as HostPowerConfig
from vcsched.formats.power import PowerSettings
from vcsched.formats.windows import MaintenanceSchedule, parse_spec
from vcsched.inventory import HostState, Inventory, VmState

AGENT = FenceConfig("fence_dummy")
BUDGET = 1 << 40


def powered(n: int = 3, *, sleep_after: float = 0.0, failures: int = 0, min_on: int = 1, target: float = 1.0,
            mode: str = "auto", sleep_margin: float = 0.0, wake_margin: float = 0.0) -> Cluster:
    """``n`` hosts with an agent; no margins unless asked (the tests of the margins ask)."""
    c = cluster_of(n)
    hosts = tuple(dataclasses.replace(h, power=HostPowerConfig(AGENT, True, 100.0, 300.0)) for h in c.hosts)
    return dataclasses.replace(c, hosts=hosts, failures_tolerated=failures,
                               power=PowerSettings(mode, min_on, target, sleep_after, 60.0, "consolidate",
                                                   sleep_margin, wake_margin))


def light(n: int = 3) -> Inventory:
    """One small VM per host: any one host's VM fits on the others at full speed."""
    return inventory_of([managed(f"v{i}", f"h{i}", f"v{i}", 0.2) for i in range(n)], n_hosts=n)


def host_change(c: Cluster, name: str, **kw: object) -> Cluster:
    return dataclasses.replace(c, hosts=tuple(dataclasses.replace(h, **kw) if h.name == name else h
                                              for h in c.hosts))


def refusal(d: object, host: str) -> str:
    return dict(d.refusals)[host]  # type: ignore[attr-defined]


def test_a_lightly_loaded_host_may_sleep_and_its_evacuation_empties_it() -> None:
    d = decide(powered(), light(), PowerState(), 0.0, budget=BUDGET)
    assert d.action == SLEEP and d.host is not None
    assert d.plan is not None and d.plan.plan is not None
    assert all(p.host != d.host for p in d.plan.plan.per_vm.values())
    assert d.plan.plan.min_yield == pytest.approx(1.0)
    assert "moving 134217728 bytes" in d.reason  # one 128 MiB VM


def test_power_saving_off_decides_nothing() -> None:
    d = decide(powered(mode="off"), light(), PowerState(), 0.0, budget=BUDGET)
    assert (d.action, d.reason) == (NONE, "power_saving is off")


def test_recommend_mode_decides_the_same_sleep_as_auto() -> None:
    auto = decide(powered(), light(), PowerState(), 0.0, budget=BUDGET)
    rec = decide(powered(mode="recommend"), light(), PowerState(), 0.0, budget=BUDGET)
    assert (rec.action, rec.host) == (auto.action, auto.host)


def test_a_host_sleeps_only_after_the_condition_held_for_sleep_after() -> None:
    c, inv = powered(sleep_after=600.0), light()
    d0 = decide(c, inv, PowerState(), 0.0, budget=BUDGET)
    assert d0.action == NONE and "of sleep_after = 600 s" in refusal(d0, "h0")
    assert d0.state.of("h0").ready_since == 0.0
    d1 = decide(c, inv, d0.state, 300.0, budget=BUDGET)
    assert d1.action == NONE and d1.state.of("h0").ready_since == 0.0
    d2 = decide(c, inv, d1.state, 600.0, budget=BUDGET)
    assert d2.action == SLEEP


def test_a_break_in_the_condition_starts_the_count_again() -> None:
    c = powered(sleep_after=600.0)
    d0 = decide(c, light(), PowerState(), 0.0, budget=BUDGET)
    busy = inventory_of([managed(f"v{i}", f"h{i}", f"v{i}", 0.9) for i in range(3)], n_hosts=3)
    d1 = decide(c, busy, d0.state, 300.0, budget=BUDGET)
    assert d1.action == NONE and d1.state.of("h0").ready_since is None
    d2 = decide(c, light(), d1.state, 700.0, budget=BUDGET)
    assert d2.action == NONE and d2.state.of("h0").ready_since == 700.0


def test_no_host_sleeps_when_the_others_cannot_keep_the_target_yield() -> None:
    busy = inventory_of([managed(f"v{i}", f"h{i}", f"v{i}", 0.6) for i in range(3)], n_hosts=3)
    d = decide(powered(), busy, PowerState(), 0.0, budget=BUDGET)
    assert d.action == NONE
    assert "below power_yield 1" in refusal(d, "h0")
    # A lower target accepts the slowdown: 1.2 cores of need on one core
    assert decide(powered(target=0.8), busy, PowerState(), 0.0, budget=BUDGET).action == SLEEP


def test_no_host_sleeps_below_a_virtual_clusters_floor() -> None:
    vms = [managed(f"v{i}", f"h{i}", f"v{i}", 0.6) for i in range(3)]
    floored = [dataclasses.replace(v, meta=dataclasses.replace(v.meta, min_yield=0.9)) for v in vms if v.meta]
    d = decide(powered(target=0.5), inventory_of(floored, n_hosts=3), PowerState(), 0.0, budget=BUDGET)
    assert d.action == NONE and "below its floor 0.9" in refusal(d, "h0")


def test_the_failures_tolerated_room_is_kept() -> None:
    # Three hosts, each VM 0.3 core / 400 MiB of 1 GiB: two hosts hold them all, but then one failure would not.
    vms = [managed(f"v{i}", f"h{i}", f"v{i}", 0.3, mem=400 * MiB) for i in range(3)]
    inv = inventory_of(vms, n_hosts=3)
    assert decide(powered(), inv, PowerState(), 0.0, budget=BUDGET).action == SLEEP
    d = decide(powered(failures=1), inv, PowerState(), 0.0, budget=BUDGET)
    assert d.action == NONE and "failover" in refusal(d, "h0") and "failures_tolerated = 1" in refusal(d, "h0")


def test_the_evacuation_stays_within_the_migration_budget() -> None:
    d = decide(powered(), light(), PowerState(), 0.0, budget=64 * MiB)
    assert d.action == NONE and "cannot be emptied" in refusal(d, "h0")


# --- the "never" rules -----------------------------------------------------------------------------------


def test_never_a_host_excluded_by_the_cluster_file() -> None:
    c = powered()
    c = host_change(c, "h0", power=dataclasses.replace(c.hosts[0].power, saving=False))
    d = decide(c, light(), PowerState(), 0.0, budget=BUDGET)
    assert refusal(d, "h0") == "excluded (power_saving = false)" and d.host != "h0"


def test_never_a_host_without_an_agent_to_wake_it() -> None:
    c = powered()
    c = host_change(c, "h0", power=dataclasses.replace(c.hosts[0].power, agent=None))
    assert "no agent" in refusal(decide(c, light(), PowerState(), 0.0, budget=BUDGET), "h0")


def test_never_a_host_in_maintenance() -> None:
    c = host_change(powered(), "h0", maintenance=True)
    assert refusal(decide(c, light(), PowerState(), 0.0, budget=BUDGET), "h0") == "in maintenance"


def test_never_one_of_the_last_min_hosts_on() -> None:
    d = decide(powered(2), light(2), PowerState(), 0.0, budget=BUDGET)
    assert d.action == SLEEP  # min_hosts_on = 1: one of two may sleep
    d = decide(powered(3, min_on=3), light(), PowerState(), 0.0, budget=BUDGET)
    assert d.action == NONE and "one of the last min_hosts_on = 3" in refusal(d, "h0")
    asleep = slept(PowerState(), light().hosts[2], 0.0)
    d = decide(powered(3, min_on=2), light(), asleep, 0.0, budget=BUDGET)
    assert "one of the last min_hosts_on = 2" in refusal(d, "h0")


def test_never_a_host_with_unmanaged_vms() -> None:
    inv = light()
    inv = dataclasses.replace(inv, vms=(*inv.vms, VmState("theirs", "h0", 1, 64 * MiB, True)))
    assert "runs unmanaged VMs (theirs)" in refusal(decide(powered(), inv, PowerState(), 0.0, budget=BUDGET), "h0")


def test_never_a_host_with_a_pinned_vm() -> None:
    inv = light()
    v0 = inv.vms[0]
    assert v0.meta is not None
    pinned = dataclasses.replace(v0, meta=dataclasses.replace(v0.meta, pinned=True))
    inv = dataclasses.replace(inv, vms=(pinned, *inv.vms[1:]))
    assert "runs pinned VMs (v0)" in refusal(decide(powered(), inv, PowerState(), 0.0, budget=BUDGET), "h0")


def test_never_a_host_with_local_disks_no_other_host_shares() -> None:
    inv = light()
    inv = dataclasses.replace(inv, vms=(dataclasses.replace(inv.vms[0], disk_bytes=1 << 30), *inv.vms[1:]))
    d = decide(powered(), inv, PowerState(), 0.0, budget=BUDGET)
    assert "disks on storage 'h0' that no other host on shares (v0)" in refusal(d, "h0")
    shared = powered()
    for h in shared.host_names:
        shared = host_change(shared, h, storage="nfs")
    assert "disks" not in dict(decide(shared, inv, PowerState(), 0.0, budget=BUDGET).refusals).get("h0", "")


def test_never_while_migrations_are_closed_or_requests_wait() -> None:
    closed = dataclasses.replace(powered(), schedule=MaintenanceSchedule("UTC", (parse_spec("w", "Mon 00:00-00:01"),)))
    t = 1_700_000_000.0 + 3 * 86400  # a Sunday
    assert "no migration now" in refusal(decide(closed, light(), PowerState(), t, budget=BUDGET), "h0")
    d = decide(powered(), light(), PowerState(), 0.0, budget=BUDGET, demand=Demand(pending=(request("w", 1, 0.1),)))
    assert d.action == NONE and "wait for room" in refusal(d, "h0")


def test_never_a_host_that_does_not_answer() -> None:
    inv = light()
    inv = dataclasses.replace(inv, hosts=(dataclasses.replace(inv.hosts[0], down="timeout"), *inv.hosts[1:]))
    assert "does not answer (timeout)" in refusal(decide(powered(), inv, PowerState(), 0.0, budget=BUDGET), "h0")


# --- waking -----------------------------------------------------------------------------------------------


def two_on_one_asleep(need: float) -> tuple[Inventory, PowerState]:
    """h0 and h1 on with one VM of ``need`` cores each; h2 asleep (a 1-core, 1 GiB host)."""
    full = inventory_of([managed("v0", "h0", "v0", need), managed("v1", "h1", "v1", need)], n_hosts=3)
    state = slept(PowerState(), full.hosts[2], 0.0)
    inv = dataclasses.replace(full, hosts=(*full.hosts[:2], dataclasses.replace(full.hosts[2], down="asleep")))
    return inv, state


def test_a_sleeping_host_stays_asleep_while_the_room_holds() -> None:
    inv, state = two_on_one_asleep(0.3)
    d = decide(powered(), inv, state, 100.0, budget=BUDGET)
    assert d.action != WAKE and d.state.of("h2").state == SLEEPING


def test_a_pending_request_that_does_not_fit_wakes_a_host() -> None:
    inv, state = two_on_one_asleep(0.3)
    d = decide(powered(), inv, state, 100.0, budget=BUDGET, demand=Demand(pending=(request("big", 1, 0.9),)))
    assert (d.action, d.host) == (WAKE, "h2") and "1 waiting request(s) admitted" in d.reason


def test_a_rising_trend_wakes_a_host_one_wake_time_ahead() -> None:
    inv, state = two_on_one_asleep(0.45)
    inv = dataclasses.replace(inv, vms=(*inv.vms, managed("v2", "h0", "v2", 0.45)))
    # h0 runs v0 and v2: 0.9 cores; v0 + 0.6 cores/min over the 60 s wake time is above the core
    d = decide(powered(), inv, state, 100.0, budget=BUDGET, demand=Demand(trend={"v0": 0.01}))
    assert (d.action, d.host) == (WAKE, "h2") and "predicted 60 s ahead" in d.reason
    flat = decide(powered(), inv, state, 100.0, budget=BUDGET, demand=Demand(trend={"v0": 0.001}))
    assert flat.action != WAKE


def test_a_host_whose_wake_failed_is_not_chosen_until_cleared() -> None:
    inv, state = two_on_one_asleep(0.3)
    big = Demand(pending=(request("big", 1, 0.9),))
    failed = wake_failed(waking(state, "h2", 100.0), "h2", 400.0)
    d = decide(powered(), inv, failed, 500.0, budget=BUDGET, demand=big)
    assert d.action != WAKE
    assert decide(powered(), inv, cleared(failed, "h2"), 500.0, budget=BUDGET, demand=big).action == WAKE


def test_a_host_already_waking_counts_as_room_coming() -> None:
    inv, state = two_on_one_asleep(0.3)
    d = decide(powered(), inv, waking(state, "h2", 100.0), 110.0, budget=BUDGET,
               demand=Demand(pending=(request("big", 1, 0.9),)))
    assert d.action == NONE and "h2 waking" in d.reason


def test_the_wake_time_is_measured_and_the_longest_kept() -> None:
    state = woke(waking(PowerState(), "h2", 100.0), "h2", 190.0)
    assert state.of("h2").state == ON and state.of("h2").wake_s == 90.0
    state = woke(waking(state, "h2", 1000.0), "h2", 1030.0)
    assert state.of("h2").wake_s == 90.0
    assert waking(state, "h2", 0.0).of("h2").state == WAKING


def test_energy_is_linear_from_idle_to_peak_and_zero_asleep() -> None:
    p = HostPowerConfig(AGENT, True, 100.0, 300.0)
    assert watts(p, 0.0) == 100.0 and watts(p, 0.5) == 200.0 and watts(p, 1.0) == 300.0
    assert watts(p, 2.0) == 300.0 and watts(p, 0.5, asleep=True) == 0.0
    assert watts(HostPowerConfig(), 0.5) == 0.0


def test_a_state_names_each_host_once() -> None:
    s = PowerState((HostPower("h1"),)).with_host(HostPower("h0", SLEEPING)).with_host(HostPower("h1", WAKING))
    assert [(h.host, h.state) for h in s.hosts] == [("h0", SLEEPING), ("h1", WAKING)]


def test_the_clusters_demand_growth_wakes_a_host_ahead_of_need() -> None:
    inv, state = two_on_one_asleep(0.45)
    inv = dataclasses.replace(inv, vms=(*inv.vms, managed("v2", "h0", "v2", 0.45)))
    # 0.9 cores on h0 growing 0.5 % a second: 1.17 cores a wake time (60 s) ahead
    d = decide(powered(), inv, state, 100.0, budget=BUDGET, demand=Demand(growth=5e-3))
    assert (d.action, d.host) == (WAKE, "h2") and "predicted 60 s ahead" in d.reason
    assert decide(powered(), inv, state, 100.0, budget=BUDGET, demand=Demand(growth=-1e-3)).action != WAKE


def test_the_totals_refuse_at_once_when_the_others_cannot_hold_every_vm() -> None:
    busy = inventory_of([managed(f"v{i}", f"h{i}", f"v{i}", 0.9) for i in range(3)], n_hosts=3)
    assert "lack the cores for every VM at power_yield 1" in refusal(decide(powered(), busy, PowerState(), 0.0,
                                                                           budget=BUDGET), "h0")
    fat = inventory_of([managed(f"v{i}", f"h{i}", f"v{i}", 0.1, mem=700 * MiB) for i in range(3)], n_hosts=3)
    assert "lack the memory" in refusal(decide(powered(), fat, PowerState(), 0.0, budget=BUDGET), "h0")


def test_of_the_hosts_ready_the_one_whose_evacuation_moves_the_fewest_bytes_sleeps() -> None:
    sizes = {"h0": 300 * MiB, "h1": 100 * MiB, "h2": 200 * MiB}
    inv = inventory_of([managed(f"v{h}", h, f"v{h}", 0.1, mem=m) for h, m in sizes.items()], n_hosts=3)
    d = decide(powered(), inv, PowerState(), 0.0, budget=BUDGET)
    assert (d.action, d.host) == (SLEEP, "h1") and f"moving {100 * MiB} bytes" in d.reason


def test_a_host_sleeps_only_if_the_others_keep_room_for_the_sleep_margin() -> None:
    vms = inventory_of([managed(f"v{i}", f"h{i}", f"v{i}", 0.4) for i in range(3)], n_hosts=3)
    assert decide(powered(), vms, PowerState(), 0.0, budget=BUDGET).action == SLEEP  # 0.8 cores on a host: fits
    d = decide(powered(sleep_margin=0.3, wake_margin=0.1), vms, PowerState(), 0.0, budget=BUDGET)
    assert d.action == NONE and "30 % more CPU demand" in refusal(d, "h0")  # 1.04 cores: it would not


def test_a_host_wakes_on_the_wake_margin_before_any_vm_slows_down() -> None:
    inv, state = two_on_one_asleep(0.45)
    inv = dataclasses.replace(inv, vms=(*inv.vms, managed("v2", "h0", "v2", 0.45)))  # h0: 0.9 of its core
    assert decide(powered(), inv, state, 100.0, budget=BUDGET).action != WAKE
    d = decide(powered(sleep_margin=0.3, wake_margin=0.2), inv, state, 100.0, budget=BUDGET)
    assert (d.action, d.host) == (WAKE, "h2") and "20 % more CPU demand" in d.reason


def test_energy_saved_counts_idle_watts_for_the_sleeps_inside_the_window() -> None:
    from vcsched.control.power import energy_saved

    c = powered()  # idle 100 W
    h2 = HostState("h2", 4, 1 << 30)
    state = slept(PowerState(), h2, 1000.0)
    state = woke(waking(state, "h2", 4600.0), "h2", 4700.0)  # asleep 1000-4600 (1 h)
    state = slept(state, h2, 8000.0)  # asleep again since 8000
    assert energy_saved(c, state, 9000.0, 9000.0) == pytest.approx(100.0 * (3600 + 1000))
    assert energy_saved(c, state, 9000.0, 2000.0) == pytest.approx(100.0 * 1000)  # the window: 7000-9000
    failed = wake_failed(waking(state, "h2", 9000.0), "h2", 9100.0, "no answer")
    assert energy_saved(c, failed, 20000.0, 20000.0) == pytest.approx(100.0 * (3600 + 1000))  # nothing after
    assert PowerState.from_dict(failed.to_dict()) == failed


def test_place_wakes_the_sleeping_host_whose_wake_alone_admits_never_one_whose_wake_failed() -> None:
    from vcsched.control.admission import admit
    from vcsched.control.power import mark_asleep, wake_to_admit

    inv, state = two_on_one_asleep(0.3)
    inv = mark_asleep(inv, state)
    assert [h.name for h in inv.asleep_hosts()] == ["h2"] and not inv.down_hosts()
    c, wide = powered(), request("wide", 3, 0.2, spread="required")  # one VM per host: needs h2
    assert not admit(c, inv, wide).admitted
    found = wake_to_admit(c, inv, state, lambda woken: admit(c, woken, wide))
    assert found is not None and found[0] == "h2" and found[1].admitted
    assert {s.host for s in found[1].plan.steps} == {"h0", "h1", "h2"}  # type: ignore[union-attr]
    failed = wake_failed(waking(state, "h2", 10.0), "h2", 20.0, "no answer")
    assert wake_to_admit(c, mark_asleep(inv, failed), failed, lambda woken: admit(c, woken, wide)) is None


def test_a_sleeping_host_no_wake_chooses_is_named_with_why_by_headroom_and_place() -> None:
    """Issue (QA on the lab): with h2's wake failed, `headroom` dropped its "with h2 woken" line and `place` refused
    on the hosts on, neither saying that a host sleeps which no wake will choose until it is cleared."""
    from types import SimpleNamespace

    from cli.headroom import _with_wakes
    from vcsched.control.headroom import headroom_for
    from vcsched.control.power import mark_asleep, unwakeable

    inv, state = two_on_one_asleep(0.3)
    c = powered()
    assert unwakeable(c, mark_asleep(inv, state), state) == {}  # it may be woken: nothing to say
    failed = wake_failed(waking(state, "h2", 10.0), "h2", 20.0, "no answer")
    asleep = mark_asleep(inv, failed)
    why = "its last wake failed: not woken until `vcsched power clear h2`"
    assert unwakeable(c, asleep, failed) == {"h2": why}
    shape = request("x", 1, 0.2)
    wakes = _with_wakes(c, SimpleNamespace(power=lambda: failed), asleep,  # type: ignore[arg-type]
                        lambda i: headroom_for(c, i, shape, min_yield=0.5))
    assert wakes == {"hosts": [], "count": 0, "per_host": {}, "wake_s": None, "wake_measured": False,
                     "not_counted": {"h2": why}}
    import acting.power
    import cli.common
    from cli.place import _by_waking
    from vcsched.control.admission import admit

    wide = request("wide", 3, 0.2, spread="required")  # one VM per host: needs h2
    refused = admit(c, asleep, wide)
    with pytest.MonkeyPatch.context() as m:  # the record as the store reads it; no host asked for its identity
        m.setattr(acting.power, "store_for", lambda *_: SimpleNamespace(read=lambda: failed))
        m.setattr(cli.common, "host_identities", lambda *_: None)
        said, _, wake = _by_waking(c, SimpleNamespace(hv=None), asleep, refused,  # type: ignore[arg-type]
                                   lambda i: admit(c, i, wide), False, True, None)
    assert wake is None and not said.admitted and said.reason == f"{refused.reason}; h2 is asleep: {why}"
    no_agent = host_change(c, "h2", power=dataclasses.replace(c.host("h2").power, agent=None))
    assert unwakeable(no_agent, mark_asleep(inv, state), state) == {"h2": "it has no power agent to wake it"}


def test_a_host_holding_a_domain_that_does_not_run_may_not_sleep() -> None:
    inv = light()
    inv = dataclasses.replace(inv, vms=(*inv.vms, VmState("old-template", "h2", 1, 256 * MiB, False)))
    why = refusal(decide(powered(), inv, PowerState(), 0.0, budget=BUDGET), "h2")
    assert why.startswith("holds domains that do not run (old-template)"), why


def test_a_wake_cut_short_is_overdue_past_twice_its_wake_time() -> None:
    from vcsched.control.power import overdue

    _, state = two_on_one_asleep(0.3)
    state = waking(state, "h2", 100.0)  # wake_time 60 s (powered()): overdue after 120 s
    assert overdue(powered(), state, 220.0) == () and overdue(powered(), state, 221.0) == ("h2",)


def test_place_apply_says_the_host_it_woke_answered_and_after_how_long() -> None:
    """Issue (QA on the lab): `place --apply` printed "waking h2: ..." and then the plan, never that h2 answered
    (nor how long the wake took, which --json has)."""
    from types import SimpleNamespace

    import acting.power
    import cli.common
    from acting.power import WakeResult
    from cli.app import console
    from cli.place import _by_waking
    from vcsched.control.admission import admit
    from vcsched.control.power import mark_asleep, woken

    inv, state = two_on_one_asleep(0.3)
    c, asleep = powered(), mark_asleep(inv, state)
    wide = request("wide", 3, 0.2, spread="required")  # one VM per host: needs h2
    awake = woken(asleep, state, ["h2"])
    said = "host h2 answers again as 00000000-0000-0000-0000-000000000002 after 1.2 s"
    with pytest.MonkeyPatch.context() as m, console.capture() as cap:
        m.setattr(acting.power, "store_for", lambda *_: SimpleNamespace(read=lambda: state))
        m.setattr(cli.common, "host_identities", lambda *_: None)
        m.setattr(acting.power, "agents", lambda *_: None)
        m.setattr(acting.power, "wake_host", lambda *_, **__: WakeResult("h2", True, said, 1.2))
        decision, _, wake = _by_waking(c, SimpleNamespace(hv=None, inventory=lambda: awake),  # type: ignore[arg-type]
                                       asleep, admit(c, asleep, wide), lambda i: admit(c, i, wide), True, False, None)
    assert decision.admitted and wake is not None and wake["woke"] is True
    assert said in " ".join(cap.get().split()), cap.get()


def test_a_place_refused_even_with_the_sleeping_hosts_woken_says_so() -> None:
    """Issue (QA on the lab): `headroom` counted "with h2 woken: 2 more" at one floor; `place` of a request with a
    higher floor was refused with the hosts on's reason alone, leaving the operator to wonder whether waking h2 by
    hand would do."""
    from types import SimpleNamespace

    import acting.power
    import cli.common
    from cli.place import _by_waking
    from vcsched.control.admission import admit
    from vcsched.control.power import mark_asleep

    inv, state = two_on_one_asleep(0.3)
    c, asleep = powered(), mark_asleep(inv, state)
    wider = request("wider", 4, 0.2, spread="required")  # one VM per host, on 4 of 3 hosts: never
    refused = admit(c, asleep, wider)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(acting.power, "store_for", lambda *_: SimpleNamespace(read=lambda: state))
        m.setattr(cli.common, "host_identities", lambda *_: None)
        said, _, wake = _by_waking(c, SimpleNamespace(hv=None), asleep, refused,  # type: ignore[arg-type]
                                   lambda i: admit(c, i, wider), False, True, None)
    assert wake is None and not said.admitted
    assert said.reason.startswith(f"{refused.reason}; waking h2 would not admit it either ("), said.reason


def test_a_place_that_needs_two_hosts_woken_says_to_wake_them_by_hand() -> None:
    from types import SimpleNamespace

    import acting.power
    import cli.common
    from cli.place import _by_waking
    from vcsched.control.admission import admit
    from vcsched.control.power import mark_asleep

    full = inventory_of([managed("v0", "h0", "v0", 0.3), managed("v1", "h1", "v1", 0.3)], n_hosts=4)
    state = slept(slept(PowerState(), full.hosts[2], 0.0), full.hosts[3], 0.0)
    asleep = mark_asleep(dataclasses.replace(full, hosts=(*full.hosts[:2], *(
        dataclasses.replace(h, down="asleep") for h in full.hosts[2:]))), state)
    c = powered(4)
    four = request("four", 4, 0.2, spread="required")  # one VM per host: both h2 and h3 needed
    with pytest.MonkeyPatch.context() as m:
        m.setattr(acting.power, "store_for", lambda *_: SimpleNamespace(read=lambda: state))
        m.setattr(cli.common, "host_identities", lambda *_: None)
        said, _, wake = _by_waking(c, SimpleNamespace(hv=None), asleep, admit(c, asleep, four),  # type: ignore[arg-type]
                                   lambda i: admit(c, i, four), False, True, None)
    assert wake is None and "it needs more than one of h2, h3 woken, which place does not do" in said.reason, \
        said.reason
