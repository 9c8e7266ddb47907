"""Fencing: the cluster file's failure fields and fence agents, and the runner of the ClusterLabs agent interface.

The runner is tested against a fake agent (a small shell script speaking the
interface: options on stdin, status exit 0 = on / 2 = off) whose behaviour
each test chooses; the lab's own agent is tested on a real lab host in
tests/test_fence_lab.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from acting.fence import agent_input, check_agents, fence_host, power_status, resolve_agent, run_agent
from cli.main import cli
from vcsched.errors import InputError
from vcsched.formats.cluster import DEFAULT_FAILURE_TIMEOUT_S, ClusterHost, FenceConfig, cluster_from_dict


def two_hosts(**top: Any) -> dict[str, Any]:
    return {"name": "c", "hosts": [{"name": "h0", "uri": "test:///default"},
                                   {"name": "h1", "uri": "test:///h1.xml"}], **top}


# --- the cluster file ---------------------------------------------------------------------------


def test_failure_fields_have_safe_defaults() -> None:
    c = cluster_from_dict(two_hosts())
    assert c.failure_timeout == DEFAULT_FAILURE_TIMEOUT_S and c.failures_tolerated == 0
    assert all(h.fence is None for h in c.hosts)


def test_default_failure_timeout_is_never_below_host_timeout() -> None:
    assert cluster_from_dict(two_hosts(host_timeout=200)).failure_timeout == 200


def test_failure_timeout_below_host_timeout_is_refused_naming_both() -> None:
    with pytest.raises(InputError, match=r"failure_timeout: 5 is below host_timeout \(10 s\)"):
        cluster_from_dict(two_hosts(host_timeout=10, failure_timeout=5))


@pytest.mark.parametrize("value", [2, 3, -1, 1.0, True, "1"])
def test_failures_tolerated_must_be_a_count_below_the_hosts(value: Any) -> None:
    with pytest.raises(InputError, match=rf"failures_tolerated: {value!r}"):
        cluster_from_dict(two_hosts(failures_tolerated=value))


def test_failures_tolerated_one_of_two_hosts_is_accepted() -> None:
    assert cluster_from_dict(two_hosts(failures_tolerated=1)).failures_tolerated == 1


def test_on_failure_defaults_to_restart_and_takes_strand() -> None:
    assert cluster_from_dict(two_hosts()).on_failure == "restart"
    assert cluster_from_dict(two_hosts(on_failure="strand")).on_failure == "strand"


@pytest.mark.parametrize("value", ["Restart", "", 1, True, None])
def test_on_failure_is_restart_or_strand(value: Any) -> None:
    with pytest.raises(InputError, match=rf"on_failure: {value!r} is not one of 'restart', 'strand'"):
        cluster_from_dict(two_hosts(on_failure=value))


def test_fence_options_are_kept_as_text_in_order() -> None:
    d = two_hosts()
    d["hosts"][0]["fence"] = {"agent": "fence_ipmilan", "ip": "10.0.0.1", "lanplus": True, "ipport": 623,
                              "password": "pw"}
    fence = cluster_from_dict(d).hosts[0].fence
    assert fence == FenceConfig("fence_ipmilan", (("ip", "10.0.0.1"), ("lanplus", "1"), ("ipport", "623"),
                                                  ("password", "pw")))
    assert fence.redacted()["password"] == "***"
    assert agent_input(fence, "off") == "ip=10.0.0.1\nlanplus=1\nipport=623\npassword=pw\naction=off\n"


@pytest.mark.parametrize("fence,message", [
    ({"ip": "x"}, r"hosts\[0\]\.fence: missing field 'agent'"),
    ({"agent": "bin/fence_x"}, r"hosts\[0\]\.fence\.agent: 'bin/fence_x' is neither a command name"),
    ({"agent": "fence_x", "action": "reboot"}, r"hosts\[0\]\.fence\.action: 'reboot': vcsched sets the fence"),
    ({"agent": "fence_x", "Bad-Key": 1}, r"hosts\[0\]\.fence: option 'Bad-Key' is not a fence-agent option"),
    ({"agent": "fence_x", "ip": "a\nb"}, r"hosts\[0\]\.fence\.ip: a fence option cannot span lines"),
    ({"agent": "fence_x", "ip": [1]}, r"hosts\[0\]\.fence\.ip: \[1\] is not a string"),
    ("fence_x", r"hosts\[0\]\.fence: expected a table"),
])
def test_bad_fence_tables_are_refused_naming_the_field(fence: Any, message: str) -> None:
    d = two_hosts()
    d["hosts"][0]["fence"] = fence
    with pytest.raises(InputError, match=message):
        cluster_from_dict(d)


def agent_script(tmp_path: Path, body: str, name: str = "fence_fake") -> Path:
    """A fake fence agent: ``body`` is shell run after stdin was saved to ``stdin.txt`` and ``$action`` set."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n"
                    f"cat > {tmp_path}/stdin.txt\n"
                    f"action=$(sed -n 's/^action=//p' {tmp_path}/stdin.txt)\n"
                    f"echo \"$action\" >> {tmp_path}/actions.txt\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def cluster_file(tmp_path: Path, fence: str) -> Path:
    f = tmp_path / "cluster.toml"
    f.write_text(f'name = "c"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\nfence = {fence}\n'
                 '[[hosts]]\nname = "h1"\nuri = "test:///default?h1"\n')
    return f


def test_an_unknown_fence_agent_is_exit_2_naming_it(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["status", "--cluster", str(cluster_file(tmp_path, '{agent = "fence_nosuch"}'))])
    assert r.exit_code == 2, r.output
    assert "hosts[0].fence.agent: unknown fence agent 'fence_nosuch'" in r.stderr


def test_a_fence_agent_that_is_not_executable_is_exit_2(tmp_path: Path) -> None:
    agent = tmp_path / "fence_plain"
    agent.write_text("#!/bin/sh\nexit 0\n")
    r = CliRunner().invoke(cli, ["status", "--cluster", str(cluster_file(tmp_path, f'{{agent = "{agent}"}}'))])
    assert r.exit_code == 2, r.output
    assert f"hosts[0].fence.agent: fence agent '{agent}' is not executable" in r.stderr


def test_failure_timeout_below_host_timeout_is_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "cluster.toml"
    f.write_text('name = "c"\nhost_timeout = 10\nfailure_timeout = 3\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    r = CliRunner().invoke(cli, ["status", "--cluster", str(f)])
    assert r.exit_code == 2 and "failure_timeout: 3 is below host_timeout" in r.stderr


def test_agents_are_found_on_path_and_by_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = agent_script(tmp_path, "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert resolve_agent("a", "fence_fake") == str(agent)
    assert resolve_agent("a", str(agent)) == str(agent)
    check_agents(cluster_from_dict({"name": "c", "hosts": [
        {"name": "h0", "uri": "test:///default", "fence": {"agent": "fence_fake"}}]}))


# --- the runner ---------------------------------------------------------------------------------


def host_with(agent: Path, **options: str) -> ClusterHost:
    return ClusterHost("h0", "test:///default", fence=FenceConfig(str(agent), tuple(options.items())))


#: A fake agent with a power state in a file, as fence_dummy's file mode: off writes it, status reads it.
STATEFUL = """state=$(cat "$(dirname "$0")/power" 2>/dev/null || echo on)
case "$action" in
  off) echo off > "$(dirname "$0")/power"; echo "Success: Powered OFF"; exit 0 ;;
  status) echo "Status: $state"; [ "$state" = off ] && exit 2; exit 0 ;;
  monitor) exit 0 ;;
esac
exit 1
"""


def test_a_host_is_fenced_by_off_then_a_status_that_says_off(tmp_path: Path) -> None:
    agent = agent_script(tmp_path, STATEFUL)
    result = fence_host(host_with(agent, ip="10.0.0.1", plug="h0"))
    assert result.fenced, result.detail
    assert (tmp_path / "actions.txt").read_text().split() == ["off", "status"]
    assert (tmp_path / "stdin.txt").read_text() == "ip=10.0.0.1\nplug=h0\naction=status\n"


def test_status_exit_codes_read_on_off_and_unknown(tmp_path: Path) -> None:
    agent = agent_script(tmp_path, STATEFUL)
    fence = FenceConfig(str(agent))
    assert power_status(fence)[0] == "on"
    run_agent(fence, "off")
    assert power_status(fence)[0] == "off"
    broken = FenceConfig(str(agent_script(tmp_path, "echo 'Failed: login denied' >&2; exit 3\n", "fence_bad")))
    state, run = power_status(broken)
    assert state == "unknown" and run.returncode == 3 and run.said() == "Failed: login denied"


def test_a_failing_off_is_not_fenced_and_says_what_the_agent_said(tmp_path: Path) -> None:
    agent = agent_script(tmp_path, "echo 'Failed: Unable to connect to 10.0.0.1' >&2; exit 1\n")
    result = fence_host(host_with(agent))
    assert not result.fenced
    assert "action=off exited 1: Failed: Unable to connect to 10.0.0.1" in result.detail
    assert (tmp_path / "actions.txt").read_text().split() == ["off"]  # no status after a failed off


def test_off_that_leaves_the_host_on_is_not_fenced(tmp_path: Path) -> None:
    agent = agent_script(tmp_path, '[ "$action" = status ] && { echo "Status: ON"; exit 0; }\nexit 0\n')
    result = fence_host(host_with(agent))
    assert not result.fenced and "off exited 0 but the host is still on" in result.detail


def test_an_agent_that_hangs_is_killed_at_the_timeout(tmp_path: Path) -> None:
    agent = agent_script(tmp_path, "sleep 30 &\nwait\n")
    result = fence_host(host_with(agent), timeout_s=0.5)
    assert not result.fenced and "did not finish within 0.5 s (killed)" in result.detail
    assert result.seconds < 10


def test_a_host_without_agent_is_never_fenced() -> None:
    result = fence_host(ClusterHost("h0", "test:///default"))
    assert not result.fenced and "has no fence agent" in result.detail


def test_switch_off_is_timed_by_the_callers_clock() -> None:
    """A power-off under the fault simulation's clock reports simulated seconds: timed by the machine's clock, a
    replay's trace (its ``power_slept`` event) differed with the machine's load (scripts/faultsim --seed 7
    --replay 386 under load)."""
    from acting.fence import STATUS_OFF, AgentRun, switch_off

    now = [100.0]

    def run(action: str) -> AgentRun:
        now[0] += 2.5  # each agent run takes 2.5 s of the caller's clock
        return AgentRun(action, 0 if action == "off" else STATUS_OFF, "", "", 0.0)

    result = switch_off("h1", "fence_fake", run, clock=lambda: now[0])
    assert result.fenced and result.seconds == 5.0
