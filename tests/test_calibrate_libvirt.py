"""The libvirt calibration backend: refusals anywhere, real caps on a lab guest.

The lab tests boot one TCG guest in a CPU loop on the session's ``lab2`` lab
and skip, with the reason, where no guest can boot.  Bounds are loose (other
work shares this machine): they catch a cap that does not bite, not precision.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from vcsched.errors import InputError

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed")

from calibration.experiment import measure  # noqa: E402
from hypervisor.caps_probe import LibvirtSubjects, vcpu_quota_for  # noqa: E402
from tests.lab_support import lab_guest  # noqa: E402


def test_quota_is_per_vcpu_thread() -> None:
    # Half a CPU over a 2-vCPU guest: each vCPU thread gets a quarter of the period.
    assert vcpu_quota_for(0.5, 2) == 25_000
    assert vcpu_quota_for(0.25, 1) == 25_000
    assert vcpu_quota_for(None, 1) == -1


def test_quota_refuses_caps_beyond_the_guest_vcpus() -> None:
    with pytest.raises(InputError, match="outside"):
        vcpu_quota_for(1.5, 1)


def test_the_test_driver_is_refused_naming_the_host() -> None:
    with pytest.raises(InputError, match=r"host test:///default: cannot set caps"):
        LibvirtSubjects("test:///default", ["test"], force=True)


def test_a_domain_vcsched_does_not_manage_is_refused_unless_forced() -> None:
    with pytest.raises(InputError, match=r"--domain test: not managed by vcsched on test:///default.*--force"):
        LibvirtSubjects("test:///default", ["test"])


def test_cli_refuses_an_unmanaged_domain_naming_force() -> None:
    r = CliRunner().invoke(
        cli, ["calibrate", "--backend", "libvirt", "--connect", "test:///default", "--domain", "test"]
    )
    assert r.exit_code == 2, r.output
    assert "not managed by vcsched" in r.stderr and "--force" in r.stderr


def test_an_unknown_domain_is_refused_naming_it() -> None:
    with pytest.raises(InputError, match="--domain nosuch: no such domain"):
        LibvirtSubjects("test:///default", ["nosuch"])


def test_cli_refusal_is_one_line_exit_2() -> None:
    r = CliRunner().invoke(
        cli, ["calibrate", "--backend", "libvirt", "--connect", "test:///default", "--domain", "test"]
    )
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "test:///default" in lines[0]


def test_cli_needs_one_guest_per_worker() -> None:
    r = CliRunner().invoke(
        cli, ["calibrate", "--backend", "libvirt", "--connect", "test:///default", "--domain", "a", "--workers", "2"]
    )
    assert r.exit_code == 2
    assert "2 worker(s) need 2" in r.stderr


@pytest.fixture(scope="module")
def guest(lab2: Any) -> Iterator[tuple[str, Any]]:
    """(host URI, domain) of one booted CPU-loop guest on the lab's first host."""
    with lab_guest(lab2, host=0) as dom:
        yield lab2.hosts[0].connect_uri, dom


@pytest.mark.lab
@pytest.mark.exclusive
def test_a_quarter_cap_gives_the_guest_about_a_quarter_cpu(guest: tuple[str, Any]) -> None:
    uri, dom = guest
    with LibvirtSubjects(uri, [dom.name()], force=True) as s:
        s.set_cap(0, 0.25)
        (m,) = measure(s, [0], 2.0)
    assert 0.15 <= m.share <= 0.35


@pytest.mark.lab
@pytest.mark.exclusive
def test_closing_restores_the_guest_as_found(guest: tuple[str, Any]) -> None:
    uri, dom = guest
    flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
    before = dom.schedulerParametersFlags(flags), dom.vcpuPinInfo(flags), dom.emulatorPinInfo(flags)
    with LibvirtSubjects(uri, [dom.name()], cpu=0, force=True) as s:
        assert dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED  # idle subjects must not compete with measured ones
        s.set_cap(0, 0.1)
        assert dom.schedulerParametersFlags(flags)["vcpu_quota"] == 10_000
    assert (dom.schedulerParametersFlags(flags), dom.vcpuPinInfo(flags), dom.emulatorPinInfo(flags)) == before
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING


@pytest.mark.lab
@pytest.mark.exclusive
def test_calibrate_command_on_a_lab_guest(guest: tuple[str, Any]) -> None:
    uri, dom = guest
    r = CliRunner().invoke(
        cli,
        ["calibrate", "--allow-unreliable", "--backend", "libvirt", "--connect", uri, "--domain", dom.name(),
         "--force",
         "--caps", "0.5", "--duration", "1.2", "--window", "0.5", "--pairs", "1", "--json"],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["unit"] == "vCPU s/s" and doc["bare"]["rate"] == 1.0
    (run,) = doc["runs"]
    assert 0.4 <= run["measured"][0]["share"] <= 0.6
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING


@pytest.mark.lab
@pytest.mark.exclusive
def test_calibrate_boots_its_own_guests_from_the_cluster_file_and_removes_them(lab2: Any) -> None:
    uri = lab2.hosts[0].connect_uri
    r = CliRunner().invoke(
        cli,
        ["calibrate", "--allow-unreliable", "--backend", "libvirt", "--connect", uri, "--cluster",
         str(lab2.cluster_file),
         "--caps", "0.25", "--duration", "1.2", "--window", "0.5", "--pairs", "1", "--json"],
    )
    assert r.exit_code == 0, r.output
    (run,) = json.loads(r.stdout)["runs"]
    assert 0.15 <= run["measured"][0]["share"] <= 0.35
    conn = libvirt.open(uri)
    try:
        left = [d.name() for d in conn.listAllDomains(0) if d.name().startswith("vcsched-calib-")]
    finally:
        conn.close()
    assert left == []


def test_a_cluster_file_without_a_guest_section_is_refused(tmp_path: Any) -> None:
    f = tmp_path / "cluster.toml"
    f.write_text('name = "c"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    r = CliRunner().invoke(
        cli, ["calibrate", "--backend", "libvirt", "--connect", "test:///default", "--cluster", str(f)]
    )
    assert r.exit_code == 2
    assert "no [guest]" in r.stderr and str(f) in r.stderr


# ---------------------------------------------------------------------------------------------- a managed domain


@pytest.fixture
def managed_host(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A test-driver host running web-0, a VM vcsched manages, in a cluster file; its own state directory."""
    from tests.builders import test_driver_node
    from vcsched.inventory import VmMeta

    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("VCSCHED_COORDINATION", raising=False)
    (tmp_path / "h0.xml").write_text(test_driver_node([("web-0", VmMeta("web", 0.5, 512 << 20, 1))], 2, 0))
    uri = f"test://{tmp_path}/h0.xml"
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'name = "c"\n[[hosts]]\nname = "h0"\nuri = "{uri}"\n')
    return uri, cluster, f"file://{tmp_path}/coord"


def calibrate(uri: str, *args: Any) -> Any:
    return CliRunner().invoke(cli, ["calibrate", "--backend", "libvirt", "--connect", uri, "--domain", "web-0",
                                    "--duration", "2", *[str(a) for a in args]])


@pytest.mark.parametrize("extra", [[], ["--force"]])
def test_a_managed_domain_is_refused_without_its_clusters_lock(managed_host: Any, extra: list[str]) -> None:
    """Issue 37: `calibrate --domain D` re-capped a VM vcsched manages without the cluster lock, racing the
    commands and the controller that cap it under that lock.  Without --cluster it is refused (exit 1), one line;
    --force is for domains vcsched does not manage and does not lift it."""
    uri, _, _ = managed_host
    r = calibrate(uri, *extra)
    assert r.exit_code == 1, r.output
    assert r.stderr.strip() == (f"vcsched: error: --domain web-0: managed by vcsched (virtual cluster 'web') on "
                                f"{uri}; a calibration pins, pauses and re-caps it, so only under its cluster's "
                                "lock: pass --cluster FILE --allow-managed")


def test_with_its_cluster_a_managed_domain_still_needs_allow_managed(managed_host: Any) -> None:
    uri, cluster, coord = managed_host
    r = calibrate(uri, "--cluster", cluster, "--coordination", coord)
    assert r.exit_code == 1 and "pass --cluster FILE --allow-managed" in r.stderr, r.output


def test_with_allow_managed_the_calibration_holds_the_cluster_lock_throughout(managed_host: Any,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """While the calibration has its domain, the lock every command that changes the cluster's hosts takes is
    busy; once it is over, it is free again.  (The test driver then refuses the caps themselves: exit 2.)"""
    import cli.calibrate as command
    from acting.lock import LockBusy

    uri, cluster, coord = managed_host
    real = command.open_subjects
    during: list[str] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            the_lock(cluster, coord).acquire()
        except LockBusy as exc:
            during.append(str(exc))
        return real(*args, **kwargs)

    monkeypatch.setattr(command, "open_subjects", spy)
    r = calibrate(uri, "--cluster", cluster, "--allow-managed", "--coordination", coord)
    assert r.exit_code == 2 and "cannot set caps" in r.stderr, r.output  # past the managed check, under the lock
    assert len(during) == 1 and during[0].startswith("cluster 'c' is locked by "), during
    after = CliRunner().invoke(cli, ["cordon", "h0", "--cluster", str(cluster), "--coordination", coord])
    assert after.exit_code == 0, after.output


def the_lock(cluster_file: Any, coord: str) -> Any:
    """The cluster lock of ``cluster_file``, as the unit of work of every command that changes its hosts takes it."""
    from acting.unit_of_work import cluster_lock
    from cli.common import load_cluster
    from hypervisor.libvirt_backend import LibvirtHypervisor

    cluster = load_cluster(str(cluster_file))
    with LibvirtHypervisor(cluster) as hv:
        return cluster_lock(cluster, hv, coord)


def test_a_calibration_is_refused_while_the_cluster_is_locked(managed_host: Any) -> None:
    uri, cluster_file, coord = managed_host
    lock = the_lock(cluster_file, coord)
    lock.acquire()
    try:
        r = calibrate(uri, "--cluster", cluster_file, "--allow-managed", "--coordination", coord)
    finally:
        lock.release()
    assert r.exit_code == 1 and "cluster 'c' is locked by" in r.stderr and "nothing changed" in r.stderr, r.output


def test_allow_managed_without_a_cluster_or_a_host_outside_it_is_bad_input(managed_host: Any) -> None:
    uri, cluster, coord = managed_host
    r = calibrate(uri, "--allow-managed")
    assert r.exit_code == 2 and "--allow-managed: only with" in r.stderr, r.output
    r = calibrate("test:///default", "--cluster", cluster, "--allow-managed", "--coordination", coord)
    assert r.exit_code == 2 and "--connect: 'test:///default' is not a host of cluster file" in r.stderr, r.output
