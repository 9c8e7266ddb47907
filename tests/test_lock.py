"""The cluster lock (tooz): one holder at a time, the holder named to whoever is refused, released on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from acting.lock import ClusterLock, LockBusy, check_url, holding, resolve_url
from vcsched.errors import InputError

HOLD = r"""
import sys, time
from acting.lock import ClusterLock
lock = ClusterLock(sys.argv[1], "lab", member="holder@test:1")
lock.acquire(float(sys.argv[2]))
print("held", flush=True)
time.sleep(float(sys.argv[3]))
lock.release()
"""


def holder(url: str, wait: float = 0.0, seconds: float = 30.0) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen([sys.executable, "-c", HOLD, url, str(wait), str(seconds)], cwd=root,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "held", p.stderr.read() if p.stderr else ""
    return p


def test_a_second_command_is_refused_naming_who_holds_the_lock(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    p = holder(url)
    try:
        with pytest.raises(LockBusy, match=r"cluster 'lab' is locked by holder@test:1 since .*--wait SECONDS"):
            ClusterLock(url, "lab").acquire()
    finally:
        p.kill()
        p.wait()


def test_the_lock_is_free_again_as_soon_as_its_holder_is_killed(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    p = holder(url)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    start = time.monotonic()
    with holding(url, "lab") as lock:
        assert lock.holder() is not None and lock.holder().member == lock.member  # type: ignore[union-attr]
    assert time.monotonic() - start < 5


def test_waiting_gets_the_lock_once_it_is_released(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    p = holder(url, seconds=1.0)
    start = time.monotonic()
    with holding(url, "lab", wait=20):
        assert time.monotonic() - start < 15
    p.wait()


def test_two_clusters_have_two_locks(tmp_path: Path) -> None:
    """While another process holds cluster 'lab', cluster 'other' can be locked and 'lab' cannot (fcntl locks are
    per process, so the holder must be another process for the refusal to mean anything)."""
    url = f"file://{tmp_path}"
    p = holder(url)
    try:
        with holding(url, "other") as lock:
            assert lock.holder() is not None and lock.holder().member == lock.member  # type: ignore[union-attr]
        with pytest.raises(LockBusy, match="cluster 'lab' is locked by holder@test:1"):
            ClusterLock(url, "lab").acquire()
    finally:
        p.kill()
        p.wait()


def test_only_one_of_many_contenders_holds_the_lock_at_a_time(tmp_path: Path) -> None:
    """Several processes loop on the lock and append to a log while holding it: their intervals never overlap."""
    log = tmp_path / "log"
    script = r"""
import sys, time
from acting.lock import holding
for _ in range(5):
    with holding(sys.argv[1], "lab", wait=30):
        with open(sys.argv[2], "a") as f:
            f.write(f"in {time.monotonic()}\n")
        time.sleep(0.02)
        with open(sys.argv[2], "a") as f:
            f.write(f"out {time.monotonic()}\n")
"""
    root = Path(__file__).resolve().parents[1]
    procs = [subprocess.Popen([sys.executable, "-c", script, f"file://{tmp_path}/c", str(log)], cwd=root)
             for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert len(events) == 30 and events == ["in", "out"] * 15


@pytest.mark.parametrize("url", ["http://x", "etcd://h:2379", "file://"])
def test_an_unknown_coordination_scheme_is_bad_input(url: str) -> None:
    with pytest.raises(InputError, match="--coordination"):
        check_url("--coordination", url)


def test_the_url_comes_from_the_flag_then_the_environment_then_the_cluster_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VCSCHED_COORDINATION", raising=False)
    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path))
    assert resolve_url(None, None) == f"file://{tmp_path}/coordination"
    assert resolve_url(None, "etcd3+http://127.0.0.1:2379") == "etcd3+http://127.0.0.1:2379"
    monkeypatch.setenv("VCSCHED_COORDINATION", "file:///srv/locks")
    assert resolve_url(None, "etcd3+http://127.0.0.1:2379") == "file:///srv/locks"
    assert resolve_url("file:///x", None) == "file:///x"
