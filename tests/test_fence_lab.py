"""The lab's fence agent on real lab hosts: off is a power cut (libvirtd, virtlogd and QEMU killed), status says so.

Driven through vcsched's own fence runner (acting/fence.py) with the
cluster file ``lab up`` wrote, so the whole ClusterLabs interface is used:
options on stdin, off, then status by exit code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from acting.fence import fence_host, power_status, run_agent
from cli.common import load_cluster
from lab import Lab, up
from lab.daemons import daemon_pid, namespace_holders
from lab.state import LabLayout, pid_gone
from tests.lab_support import running_lab, skip_unless_lab_possible, start_lab_guest

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    skip_unless_lab_possible()
    with running_lab(2) as lab:
        yield lab


def test_lab_up_names_the_lab_agent_for_every_host(lab: Lab) -> None:
    cluster = load_cluster(str(lab.cluster_file))
    for h in cluster.hosts:
        assert h.fence is not None and h.fence.agent == str(lab.dir / "fence_vcsched_lab")
        assert dict(h.fence.options) == {"lab_dir": str(lab.dir), "plug": h.name}
    fence = cluster.hosts[0].fence
    assert fence is not None
    assert run_agent(fence, "monitor").returncode == 0
    assert run_agent(fence, "list").stdout.split() == ["h0,h0", "h1,h1"]
    assert "<resource-agent name=\"fence_vcsched_lab\"" in run_agent(fence, "metadata").stdout
    assert run_agent(fence, "on").returncode == 0  # already on (power saving wakes hosts with it: test_power_lab.py)


def test_off_kills_the_hosts_libvirtd_and_qemu_and_status_says_off(lab: Lab) -> None:
    layout = LabLayout(lab.dir)
    start_lab_guest(lab, host=1, wait=False)
    libvirtd = daemon_pid(layout, 1, "libvirtd")
    other = daemon_pid(layout, 0, "libvirtd")
    qemu = [p for p in namespace_holders(layout, 1)
            if b"qemu-system" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert libvirtd is not None and other is not None and qemu, "h1 runs a libvirtd and a guest"
    cluster = load_cluster(str(lab.cluster_file))
    h1 = cluster.host("h1")
    assert h1.fence is not None and power_status(h1.fence)[0] == "on"

    result = fence_host(h1)

    assert result.fenced, result.detail
    assert pid_gone(libvirtd) and all(pid_gone(p) for p in qemu)
    assert not namespace_holders(layout, 1)
    assert power_status(h1.fence)[0] == "off"
    assert daemon_pid(layout, 0, "libvirtd") == other, "the other host is untouched"
    # lab up powers it back on (a repair: fresh daemons in a fresh namespace)
    up(2, lab.dir)
    assert power_status(h1.fence)[0] == "on"
