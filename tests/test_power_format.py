"""The cluster file's power-saving fields: defaults, and every refusal naming the field and the value (exit 2)."""

from __future__ import annotations

from typing import Any

import pytest

from vcsched.errors import InputError
from vcsched.formats.cluster import cluster_from_dict
from vcsched.formats.power import DEFAULT_SLEEP_AFTER_S, DEFAULT_WAKE_TIME_S


def cluster(top: dict[str, Any] | None = None, host: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "c", **(top or {}),
            "hosts": [{"name": "h0", "uri": "test:///default", **(host or {})},
                      {"name": "h1", "uri": "test:///h1"}]}


def test_power_saving_is_off_by_default_with_dpm_like_timers() -> None:
    c = cluster_from_dict(cluster())
    p = c.power
    assert (p.mode, p.min_hosts_on, p.target_yield, p.spare) == ("off", 1, 1.0, "consolidate")
    assert (p.sleep_after, p.wake_time) == (DEFAULT_SLEEP_AFTER_S, DEFAULT_WAKE_TIME_S)
    assert (p.sleep_margin, p.wake_margin) == (0.3, 0.1)
    h = c.hosts[0].power
    assert h.agent is None and h.saving and h.idle_watts is None and h.peak_watts is None


def test_every_cluster_power_field_is_read() -> None:
    c = cluster_from_dict(cluster({"power_saving": "auto", "min_hosts_on": 2, "power_yield": 0.8,
                                   "sleep_after": "5m", "wake_time": "90s", "spare": "spread",
                                   "sleep_margin": 0.5, "wake_margin": 0}))
    p = c.power
    assert (p.mode, p.min_hosts_on, p.target_yield, p.sleep_after, p.wake_time, p.spare) == (
        "auto", 2, 0.8, 300.0, 90.0, "spread")
    assert (p.sleep_margin, p.wake_margin) == (0.5, 0.0)


def test_the_power_agent_defaults_to_the_fence_agent() -> None:
    c = cluster_from_dict(cluster(host={"fence": {"agent": "fence_ipmilan", "ip": "10.0.0.1"}}))
    assert c.hosts[0].power.agent == c.hosts[0].fence
    assert c.hosts[1].power.agent is None


def test_a_power_agent_of_its_own_is_parsed_like_a_fence_agent() -> None:
    c = cluster_from_dict(cluster(host={"fence": {"agent": "fence_ipmilan"},
                                        "power": {"agent": "fence_redfish", "ip": "10.0.0.9", "ssl": True},
                                        "power_saving": False, "idle_watts": 95, "peak_watts": 310.5}))
    h = c.hosts[0]
    assert h.power.agent is not None and h.power.agent.agent == "fence_redfish"
    assert h.power.agent.options == (("ip", "10.0.0.9"), ("ssl", "1"))
    assert h.fence is not None and h.fence.agent == "fence_ipmilan"
    assert (h.power.saving, h.power.idle_watts, h.power.peak_watts) == (False, 95.0, 310.5)


@pytest.mark.parametrize(("top", "host", "message"), [
    ({"power_saving": "on"}, {}, "power_saving: 'on' is not one of 'off', 'recommend', 'auto'"),
    ({"power_saving": True}, {}, "power_saving: True is not one of"),
    ({"min_hosts_on": 0}, {}, "min_hosts_on: 0 is not a whole number >= 1"),
    ({"min_hosts_on": 1.5}, {}, "min_hosts_on: 1.5 is not a whole number >= 1"),
    ({"min_hosts_on": 3}, {}, "min_hosts_on: 3 is above the number of hosts (2)"),
    ({"power_yield": 0}, {}, "power_yield: 0 is not in (0, 1]"),
    ({"power_yield": 1.2}, {}, "power_yield: 1.2 is not in (0, 1]"),
    ({"sleep_after": "soon"}, {}, "sleep_after: 'soon' is not a duration"),
    ({"wake_time": 0}, {}, "wake_time: 0 must be above 0 seconds"),
    ({"spare": "pack"}, {}, "spare: 'pack' is not one of 'consolidate', 'spread'"),
    ({"sleep_margin": -0.1}, {}, "sleep_margin: -0.1 must be at least 0"),
    ({"wake_margin": 0.3}, {}, "wake_margin: 0.3: wake_margin (0.3) must be below sleep_margin (0.3)"),
    ({"sleep_margin": 0.05}, {}, "sleep_margin: 0.05: wake_margin (0.1) must be below sleep_margin (0.05)"),
    ({}, {"power_saving": "no"}, "hosts[0].power_saving: 'no' is not true or false"),
    ({}, {"idle_watts": -1, "peak_watts": 10}, "hosts[0].idle_watts: -1 must be at least 0"),
    ({}, {"idle_watts": 200, "peak_watts": 100}, "hosts[0].idle_watts: 200 is above peak_watts (100)"),
    ({}, {"peak_watts": 100}, "hosts[0].peak_watts: 100 given alone: declare both"),
    ({}, {"power": {"ip": "x"}}, "hosts[0].power: missing field 'agent'"),
    ({}, {"power": {"agent": "bin/fence"}}, "hosts[0].power.agent: 'bin/fence' is neither a command name"),
    ({}, {"power": {"agent": "fence_x", "action": "on"}}, "hosts[0].power.action: 'on': vcsched sets"),
])
def test_bad_power_fields_are_refused_naming_field_and_value(top: dict[str, Any], host: dict[str, Any],
                                                            message: str) -> None:
    with pytest.raises(InputError) as e:
        cluster_from_dict(cluster(top, host))
    assert message in str(e.value)


def test_a_bad_power_field_stops_a_command_with_one_line_and_exit_2(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from cli.main import cli

    path = tmp_path / "cluster.toml"
    path.write_text('name = "t"\npower_saving = "sometimes"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    r = CliRunner().invoke(cli, ["status", "--sample", "0", "--cluster", str(path)])
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert "power_saving: 'sometimes' is not one of" in r.stderr
