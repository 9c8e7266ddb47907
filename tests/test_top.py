"""`vcsched top` without a terminal: the view's numbers (vcsched/control/top.py), the screen's rows, columns and
order (cli/top_view.py), following the controller's log (EventTail), and the command printing one frame."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from acting.events import EventTail
from acting.sampling import CpuSampler
from cli.main import cli
from cli.top_view import (
    VM_COLUMNS,
    Refresh,
    Sort,
    event_text,
    fit_columns,
    frame,
    on_key,
    plain,
    sort_vms,
    table,
    width_of,
)
from tests.builders import inventory_of, managed, memory_hypervisor
from tests.fake_load import FakeClock, LoadedHypervisor, busy
from vcsched.control.observe import Sample, estimate_all
from vcsched.control.top import TopView, VmRow, controller_state, top_view
from vcsched.inventory import HostState, InDoubt, Inventory, VmMeta, VmState

MiB = 1 << 20
T0 = 1_700_000_000.0


def samples(*used: float, cap: float | None = 0.5) -> list[Sample]:
    return [Sample(T0 + i, 1.0, u, cap) for i, u in enumerate(used)]


def lab_inventory() -> Inventory:
    """h0 with web-0 (capped 0.3, needs 0.6, floor 0.8) and an unmanaged domain; h1 with db-0 (0.5 of 0.5)
    arriving from h0; h2 down."""
    web = dataclasses.replace(managed("web-0", "h0", "web", 0.6, 0.3),
                              meta=VmMeta("web", 0.6, 128 * MiB, 1, min_yield=0.8))
    db = dataclasses.replace(managed("db-0", "h1", "db", 0.5, 0.5), arriving_from="h0", paused=True)
    other = VmState("other", "h0", 2, 256 * MiB, True)
    hosts = (HostState("h0", 2, 4096 * MiB), HostState("h1", 1, 2048 * MiB, 512 * MiB),
             HostState("h2", 4, 0, down="host h2: did not answer within 2 s (host_timeout)"))
    return Inventory("lab", hosts, (web, other, db))


def view_of(inv: Inventory | None = None, windows: dict[str, list[Sample]] | None = None,
            **kwargs: Any) -> TopView:
    inv = inv or lab_inventory()
    if windows is None:
        windows = {"web-0": samples(0.3, 0.3, 0.31, cap=0.3), "other": samples(0.7, cap=None),
                   "db-0": samples(0.1, 0.12, 0.1)}
    estimates = estimate_all(inv, windows)
    vcs = [{"name": "web", "yield": 0.5, "min_yield": 0.8}, {"name": "db", "yield": 1.0, "min_yield": None}]
    kwargs.setdefault("down_since", {"h2": T0})
    kwargs.setdefault("now", T0 + 75)
    return top_view(inv, "yield", windows, estimates, vcs, **kwargs)


# ---------------------------------------------------------------------------------------------- the numbers


def test_a_vm_row_has_its_cap_use_binding_needs_yield_and_floor() -> None:
    vms = {v.name: v for v in view_of().vms}
    web = vms["web-0"]
    assert (web.vc, web.host, web.cap_cores, web.used_cores) == ("web", "h0", 0.3, 0.31)
    assert web.saturated is True  # at its cap in every sample: the estimator's verdict
    assert web.need_cores == 0.6 and web.estimated_cores is not None and web.estimated_cores >= 0.6
    assert web.yield_ == pytest.approx(0.5) and web.floor == 0.8 and web.below_floor
    db = vms["db-0"]
    assert db.saturated is False and db.estimated_cores == pytest.approx(0.16)  # p90 0.116 x 1.1 + 0.03, rounded up
    assert not db.below_floor


def test_an_unmanaged_vm_is_shown_with_its_use_but_no_need_or_yield() -> None:
    other = next(v for v in view_of().vms if v.name == "other")
    assert other.vc is None and other.used_cores == 0.7 and other.saturated is False
    assert other.need_cores is None and other.estimated_cores is None and other.yield_ is None


def test_a_host_row_sums_caps_use_and_memory_of_its_vms() -> None:
    h0, h1, _ = view_of().hosts
    assert h0.caps_cores == pytest.approx(0.3)  # managed VMs' caps only
    assert h0.used_cores == pytest.approx(0.31 + 0.7)  # every VM's use, unmanaged too
    assert h0.memory_used_bytes == 384 * MiB and h0.memory_usable_bytes == 4096 * MiB and h0.vms == 2
    assert h1.memory_usable_bytes == 1536 * MiB  # less memory_reserved


def test_a_down_host_says_why_and_for_how_long_and_counts_nothing() -> None:
    h2 = view_of().hosts[2]
    assert h2.down is not None and "did not answer" in h2.down and h2.down_for == 75
    assert h2.used_cores is None and h2.vms == 0


def test_marks_migrating_paused_in_doubt_and_cordoned() -> None:
    inv = lab_inventory()
    doubt = InDoubt("web-0", "u-1", ("h0", "h1"), ("running", "running"))
    copy = dataclasses.replace(inv.vms[0], host="h1", in_doubt=True)
    inv = dataclasses.replace(inv, vms=(dataclasses.replace(inv.vms[0], in_doubt=True), *inv.vms[1:], copy),
                              in_doubt=(doubt,))
    view = view_of(inv, cordoned={"h1"})
    db = next(v for v in view.vms if v.name == "db-0")
    assert db.migrating == "h0>h1" and db.paused
    assert [v.in_doubt for v in view.vms if v.name == "web-0"] == [True, True]
    assert view.in_doubt == (doubt,)
    assert [h.cordoned for h in view.hosts] == [False, True, False]


def test_min_and_mean_yield_are_over_the_virtual_clusters_and_name_those_below_their_floor() -> None:
    view = view_of()
    assert view.min_yield == 0.5 and view.mean_yield == 0.75 and view.below_floor == ("web",)


# ---------------------------------------------------------------------------------------------- the controller's log


def ev(event: str, t: float, member: str = "m1", **fields: Any) -> dict[str, Any]:
    return {"event": event, "time": T0 + t, "member": member, **fields}


MIGRATE = {"op": "migrate", "vm": "db-0", "from": "h0", "to": "h1", "bytes": 1}
CAP = {"op": "set-cap", "vm": "web-0", "host": "h0", "cap_cores": 0.5}


def test_the_log_says_who_leads_and_the_last_decision() -> None:
    c = controller_state([ev("start", 0), ev("leader", 1), ev("interval", 2), ev("decision", 3, kind="nothing"),
                          ev("decision", 4, kind="re-cap", reason="needs moved")])
    assert c.leader == "m1" and c.decision is not None and c.decision["kind"] == "re-cap"
    assert c.last_event_at == T0 + 4
    assert [e["event"] for e in c.recent] == ["start", "leader", "decision"]  # no interval, no "nothing"
    assert controller_state([ev("leader", 1), ev("standby", 2, reason="lease lost")]).leader is None
    assert controller_state([ev("leader", 1, "a"), ev("stop", 2, "b")]).leader == "a"


def test_a_migration_is_in_flight_from_its_plan_until_its_step_or_the_plans_end() -> None:
    plan = ev("plan", 1, kind="re-balance", dry_run=False, plan={"steps": [CAP, MIGRATE]})
    assert controller_state([plan]).migrating == {"db-0": ("h0", "h1")}
    assert controller_state([plan, ev("step", 2, outcome="done", **MIGRATE)]).migrating == {}
    assert controller_state([plan, ev("applied", 2, ok=False)]).migrating == {}
    dry = dict(plan, dry_run=True)
    assert controller_state([dry]).migrating == {}  # a dry run moves nothing


def test_a_host_has_failed_from_a_failed_step_until_a_plan_applies_and_while_the_controller_finds_it_down() -> None:
    failed = ev("step", 1, outcome="failed", detail="cannot migrate: connection reset", **MIGRATE)
    c = controller_state([failed])
    assert set(c.failed) == {"h0", "h1"} and "connection reset" in c.failed["h1"]
    assert controller_state([failed, ev("applied", 2, ok=True)]).failed == {}
    down = ev("host-down", 3, host="h1", reason="did not answer")
    assert "did not answer" in controller_state([down]).failed["h1"]
    assert controller_state([down, ev("host-up", 4, host="h1")]).failed == {}


def test_the_view_marks_a_vm_the_controller_is_migrating_and_a_host_it_found_failed() -> None:
    plan = ev("plan", 1, kind="re-balance", dry_run=False,
              plan={"steps": [dict(MIGRATE, vm="web-0", **{"from": "h0", "to": "h1"})]})
    view = view_of(controller=controller_state([plan, ev("host-down", 2, host="h2", reason="gone")]))
    assert next(v for v in view.vms if v.name == "web-0").migrating == "h0>h1"
    assert view.hosts[2].failed is not None and view.hosts[0].failed is None


def test_event_lines_say_what_happened() -> None:
    assert event_text(ev("step", 0, outcome="failed", detail="no route", **MIGRATE)) == \
        "step migrate db-0 h0>h1 failed: no route"
    assert event_text(ev("step", 0, outcome="done", **CAP)) == "step set-cap web-0 h0 cap 0.50 done"
    assert event_text(ev("applied", 0, kind="re-cap", ok=True, steps=2, migrated_bytes=128 * MiB)) == \
        "applied re-cap: ok, 2 steps, 128 MiB moved"
    assert event_text(ev("host-down", 0, host="h1", reason="timeout")) == "host-down h1: timeout"


# ---------------------------------------------------------------------------------------------- following the log


def test_the_tail_reads_appended_lines_once_they_end_and_skips_what_is_not_an_event(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(ev("start", 0)) + "\nnot json\n" + '{"event": "leader", "time"')
    tail = EventTail(log)
    assert [e["event"] for e in tail.poll()] == ["start"]
    with log.open("a") as f:
        f.write(f': {T0}, "member": "m1"}}\n' + json.dumps(ev("interval", 1)) + "\n")
    assert [e["event"] for e in tail.poll()] == ["leader", "interval"]
    assert tail.poll() == []


def test_the_tail_reads_a_truncated_or_replaced_log_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(ev("interval", i)) + "\n" for i in range(5)))
    tail = EventTail(log)
    tail.poll()
    log.write_text(json.dumps(ev("start", 9)) + "\n")  # logrotate's copytruncate, then a new line
    assert [e["event"] for e in tail.poll()] == ["start"]
    replaced = tmp_path / "new.jsonl"
    replaced.write_text(json.dumps(ev("stop", 10)) + "\n" + json.dumps(ev("start", 11)) + "\n")
    replaced.rename(log)
    assert [e["event"] for e in tail.poll()] == ["stop", "start"]


def test_the_tail_starts_near_the_end_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(ev("interval", i)) + "\n" for i in range(2000)))
    tail = EventTail(log, start_bytes=1000)
    got = tail.poll()
    assert 5 < len(got) < 30 and got[-1]["time"] == T0 + 1999  # whole lines only, the last ones


# ---------------------------------------------------------------------------------------------- sampling every VM


def test_the_sampler_measures_unmanaged_vms_when_asked() -> None:
    clock = FakeClock()
    inv = inventory_of([managed("a-0", "h0", "a", 0.5, 0.5), VmState("other", "h0", 1, 128 * MiB, True)])
    hv = LoadedHypervisor("lab", inv.hosts, inv.vms, clock, {"a-0": busy(0.2), "other": busy(0.4)})
    for every_vm, expected in ((False, {"a-0"}), (True, {"a-0", "other"})):
        sampler = CpuSampler(30, clock, every_vm=every_vm)
        for _ in range(3):
            sampler.sample(hv)
            clock.advance(2)
        assert set(sampler.samples()) == expected
    assert sampler.samples()["other"][-1].used_cores == pytest.approx(0.4, abs=0.01)


# ---------------------------------------------------------------------------------------------- the screen


def rows(n: int) -> list[VmRow]:
    return [VmRow(f"vm{i}", f"h{i % 3}", "vc", 1, True, 0.5, 0.1 * i, False, 0.5, 0.5, "measured", 0.5 + 0.04 * i,
                  None) for i in range(n)]


def test_sorting_by_yield_use_and_host_keeps_unmeasured_vms_last() -> None:
    vms = [*rows(4), dataclasses.replace(rows(1)[0], name="idle", used_cores=None, yield_=None)]
    assert [v.name for v in sort_vms(vms, Sort("yield"))] == ["vm0", "vm1", "vm2", "vm3", "idle"]
    assert [v.name for v in sort_vms(vms, Sort("yield", True))] == ["vm3", "vm2", "vm1", "vm0", "idle"]
    assert [v.name for v in sort_vms(vms, Sort("use"))] == ["vm3", "vm2", "vm1", "vm0", "idle"]
    assert [v.host for v in sort_vms(rows(6), Sort("host"))] == ["h0", "h0", "h1", "h1", "h2", "h2"]
    assert [v.name for v in sort_vms([*rows(12)], Sort("host"))][:4] == ["vm0", "vm3", "vm6", "vm9"]  # 9 < 10


def test_keys_change_the_sort_and_q_quits() -> None:
    s = Sort()
    assert on_key(s, "y") == Sort("yield") and on_key(Sort("yield"), "r") == Sort("yield", True)
    assert on_key(Sort("yield", True), "u") == Sort("use") and on_key(s, "x") == s
    assert on_key(s, "q") is None and on_key(s, "Q") is None


def test_a_narrow_terminal_drops_columns_by_priority_and_never_cuts_a_value() -> None:
    vms = list(view_of().vms)
    full = [c.header for c, _ in fit_columns(VM_COLUMNS, vms, 500)]
    assert full == [c.header for c in VM_COLUMNS]
    narrow = [c.header for c, _ in fit_columns(VM_COLUMNS, vms, 60)]
    assert {"VM", "HOST", "CAP", "USED", "YIELD", "STATE"} <= set(narrow) and "BASIS" not in narrow
    assert narrow == [h for h in full if h in narrow]  # the order is kept
    for width in range(30, 140, 7):
        lines = table(VM_COLUMNS, vms, width)
        kept = [c for c, _ in fit_columns(VM_COLUMNS, vms, width)]
        for v, line in zip(vms, lines[1:], strict=True):
            cells = [seg for seg, _ in line if seg.strip()]
            assert [c.strip() for c in cells] == [c.cell(v) for c in kept if c.cell(v)]  # every value whole


def test_every_line_of_a_frame_fits_its_width_and_height() -> None:
    view = dataclasses.replace(view_of(), vms=tuple(rows(80)))
    for width, height in ((200, 60), (100, 30), (72, 24), (50, 16)):
        lines = frame(view, Sort("yield"), width, height, Refresh(T0, 2.0), T0 + 1)
        assert len(lines) == height, (width, height)
        assert max(width_of(line) for line in lines) <= width, (width, plain(lines))
        text = plain(lines)
        assert "q quit" in text.splitlines()[-1]
        assert "more VMs" in text  # 80 VMs do not fit: the first ones in the chosen order, and how many more


def test_a_frame_shows_hosts_vms_marks_yields_and_the_controller() -> None:
    plan = ev("plan", 70, kind="re-balance", dry_run=False, plan={"steps": [MIGRATE]})
    view = view_of(controller=controller_state([ev("leader", 60), plan]))
    text = plain(frame(view, Sort("host"), 160, None, Refresh(T0 + 74, 2.0, events_file="run.jsonl"), T0 + 75))
    assert "min yield 0.500 (web)" in text and "mean yield 0.750" in text and "below floor: web" in text
    host_lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("h")}
    assert "DOWN 1m15s" in host_lines["h2"] and "did not answer within 2 s" in text
    vm_lines = {line.split()[0]: line for line in text.splitlines() if line.startswith(("web-0", "db-0", "other"))}
    assert "migrating h0>h1" in vm_lines["db-0"] and "paused" in vm_lines["db-0"]
    assert "unmanaged" in vm_lines["other"]
    assert "controller · leader m1" in text and "plan re-balance: 1 step, 1 migration" in text


# ---------------------------------------------------------------------------------------------- the command


def test_piped_it_prints_one_frame_of_the_hosts_and_vms_and_exits(tmp_path: Path) -> None:
    from hypervisor.testhosts import write_scale_cluster

    scale = write_scale_cluster(tmp_path / "hosts", 2, 3)
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["top", "--cluster", str(scale.cluster_file), "--interval", "0.2"])
    assert r.exit_code == 0, r.output
    assert time.monotonic() - t0 < 30
    lines = r.stdout.splitlines()
    assert lines[0].startswith("vcsched top · cluster scale") and "q quit" in lines[-1]
    assert sum(1 for line in lines if line.startswith(("h0 ", "h1 "))) == 2
    assert sum(1 for line in lines if line.startswith("vm")) == 6


@pytest.mark.parametrize(("args", "names"), [
    (["--interval", "0"], "--interval"),
    (["--window", "-1"], "--window"),
    (["--sort", "name"], "--sort"),
    (["--events", "/no/such/run.jsonl"], "--events"),
    (["--policy", "nope"], "nope"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str], names: str) -> None:
    from tests.test_run_cli import cluster_file

    r = CliRunner().invoke(cli, ["top", "--cluster", str(cluster_file(tmp_path)), *args])
    assert r.exit_code == 2, r.output
    assert names in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr


def test_the_first_reading_has_no_use_yet_and_plans_with_the_declared_need() -> None:
    inv = lab_inventory()
    hv = memory_hypervisor(dataclasses.replace(inv, hosts=inv.hosts[:2], vms=inv.vms[:2]))
    got = hv.inventory()
    view = top_view(got, "yield", {}, estimate_all(got, {}), [])
    web = next(v for v in view.vms if v.name == "web-0")
    assert web.used_cores is None and web.saturated is None
    assert web.estimated_cores == 0.6 and web.basis == "too few samples"
    assert view.hosts[0].used_cores is None and view.min_yield is None


def test_keys_typed_together_are_read_one_by_one_and_an_arrow_as_one() -> None:
    from cli.terminal import keys_in

    assert keys_in("hr") == ["h", "r"]
    assert keys_in("\x1b[Ay\x1b[15~q") == ["\x1b[A", "y", "\x1b[15~", "q"]


def test_the_controllers_events_keep_three_lines_among_many_vms_and_fill_the_room_left() -> None:
    log = [ev("leader", 0)] + [ev("decision", i, kind="re-cap", reason=f"r{i}") for i in range(1, 40)]
    crowded = dataclasses.replace(view_of(), vms=tuple(rows(80)), controller=controller_state(log))
    stamp = re.compile(r"^\d\d:\d\d:\d\d decision")
    lines = plain(frame(crowded, Sort(), 100, 30, Refresh(T0, 2.0, events_file="run.jsonl"), T0)).splitlines()
    assert len(lines) == 30 and sum(1 for line in lines if stamp.match(line)) == 3
    assert lines[-2].endswith("decision re-cap: r39")  # the latest, just above the footer
    roomy = dataclasses.replace(crowded, vms=tuple(rows(2)))
    lines = plain(frame(roomy, Sort(), 100, 50, Refresh(T0, 2.0, events_file="run.jsonl"), T0)).splitlines()
    assert len(lines) == 50 and sum(1 for line in lines if stamp.match(line)) == 20


class Asked:
    """A hypervisor that records which hosts each inventory asked for."""

    def __init__(self, hv: Any) -> None:
        self.hv = hv
        self.asked: list[list[str] | None] = []

    def inventory(self, hosts: Any = None) -> Inventory:
        self.asked.append(None if hosts is None else sorted(hosts))
        got: Inventory = self.hv.inventory(hosts)
        return got

    def cpu_time_ns(self, host: str, vm: str) -> int | None:
        return None

    def cpu_counters(self, host: str, vm: str) -> None:
        return None


def test_a_down_host_is_retried_in_the_background_and_the_others_keep_refreshing() -> None:
    from cli.top import Reader
    from tests.builders import cluster_of
    from vcsched.control.sharing import sharing_for

    inv = inventory_of([managed("a-0", "h0", "a", 0.5, 0.5), managed("b-0", "h1", "b", 0.5, 0.5)])
    mem = memory_hypervisor(inv)
    hv, prober = Asked(mem), Asked(mem)
    cluster = cluster_of(2)
    reader = Reader(cluster, hv, sharing_for(cluster), 1.0, 30.0, None, prober=prober)
    assert [h.down for h in reader.read().hosts] == [None, None] and hv.asked == [["h0", "h1"]]
    mem.down["h1"] = "host h1: did not answer within 2 s (host_timeout)"
    view = reader.read()  # found down: from now on the readings leave it out, a retry asks it alone
    assert view.hosts[1].down is not None and [v.name for v in view.vms] == ["a-0"]
    view = reader.read()
    assert hv.asked[-1] == ["h0"] and view.hosts[1].down is not None and view.hosts[1].name == "h1"
    assert reader._probing is not None
    reader._probing.join(5)
    assert prober.asked and all(a == ["h1"] for a in prober.asked)
    del mem.down["h1"]
    reader.read()  # starts a retry, which finds h1 back
    assert reader._probing is not None
    reader._probing.join(5)
    view = reader.read()
    assert hv.asked[-1] == ["h0", "h1"] and [h.down for h in view.hosts] == [None, None]
    assert {v.name for v in view.vms} == {"a-0", "b-0"}


def test_a_frame_lists_each_lost_vm_with_why_and_how_to_restart_it() -> None:
    from vcsched.control.lost import HOST_FENCED, Lost

    view = view_of(lost=[Lost("db-1", "db", "h2", HOST_FENCED, T0 + 10)])
    text = plain(frame(view, Sort("host"), 160, None, Refresh(T0 + 74, 2.0), T0 + 75))
    assert (f"LOST: db-1 (db) runs nowhere: recorded on h2, host fenced, not restarted, since "
            f"{time.strftime('%H:%M:%S', time.localtime(T0 + 10))} (vcsched restart db-1 --apply)") in text
    unknown = dataclasses.replace(view_of(), lost_unknown="definitions store file:///x: cannot list definitions")
    assert "lost VMs unknown: definitions store" in plain(frame(unknown, Sort("host"), 160, None,
                                                                Refresh(T0 + 74, 2.0), T0 + 75))


def test_a_host_vcsched_put_to_sleep_is_shown_asleep_not_down() -> None:
    """Issue (QA on the lab): after `vcsched power sleep h2 --apply`, `top` showed h2 "DOWN 2s" with libvirt's
    "Connection refused" and counted "3 hosts, 1 down", where `status` says "h2 (sleeping)"."""
    from cli.top import Reader
    from tests.builders import cluster_of
    from vcsched.control.power import PowerState, slept, wake_failed
    from vcsched.control.sharing import sharing_for

    inv = inventory_of([managed("a-0", "h0", "a", 0.5, 0.5)])
    mem = memory_hypervisor(inv)
    mem.down["h1"] = "host h1: cannot connect: Connection refused"
    cluster = cluster_of(2)
    record = slept(PowerState(), HostState("h1", 1, 1024 << 20), T0)
    reader = Reader(cluster, mem, sharing_for(cluster), 1.0, 30.0, None, power=lambda: record)
    view = reader.read()
    assert view.hosts[1].asleep == "sleeping"
    text = plain(frame(view, Sort("host"), 80, None, Refresh(T0 + 74, 2.0), T0 + 75))
    assert "2 hosts, 1 asleep" in text and "down" not in text.split("\n")[0], text
    h1 = next(line for line in text.splitlines() if line.startswith("h1 "))
    assert "sleeping" in h1 and "DOWN" not in h1, text
    record = wake_failed(record, "h1", T0 + 5, "on exited 1")
    view = Reader(cluster, mem, sharing_for(cluster), 1.0, 30.0, None, power=lambda: record).read()
    assert view.hosts[1].asleep == "wake-failed"
    view = Reader(cluster, mem, sharing_for(cluster), 1.0, 30.0, None).read()  # no record: down, as before
    assert view.hosts[1].asleep is None and "1 down" in plain(frame(view, Sort("host"), 80, None,
                                                                    Refresh(T0 + 74, 2.0), T0 + 75))


def test_the_help_says_narrow_columns_go_under_the_row_not_that_they_are_left_out() -> None:
    """Issue (QA): --help said the least important columns "are left out", where docs/cli.md (and the screen)
    put their values on a line under the VM's row: nothing hidden."""
    text = " ".join(CliRunner().invoke(cli, ["top", "--help"], env={"COLUMNS": "200"}).stdout.split())
    assert "left out" not in text and "go on an indented line under it" in text
