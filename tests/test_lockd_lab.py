"""virtlockd on the lab: libvirt itself refuses a second copy of a VM whose lease another host holds.

Every lab host runs virtlockd (``lock_manager = "lockd"``, one lockspace directory for all hosts: the lab's
stand-in for a lockspace on shared storage).  A guest holding a lease in that lockspace runs on h0; the same
domain started on h1 is refused by libvirt's lock manager ("resource busy"), and starts once h0's copy is gone
(its lease went with it).

The guest's lease is an explicit ``<lease>`` rather than a disk's automatic one: on one machine QEMU's own
image locking refuses a second writer of a disk file first (seen: 'Failed to get "write" lock'), which would hide
whether virtlockd refuses it; across machines on NFS it is virtlockd's lease on shared storage that does.
Disk leases are on too (``auto_disk_leases``): a guest with a disk holds one (the first test).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hypervisor.guest import guest_xml, make_disk
from lab import Lab
from lab.state import LabLayout
from tests.lab_support import running_lab, skip_unless_lab_possible

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def shared2() -> Iterator[Lab]:
    skip_unless_lab_possible()
    with running_lab(2, shared_storage=True) as lab:
        yield lab


def xml_with_lease(lab: Lab, host: int) -> str:
    """The lab guest ``leased`` (no disk) holding the lease ``leased`` in the lab's lockspace (libvirt's lockd
    names a lease's lockspace ``<target path>/<lockspace>``: the shared directory virtlockd was given)."""
    space = LabLayout(lab.dir).lockspace_dir
    lease = (f"<lease><lockspace>{space.name}</lockspace><key>leased</key><target path='{space.parent}'/>"
             "</lease>")
    return guest_xml("leased", lab.guest, partition=lab.hosts[host].partition, memory_mib=128).replace(
        "<devices>", f"<devices>{lease}", 1)


def test_a_guest_with_a_disk_holds_a_lease_in_the_shared_lockspace(shared2: Lab) -> None:
    import libvirt

    layout = LabLayout(shared2.dir)
    assert (layout.host_dir(0) / "etc" / "qemu-lockd.conf").read_text().count(str(layout.lockspace_dir)) == 1
    disk = make_disk(layout.shared_dir / "disked.img", 1 << 20)
    conn = libvirt.open(shared2.hosts[0].connect_uri)
    try:
        dom = conn.createXML(guest_xml("disked", shared2.guest, partition=shared2.hosts[0].partition,
                                       memory_mib=128, disk=disk), 0)
        assert [p for p in layout.lockspace_dir.iterdir() if p.is_file()], "a disk lease, by the path's hash"
        dom.destroy()
    finally:
        conn.close()


def test_a_second_copy_of_a_vm_whose_lease_is_held_is_refused_by_libvirt(shared2: Lab) -> None:
    import libvirt

    layout = LabLayout(shared2.dir)
    (layout.lockspace_dir / "leased").touch()  # a lease named in the XML must exist (disk leases are made)
    h0 = libvirt.open(shared2.hosts[0].connect_uri)
    h1 = libvirt.open(shared2.hosts[1].connect_uri)
    try:
        first = h0.createXML(xml_with_lease(shared2, 0), 0)
        with pytest.raises(libvirt.libvirtError) as refused:
            h1.createXML(xml_with_lease(shared2, 1), 0)
        message = str(refused.value)
        print(f"h1 refused: {message}")
        assert "resource busy" in message.lower() or "is locked" in message.lower(), message
        assert not [d for d in h1.listAllDomains(0) if d.name() == "leased" and d.isActive()]
        first.destroy()
        second = h1.createXML(xml_with_lease(shared2, 1), 0)  # the lease is free
        second.destroy()
    finally:
        for conn in (h0, h1):
            for dom in conn.listAllDomains(0):
                if dom.name() == "leased" and dom.isActive():
                    dom.destroy()
            conn.close()
