"""One active controller (issue 19) on a real etcd: two `vcsched run` daemons, never two leaders, and a takeover
within the lease TTL plus one interval when the leader is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.etcd_support import Etcd
from tests.test_run_cli import cluster_file

ROOT = Path(__file__).resolve().parents[1]
TTL = 3.0
INTERVAL = 2.0
SLACK = 2.0  # process start-up and scheduling on a busy 2-core machine


def daemon(etcd: Etcd, cluster: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", "--cluster", str(cluster), "--budget-per-interval", "0",
         "--dry-run", "--interval", f"{INTERVAL:g}", "--log", str(log), "--coordination", etcd.url,
         "--lock-ttl", f"{TTL:g}", "--metrics-port", "0"],
        cwd=ROOT, env={**os.environ, "VCSCHED_STATE_DIR": str(log.parent / "state")},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def leadership(evs: list[dict[str, Any]], end: float) -> list[tuple[float, float]]:
    """The (from, to) spans in which this daemon said it was the leader; an open span ends at ``end``."""
    spans, since = [], None
    for e in evs:
        if e["event"] == "leader" and since is None:
            since = e["time"]
        elif e["event"] in ("standby", "stop") and since is not None:
            spans.append((since, e["time"]))
            since = None
    if since is not None:
        spans.append((since, end))
    return spans


def scrape_leader(evs: list[dict[str, Any]]) -> float:
    port = evs[0]["metrics"]["port"]
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    line = next(x for x in body.splitlines() if x.startswith("vcsched_leader{"))
    return float(line.rsplit(" ", 1)[1])


def test_two_daemons_one_leader_and_a_takeover_within_ttl_plus_an_interval(etcd: Etcd, tmp_path: Path) -> None:
    cluster = cluster_file(tmp_path)
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    procs = [daemon(etcd, cluster, logs[0])]
    try:
        wait_for(lambda: any(e["event"] == "leader" for e in events(logs[0])), 60, "the first daemon to lead")
        procs.append(daemon(etcd, cluster, logs[1]))
        wait_for(lambda: any(e["event"] == "standby" for e in events(logs[1])), 60, "the second to stand by")
        time.sleep(3 * INTERVAL)  # both running side by side for a while
        assert [scrape_leader(events(log)) for log in logs] == [1.0, 0.0]
        assert not any(e["event"] == "leader" for e in events(logs[1]))

        procs[0].send_signal(signal.SIGKILL)
        killed = time.time()
        procs[0].wait()
        wait_for(lambda: any(e["event"] == "leader" for e in events(logs[1])), TTL + INTERVAL + 30,
                 "the standby to take over")
        took = next(e["time"] for e in events(logs[1]) if e["event"] == "leader") - killed
        print(f"takeover {took:.2f} s after SIGKILL (TTL {TTL:g} s, interval {INTERVAL:g} s)")
        assert took <= TTL + INTERVAL + SLACK, took
        wait_for(lambda: scrape_leader(events(logs[1])) == 1.0, 30, "the new leader's vcsched_leader metric")

        # The killed daemon's leadership ended when it died; the spans never overlap.
        a = leadership(events(logs[0]), killed)
        b = leadership(events(logs[1]), time.time())
        assert a and b
        for s1, e1 in a:
            for s2, e2 in b:
                assert e1 <= s2 or e2 <= s1, (a, b)

        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(timeout=30) == 0
        assert events(logs[1])[-1]["event"] == "stop"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_leader_cut_off_from_etcd_stands_down_before_its_lease_could_expire(etcd: Etcd, tmp_path: Path) -> None:
    cluster = cluster_file(tmp_path)
    log = tmp_path / "a.jsonl"
    p = daemon(etcd, cluster, log)
    try:
        wait_for(lambda: any(e["event"] == "leader" for e in events(log)), 60, "the daemon to lead")
        time.sleep(INTERVAL)
        etcd.stop()  # SIGSTOP: etcd hangs, renewals time out
        hung = time.time()
        try:
            wait_for(lambda: any(e["event"] == "standby" for e in events(log)), 30, "the leader to stand down")
        finally:
            etcd.cont()
        down = next(e for e in events(log) if e["event"] == "standby")
        print(f"stood down {down['time'] - hung:.2f} s after etcd hung (TTL {TTL:g} s): {down['reason']}")
        assert down["time"] - hung < TTL, down
        # With etcd back, it leads again (a fresh lease).
        wait_for(lambda: sum(e["event"] == "leader" for e in events(log)) == 2, 60, "leadership back")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
