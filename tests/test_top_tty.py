"""`vcsched top` in a real terminal (tmux), on libvirt test-driver hosts: keys sort and quit, the terminal is
restored however it ends, and a narrow terminal drops columns instead of cutting values."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypervisor.testhosts import write_scale_cluster
from tests.tmux_support import Pane, restored


@pytest.fixture
def hosts(tmp_path: Path) -> Path:
    """Two test-driver hosts of three managed VMs each."""
    return write_scale_cluster(tmp_path / "hosts", 2, 3).cluster_file


@pytest.fixture
def top(hosts: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pane]:
    width = getattr(request, "param", 120)
    pane = Pane([sys.executable, "-m", "cli.main", "top", "--cluster", str(hosts), "--interval", "0.5"],
                width=width, height=30, env={"VCSCHED_STATE_DIR": str(tmp_path / "state")})
    try:
        pane.wait_for(lambda s: "vm5" in s, 60)
        yield pane
    finally:
        pane.close()


def vm_names(screen: str) -> list[str]:
    return [line.split()[0] for line in screen.splitlines() if line.startswith("vm")]


def test_keys_sort_the_vms_and_q_quits_with_the_terminal_restored(top: Pane) -> None:
    screen = top.screen()
    assert "sorted by host" in screen and vm_names(screen) == [f"vm{i}" for i in range(6)]
    assert "y yield" in screen and "u use" in screen and "h host" in screen and "q quit" in screen
    top.keys("h", "r")
    screen = top.wait_for(lambda s: "sorted by host, reversed" in s, 10)
    assert vm_names(screen)[:3] == ["vm3", "vm4", "vm5"]  # h1's VMs first
    top.keys("y")
    top.wait_for(lambda s: "sorted by yield" in s and "reversed" not in s, 10)
    top.keys("q")
    code, stty = top.exit_code()
    assert code == 0 and restored(stty), stty


def test_sigterm_ends_it_with_143_and_the_terminal_restored(top: Pane) -> None:
    os.kill(top.command_pid(), signal.SIGTERM)
    code, stty = top.exit_code()
    assert code == 143 and restored(stty), stty


@pytest.mark.parametrize("top", [64], indirect=True)
def test_a_narrow_terminal_drops_columns_and_cuts_no_value(top: Pane) -> None:
    screen = top.screen()
    lines = screen.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 64
    header = next((line for line in lines if line.startswith("VM ")), screen)
    assert header.split()[:2] == ["VM", "VC"] and "BASIS" not in header, screen  # the least important left out
    for line in lines:
        if line.startswith("vm"):
            _name, vc, host, cap = line.split()[:4]
            assert vc.startswith("vc") and host in ("h0", "h1") and cap == "0.50"
    top.keys("q")
    assert top.exit_code()[0] == 0
