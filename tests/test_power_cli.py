"""``vcsched power`` on libvirt's test driver with a fake agent: the exit codes, --json, and a whole sleep/wake
record cycle through the commands (the real cycle, with live migration and a powered-off host, is
tests/test_power_lab.py)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.testhosts import node_xml


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VCSCHED_COORDINATION", raising=False)
    return tmp_path / "state"


def agent(tmp_path: Path, on_exit: int = 0) -> Path:
    """A fake power agent: each action logged; off 0, status 2 (off), on ``on_exit``."""
    path = tmp_path / "fence_fake"
    path.write_text(f"#!/bin/sh\nin=$(cat)\necho \"$in\" | grep action= >> {tmp_path}/called\n"
                    "case \"$in\" in *action=status*) exit 2;; "
                    f"*action=on*) echo 'Failed: the BMC does not answer' >&2; exit {on_exit};; esac\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def cluster(tmp_path: Path, power: Path | None) -> Path:
    """h0 runs 2 VMs, h1 none (test-driver files); only h1 has a power agent."""
    for i, vms in ((0, 2), (1, 0)):
        (tmp_path / f"h{i}.xml").write_text(node_xml(i, vms))
    lines = ['name = "t"', "power_saving = \"recommend\"", 'wake_time = "1s"']
    for i in (0, 1):
        lines += ["[[hosts]]", f'name = "h{i}"', f'uri = "test://{tmp_path}/h{i}.xml"']
        if i == 1 and power is not None:
            lines.append(f'power = {{agent = "{power}", plug = "h1"}}')
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*args: object, code: int) -> dict[str, object]:
    r = CliRunner().invoke(cli, ["power", *map(str, args), "--json"])
    assert r.exit_code == code, (r.stdout, r.stderr)
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_a_host_without_an_agent_may_not_sleep_dry_run_and_apply_alike(tmp_path: Path) -> None:
    c = cluster(tmp_path, None)
    for apply in ([], ["--apply"]):
        doc = run("sleep", "h1", "--cluster", c, *apply, code=1)
        assert "no agent to power it on" in str(doc["reason"]) and not doc["slept"]


def test_sleep_then_wake_through_the_commands_records_each_state(tmp_path: Path) -> None:
    c = cluster(tmp_path, agent(tmp_path))
    dry = run("sleep", "h1", "--cluster", c, code=0)
    assert not dry["slept"] and not (tmp_path / "called").exists(), "a dry run runs no agent"
    assert run("wake", "h1", "--cluster", c, code=1)["reason"] == \
        "host h1 is on (not put to sleep by vcsched): nothing to wake"
    slept = run("sleep", "h1", "--cluster", c, "--apply", code=0)
    assert slept["slept"] and slept["off"]["fenced"]  # type: ignore[index]
    assert (tmp_path / "called").read_text().split() == ["action=off", "action=status"]
    status = run("status", "--cluster", c, code=0)
    states = {h["host"]: h["state"] for h in status["hosts"]}  # type: ignore[attr-defined]
    assert states == {"h0": "on", "h1": "sleeping"} and status["decision"]["action"] in ("none", "wake")  # type: ignore[index]
    woke = run("wake", "h1", "--cluster", c, "--apply", code=0)  # the test driver answers at once, as itself
    assert woke["woke"], woke
    after = {h["host"]: h for h in run("status", "--cluster", c, code=0)["hosts"]}  # type: ignore[attr-defined]
    assert after["h1"]["state"] == "on" and after["h1"]["wake_s"] is not None


def test_a_failed_wake_exits_1_and_sticks_until_cleared(tmp_path: Path) -> None:
    c = cluster(tmp_path, agent(tmp_path, on_exit=1))
    run("sleep", "h1", "--cluster", c, "--apply", code=0)
    failed = run("wake", "h1", "--cluster", c, "--apply", code=1)
    assert not failed["woke"] and "the BMC does not answer" in str(failed["reason"])
    h1 = {h["host"]: h for h in run("status", "--cluster", c, code=0)["hosts"]}["h1"]  # type: ignore[attr-defined]
    assert h1["state"] == "wake-failed" and "the BMC does not answer" in h1["reason"]
    assert run("clear", "h1", "--cluster", c, code=0)["cleared"]
    assert run("clear", "h1", "--cluster", c, code=0)["cleared"] is False  # nothing left to clear: still 0
    h1 = {h["host"]: h for h in run("status", "--cluster", c, code=0)["hosts"]}["h1"]  # type: ignore[attr-defined]
    assert h1["state"] == "sleeping"


def test_an_unknown_host_is_bad_input(tmp_path: Path) -> None:
    c = cluster(tmp_path, None)
    for command in ("sleep", "wake", "clear"):
        r = CliRunner().invoke(cli, ["power", command, "h9", "--cluster", str(c)])
        assert r.exit_code == 2 and "h9" in r.stderr, (command, r.stderr)


def with_dead_host(tmp_path: Path) -> Path:
    """h0 on the test driver; far behind a socket nobody listens on (refused at once: down, no wait)."""
    (tmp_path / "h0.xml").write_text(node_xml(0, 2))
    path = tmp_path / "dead.toml"
    path.write_text(f'name = "t"\n[[hosts]]\nname = "h0"\nuri = "test://{tmp_path}/h0.xml"\n'
                    f'[[hosts]]\nname = "far"\nuri = "qemu+unix:///system?socket={tmp_path}/none.sock"\n')
    return path


def run_dead(tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["power", *args, "--cluster", str(with_dead_host(tmp_path)),
                                    "--coordination", f"file://{tmp_path}/coordination"], env={"COLUMNS": "80"})


def test_power_status_says_a_host_that_does_not_answer_is_down_not_plainly_on(tmp_path: Path) -> None:
    """Issue (QA on the lab, libvirtd stopped with SIGSTOP): `power status` showed the dead host as "on", like the
    others; only --json's "answers" said otherwise."""
    r = run_dead(tmp_path, "status")
    assert r.exit_code == 0, r.output
    far = next(line for line in r.stdout.splitlines() if line.startswith("│ far "))
    assert "on, but down (not asleep)" in far, r.stdout
    doc = json.loads(run_dead(tmp_path, "status", "--json").stdout)
    (h,) = [h for h in doc["hosts"] if h["host"] == "far"]
    assert h["state"] == "on" and h["answers"] is False and "but down (not asleep)" in h["text"]


def test_waking_a_host_that_is_down_not_asleep_says_so_and_points_at_recover(tmp_path: Path) -> None:
    """Issue: `power wake` of a dead host answered "host far is on (... ): nothing to wake"."""
    r = run_dead(tmp_path, "wake", "far")
    assert r.exit_code == 1
    assert "host far was not put to sleep by vcsched: it is down (" in r.stderr, r.stderr
    assert "`vcsched recover far`" in r.stderr and "is on" not in r.stderr
    assert "is on (not put to sleep by vcsched): nothing to wake" in run_dead(tmp_path, "wake", "h0").stderr


def test_a_sleep_says_in_one_plain_sentence_that_the_host_is_asleep(tmp_path: Path) -> None:
    """Issue (QA on the lab): "host h2 is asleep (host h2 is off (fence agent /var/...: off, then status off))"."""
    fake = agent(tmp_path)
    r = CliRunner().invoke(cli, ["power", "sleep", "h1", "--cluster", str(cluster(tmp_path, fake)), "--apply"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert f"h1 is asleep: emptied, then powered off through {fake} (off, then status said off)" in r.stdout
    assert "((" not in r.stdout and "))" not in r.stdout


def asleep_h2(tmp_path: Path) -> Path:
    """Simulated hosts (``sim://``: they cap CPU): h0 and h1 full at yield 1, h2 recorded asleep (its URI answers
    nothing), its record where every command looks by default (the state directory, per test); the cluster file."""
    from acting.power import store_for
    from cli.common import load_cluster
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from hypervisor.testhosts import CORES, HOST_MEMORY_MIB, write_scale_cluster
    from vcsched.control.power import slept
    from vcsched.inventory import HostState

    hosts = write_scale_cluster(tmp_path, 2, 2 * CORES, scheme="sim")  # h0 and h1 full at yield 1
    text = hosts.cluster_file.read_text()
    text += (f'[[hosts]]\nname = "h2"\nuri = "sim://{tmp_path}/asleep.xml"\n'  # asleep: its URI answers nothing
             'uuid = "00000000-0000-0000-0000-000000000002"\npower = {agent = "fence_dummy"}\n')
    hosts.cluster_file.write_text(text)
    cluster = load_cluster(str(hosts.cluster_file))
    with LibvirtHypervisor(cluster) as hv:
        store = store_for(cluster, hv.identities())
    store.change(lambda s: slept(s, HostState("h2", CORES, HOST_MEMORY_MIB << 20), 1.0))
    return hosts.cluster_file


def test_headroom_says_a_wake_time_is_assumed_until_one_was_measured(tmp_path: Path) -> None:
    """Issue (QA on the lab): "with h2 woken (asleep; a wake takes up to 600 s)" where 600 s is only the cluster's
    wake_time, no wake of h2 having been measured."""
    cluster_file = asleep_h2(tmp_path)
    r = CliRunner().invoke(cli, ["headroom", "--vm", "cpu_cores=0.5,memory=512MiB", "--cluster", str(cluster_file)],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "with h2 woken (asleep; a wake assumed to take 600 s, the cluster's wake_time: none measured yet)" in \
        " ".join(r.stdout.split()), r.stdout


def test_a_place_dry_run_that_needs_a_wake_says_its_plan_was_not_saved(tmp_path: Path) -> None:
    """Issue (QA on the lab): `place REQ -o PLAN.json` whose plan needs a sleeping host woken printed the plan and
    "--apply would wake h2 first", exit 0, and silently wrote no file (a saved plan cannot wake a host)."""
    cluster_file = asleep_h2(tmp_path)
    request = tmp_path / "more.toml"
    request.write_text('name = "more"\nvms = 2\nvcpus = 1\nmemory = "512MiB"\ncpu_cores = 0.5\nmin_yield = 1.0\n')
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["place", str(request), "--cluster", str(cluster_file), "-o", str(plan)],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "--apply would wake h2 first" in r.stdout and not plan.exists()
    assert f"note: plan not saved to {plan}: it needs h2 woken first" in " ".join(r.stderr.split()), r.stderr


def test_power_status_says_a_host_recorded_asleep_that_answers_was_powered_on_outside_vcsched(tmp_path: Path) -> None:
    """Issue (QA on the lab): after `vcsched lab up` restarted a sleeping host's daemons, `power status` still said
    "sleeping since T" with nothing else, while every other command read the host as awake.  (The fake agent's
    `off` leaves the test-driver host answering, as a host switched on again by hand.)"""
    c = cluster(tmp_path, agent(tmp_path))
    run("sleep", "h1", "--cluster", c, "--apply", code=0)
    h1 = {h["host"]: h for h in run("status", "--cluster", c, code=0)["hosts"]}["h1"]  # type: ignore[attr-defined]
    assert h1["state"] == "sleeping" and h1["answers"] is True
    assert h1["text"].endswith(", but it answers (powered on outside vcsched? `vcsched power wake h1 --apply` "
                               "records it on)"), h1


def test_power_status_keeps_on_a_host_whose_sleep_was_skipped(tmp_path: Path) -> None:
    """The next decision `power status` shows is the controller's: a skipped sleep's veto keeps the host on."""
    from cli.common import load_cluster
    from cli.recommend import _store
    from vcsched.control import recommend as rc

    c = cluster(tmp_path, agent(tmp_path))
    book = _store(load_cluster(str(c)), None)
    book.update(lambda b: (rc.Book(vetoes=(rc.Veto("r1", (), 4e9, ("h1",)),)), None))
    refusals = run("status", "--cluster", c, code=0)["decision"]["refusals"]  # type: ignore[index]
    assert "its sleep was skipped (r1)" in refusals["h1"], refusals  # type: ignore[index]
