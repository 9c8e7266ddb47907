"""Power saving on a real 3-host lab: the lab's fence agent as a power interface, then the whole cycle.

Power saving wakes a sleeping host through its agent's ``on`` and uses it again only once libvirt answers
with the same host UUID; the lab's agent must do that on real lab hosts (lab/fence_agent.py).  Then
`vcsched power sleep h2 --apply` (evacuated, daemons gone, read as sleeping, no VM below its floor), a
`place --apply` whose wake fails (the agent's ``on`` made to fail: wake-failed, not chosen again until
`vcsched power clear`), and one that wakes h2 as itself and admits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest
from click.testing import CliRunner

from acting.fence import power_status, run_agent
from cli.common import load_cluster
from cli.main import cli
from hypervisor.identity import uuid_from_capabilities
from lab import Lab
from lab.daemons import daemon_pid, namespace_holders
from lab.fence_agent import power_on_fault
from lab.state import LabLayout
from tests.lab_support import own_lab, state_dir_of_its_own

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with state_dir_of_its_own(tmp_path_factory.mktemp("power-state")), own_lab(3) as lab:  # the power record too
        yield lab


def run(*args: object) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def ok(*args: object, code: int = 0) -> dict[str, object]:
    """``vcsched ARGS --json``'s document, once it exited ``code``."""
    r = run(*args, "--json")
    assert r.exit_code == code, (args, r.stdout, r.stderr)  # type: ignore[attr-defined]
    return json.loads(r.stdout)  # type: ignore[attr-defined,no-any-return]


def host_uuid(uri: str) -> str | None:
    conn = libvirt.open(uri)
    try:
        return uuid_from_capabilities(conn.getCapabilities())
    finally:
        conn.close()


def test_off_then_on_brings_the_same_host_back(lab: Lab) -> None:
    layout = LabLayout(lab.dir)
    cluster = load_cluster(str(lab.cluster_file))
    h1 = cluster.host("h1")
    assert h1.power.agent is not None and h1.power.agent == h1.fence  # the power agent defaults to the fence agent
    before = host_uuid(cluster.connect_uri("h1"))
    assert before is not None and before == h1.uuid
    other = daemon_pid(layout, 0, "libvirtd")
    agent = h1.power.agent

    assert run_agent(agent, "off").returncode == 0
    assert power_status(agent)[0] == "off" and not namespace_holders(layout, 1)

    on = run_agent(agent, "on")
    assert on.returncode == 0, on.stderr
    assert "Powered ON" in on.stdout
    assert power_status(agent)[0] == "on"
    assert host_uuid(cluster.connect_uri("h1")) == before
    assert daemon_pid(layout, 0, "libvirtd") == other, "the other host is untouched"

    again = run_agent(agent, "on")  # already on: nothing to do, as the fence-agents answer
    assert again.returncode == 0 and "Already ON" in again.stdout
    assert run_agent(agent, "reboot").returncode == 1


def test_a_host_sleeps_emptied_and_wakes_as_itself_when_a_request_needs_it_and_a_failed_wake_sticks(
        lab: Lab, tmp_path: Path) -> None:
    layout, cf = LabLayout(lab.dir), lab.cluster_file
    cluster = load_cluster(str(cf))
    light = tmp_path / "light.toml"  # one VM per host, each with a floor
    light.write_text('name = "light"\nvms = 3\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.2\n'
                     'min_yield = 0.9\nspread = "preferred"\n')
    placed = ok("place", light, "--cluster", cf, "--apply")
    on_h2 = [s["vm"] for s in placed["plan"]["steps"] if s["host"] == "h2"]  # type: ignore[index]
    assert on_h2, placed

    t0 = time.monotonic()
    slept = ok("power", "sleep", "h2", "--cluster", cf, "--apply")
    print(f"power sleep h2 --apply (evacuating {len(on_h2)} VM): {time.monotonic() - t0:.1f} s")
    assert slept["slept"] and slept["off"]["fenced"], slept  # type: ignore[index]
    assert not namespace_holders(layout, 2), "its daemons are gone"
    status = ok("status", "--cluster", cf, "--sample", 0)
    h2 = next(h for h in status["hosts"] if h["name"] == "h2")  # type: ignore[attr-defined]
    assert h2["asleep"] and status["ok"], h2
    vms = {v["name"]: v for v in status["vms"]}  # type: ignore[attr-defined]
    assert all(vms[v]["host"] != "h2" and vms[v]["active"] for v in on_h2)
    assert not any(v["below_floor"] for v in vms.values()), vms  # no VM below its floor
    power = ok("power", "status", "--cluster", cf)
    assert {h["host"]: h["state"] for h in power["hosts"]} == {"h0": "on", "h1": "on", "h2": "sleeping"}  # type: ignore[attr-defined]
    text = run("power", "status", "--cluster", cf)
    assert text.exit_code == 0 and "sleeping since" in text.stdout, text.stdout  # type: ignore[attr-defined]
    shown = run("status", "--cluster", cf, "--sample", 0)
    assert "h2 (sleeping)" in shown.stdout and "1 host asleep (h2)" in shown.stdout, shown.stdout  # type: ignore[attr-defined]

    never = ok("recover", "h2", "--cluster", cf, "--apply", code=1)  # asleep is not failed: never fenced
    assert "is asleep" in str(never["refused"]) and not namespace_holders(layout, 2), never
    room = ok("headroom", "--vm", "cpu_cores=0.5,memory=128MiB", "--cluster", cf)
    assert room["with_wakes"]["hosts"] == ["h2"] and room["with_wakes"]["count"] > room["count"], room  # type: ignore[index]

    wide = tmp_path / "wide.toml"  # one VM on every host: needs h2
    wide.write_text('name = "wide"\nvms = 3\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.1\nspread = true\n')
    dry = ok("place", wide, "--cluster", cf)
    assert dry["admitted"] and dry["wake"]["host"] == "h2", dry  # type: ignore[index]

    fault = power_on_fault(layout.host_dir(2))
    fault.write_text("the BMC does not answer")
    try:
        refused = ok("place", wide, "--cluster", cf, "--apply", code=1)
    finally:
        fault.unlink()
    assert not refused["admitted"] and refused["wake"]["woke"] is False, refused  # type: ignore[index]
    assert "the BMC does not answer" in str(refused["reason"])
    assert {h["host"]: h["state"] for h in ok("power", "status", "--cluster", cf)["hosts"]}["h2"] == "wake-failed"  # type: ignore[attr-defined,index]
    again = ok("place", wide, "--cluster", cf, code=1)  # not chosen again: no wake offered
    assert not again["admitted"] and again["wake"] is None, again

    ok("power", "clear", "h2", "--cluster", cf)
    t0 = time.monotonic()
    woke = ok("place", wide, "--cluster", cf, "--apply")
    print(f"place --apply waking h2: {time.monotonic() - t0:.1f} s (the wake: {woke['wake']['seconds']} s)")  # type: ignore[index]
    assert woke["admitted"] and woke["wake"]["woke"] and woke["applied"]["ok"], woke  # type: ignore[index]
    assert host_uuid(cluster.connect_uri("h2")) == cluster.host("h2").uuid  # the same host answers
    power = ok("power", "status", "--cluster", cf)
    h2p = next(h for h in power["hosts"] if h["host"] == "h2")  # type: ignore[attr-defined]
    assert h2p["state"] == "on" and h2p["wake_s"] is not None and h2p["wake_s"] > 0, h2p


#: The controller's lab run: its interval, and the longest the test waits for each of its steps.  The cluster file's
#: power fields: sleep_margin 3.0, a host sleeps only while the others could take four times the measured demand
#: (idle guests); wake_margin 2.5, one wakes once the hosts on lack room for 3.5 times it, which guests spinning
#: flat out pass even when a loaded machine gives each of them a fifth of a core.
RUN_INTERVAL_S, RUN_STEP_S = 2.0, 90.0
RUN_POWER = ('power_saving = "auto"\nmin_hosts_on = 2\nsleep_after = "2s"\nwake_time = "5s"\n'
             "sleep_margin = 3.0\nwake_margin = 2.5\nfailures_tolerated = 1\n")


def controller_cluster(lab: Lab, tmp_path: Path) -> Path:
    """The lab's cluster file with power saving on, and guests that stay idle (the lab's spin flat out)."""
    text = lab.cluster_file.read_text()
    head, sep, rest = text.partition("\n[guest]\n")
    cmdline = next(line for line in rest.splitlines() if line.startswith("cmdline = "))
    rest = rest.replace(cmdline, f'{cmdline[:-1]} vcsched.load=idle:3600"', 1)
    path = tmp_path / "power-auto.toml"
    path.write_text(head + "\n" + RUN_POWER + sep + rest)
    return path


def test_vcsched_run_puts_an_idle_host_to_sleep_and_wakes_it_when_demand_rises(lab: Lab, tmp_path: Path) -> None:
    """`vcsched run` with power_saving = "auto" on three idle VMs, one per host: it evacuates one host and powers
    it off (its daemons gone, no VM below its floor); then three VMs that spin flat out arrive on the two hosts on
    (placed there: they fit by their declared needs) and, their measured demand lacking the room, it wakes the
    host, as itself."""
    import os
    import subprocess
    import sys

    layout = LabLayout(lab.dir)
    cf = controller_cluster(lab, tmp_path)
    before = ok("status", "--cluster", cf, "--sample", 0)
    gone = sorted({v["cluster"] for v in before["vms"] if v["managed"]})  # type: ignore[attr-defined]
    if gone:  # the module's earlier tests' virtual clusters spin flat out: they leave
        ok("adapt", "--cluster", cf, "--budget", "0", *[a for vc in gone for a in ("--depart", vc)], "--apply")
    calm = tmp_path / "calm.toml"
    calm.write_text('name = "calm"\nvms = 3\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.2\nmin_yield = 0.9\n'
                    'spread = "preferred"\n')
    ok("place", calm, "--cluster", cf, "--apply")
    log = tmp_path / "run.jsonl"
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "--cluster", str(cf), "--interval",
                             f"{RUN_INTERVAL_S:g}s", "--budget-per-interval", "1GiB", "--log", str(log)],
                            cwd=Path(__file__).resolve().parents[1], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def events(kind: str) -> list[dict[str, object]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [e for e in map(json.loads, lines) if e["event"] == kind]

    def until(kind: str) -> dict[str, object]:
        deadline = time.monotonic() + RUN_STEP_S
        while time.monotonic() < deadline:
            if events(kind):
                return events(kind)[0]
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        raise AssertionError(f"no {kind} within {RUN_STEP_S:g} s: " + json.dumps(events("power_decision")[-3:]))

    try:
        slept = until("power_slept")
        host = str(slept["host"])
        print(f"vcsched run: {host} asleep {time.monotonic() - start:.1f} s after it started")
        assert not namespace_holders(layout, int(host[1:])), "its daemons are gone"
        status = ok("status", "--cluster", cf, "--sample", 0, "--events", log)  # on the controller's estimates
        vms = [v for v in status["vms"] if v["cluster"] == "calm"]  # type: ignore[attr-defined]
        assert len(vms) == 3 and all(v["active"] and v["host"] != host for v in vms), vms
        assert not any(v["below_floor"] for v in vms), vms
        # N+1 kept with the host asleep (failures_tolerated = 1): either host on may fail, its VMs fit on the other
        assert status["failures_tolerated"] == 1 and status["headroom"], status  # type: ignore[index]
        assert all(f["fits"] for f in status["headroom"]), status["headroom"]  # type: ignore[index]

        burst = tmp_path / "burst.toml"  # the lab's own guests: they spin flat out
        burst.write_text('name = "burst"\nvms = 3\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.1\n'
                         'spread = "preferred"\n')
        placed = ok("place", burst, "--cluster", lab.cluster_file, "--apply")
        assert placed["wake"] is None, "they fit on the hosts on: no wake by place"
        arrived = time.monotonic()
        woke = until("power_woke")
        print(f"vcsched run: {woke['host']} woke {time.monotonic() - arrived:.1f} s after the demand arrived "
              f"(the wake: {woke['seconds']} s)")
        assert woke["host"] == host and not events("power_wake_failed")
        power = ok("power", "status", "--cluster", cf)
        assert {h["host"]: h["state"] for h in power["hosts"]}[host] == "on", power  # type: ignore[attr-defined]
        assert not events("host_failed"), "a host put to sleep is never a failed host"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
