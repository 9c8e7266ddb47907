"""The lab host's own init (lab/reaper.py): what its start script leaves running is the reaper's
child, reaped by it, and the reaper leaves once nothing is left.  No libvirt needed: a shell stands in for the
daemons."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from lab.daemons import REAPED
from lab.state import pid_gone


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not pid_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid_gone(pid)


def test_the_script_status_is_returned_and_what_it_left_running_is_the_reapers_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    # A daemon the way libvirtd -d starts: the script's child outlives the script (its parent exits).
    proc = subprocess.run([*REAPED, "sh", "-c", f"sleep 60 & echo $! > {pid_file}; exit 3"], timeout=60,
                          check=False)
    assert proc.returncode == 3
    daemon = int(pid_file.read_text())
    reaper = parent_of(daemon)
    try:
        assert b"reaper.py" in Path(f"/proc/{reaper}/cmdline").read_bytes()  # not the machine's init
        assert reaper != 1
    finally:
        subprocess.run(["kill", str(daemon)], check=False)
    assert wait_gone(daemon)
    assert wait_gone(reaper), "the reaper stays once nothing is left to reap"


def test_a_command_that_cannot_run_is_a_failure_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run([*REAPED, str(tmp_path / "missing")], timeout=60, check=False, capture_output=True,
                          text=True)
    assert proc.returncode == 127
    assert f"reaper: cannot run {tmp_path / 'missing'}: No such file or directory" in proc.stderr
