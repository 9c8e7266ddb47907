"""The cluster lock on a real etcd: one holder at a time across processes, freed within the TTL when its holder
is killed, and a holder that cannot renew its lease starts no further step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from acting.executor import DONE, NOT_RUN, apply_plan
from acting.lock import ClusterLock, CoordinationDown, LockBusy, LockLost, holding
from tests.builders import cluster_of, inventory_of, memory_hypervisor, request
from tests.etcd_support import Etcd
from vcsched.control.admission import admit

ROOT = Path(__file__).resolve().parents[1]
TTL = 3.0

HOLD = r"""
import sys, time
from acting.lock import ClusterLock
lock = ClusterLock(sys.argv[1], "lab", member="holder@test:1", ttl=float(sys.argv[2]))
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def hold(url: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, url, str(TTL)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line == "held", p.stderr.read() if p.stderr else line
    return p


def test_a_second_holder_is_refused_naming_the_first(etcd: Etcd) -> None:
    p = hold(etcd.url)
    try:
        with pytest.raises(LockBusy, match="locked by holder@test:1 since"):
            ClusterLock(etcd.url, "lab", ttl=TTL).acquire()
    finally:
        p.kill()
        p.wait()


def test_the_lock_of_a_killed_holder_is_free_within_its_ttl(etcd: Etcd) -> None:
    p = hold(etcd.url)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    start = time.monotonic()
    with holding(etcd.url, "lab", wait=30, ttl=TTL):
        waited = time.monotonic() - start
    assert waited <= TTL + 2.0, waited


def test_only_one_of_many_contenders_holds_the_lock_at_a_time(etcd: Etcd, tmp_path: Path) -> None:
    log = tmp_path / "log"
    script = r"""
import sys, time
from acting.lock import holding
for _ in range(4):
    with holding(sys.argv[1], "lab", wait=60, ttl=3):
        with open(sys.argv[2], "a") as f:
            f.write(f"in {time.monotonic()}\n")
        time.sleep(0.05)
        with open(sys.argv[2], "a") as f:
            f.write(f"out {time.monotonic()}\n")
"""
    procs = [subprocess.Popen([sys.executable, "-c", script, etcd.url, str(log)], cwd=ROOT) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert len(events) == 24 and events == ["in", "out"] * 12


def test_a_holder_that_cannot_renew_starts_no_further_step(etcd: Etcd) -> None:
    hv = memory_hypervisor(inventory_of())
    d = admit(cluster_of(), hv.inventory(), request("web", vms=2, need=0.5))
    assert d.plan is not None
    lock = ClusterLock(etcd.url, "lab", ttl=TTL)
    lock.acquire()
    first = d.plan.steps[0]

    def etcd_hangs() -> None:  # right after the guard let the first step start
        etcd.stop()
        time.sleep(TTL)  # the lease may have run out by now: the holder must not act on it

    hv.before[(first.op, first.vm)] = etcd_hangs
    try:
        report = apply_plan(hv, d.plan, guard=lock.guard)
    finally:
        etcd.cont()
        lock.release()
    assert [r.outcome for r in report.results] == [DONE, NOT_RUN]
    assert report.stopped is not None and "cannot renew the lock's lease" in report.stopped
    assert "web-1" not in hv.vms


def test_a_guard_with_a_healthy_etcd_lets_every_step_run(etcd: Etcd) -> None:
    hv = memory_hypervisor(inventory_of())
    d = admit(cluster_of(), hv.inventory(), request("web", vms=2, need=0.5))
    assert d.plan is not None
    with holding(etcd.url, "lab", ttl=TTL) as lock:
        assert apply_plan(hv, d.plan, guard=lock.guard).ok


def test_an_unreachable_etcd_changes_nothing() -> None:
    with pytest.raises(CoordinationDown, match=r"coordination service etcd3\+http://127\.0\.0\.1:9.* unreachable: "
                                               r".*nothing changed"):
        ClusterLock("etcd3+http://127.0.0.1:9", "lab", ttl=1).acquire()


def test_lock_lost_is_what_a_guard_raises() -> None:
    lock = ClusterLock("file:///tmp/none", "lab")
    with pytest.raises(LockLost, match="not held"):
        lock.guard()
