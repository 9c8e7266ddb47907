"""Starvation on a real lab (docs/contention.md): the estimate tells a starved VM from one that wants less.

Managed guests with a known duty cycle (the guest /init's ``vcsched.load=``)
run capped beside uncapped busy guests vcsched does not manage, one on every
host of a 4-host lab: this machine's two cores cannot serve them all, so the
managed guests wait in the run queue (``vcpu.N.delay``) and use less than
they need.

* under contention a ``vcsched run`` daemon marks their estimates censored,
  lowers no cap and leaves no VM below its floor (the downward spiral of
  issue 39: the estimator of before lowered fl-0 from 0.40 to 0.28 core
  within 40 s, below its 0.8 floor), acting or recommending (its
  recommendations approved as soon as listed).  Both modes run at once, for
  one :data:`RUN_S`: each daemon on a cluster of two hosts of its own
  (:data:`MODE_HOSTS`: its own coordination and state directories, its own two
  managed guests, a busy guest on each of its hosts), as each had the whole
  2-host lab when they ran one after the other (44 and 43 s of CI's serial
  second pass).  The four one-vCPU busy guests spin on as many vCPUs as the two
  two-vCPU ones of then, and four managed guests instead of two only add
  contention: what is checked holds or gets stronger under more load;
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

The module's lab is its own (``own_lab``): the busy guests would take what the other lab tests measure.  The
quiet test uses h0 alone, after the contended run has destroyed its guests.
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
from click.testing import CliRunner

from acting.sampling import CpuSampler
from cli.main import cli
from hypervisor.guest import GuestImage, guest_xml, wait_for_boot
from hypervisor.libvirt_backend import LibvirtHypervisor
from lab import Lab
from lab.image import LOAD_MARKER
from tests.lab_support import destroy_everywhere, guest_console, own_lab, start_lab_guest
from tests.skip_policy import patience, skip_or_fail
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
#: Each mode's daemon and the lab hosts of its cluster (fl-0 on the first, fl-1 on the second).
MODE_HOSTS = {"act": (0, 1), "recommend": (2, 3)}
#: The need alone, without the planning headroom (ObserveParams.headroom, margin): what is compared with the duty
#: cycle.  Windows of five one-second samples.
NEED_ONLY = ObserveParams(headroom=0.0, margin=0.0)
SAMPLE_S, WINDOW_SAMPLES = 1.0, 5
QUIET_WINDOWS = 3  # docs/contention.md: a quiet guest's need is within 10 % by its third window
#: The cpu controller's largest weight: the lab partition's processes run before the machine's other work.
TOP_SHARES = 262144
#: The quiet guest is measured from this long after its duty cycle started (its ``VCSCHED-LOAD`` console line):
#: past its first instants.  Its boot leaves no tail: with its partition at TOP_SHARES it used 0.70 core in its
#: first 2 s (the boot, 2.5 s to the marker), then 0.46-0.50 every 2 s for 36 s (2026-11-27, at load 10).
QUIET_SETTLE_S = 2.0
BOOT_TIMEOUT_S = 120.0  # creation to the duty cycle's console line (patience() times that under CI)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with own_lab(len(MODE_HOSTS) * 2, cores=1) as lab:
        yield lab


def lab_cluster(lab: Lab, tmp: Path, hosts: tuple[int, ...] | None = None) -> tuple[Path, Cluster]:
    """The lab's cluster file with its coordination directory in ``tmp``, its hosts reduced to ``hosts`` (indexes;
    None: all of them)."""
    import tomllib

    head, *blocks = lab.cluster_file.read_text().split("\n[[hosts]]\n")
    keep = {lab.hosts[i].name for i in (range(len(lab.hosts)) if hosts is None else hosts)}
    text = head + "".join("\n[[hosts]]\n" + b for b in blocks if tomllib.loads(b)["name"] in keep)
    path = tmp / "cluster.toml"
    path.write_text(f'coordination = "file://{tmp / "coord"}"\n' + text)
    cluster = cluster_from_dict(tomllib.loads(path.read_text()))
    assert {h.name for h in cluster.hosts} == keep, (keep, text)
    return path, cluster


def create_managed(hv: LibvirtHypervisor, cluster: Cluster, name: str, host: str, need: float, cap: float,
                   duty: int, floor: float | None = None, console: Path | None = None) -> None:
    """Managed VM ``name`` on ``host`` spinning at ``duty`` % of its vCPU; with ``console``, booted from a template
    whose serial console is that file (what :func:`wait_for_duty` reads), else with a pty console."""
    g = cluster.guest
    assert g is not None
    cmdline = f"{g.cmdline} vcsched.load={duty}:3600"
    if console is None:
        boot = Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=cmdline, domain_type=g.domain_type)
    else:
        template = console.with_suffix(".xml")
        image = GuestImage(Path(g.kernel), Path(g.initrd), cmdline, g.domain_type)
        template.write_text(guest_xml(name, image, console_log=console))
        boot = Boot("template", path=str(template), domain_type=g.domain_type)
    hv.create_vm(CreateStep(name, host, name.rsplit("-", 1)[0], 1, 128 * MIB, need, cap, boot, min_yield=floor))


def wait_for_duty(console: Path) -> None:
    """Return once the guest printed its duty cycle's ``VCSCHED-LOAD`` line (it booted and the load loop runs);
    skip (fail on CI) if it does not within :data:`BOOT_TIMEOUT_S`."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S * patience()
    while time.monotonic() < deadline:
        if console.exists() and LOAD_MARKER in console.read_text(errors="replace"):
            return
        time.sleep(0.2)
    skip_or_fail(f"the guest did not start its duty cycle within {BOOT_TIMEOUT_S * patience():g} s "
                 f"(load average {os.getloadavg()[0]:.1f})")


@contextlib.contextmanager
def busy_guests(lab: Lab, hosts: list[int], vcpus: int = 1) -> Iterator[list[str]]:
    """Uncapped guests spinning on every vCPU, not managed by vcsched (no metadata): contention.  They boot side
    by side; the block starts once every one printed its boot marker (is in its busy loop)."""
    started: list[tuple[int, str]] = []
    try:
        for i in hosts:
            name = f"hog{uuid.uuid4().hex[:6]}"
            started.append((i, name))
            start_lab_guest(lab, i, name, vcpus=vcpus, wait=False)
        for i, name in started:
            wait_for_boot(guest_console(lab, i, name))
        yield [name for _, name in started]
    finally:
        for _, name in started:
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


@dataclass(frozen=True)
class Daemon:
    """One mode's `vcsched run`: its cluster (a part of the lab), environment, managed VMs and event log."""

    mode: str
    hosts: tuple[int, ...]
    path: Path
    cluster: Cluster
    state_dir: Path
    names: list[str]
    log: Path

    def command(self) -> list[str]:
        return [sys.executable, "-m", "cli.main", "run", "--cluster", str(self.path), "--interval", f"{INTERVAL:g}s",
                "--budget-per-interval", "256MiB", "--probe-seconds", "0", "--mode", self.mode, "--log",
                str(self.log)]


def approve_open(d: Daemon) -> list[dict[str, Any]]:
    """Approve every open recommendation of ``d``'s cluster (in this process, as an operator's commands would):
    what each approval returned."""
    env = {"VCSCHED_STATE_DIR": str(d.state_dir)}
    listed = CliRunner().invoke(cli, ["recommendations", "--cluster", str(d.path), "--json"], env=env)
    assert listed.exit_code == 0, (listed.output, listed.exception)
    out = []
    for r in json.loads(listed.stdout).get("recommendations", []):
        if r["state"] == "open":
            done = CliRunner().invoke(cli, ["approve", r["id"], "--cluster", str(d.path), "--json"], env=env)
            crash = None if isinstance(done.exception, SystemExit | None) else repr(done.exception)
            out.append({"id": r["id"], "exit": done.exit_code, "stderr": done.stderr.strip(), "crash": crash,
                        "effect": r["effect"]})
    return out


def run_contended(lab: Lab, tmp: Path) -> dict[str, Contended]:
    """For each mode of :data:`MODE_HOSTS`, fl-0 and fl-1 on its cluster's two hosts, beside a busy guest on every
    host, under `vcsched run --mode MODE` for :data:`RUN_S`, the daemons side by side; in recommend mode every open
    recommendation is approved as soon as it is listed."""
    daemons = []
    for mode, hosts in MODE_HOSTS.items():
        mode_dir = tmp / mode
        mode_dir.mkdir()
        path, cluster = lab_cluster(lab, mode_dir, hosts)
        daemons.append(Daemon(mode, hosts, path, cluster, mode_dir / "state",
                              [f"fl{uuid.uuid4().hex[:4]}-{i}" for i in range(len(hosts))], mode_dir / "run.jsonl"))
    procs: list[subprocess.Popen[bytes]] = []
    approved: list[dict[str, Any]] = []
    final: dict[str, dict[str, Any]] = {}
    try:
        with busy_guests(lab, list(range(len(lab.hosts)))), contextlib.ExitStack() as stack:
            hvs = {d.mode: stack.enter_context(LibvirtHypervisor(d.cluster)) for d in daemons}
            for d in daemons:
                for name, i in zip(d.names, d.hosts, strict=True):
                    create_managed(hvs[d.mode], d.cluster, name, lab.hosts[i].name, NEED, CAP, DUTY, FLOOR)
            for d in daemons:
                procs.append(subprocess.Popen(d.command(), cwd=ROOT, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE,
                                              env={**os.environ, "VCSCHED_STATE_DIR": str(d.state_dir)}))
            recommending = [d for d in daemons if d.mode == "recommend"]
            end = time.monotonic() + RUN_S
            while time.monotonic() < end:
                time.sleep(INTERVAL)
                for d in recommending:
                    approved += approve_open(d)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                assert proc.wait(timeout=60) == 0, proc.communicate()
            final = {d.mode: {v.name: v for v in hvs[d.mode].inventory().managed()} for d in daemons}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for d in daemons:
            for name in d.names:
                destroy_everywhere(lab, name)
    return {d.mode: Contended(d.names, events_of(d.log), final[d.mode], approved if d.mode == "recommend" else [])
            for d in daemons}


@pytest.fixture(scope="module")
def contended(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Contended]:
    """The two modes' runs (:func:`run_contended`), once for the module."""
    return run_contended(lab, tmp_path_factory.mktemp("contended"))


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


def test_under_contention_estimates_are_censored_and_the_controller_lowers_no_cap(
        contended: dict[str, Contended]) -> None:
    run = contended["act"]
    no_cap_lowered_none_below_floor_estimates_censored(run)
    # Every plan applied a settle period (two windows) before the end is audited, predicted against achieved.
    settled = [e for e in run.events if e["event"] == "applied" and e.get("ok") and e.get("steps")
               and e["time"] < run.events[-1]["time"] - 4 * INTERVAL]
    audits = [e for e in run.events if e["event"] == "audit"]
    assert len(audits) >= len(settled), (settled, audits)


def test_under_contention_recommend_mode_with_approvals_lowers_no_cap(contended: dict[str, Contended]) -> None:
    run = contended["recommend"]
    no_cap_lowered_none_below_floor_estimates_censored(run)
    # Applied, or refused with a reason (not an exception).
    assert all(a["exit"] in (0, 1) and a["crash"] is None for a in run.approved), run.approved


def test_without_contention_a_duty_cycle_is_estimated_within_ten_percent(lab: Lab, tmp_path: Path) -> None:
    _path, cluster = lab_cluster(lab, tmp_path)
    name = f"q{uuid.uuid4().hex[:4]}-0"
    console = guest_console(lab, 0, name)
    try:
        with LibvirtHypervisor(cluster) as hv, cpu_priority(lab, 0):
            create_managed(hv, cluster, name, "h0", 0.8, 0.8, DUTY, console=console)
            wait_for_duty(console)
            time.sleep(QUIET_SETTLE_S)
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
