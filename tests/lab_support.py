"""The real-libvirt lab as pytest fixtures, for every integration test that needs hosts.

Use it from any test module (tests/conftest.py re-exports the fixture)::

    @pytest.mark.lab
    def test_cap_limits_cpu(lab2):
        with lab_guest(lab2, host=0) as dom:      # a booted TCG guest in a CPU loop
            ...                                    # dom is a libvirt.virDomain

``lab2`` brings up a 2-host lab in its own directory (``/var/tmp/vcl-XXXXXXXX``)
once per test session and tears it down at the end, asserting that no daemon,
guest process or cgroup partition is left.  It skips, with the reason, where
the lab cannot run (not root, packages missing, cgroups read-only, no TCG boot).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypervisor.lab import Lab, down, guest_boot_check, prerequisites_problem, status, up
from hypervisor.lab import cgroups as lab_cgroups
from hypervisor.lab.daemons import namespace_holders
from hypervisor.lab.guest import start_guest, wait_for_boot
from hypervisor.lab.state import LabLayout


def lab_leftovers(lab_dir: Path, n_hosts: int) -> list[str]:
    """What a stopped lab left behind: live daemons of its pid files, its partitions in any hierarchy."""
    layout = LabLayout(lab_dir)
    problems: list[str] = []
    st = status(lab_dir)
    for h in st.hosts:
        if h.libvirtd_pid or h.virtlogd_pid:
            problems.append(f"{h.name}: daemons still running ({h.libvirtd_pid}, {h.virtlogd_pid})")
    for i in range(n_hosts):
        for d in lab_cgroups.partition_dirs(layout.partition(i)):
            problems.append(f"partition left: {d}")
        holders = namespace_holders(layout, i)
        if holders:
            problems.append(f"h{i}: processes still in its namespace: {holders}")
    return problems


#: How the session's lab fixtures reach their hosts: ``VCSCHED_LAB_TRANSPORT=tls`` runs every lab test over TLS
#: (each host on its own loopback address), as scripts/test does in a second pass.
LAB_TRANSPORT = os.environ.get("VCSCHED_LAB_TRANSPORT", "unix")


def new_lab_dir(transport: str = "unix") -> Path:
    """A fresh, short state directory (unix socket paths must stay under 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix="vcl-tls-" if transport == "tls" else "vcl-", dir="/var/tmp"))


def skip_unless_lab_possible() -> None:
    reason = guest_boot_check()
    if reason is not None:
        pytest.skip(f"lab unavailable: {reason}")


@contextlib.contextmanager
def running_lab(n_hosts: int, transport: str = "unix", **options: Any) -> Iterator[Lab]:
    """An ``n_hosts`` lab in a fresh directory of its own for the ``with`` block, then down and purged.

    Teardown fails the fixture if any daemon, guest process or cgroup partition outlived ``lab down``.
    ``options`` go to :func:`hypervisor.lab.up` (``cores``, ``shared_storage``, ...).
    """
    d = new_lab_dir(transport)
    try:
        yield up(n_hosts, d, transport=transport, **options)
    finally:
        down(d)
        left = lab_leftovers(d, n_hosts)
        down(d, purge=True)
        assert not left, f"lab teardown left: {left}"


@contextlib.contextmanager
def own_lab(n_hosts: int, **options: Any) -> Iterator[Lab]:
    """A lab a module keeps to itself (its tests signal, kill or measure what a shared lab's other users would
    feel): skipped with the missing prerequisite's reason, else :func:`running_lab`."""
    problem = prerequisites_problem()
    if problem:
        pytest.skip(f"lab unavailable: {problem}")
    with running_lab(n_hosts, **options) as lab:
        yield lab


@pytest.fixture(scope="session")
def lab2() -> Iterator[Lab]:
    """A running 2-host lab (hosts h0, h1; cores = 1 each), shared by the whole test session."""
    skip_unless_lab_possible()
    with running_lab(2, LAB_TRANSPORT) as lab:
        yield lab


def start_lab_guest(lab: Lab, host: int = 0, name: str | None = None, *, vcpus: int = 1, memory_mib: int = 128,
                    wait: bool = True) -> Any:
    """Start the lab's CPU-loop guest on ``lab.hosts[host]``; returns its ``libvirt.virDomain``.

    With ``wait`` it returns once the guest printed its boot marker (it is then
    in its busy loop).  The guest is transient and in the host's partition, so
    ``lab down`` removes it whatever happens to the test.
    """
    import libvirt

    h = lab.hosts[host]
    name = name or f"t-{uuid.uuid4().hex[:8]}"
    console = LabLayout(lab.dir).host_dir(host) / "console" / f"{name}.log"
    conn = libvirt.open(h.connect_uri)
    dom = start_guest(conn, name, lab.guest, partition=h.partition, console_log=console, vcpus=vcpus,
                      memory_mib=memory_mib)
    if wait:
        wait_for_boot(console)
    return dom


def copies(lab: Lab, name: str) -> list[tuple[str, bool]]:
    """``(host, active)`` for every copy of domain ``name`` on the lab's hosts, as libvirt lists them."""
    import libvirt

    out = []
    for h in lab.hosts:
        conn = libvirt.open(h.connect_uri)
        try:
            out += [(h.name, bool(d.isActive())) for d in conn.listAllDomains(0) if d.name() == name]
        finally:
            conn.close()
    return out


def destroy_everywhere(lab: Lab, name: str) -> None:
    """Destroy (and undefine) guest ``name`` on whichever lab host has it now (it may have migrated)."""
    import libvirt

    for h in lab.hosts:
        conn = libvirt.open(h.connect_uri)
        try:
            # Listing instead of lookupByName: a miss is normal here and libvirt would print it.
            for dom in conn.listAllDomains(0):
                if dom.name() != name:
                    continue
                try:
                    persistent = dom.isPersistent()  # a transient domain is gone once destroyed
                    if dom.isActive():
                        dom.destroy()
                    if persistent:
                        dom.undefine()
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:  # gone meanwhile: what we wanted
                        raise
        finally:
            conn.close()


@contextlib.contextmanager
def lab_guest(lab: Lab, host: int = 0, name: str | None = None, **kwargs: Any) -> Iterator[Any]:
    """A booted CPU-loop guest for the duration of a ``with`` block (destroyed wherever it ends up)."""
    dom = start_lab_guest(lab, host, name, **kwargs)
    try:
        yield dom
    finally:
        destroy_everywhere(lab, dom.name())
