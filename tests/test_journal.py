"""Probe caps and calibration settings journaled before they change, and put back on every way out.

On the in-memory hypervisor with CPU load on a fake clock (tests/fake_load.py):
what ``vcsched observe --probe`` and ``vcsched run`` do when stopped, failing
or killed while a probe's caps are raised.  A journal "of a dead process" is
one whose recorded start time is not its pid's (hypervisor/journal.py); the
real signals and SIGKILL are in tests/test_journal_lab.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from acting.restore import restore_journal
from acting.sampling import CpuSampler, probe_and_restore
from hypervisor.journal import (
    CALIBRATION,
    PROBE,
    Journal,
    ProbeEntry,
    pending,
    process_started,
    signals_held,
)
from hypervisor.memory import MemoryHypervisor
from tests.builders import inventory_of, managed
from tests.fake_load import FakeClock, FakeLocks, LoadedHypervisor, busy, phases
from tests.test_controller import Run
from vcsched.control.rebalance import NOTHING, Decision

PROBED = ProbeEntry("h0", "hungry", None, 0.2, 0.5)
#: The decision when no allocation keeps every VM where it is: no plan at all.
NO_PLAN = Decision(NOTHING, None, "test: no allocation")


def cluster_hv(cap: float = 0.5) -> MemoryHypervisor:
    """h0 holds ``hungry`` at ``cap`` (a probe raised it from 0.2 to 0.5) and ``light`` at 0.5."""
    inv = inventory_of([managed("hungry", "h0", "a", 0.2, cap), managed("light", "h0", "b", 0.5, 0.5)])
    return MemoryHypervisor(inv.cluster, inv.hosts, inv.vms)


def dead_journal(directory: Path, kind: str = PROBE, **content: object) -> Path:
    """A journal as a process that died left it: this pid, but a start time that is not this process's."""
    j = Journal(kind, directory, pid=os.getpid())
    j.write(**content)
    doc = json.loads(j.path.read_text())
    doc["started"] = -1
    j.path.write_text(json.dumps(doc))
    return j.path


# ---------------------------------------------------------------------------------------------- the journal itself


def test_a_journal_names_its_process_and_is_replaced_whole(tmp_path: Path) -> None:
    j = Journal(PROBE, tmp_path)
    j.write(cluster="lab", vms=[PROBED])
    doc = json.loads(j.path.read_text())
    assert doc["version"] == 1 and doc["kind"] == "probe" and doc["pid"] == os.getpid()
    assert doc["started"] == process_started(os.getpid())
    assert doc["vms"] == [{"host": "h0", "vm": "hungry", "uuid": None, "before": 0.2, "raised": 0.5}]
    j.write(cluster="lab", vms=[])
    assert json.loads(j.path.read_text())["vms"] == [] and not list(tmp_path.glob("*.tmp"))
    j.clear()
    assert not j.path.exists()


def test_a_running_process_journal_is_left_to_it(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        Journal(PROBE, tmp_path, pid=sleeper.pid).write(cluster="lab", vms=[PROBED])
        hv = cluster_hv()
        report = restore_journal(hv, directory=tmp_path)
        assert report.restored == () and any("still runs" in line for line in report.left)
        assert hv.vms["hungry"].cap_cores == pytest.approx(0.5)
    finally:
        sleeper.kill()
        sleeper.wait()
    # Gone now: the same journal is put back.
    assert restore_journal(hv, directory=tmp_path).restored
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.2)


def test_this_process_journal_is_restored_only_when_asked(tmp_path: Path) -> None:
    Journal(PROBE, tmp_path).write(cluster="lab", vms=[PROBED])
    hv = cluster_hv()
    assert restore_journal(hv, directory=tmp_path) == restore_journal(hv, directory=tmp_path, own=False)
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.5) and pending(PROBE, tmp_path) == []
    assert pending(PROBE, tmp_path, own=True)
    restore_journal(hv, directory=tmp_path, own=True)
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.2) and not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------- probe journals


def test_a_dead_process_probe_caps_are_put_back_and_its_journal_removed(tmp_path: Path) -> None:
    path = dead_journal(tmp_path, cluster="lab", vms=[PROBED])
    hv = cluster_hv()
    report = restore_journal(hv, directory=tmp_path)
    assert report.problems == () and report.restored == ("hungry: cap put back to 0.2 (a probe had raised it)",)
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.2) and hv.vms["light"].cap_cores == pytest.approx(0.5)
    assert not path.exists()


def test_a_cap_set_since_the_probe_stands(tmp_path: Path) -> None:
    path = dead_journal(tmp_path, cluster="lab", vms=[PROBED])
    hv = cluster_hv(cap=0.3)  # a later plan re-capped it
    report = restore_journal(hv, directory=tmp_path)
    assert report.restored == () and report.problems == ()
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.3) and not path.exists()


def test_a_probe_on_a_host_that_is_down_stays_journaled(tmp_path: Path) -> None:
    path = dead_journal(tmp_path, cluster="lab", vms=[PROBED])
    hv = cluster_hv()
    hv.down["h0"] = "no answer"
    report = restore_journal(hv, directory=tmp_path)
    assert report.problems and "h0 is down" in report.problems[0] and path.exists()
    del hv.down["h0"]
    assert restore_journal(hv, directory=tmp_path).restored and not path.exists()


def test_another_cluster_probe_journal_and_calibration_journals_are_left(tmp_path: Path) -> None:
    other = dead_journal(tmp_path, cluster="elsewhere", vms=[PROBED])
    hv = cluster_hv()
    report = restore_journal(hv, kinds=(PROBE,), directory=tmp_path)
    assert any("'elsewhere'" in line for line in report.left) and other.exists()
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.5)
    assert restore_journal(None, kinds=(PROBE,), directory=tmp_path).left  # no hypervisor: left, not acted on


# ---------------------------------------------------------------------------------------------- observe --probe


def observed(tmp_path: Path) -> tuple[LoadedHypervisor, FakeClock, CpuSampler, Journal]:
    clock = FakeClock()
    inv = inventory_of([managed("hungry", "h0", "a", 0.2, 0.2), managed("light", "h0", "b", 0.5, 0.5)])
    hv = LoadedHypervisor("lab", inv.hosts, inv.vms, clock, {"hungry": busy(0.6), "light": busy(0.1)})
    sampler = CpuSampler(60 + 5, clock)
    sampler.sample_for(hv, 60, 5, threading.Event())
    return hv, clock, sampler, Journal(PROBE, tmp_path)


def test_the_probe_journal_is_written_before_the_first_cap_rises(tmp_path: Path) -> None:
    hv, _clock, sampler, journal = observed(tmp_path)
    seen: list[object] = []
    hv.before[("set-cap", "hungry")] = lambda: seen.append(json.loads(journal.path.read_text())["vms"])
    done, _, _ = probe_and_restore(hv, sampler, 6, 1, threading.Event(), journal=journal)
    assert seen == [[{"host": "h0", "vm": "hungry", "uuid": None, "before": 0.2, "raised": 0.5}]]
    assert done.restored is not None and done.restored.ok and not journal.exists()


def test_a_stop_while_the_probe_samples_puts_the_caps_back(tmp_path: Path) -> None:
    """SIGTERM or Ctrl-C during `observe --probe` (cli.signals sets the stop event): sampling ends, caps go back."""
    hv, clock, sampler, journal = observed(tmp_path)
    stop = threading.Event()
    clock.at.append((clock.now + 2, stop.set))
    done, _, _ = probe_and_restore(hv, sampler, 6, 1, stop, journal=journal)
    assert done.caps == {"hungry": pytest.approx(0.5)} and clock.now < 66  # stopped early
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.2) and not journal.exists()


def test_an_exception_while_the_caps_are_raised_puts_them_back(tmp_path: Path) -> None:
    hv, clock, sampler, journal = observed(tmp_path)

    def interrupt() -> None:
        raise KeyboardInterrupt

    clock.at.append((clock.now + 2, interrupt))
    with pytest.raises(KeyboardInterrupt):
        probe_and_restore(hv, sampler, 6, 1, threading.Event(), journal=journal)
    assert hv.vms["hungry"].cap_cores == pytest.approx(0.2) and not journal.exists()


# ---------------------------------------------------------------------------------------------- vcsched run


def probing() -> tuple[LoadedHypervisor, FakeClock]:
    """a-0 busy from t=60 at its cap: the interval at 70 probes it (tests/test_controller.py)."""
    clock = FakeClock()
    inv = inventory_of([managed("a-0", "h0", "a", 0.5, 0.5), managed("z-0", "h0", "z", 0.3, 0.3)])
    return LoadedHypervisor("lab", inv.hosts, inv.vms, clock,
                            {"a-0": phases((0.05, 60), (0.9, 60)), "z-0": busy(0.1)}), clock


def test_sigterm_while_a_probe_samples_puts_its_caps_back_before_run_returns(tmp_path: Path) -> None:
    hv, clock = probing()
    run = Run(hv, clock, FakeLocks(), journals=tmp_path)
    raised: list[float] = []

    def on_raise() -> None:  # just before the probe's set-cap: SIGTERM 1 s into its sampling
        raised.append(clock.now)
        clock.at.append((clock.now + 1, run.controller.stop.set))

    run.cycles(7)  # up to t=60
    cap_before = hv.vms["a-0"].cap_cores
    hv.before[("set-cap", "a-0")] = on_raise
    run.controller.run()
    assert raised, run.events()
    probe = run.events("probe")[-1]
    assert probe["caps"]["a-0"] > probe["before"]["a-0"] == pytest.approx(cap_before)
    assert hv.vms["a-0"].cap_cores == pytest.approx(cap_before)
    assert run.events("probe-restore")[-1]["restored"] and not list(tmp_path.iterdir())
    assert run.events()[-1]["event"] == "stop"


def test_probe_caps_are_put_back_when_the_interval_plans_nothing(tmp_path: Path) -> None:
    hv, clock = probing()
    run = Run(hv, clock, FakeLocks(), journals=tmp_path)
    run.cycles(7)
    cap_before = hv.vms["a-0"].cap_cores
    run.controller.rebalancer.decide = lambda *_a: NO_PLAN  # type: ignore[method-assign]
    run.cycles(1)
    assert run.events("probe") and hv.vms["a-0"].cap_cores == pytest.approx(cap_before)
    assert not list(tmp_path.iterdir())


def test_probe_caps_a_busy_lock_kept_raised_are_put_back_at_the_next_interval(tmp_path: Path) -> None:
    hv, clock = probing()
    locks = FakeLocks()
    run = Run(hv, clock, locks, journals=tmp_path)
    run.cycles(7)
    cap_before = hv.vms["a-0"].cap_cores
    # Another command takes the cluster lock right after the probe raised a-0's cap, until the next interval.
    hv.before[("set-cap", "a-0")] = lambda: clock.at.append((clock.now + 0.5, lambda: locks.holders.update(
        {"cluster": "operator"})))
    run.controller.rebalancer.decide = lambda *_a: NO_PLAN  # type: ignore[method-assign]
    run.cycles(1)
    assert hv.vms["a-0"].cap_cores != pytest.approx(cap_before) and list(tmp_path.iterdir())
    assert any(e["action"] == "probe-restore" for e in run.events("lock-busy"))
    del locks.holders["cluster"]
    run.cycles(1)
    assert run.events("probe-restore") and not list(tmp_path.iterdir())


def test_a_killed_controller_probe_caps_are_put_back_by_the_next_one(tmp_path: Path) -> None:
    hv, clock = probing()
    hv.vms["a-0"] = replace(hv.vms["a-0"], cap_cores=0.7)
    dead_journal(tmp_path, cluster="lab", vms=[ProbeEntry("h0", "a-0", None, 0.5, 0.7)])
    run = Run(hv, clock, FakeLocks(), journals=tmp_path)
    run.cycles(1)
    assert run.events("probe-restore")[0]["restored"] == ["a-0: cap put back to 0.5 (a probe had raised it)"]
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------- signals held


def test_signals_held_are_delivered_after_the_block() -> None:
    import signal

    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, _f: got.append(s))
    try:
        with signals_held() as came:
            os.kill(os.getpid(), signal.SIGTERM)
            assert came == [signal.SIGTERM] and got == []
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_calibration_journals_need_no_hypervisor_and_a_gone_domain_is_moot(tmp_path: Path) -> None:
    path = dead_journal(tmp_path, CALIBRATION, domains=[{"uri": "test:///default", "domain": "gone",
                                                         "uuid": "00000000-0000-0000-0000-0000000000aa",
                                                         "scheduler": {"vcpu_period": 100000, "vcpu_quota": -1}}])
    pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    report = restore_journal(kinds=(CALIBRATION,), directory=tmp_path)
    assert report.restored == ("gone on test:///default: gone; nothing to put back",) and not path.exists()


# ---------------------------------------------------------------------------------------------- vcsched repair


def test_repair_lists_then_puts_back_what_killed_processes_journaled(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`vcsched repair` (dry run) names each journal of a gone process; `--apply` puts it back and removes it.

    Test-driver hosts: the calibrated domain is gone, which is the one outcome the test driver can show."""
    pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    from click.testing import CliRunner

    from cli.main import cli
    from hypervisor.testhosts import write_scale_cluster

    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    cluster = write_scale_cluster(tmp_path / "hosts", 2, 1).cluster_file
    path = dead_journal(tmp_path / "state" / "journal", CALIBRATION, domains=[
        {"uri": "test:///default", "domain": "gone", "uuid": "00000000-0000-0000-0000-0000000000aa"}])
    r = CliRunner().invoke(cli, ["repair", "--cluster", str(cluster)])
    assert r.exit_code == 0, r.output
    assert "a killed calibration" in r.stdout and "gone on test:///default" in r.stdout and path.exists()
    r = CliRunner().invoke(cli, ["repair", "--cluster", str(cluster), "--apply", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["journal"]["restored"] == ["gone on test:///default: gone; nothing to put back"]
    assert not path.exists()


def test_sigterm_while_observe_samples_ends_it_at_once_with_143(tmp_path: Path) -> None:
    """cli/signals.py: SIGTERM stops the sampling (no 30 s wait), and the command says nothing changed."""
    import signal
    import sys

    pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    from hypervisor.testhosts import write_scale_cluster

    cluster = write_scale_cluster(tmp_path / "hosts", 1, 1).cluster_file
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "observe", "--cluster", str(cluster), "--window", "30s",
                             "--probe"], cwd=Path(__file__).resolve().parents[1], text=True,
                            env={**os.environ, "VCSCHED_STATE_DIR": str(tmp_path / "state")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "sampling CPU use every ..." once it samples
    assert line.startswith("sampling"), line
    proc.send_signal(signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=20)  # well before the 30 s window would end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "vcsched: error: interrupted by SIGTERM: nothing changed" in err
