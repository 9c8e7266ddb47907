"""Power saving over time (vcsched/simulate/power.py, `vcsched simulate --power`): what each policy promises."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from vcsched.errors import InputError
from vcsched.simulate.power import PowerRunOptions, arrivals, power_study, simulate_power, with_hosts
from vcsched.simulate.scenarios import one_part
from vcsched.simulate.workload import HostSpec, VCClass, Work, Workload, validate

SHORT = PowerRunOptions(hosts=4, hours=12.0, warmup=3600.0, interval=600.0)


def workload(rate: float = 1.0, need: float = 0.3) -> Workload:
    return validate(Workload((HostSpec("h", 1.0, 1.0),), (
        VCClass("small", rate, one_part({"cpu": need}), vms=2, memory=0.05, work=Work(1.0)),)))


def test_off_keeps_every_host_on_and_counts_its_energy() -> None:
    r = simulate_power(workload(), dataclasses.replace(SHORT, policy="off"))
    assert (r.sleeps, r.wakes, r.late_wakes, r.hosts_on_avg, r.fewest_on) == (0, 0, 0, 4.0, 4)
    # at least the idle draw of 4 hosts over 12 hours, at most their peak
    assert 4 * 0.120 * 12 <= r.energy_kwh <= 4 * 0.300 * 12


def test_an_idle_cluster_under_auto_sleeps_down_to_min_hosts_on() -> None:
    r = simulate_power(workload(rate=1e-6), dataclasses.replace(SHORT, policy="auto"))
    assert r.fewest_on == 1 and r.hosts_on_avg < 1.5
    off = simulate_power(workload(rate=1e-6), dataclasses.replace(SHORT, policy="off"))
    assert r.energy_kwh < 0.5 * off.energy_kwh


def test_auto_never_puts_a_host_to_sleep_below_the_target_yield() -> None:
    r = simulate_power(with_hosts(workload(), 4, 0.4), dataclasses.replace(SHORT, policy="auto", hours=24.0))
    assert r.sleeps > 0
    assert r.after_sleep_min_yield >= 1.0 - 1e-6


def test_auto_keeps_the_room_for_a_host_failure() -> None:
    r = simulate_power(workload(rate=1e-6), dataclasses.replace(SHORT, policy="auto", failures_tolerated=1))
    assert r.fewest_on == 2  # idle, yet one host on could not fail with another taking over
    busy = simulate_power(with_hosts(workload(), 4, 0.3), dataclasses.replace(SHORT, policy="auto",
                                                                              failures_tolerated=1))
    assert busy.fewest_on >= 2


def test_every_policy_sees_the_same_virtual_clusters() -> None:
    w = with_hosts(workload(), 4, 0.5)
    vcs = {p: simulate_power(w, dataclasses.replace(SHORT, policy=p)).vcs for p in ("auto", "threshold", "off")}
    assert len(set(vcs.values())) == 1 and vcs["off"] > 0


def test_the_daily_cycle_shapes_the_arrivals() -> None:
    w = with_hosts(workload(rate=1.0), 4, None)
    times = [t for t, _, _ in arrivals(w, dataclasses.replace(SHORT, diurnal=0.9), 10 * 86400.0)]
    day = sum(1 for t in times if (t % 86400.0) < 43200.0)  # sin > 0 in the first half of each day
    assert day > 2 * (len(times) - day)


def test_late_wakes_are_wakes_and_a_study_pairs_against_off() -> None:
    points = power_study(with_hosts(workload(), 4, 0.5), ["auto", "threshold"], SHORT, 2)
    assert [p.policy for p in points] == ["auto", "threshold"]
    for p in points:
        m = p.metrics
        assert m["late_wakes"] is not None and m["wakes"] is not None and m["late_wakes"].mean <= m["wakes"].mean
        assert m["energy_saved"] is not None and m["energy_saved"].n == 2


@pytest.mark.parametrize(("options", "named"), [
    (dict(policy="sometimes"), "--power: 'sometimes'"),
    (dict(hosts=1), "--hosts: 1 hosts"),
    (dict(diurnal=1.0), "--diurnal: 1 is not in [0, 1)"),
    (dict(failures_tolerated=4), "--failures: 4 is not below the 4 hosts"),
])
def test_bad_options_are_refused_naming_them(options: dict[str, Any], named: str) -> None:
    with pytest.raises(InputError, match=named.replace("(", r"\(").replace("[", r"\[").replace(")", r"\)")):
        simulate_power(workload(), dataclasses.replace(SHORT, **options))


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["simulate", *args])


def test_the_command_prints_json_and_csv(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    r = run("cluster64", "--power", "auto,threshold", "--hosts", "4", "--hours", "3", "-r", "1", "--load", "0.3",
            "--json", "--csv", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [p["policy"] for p in doc["points"]] == ["auto", "threshold"]
    assert {"energy_kwh", "energy_saved", "late_wakes", "migrations"} <= set(doc["points"][0]["metrics"])
    assert out.read_text().startswith("workload,power,load,metric,mean,ci95,n")


@pytest.mark.parametrize(("args", "named"), [
    (["--power", "dpm"], "--power: 'dpm' is not one of auto, threshold, off, all"),
    (["--power", "auto", "--altruism", "1"], "--altruism: not with --power"),
    (["--power", "auto", "-p", "drf"], "--policy: not with --power"),
    (["--hosts", "4"], "--hosts: only with --power"),
    (["--power", "auto", "--wake-time", "soon"], "--wake-time: 'soon' is not a duration"),
    (["--power", "auto", "--load", "1.2"], "--load"),
])
def test_bad_power_input_is_one_line_and_exit_2(args: list[str], named: str) -> None:
    r = run("cluster64", *args)
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert named in r.stderr
