"""Starvation on a real lab (docs/contention.md): the estimate tells a starved VM from one that wants less.

Managed guests with a known duty cycle (the guest /init's ``vcsched.load=``)
run capped beside uncapped busy guests vcsched does not manage, one on every
host of a 2-host lab: this machine's two cores cannot serve them all, so the
managed guests wait in the run queue (``vcpu.N.delay``) and use less than
they need.

* under contention a ``vcsched run`` daemon marks their estimates censored,
  lowers no cap and leaves no VM below its floor (the downward spiral of
  issue 39: the estimator of before lowered fl-0 from 0.40 to 0.28 core
  within 40 s, below its 0.8 floor);
* without contention a guest's need is estimated within 10 % of its true
  need within :data:`QUIET_WINDOWS` windows.  Its true need is what it uses
  when nothing holds it back: a guest spinning at 40 % of its vCPU uses
  0.47-0.49 core of this machine (the load loop's own work under TCG), not
  0.40, so the reference is its mean use over the windows in which it
  neither hit its cap nor waited.  A development machine shared with other
  test runs is rarely quiet, so the test gives its host's cgroup partition
  the largest CPU weight (``cpu.shares``) while it measures: its one guest
  then runs when it wants.  It measures CPU time: it runs alone
  (``exclusive``), and skips (fails on CI) if the guest waits all the same.

The module's lab is its own (``own_lab``): the busy guests would take what the other lab tests measure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from acting.sampling import CpuSampler
from hypervisor.libvirt_backend import LibvirtHypervisor
from lab import Lab
from tests.lab_support import destroy_everywhere, own_lab, start_lab_guest
from tests.skip_policy import skip_or_fail
from vcsched.control.observe import ObserveParams, estimate_all
from vcsched.formats.cluster import Cluster, cluster_from_dict
from vcsched.plans.steps import Boot, CreateStep

pytestmark = [pytest.mark.lab, pytest.mark.exclusive]

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
#: fl-0 and fl-1 as in issue 39: 0.4 core each, capped at it, floor 0.8; each spins at 40 % of its vCPU.
NEED, CAP, FLOOR, DUTY = 0.4, 0.4, 0.8, 40
INTERVAL = 2.0
RUN_S = 36.0  # 18 intervals: the old estimator had lowered fl-0 below its floor within 40 s
#: The need alone, without the planning headroom (ObserveParams.headroom, margin): what is compared with the duty
#: cycle.  Windows of five one-second samples.
NEED_ONLY = ObserveParams(headroom=0.0, margin=0.0)
SAMPLE_S, WINDOW_SAMPLES = 1.0, 5
QUIET_WINDOWS = 3  # docs/contention.md: a quiet guest's need is within 10 % by its third window
#: The cpu controller's largest weight: the lab partition's processes run before the machine's other work.
TOP_SHARES = 262144
BOOT_SETTLE_S = 20.0  # a TCG guest keeps working ~20 s after its boot (tests/test_run_lab.py)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with own_lab(2, cores=1) as lab:
        yield lab


def lab_cluster(lab: Lab, tmp: Path) -> tuple[Path, Cluster]:
    import tomllib

    path = tmp / "cluster.toml"
    path.write_text(f'coordination = "file://{tmp / "coord"}"\n' + lab.cluster_file.read_text())
    return path, cluster_from_dict(tomllib.loads(path.read_text()))


def create_managed(hv: LibvirtHypervisor, cluster: Cluster, name: str, host: str, need: float, cap: float,
                   duty: int, floor: float | None = None) -> None:
    g = cluster.guest
    assert g is not None
    boot = Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=f"{g.cmdline} vcsched.load={duty}:3600",
                domain_type=g.domain_type)
    hv.create_vm(CreateStep(name, host, name.rsplit("-", 1)[0], 1, 128 * MIB, need, cap, boot, min_yield=floor))


@contextlib.contextmanager
def busy_guests(lab: Lab, hosts: list[int], vcpus: int = 2) -> Iterator[list[str]]:
    """Uncapped guests spinning on every vCPU, not managed by vcsched (no metadata): contention."""
    names = []
    try:
        for i in hosts:
            name = f"hog{uuid.uuid4().hex[:6]}"
            names.append(name)
            start_lab_guest(lab, i, name, vcpus=vcpus)
        yield names
    finally:
        for name in names:
            destroy_everywhere(lab, name)


@dataclass(frozen=True)
class Window:
    """One window's estimates of a VM, by the estimator of today and by the one of before (the same samples
    without the waiting and throttling signals: it saw only used CPU and the cap)."""

    vm: str
    new: float
    old: float
    censored: bool
    waited: float | None
    basis: str = ""  # how today's estimator reached it
    samples: int = 0
    used_mean: float = 0.0  # the mean of the cores used over the window


def sample_windows(hv: LibvirtHypervisor, vms: list[str], windows: int,
                   declared: dict[str, float]) -> list[Window]:
    """``windows`` consecutive windows of :data:`WINDOW_SAMPLES` one-second samples, estimated both ways with
    :data:`NEED_ONLY` (caps unchanged meanwhile; the previous estimate: the declared need)."""
    sampler = CpuSampler(SAMPLE_S * WINDOW_SAMPLES + SAMPLE_S / 2, min_seconds=SAMPLE_S / 2)
    out = []
    stop = threading.Event()
    inventory = sampler.sample(hv)
    for _ in range(windows):
        sampler.sample_for(hv, SAMPLE_S * WINDOW_SAMPLES, SAMPLE_S, stop)
        inventory = hv.inventory()
        samples = {k: v for k, v in sampler.samples().items() if k in vms}
        stripped = {k: [replace(s, throttled=None, waited_cores=None) for s in v] for k, v in samples.items()}
        new = estimate_all(inventory, samples, declared, NEED_ONLY)
        old = estimate_all(inventory, stripped, declared, NEED_ONLY)
        for vm in vms:
            if vm in new and vm in old:
                e = new[vm]
                used = [s.used_cores for s in samples.get(vm, ())]
                out.append(Window(vm, e.estimate, old[vm].estimate, e.censored, e.waited_cores, e.basis, e.samples,
                                  sum(used) / len(used) if used else 0.0))
    return out


@contextlib.contextmanager
def cpu_priority(lab: Lab, host: int) -> Iterator[None]:
    """The host's cgroup partition at :data:`TOP_SHARES` for the ``with`` block (cgroup v1 cpu controller; where
    there is none, nothing changes), its weight put back after."""
    from lab.state import partition_dir_name

    shares = Path("/sys/fs/cgroup/cpu") / partition_dir_name(lab.hosts[host].partition) / "cpu.shares"
    before = shares.read_text().strip() if shares.exists() else None
    if before is not None:
        shares.write_text(str(TOP_SHARES))
    try:
        yield
    finally:
        if before is not None and shares.exists():
            shares.write_text(before)


def events_of(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@dataclass
class Contended:
    """What a `vcsched run` beside busy guests did: its events, the managed VMs at the end, the approvals made."""

    names: list[str]
    events: list[dict[str, Any]]
    final: dict[str, Any]
    approved: list[dict[str, Any]]


def run_contended(lab: Lab, tmp_path: Path, mode: str) -> Contended:
    """fl-0 on h0 and fl-1 on h1 beside a busy guest on each host, under `vcsched run --mode MODE` for
    :data:`RUN_S`; in recommend mode every open recommendation is approved as soon as it is listed."""
    path, cluster = lab_cluster(lab, tmp_path)
    names = [f"fl{uuid.uuid4().hex[:4]}-{i}" for i in range(2)]
    log = tmp_path / "run.jsonl"
    env = {**os.environ, "VCSCHED_STATE_DIR": str(tmp_path / "state")}
    proc = None
    approved: list[dict[str, Any]] = []
    try:
        with LibvirtHypervisor(cluster) as hv, busy_guests(lab, [0, 1]):
            for i, name in enumerate(names):
                create_managed(hv, cluster, name, f"h{i}", NEED, CAP, DUTY, FLOOR)
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "run", "--cluster", str(path), "--interval", f"{INTERVAL:g}s",
                 "--budget-per-interval", "256MiB", "--probe-seconds", "0", "--mode", mode, "--log", str(log)],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            end = time.monotonic() + RUN_S
            while time.monotonic() < end:
                time.sleep(INTERVAL)
                if mode != "recommend":
                    continue
                listed = subprocess.run([sys.executable, "-m", "cli.main", "recommendations", "--cluster", str(path),
                                         "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
                for r in json.loads(listed.stdout or "{}").get("recommendations", []):
                    if r["state"] == "open":
                        done = subprocess.run([sys.executable, "-m", "cli.main", "approve", r["id"], "--cluster",
                                               str(path), "--json"], cwd=ROOT, env=env, capture_output=True,
                                              text=True, timeout=120)
                        approved.append({"id": r["id"], "exit": done.returncode, "stderr": done.stderr.strip(),
                                         "effect": r["effect"]})
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, proc.communicate()
            final = {v.name: v for v in hv.inventory().managed()}
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for name in names:
            destroy_everywhere(lab, name)
    return Contended(names, events_of(log), final, approved)


def no_cap_lowered_none_below_floor_estimates_censored(run: Contended) -> None:
    observed = [v for e in run.events if e["event"] == "observe" for v in e["vms"] if v["vm"] in run.names]
    assert observed, "the daemon estimated nothing"
    lowered = [(e["vm"], e["op"], e["cap_cores"]) for e in run.events if e["event"] == "step"
               and e.get("vm") in run.names and e.get("cap_cores") is not None
               and float(e["cap_cores"]) < CAP - 0.005]
    assert not lowered, lowered
    for name in run.names:
        cap = run.final[name].cap_cores
        assert cap is not None and cap / NEED >= FLOOR - 1e-3, (name, cap)
    censored = [v for v in observed if v["samples"] >= 3]
    assert censored and all(v["censored"] for v in censored[len(censored) // 2:]), \
        [(v["vm"], v["basis"], v["waited_cores"]) for v in censored]


def test_under_contention_estimates_are_censored_and_the_controller_lowers_no_cap(lab: Lab,
                                                                                  tmp_path: Path) -> None:
    run = run_contended(lab, tmp_path, "act")
    no_cap_lowered_none_below_floor_estimates_censored(run)
    # Every plan applied a settle period (two windows) before the end is audited, predicted against achieved.
    settled = [e for e in run.events if e["event"] == "applied" and e.get("ok") and e.get("steps")
               and e["time"] < run.events[-1]["time"] - 4 * INTERVAL]
    audits = [e for e in run.events if e["event"] == "audit"]
    assert len(audits) >= len(settled), (settled, audits)


def test_under_contention_recommend_mode_with_approvals_lowers_no_cap(lab: Lab, tmp_path: Path) -> None:
    run = run_contended(lab, tmp_path, "recommend")
    no_cap_lowered_none_below_floor_estimates_censored(run)
    assert all(a["exit"] in (0, 1) for a in run.approved), run.approved  # applied, or refused with a reason


def test_without_contention_a_duty_cycle_is_estimated_within_ten_percent(lab: Lab, tmp_path: Path) -> None:
    _path, cluster = lab_cluster(lab, tmp_path)
    name = f"q{uuid.uuid4().hex[:4]}-0"
    try:
        with LibvirtHypervisor(cluster) as hv, cpu_priority(lab, 0):
            create_managed(hv, cluster, name, "h0", 0.8, 0.8, DUTY)
            time.sleep(BOOT_SETTLE_S)
            windows = sample_windows(hv, [name], QUIET_WINDOWS, {name: 0.8})
    finally:
        destroy_everywhere(lab, name)
    waited = [w.waited for w in windows if w.waited is not None]
    last = windows[-1]
    if any(w.censored for w in windows):
        skip_or_fail(f"machine too busy: the guest waited up to {max(waited, default=0):.2f} core for a host CPU "
                     f"(/proc/pressure/cpu: {Path('/proc/pressure/cpu').read_text().splitlines()[0]})")
    true_need = sum(w.used_mean for w in windows) / len(windows)
    assert DUTY / 100 <= true_need <= 1.3 * DUTY / 100, windows  # the duty cycle plus the load loop's own work
    assert abs(last.new - true_need) <= 0.1 * true_need, windows
    assert last.basis == "measured" and last.new < 0.8  # not held at its declared need: nothing censored it
