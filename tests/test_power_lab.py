"""The lab's fence agent as a power interface: off, status off, on, status on, and the same host answers.

Power saving wakes a sleeping host through its agent's ``on`` and uses it again only once libvirt answers
with the same host UUID; the lab's agent must do that on real lab hosts (lab/fence_agent.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import libvirt
import pytest

from acting.fence import power_status, run_agent
from cli.common import load_cluster
from hypervisor.identity import uuid_from_capabilities
from lab import Lab
from lab.daemons import daemon_pid, namespace_holders
from lab.state import LabLayout
from tests.lab_support import own_lab

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with own_lab(2) as lab:
        yield lab


def host_uuid(uri: str) -> str | None:
    conn = libvirt.open(uri)
    try:
        return uuid_from_capabilities(conn.getCapabilities())
    finally:
        conn.close()


def test_off_then_on_brings_the_same_host_back(lab: Lab) -> None:
    layout = LabLayout(lab.dir)
    cluster = load_cluster(str(lab.cluster_file))
    h1 = cluster.host("h1")
    assert h1.power.agent is not None and h1.power.agent == h1.fence  # the power agent defaults to the fence agent
    before = host_uuid(cluster.connect_uri("h1"))
    assert before is not None and before == h1.uuid
    other = daemon_pid(layout, 0, "libvirtd")
    agent = h1.power.agent

    assert run_agent(agent, "off").returncode == 0
    assert power_status(agent)[0] == "off" and not namespace_holders(layout, 1)

    on = run_agent(agent, "on")
    assert on.returncode == 0, on.stderr
    assert "Powered ON" in on.stdout
    assert power_status(agent)[0] == "on"
    assert host_uuid(cluster.connect_uri("h1")) == before
    assert daemon_pid(layout, 0, "libvirtd") == other, "the other host is untouched"

    again = run_agent(agent, "on")  # already on: nothing to do, as the fence-agents answer
    assert again.returncode == 0 and "Already ON" in again.stdout
    assert run_agent(agent, "reboot").returncode == 1
