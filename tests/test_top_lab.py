"""`vcsched top` on the real lab, in a real terminal (tmux): it shows the hosts and VMs with their caps and measured
use, follows `vcsched adapt --apply` within two refreshes, and keeps refreshing with a host's libvirtd stopped.

Two managed guests needing 0.6 cores each run on h0 (1 core), capped at 0.5
(tests/test_adapt_lab.py's fixture); `top --interval 1` watches.  `adapt --apply`
moves one to h1 and raises both caps to 0.6: the screen must show it within
two refreshes of adapt's end.  Then h1's libvirtd is stopped (SIGSTOP; SIGCONT
in a finally): h1 must show DOWN within the cluster's host_timeout (2 s here)
plus a refresh, the screen must keep refreshing meanwhile, and h1 must come
back once its daemon runs again.  Uses the session's ``lab2``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from lab import Lab
from lab.daemons import daemon_pid
from lab.state import LabLayout
from tests import test_adapt_lab
from tests.tmux_support import Pane, restored

pytestmark = pytest.mark.lab

INTERVAL = 1.0
#: Two managed guests needing 0.6 cores each on h0, capped at 0.5: test_adapt_lab's fixture, under this name here.
guests_on_h0 = test_adapt_lab.two_on_h0
HOST_TIMEOUT = 2


def quick_cluster_file(lab: Lab, tmp: Path) -> Path:
    """The lab's cluster file with host_timeout = 2 s: a stopped host is down for a reading after 2 s."""
    lines = lab.cluster_file.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("name = "))
    p = tmp / "cluster.toml"
    p.write_text("\n".join([*lines[:at + 1], f"host_timeout = {HOST_TIMEOUT}", *lines[at + 1:]]) + "\n")
    return p


def rows(screen: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    """The screen's rows that start with one of ``names``, split into cells."""
    return {line.split()[0]: line.split() for line in screen.splitlines() if line.split()[:1]
            and line.split()[0] in names}


def read_at(screen: str) -> str | None:
    """When the shown view was read: the title's HH:MM:SS."""
    m = re.search(r"(\d\d:\d\d:\d\d) \(every", screen)
    return m.group(1) if m else None


def vm_cells(screen: str, vms: tuple[str, ...]) -> dict[str, tuple[str, float, float | None]]:
    """VM -> (host, cap, used) from the VM table (columns VM VC HOST CAP USED ...)."""
    out = {}
    for name, cells in rows(screen, vms).items():
        out[name] = (cells[2], float(cells[3]), None if cells[4] == "-" else float(cells[4]))
    return out


def test_top_shows_the_lab_follows_adapt_and_keeps_refreshing_with_a_host_stopped(
        lab2: Lab, guests_on_h0: tuple[str, str], tmp_path: Path) -> None:
    two_on_h0 = guests_on_h0
    p = quick_cluster_file(lab2, tmp_path)
    pane = Pane([sys.executable, "-m", "cli.main", "top", "--cluster", str(p), "--interval", f"{INTERVAL:g}"],
                width=150, height=40, env={"VCSCHED_STATE_DIR": os.environ["VCSCHED_STATE_DIR"]})
    try:
        # The lab's hosts and the two guests on h0, capped at 0.5, measured (a use shown for each).
        screen = pane.wait_for(lambda s: all(c[2] is not None for c in vm_cells(s, two_on_h0).values())
                               and len(vm_cells(s, two_on_h0)) == 2, 60)
        print(screen)
        hosts = rows(screen, ("h0", "h1"))
        assert set(hosts) == {"h0", "h1"} and hosts["h0"][2] == "1.00" and hosts["h1"][2] == "0.00"
        for host, cap, used in vm_cells(screen, two_on_h0).values():
            assert host == "h0" and cap == 0.5
            assert used is not None and used <= cap + 0.05  # never above its cap (+ the emulator thread)

        # adapt --apply moves one guest to h1 and raises both caps to 0.6: on the screen within two refreshes.
        # (with the lab's own host_timeout: 2 s is for top; a migration's checks over TLS on a loaded machine
        # can take longer, and a keepalive that short closed the connection mid-move)
        done = CliRunner().invoke(cli, ["adapt", "--cluster", str(lab2.cluster_file), "--budget", "128MiB",
                                        "--apply", "--json"])
        applied = time.monotonic()
        assert done.exit_code == 0, done.output
        moved = next(s["vm"] for s in json.loads(done.stdout)["plan"]["steps"] if s["op"] == "migrate")

        def adapted(s: str) -> bool:
            cells = vm_cells(s, two_on_h0)
            return len(cells) == 2 and cells[moved][0] == "h1" and all(c[1] == 0.6 for c in cells.values())

        screen = pane.wait_for(adapted, 30, poll=0.05)
        took = time.monotonic() - applied
        print(f"adapt's change on the screen {took:.2f} s after adapt returned\n{screen}")
        assert took <= 2 * INTERVAL + 0.5, f"{took:.2f} s: more than two refreshes of {INTERVAL:g} s"
        hosts = rows(screen, ("h0", "h1"))
        assert hosts["h0"][2] == "0.60" and hosts["h1"][2] == "0.60"

        # h1's libvirtd stopped: h1 shows DOWN, and the screen keeps refreshing.
        pid = daemon_pid(LabLayout(lab2.dir), 1, "libvirtd")
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            screen = pane.wait_for(lambda s: "DOWN" in " ".join(rows(s, ("h1",)).get("h1", [])), 30, poll=0.05)
            down_after = time.monotonic() - stopped
            print(f"h1 shown DOWN {down_after:.2f} s after its libvirtd was stopped\n{screen}")
            assert down_after <= HOST_TIMEOUT + 2 * INTERVAL + 1
            assert f"did not answer within {HOST_TIMEOUT} s" in screen
            assert rows(screen, ("h0",))["h0"][2] == "0.60"  # the host that answers is shown as usual
            stamps = {read_at(screen)}
            pane.wait_for(lambda s: (stamps.add(read_at(s)) or len(stamps) >= 3) and "DOWN" in s,
                          4 * (HOST_TIMEOUT + INTERVAL))  # two more readings while h1 is still down
            pane.keys("y")
            pane.wait_for(lambda s: "sorted by yield" in s, 5)  # keys answered while h1 hangs
        finally:
            os.kill(pid, signal.SIGCONT)
        pane.wait_for(lambda s: "DOWN" not in s and moved in rows(s, two_on_h0), 30)
        pane.keys("q")
        code, stty = pane.exit_code()
        assert code == 0 and restored(stty), stty
    finally:
        pane.close()
