"""`vcsched run` and `vcsched observe` on the command line: bad input starts nothing; SIGTERM stops a daemon."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli

ROOT = Path(__file__).resolve().parents[1]


def cluster_file(tmp_path: Path) -> Path:
    """A one-host cluster on libvirt's built-in test driver (no daemon; its domain 'test' is unmanaged)."""
    path = tmp_path / "cluster.toml"
    path.write_text('name = "t"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    return path


def invoke(*args: Any, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def one_line(result: Any) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error: "), result.stderr
    assert result.stdout == "", "nothing may start: no event is written"
    return str(lines[0])


@pytest.mark.parametrize(("args", "names"), [
    (["--interval", "0"], "--interval"),
    (["--interval", "-5s"], "--interval"),
    (["--interval", "nan"], "--interval"),
    (["--interval", "soon"], "--interval"),
    (["--budget-per-interval", "-1"], "--budget-per-interval"),
    (["--budget-per-interval", "lots"], "--budget-per-interval"),
    (["--threshold", "1.5"], "--threshold"),
    (["--threshold", "-0.1"], "--threshold"),
    (["--threshold", "nan"], "--threshold"),
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--metrics-port", "-1"], "--metrics-port"),
    (["--settle", "0"], "--settle"),
    (["--coordination", "gopher://x"], "--coordination"),
    (["--duration", "0"], "--duration"),
    (["--duration", "forever"], "--duration"),
])
def test_bad_options_are_one_line_and_start_nothing(tmp_path: Path, args: list[str], names: str) -> None:
    base = ["run", "--cluster", cluster_file(tmp_path), "--budget-per-interval", "0"]
    line = one_line(invoke(*base, *args, env={"VCSCHED_STATE_DIR": str(tmp_path / "state")}))
    assert names in line


def test_a_metrics_port_in_use_is_bad_input_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = one_line(invoke("run", "--cluster", cluster_file(tmp_path), "--budget-per-interval", "0",
                               "--metrics-port", port, env={"VCSCHED_STATE_DIR": str(tmp_path / "state")}))
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in line


def test_a_metrics_address_not_on_this_machine_is_bad_input(tmp_path: Path) -> None:
    line = one_line(invoke("run", "--cluster", cluster_file(tmp_path), "--budget-per-interval", "0",
                           "--metrics-port", "0", "--metrics-addr", "192.0.2.1",
                           env={"VCSCHED_STATE_DIR": str(tmp_path / "state")}))
    assert "cannot listen on 192.0.2.1" in line


def test_an_unwritable_log_is_bad_input_and_frees_the_metrics_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bad = tmp_path / "no" / "such" / "dir" / "run.jsonl"
    line = one_line(invoke("run", "--cluster", cluster_file(tmp_path), "--budget-per-interval", "0",
                           "--log", bad, "--metrics-port", port,
                           env={"VCSCHED_STATE_DIR": str(tmp_path / "state")}))
    assert f"--log {bad}: cannot write" in line
    with socket.socket() as s:  # the endpoint opened before the log was tried is closed again
        s.bind(("127.0.0.1", port))


def test_a_missing_cluster_file_is_bad_input(tmp_path: Path) -> None:
    line = one_line(invoke("run", "--cluster", tmp_path / "none.toml", "--budget-per-interval", "0"))
    assert "none.toml" in line


def test_observe_bad_window_is_one_line(tmp_path: Path) -> None:
    assert "--window" in one_line(invoke("observe", "--cluster", cluster_file(tmp_path), "--window", "0"))


def test_observe_reports_every_managed_vm_and_none_here(tmp_path: Path) -> None:
    r = invoke("observe", "--cluster", cluster_file(tmp_path), "--window", "0.2s", "--sample", "0.1s", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["cluster"] == "t" and doc["vms"] == [] and doc["hosts_down"] == []
    assert set(doc["machine"]) == {"cpu_pressure_some", "steal_cores"} and doc["signals_missing"] == {}


@contextlib.contextmanager
def running_controller(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real `vcsched run --dry-run` (interval 0.5 s, metrics on a free port, events in ``run.jsonl``) on the
    test-driver cluster, once it has logged two intervals; killed at the end if still running."""
    log = tmp_path / "run.jsonl"
    env = {**os.environ, "VCSCHED_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "--cluster", str(cluster_file(tmp_path)),
                          "--budget-per-interval", "0", "--interval", "0.5s", "--dry-run", "--log", str(log),
                          "--metrics-port", "0"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            if text.count('"event":"interval"') >= 2:
                break
            assert p.poll() is None, p.communicate()
            time.sleep(0.1)
        yield p, log
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_running_controller_leads_alone_and_stops_on_sigterm(tmp_path: Path) -> None:
    with running_controller(tmp_path) as (p, log):
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, p.communicate()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and "leader" in kinds and kinds[-1] == "stop"
    assert kinds.count("interval") >= 2
    metrics = events[0]["metrics"]
    assert metrics["addr"] == "127.0.0.1" and metrics["port"] > 0
    assert all(isinstance(e["time"], float | int) and e["member"].endswith(f":{p.pid}") for e in events)


def test_a_controller_with_a_duration_stops_on_its_own(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    r = invoke("run", "--cluster", cluster_file(tmp_path), "--budget-per-interval", "0", "--interval", "0.2s",
               "--dry-run", "--duration", "1s", "--log", log, env={"VCSCHED_STATE_DIR": str(tmp_path / "state")})
    assert r.exit_code == 0, (r.output, r.stderr)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[0]["event"] == "start" and events[-1]["event"] == "stop"
    ticks = [e for e in events if e["event"] == "interval"]
    assert 2 <= len(ticks) <= 8, len(ticks)  # about 1 s of 0.2 s intervals
    assert events[-1]["time"] - events[0]["time"] < 10


def test_status_reads_the_controllers_estimates_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps({"event": "observe", "vms": []}) + "\n")
    r = invoke("status", "--cluster", cluster_file(tmp_path), "--sample", "0", "--events", log, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["estimates_from"] == str(log)
    assert "--events" in one_line(invoke("status", "--cluster", cluster_file(tmp_path), "--events",
                                         tmp_path / "none.jsonl"))
