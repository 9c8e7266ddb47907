"""A dead host paid once, on the real-libvirt lab (hypervisor/down_hosts.py, docs/hosts-down.md).

h1's libvirtd is SIGSTOPped (a hung daemon: its socket accepts, nothing answers).  The first ``vcsched status``
waits the full ``host_timeout`` for it; the next ones give it one short probe and name it as known down, while
h0 is shown as usual.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import Lab
from lab.daemons import daemon_pid
from lab.state import LabLayout
from tests.lab_support import own_lab

pytestmark = pytest.mark.lab

HOST_TIMEOUT = 8


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with own_lab(2) as lab:
        yield lab


def status(cluster_file: Path, state: Path) -> tuple[float, dict[str, str | None]]:
    """Seconds a whole `vcsched status --json` took, and each host's down reason."""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cli.main", "status", "--cluster", str(cluster_file), "--json"],
                          env={**os.environ, "VCSCHED_STATE_DIR": str(state)}, capture_output=True, text=True,
                          timeout=120, check=False)
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    return took, {h["name"]: h["down"] for h in json.loads(done.stdout)["hosts"]}


def test_status_waits_for_a_stopped_libvirtd_once_then_probes_it(lab: Lab, tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.toml"
    cluster_file.write_text(f"host_timeout = {HOST_TIMEOUT}\n" + lab.cluster_file.read_text())
    libvirtd = daemon_pid(LabLayout(lab.dir), 1, "libvirtd")
    assert libvirtd is not None
    os.kill(libvirtd, signal.SIGSTOP)
    try:
        runs = [status(cluster_file, tmp_path / "state") for _ in range(3)]
    finally:
        os.kill(libvirtd, signal.SIGCONT)
    (first, down), *later = runs
    assert down["h0"] is None and down["h1"] is not None
    assert first >= HOST_TIMEOUT and f"did not answer within {HOST_TIMEOUT} s" in down["h1"], (first, down)
    for took, down in later:
        assert down["h0"] is None and str(down["h1"]).startswith("host h1: known down since "), down
        assert took < HOST_TIMEOUT - 1, (took, [r[0] for r in runs])  # one probe of 1 s, not host_timeout
    print(f"status with h1's libvirtd stopped: {[round(r[0], 2) for r in runs]} s")
    took, down = status(cluster_file, tmp_path / "state")  # answering again: read in full, the record dropped
    assert down == {"h0": None, "h1": None} and not json.loads((tmp_path / "state" / "hosts-down.json").read_text())
