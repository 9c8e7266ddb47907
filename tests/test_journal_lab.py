"""Hazards 3 and 4 of issue 31 on a real lab: what SIGTERM and SIGKILL leave behind while a probe has raised
caps, or while a calibration has pinned and re-capped a domain — and that it is put back.

One 2-host lab of this module's own (1 core per host), one managed guest
(``probe-0``, declared need 0.2, capped at 0.2, in a CPU loop) created once
and shared by the tests, as ``vcsched place --apply`` would leave it.  Each
test runs the real command in a subprocess, waits for the *observable* worst
moment — the cap libvirt reports is the probe's raised one, or the domain is
pinned to one CPU at the calibration's quota — and only then signals it; every
check reads libvirt directly, never through vcsched.  The guest's own CPU use
only has to reach its 0.2 cap (saturated: the probe's trigger), which a TCG
guest in a loop does even on a loaded machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hypervisor.libvirt_backend import LibvirtHypervisor
from lab import Lab
from tests.lab_support import destroy_everywhere, own_lab, start_lab_guest
from tests.skip_policy import patience, skip_or_fail
from vcsched.formats.cluster import Cluster, cluster_from_dict
from vcsched.plans.steps import Boot, CreateStep

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed")

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
VM = "probe-0"
CAP, CAP_QUOTA = 0.2, 20_000  # its cap, and the vcpu_quota libvirt holds for it (1 vCPU, period 100000)
#: What a probe raises it to on a 1-core host where it is alone: the whole core.
RAISED_QUOTA = 100_000
WAIT = 60.0  # seconds for an observable moment (a TCG guest on a loaded 2-core machine)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with own_lab(2, cores=1) as lab:
        yield lab


def cluster_of(lab: Lab) -> Cluster:
    return cluster_from_dict(tomllib.loads(lab.cluster_file.read_text()))


@pytest.fixture(scope="module")
def guest(lab: Lab) -> Iterator[Any]:
    """``probe-0``, managed, capped at 0.2 on h0; its libvirt domain."""
    g = lab.guest
    with LibvirtHypervisor(cluster_of(lab)) as hv:
        hv.create_vm(CreateStep(VM, "h0", "probe", 1, 128 * MIB, CAP, CAP,
                                Boot("kernel", str(g.kernel), str(g.initrd), g.cmdline, g.domain_type)))
    conn = libvirt.open(lab.hosts[0].connect_uri)
    try:
        yield conn.lookupByName(VM)
    finally:
        conn.close()
        destroy_everywhere(lab, VM)


@pytest.fixture(autouse=True)
def at_its_cap(request: pytest.FixtureRequest) -> None:
    """Each test starts with ``probe-0`` at its 0.2 cap (a `run` before may have re-capped it to what it uses)."""
    if "guest" in request.fixturenames:
        dom = request.getfixturevalue("guest")
        dom.setSchedulerParametersFlags({"vcpu_period": 100_000, "vcpu_quota": CAP_QUOTA},
                                        libvirt.VIR_DOMAIN_AFFECT_LIVE)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The test's own vcsched state directory (its lock and its journals)."""
    return tmp_path / "state"


def quota(dom: Any) -> int:
    return int(dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)["vcpu_quota"])


def settings(dom: Any) -> tuple[Any, ...]:
    """Everything a calibration changes, as libvirt reports it: scheduler parameters, pinning, state."""
    live = libvirt.VIR_DOMAIN_AFFECT_LIVE
    return (dom.schedulerParametersFlags(live), dom.vcpuPinInfo(live), dom.emulatorPinInfo(live), dom.state()[0])


def vcsched(state: Path, *args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cli.main", *map(str, args)], cwd=ROOT, text=True,
                            env={**os.environ, "VCSCHED_STATE_DIR": str(state)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(what: str, condition: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    """Until ``condition`` holds (polled every 0.1 s); skip (or fail where skips are not allowed) with the
    process's output if it never does or the process ends first."""
    deadline = time.monotonic() + WAIT * patience()
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}: {out[-2000:]} {err[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            skip_or_fail(f"{what} did not happen within {WAIT * patience():g} s (load average "
                         f"{os.getloadavg()[0]:.1f}): {err[-1000:]}")
        time.sleep(0.1)


def ended(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def observe_probing(lab: Lab, state: Path, dom: Any) -> subprocess.Popen[str]:
    """`observe --probe` once it has raised the guest's cap (the worst moment to be stopped).

    The probe is only for a VM its window found at its cap; on a loaded machine a window can miss that, and
    observe then ends without probing: it is run again, a few times."""
    for _ in range(4):
        proc = vcsched(state, "observe", "--cluster", lab.cluster_file, "--window", "3s", "--sample", "0.5s",
                       "--probe", "--probe-seconds", "60s")
        deadline = time.monotonic() + WAIT * patience()
        while quota(dom) != RAISED_QUOTA and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if quota(dom) == RAISED_QUOTA:
            return proc
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
        if proc.returncode != 0:
            pytest.fail(f"observe --probe failed (exit {proc.returncode}): {out[-2000:]} {err[-2000:]}")
    skip_or_fail(f"observe never found {VM} at its cap in four 3 s windows (load average {os.getloadavg()[0]:.1f})")
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------- hazard 3: probes


@pytest.mark.parametrize(("sig", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_a_signal_while_observe_probes_puts_the_cap_back_then_exits(lab: Lab, guest: Any, state: Path,
                                                                    sig: signal.Signals, exit_code: int) -> None:
    proc = observe_probing(lab, state, guest)
    proc.send_signal(sig)
    code, _out, err = ended(proc)
    assert quota(guest) == CAP_QUOTA, err
    assert code == exit_code, err
    assert f"interrupted by {sig.name}: probe caps put back" in err


def test_sigterm_while_run_probes_puts_the_cap_back_before_a_clean_exit(lab: Lab, guest: Any, state: Path,
                                                                       tmp_path: Path) -> None:
    """How systemd stops `vcsched run`: exit 0, and the cap the probe raised is back where the probe found it."""
    log = tmp_path / "run.jsonl"
    proc = vcsched(state, "run", "--cluster", lab.cluster_file, "--interval", "2s", "--window", "2s", "--sample",
                   "0.5s", "--probe-seconds", "60s", "--budget-per-interval", "0", "--log", log)

    def probing() -> dict[str, Any] | None:
        """The probe event, once its raised cap is what libvirt holds (until then the controller re-caps the
        guest to what it measures: a probe comes once it is found at its full estimate)."""
        events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        probes = [e for e in events if e["event"] == "probe" and not e["dry_run"]]
        return probes[-1] if probes and quota(guest) == RAISED_QUOTA else None

    seen: list[dict[str, Any]] = []
    try:
        wait_for("the controller's probe raising the cap", lambda: seen.append(probing() or {}) or bool(seen[-1]),
                 proc)
        probe = seen[-1]
        proc.send_signal(signal.SIGTERM)
        code, _out, err = ended(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert quota(guest) == round(probe["before"][VM] * 100_000), log.read_text()
    assert code == 0, err


def test_a_probe_killed_by_sigkill_is_put_back_by_the_next_probe(lab: Lab, guest: Any, state: Path) -> None:
    proc = observe_probing(lab, state, guest)
    try:
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert quota(guest) == RAISED_QUOTA  # SIGKILL: nothing ran after it
    # The next probing command puts it back before anything else (and then probes for 1 s itself).
    code, _out, err = ended(vcsched(state, "observe", "--cluster", lab.cluster_file, "--window", "1s", "--sample",
                                    "0.5s", "--probe", "--probe-seconds", "1s"))
    assert code == 0, err
    assert f"a killed probe's {VM}: cap put back to {CAP:g}" in err
    assert quota(guest) == CAP_QUOTA


# ---------------------------------------------------------------------------------------------- hazard 4: calibration


def calibrate(lab: Lab, state: Path, dom: Any, *extra: Any) -> subprocess.Popen[str]:
    return vcsched(state, "calibrate", "--allow-unreliable", "--backend", "libvirt", "--connect",
                   lab.hosts[0].connect_uri, "--domain",
                   dom.name(), "--pairs", "1", "--window", "0.5", *extra)


def calibrate_managed(lab: Lab, state: Path, dom: Any, *extra: Any) -> subprocess.Popen[str]:
    """A VM vcsched manages is calibrated only under its cluster's lock (docs/calibration.md)."""
    return calibrate(lab, state, dom, "--cluster", lab.cluster_file, "--allow-managed", *extra)


def test_calibration_refuses_a_domain_vcsched_does_not_manage(lab: Lab, state: Path) -> None:
    other = start_lab_guest(lab, 0, wait=False)  # unmanaged: no vcsched metadata
    try:
        before = settings(other)
        code, _out, err = ended(calibrate(lab, state, other, "--caps", "0.25", "--duration", "1.2", "--cpu", "0"))
        assert settings(other) == before
        assert code == 2, err
        assert f"--domain {other.name()}: not managed by vcsched" in err and "--force" in err
    finally:
        destroy_everywhere(lab, other.name())


def pinned_and_uncapped(dom: Any) -> bool:
    """The calibration's first measurement (the overhead, uncapped) is running: pinned to CPU 0, no cap."""
    s = settings(dom)
    return s[1][0] == (True, False) and s[0]["vcpu_quota"] != CAP_QUOTA and s[3] == libvirt.VIR_DOMAIN_RUNNING


def test_a_calibration_killed_while_pinned_and_uncapped_is_put_back_by_the_next(lab: Lab, guest: Any,
                                                                                state: Path) -> None:
    """SIGKILL while the domain is pinned to CPU 0 and uncapped (the issue's "left it uncapped and pinned");
    the next calibration puts it back first (then measures, and restores what it found)."""
    before = settings(guest)
    assert all(before[1][0]) and before[3] == libvirt.VIR_DOMAIN_RUNNING  # on every CPU, running, at its cap
    proc = calibrate_managed(lab, state, guest, "--caps", "0.25", "--duration", "60", "--cpu", "0")
    try:
        wait_for("the calibration pinning and uncapping the domain", lambda: pinned_and_uncapped(guest), proc)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert settings(guest) != before  # what SIGKILL left
    code, _out, err = ended(calibrate_managed(lab, state, guest, "--caps", "0.5", "--duration", "1.2"))
    assert code == 0, err
    assert settings(guest) == before, err
    assert f"a killed calibration's {VM} on {lab.hosts[0].connect_uri}: vCPU 0 pinning put back" in err


def test_sigterm_during_calibration_leaves_the_domain_running_as_found(lab: Lab, guest: Any, state: Path) -> None:
    before = settings(guest)
    proc = calibrate_managed(lab, state, guest, "--caps", "0.25", "--duration", "60", "--cpu", "0")
    try:
        wait_for("the calibration pinning and uncapping the domain", lambda: pinned_and_uncapped(guest), proc)
        proc.send_signal(signal.SIGTERM)
        code, _out, err = ended(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert settings(guest) == before, err
    assert code == 130, err
    assert not list((state / "journal").glob("*.json"))  # everything went back: nothing left to repair


def test_guests_a_killed_calibration_booted_are_destroyed_by_repair(lab: Lab, state: Path) -> None:
    """Without --domain, calibrate boots its own transient guests; SIGKILL while the first boots, then
    `vcsched repair --apply`: none is left running."""
    conn = libvirt.open(lab.hosts[0].connect_uri)

    def calib_guests() -> list[str]:
        return [d.name() for d in conn.listAllDomains(0) if d.name().startswith("vcsched-calib-")]

    try:
        proc = vcsched(state, "calibrate", "--allow-unreliable", "--backend", "libvirt", "--connect",
                   lab.hosts[0].connect_uri,
                       "--cluster", lab.cluster_file, "--caps", "0.25", "--duration", "1.2", "--pairs", "1",
                       "--window", "0.5", "--cpu", "0")

        def booting() -> bool:  # its console has output: started well before now (and journaled as it started)
            return any(p.stat().st_size > 0 for p in Path("/var/tmp").glob(f"vcsched-calib-*/vcsched-calib-"
                                                                             f"{proc.pid}-0.log"))

        wait_for("the calibration's own guest booting", booting, proc)
        proc.kill()
        proc.wait()
        assert calib_guests() == [f"vcsched-calib-{proc.pid}-0"]  # what SIGKILL left
        code, out, err = ended(vcsched(state, "repair", "--cluster", lab.cluster_file, "--apply"))
        assert code == 0, out + err
        assert f"calibration guest vcsched-calib-{proc.pid}-0 on {lab.hosts[0].connect_uri}: destroyed" in out
        assert calib_guests() == []
        assert not list(Path("/var/tmp").glob(f"vcsched-calib-*/vcsched-calib-{proc.pid}-0.log"))  # its console too
    finally:
        for name in calib_guests():
            destroy_everywhere(lab, name)
        conn.close()
