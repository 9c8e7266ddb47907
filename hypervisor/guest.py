"""The minimal TCG guest that burns CPU, writes to its disk or sends packets: its domain XML, starting it on a
libvirt connection, and waiting for it to boot (the lab's tests and the calibration's subjects both boot it).

This is not the controller's way of creating VMs (that is the plan applier: acting/executor.py over
:mod:`hypervisor.libvirt_backend`): it is what an integration test or the calibration needs when it just wants
"a guest that uses CPU, here" (or disk, or network: :data:`WORKLOADS`).  Its image (kernel and busybox
initramfs, whose /init prints :data:`BOOT_MARKER`) is built by the lab (lab/image.py); the calibration
imports this module, not the lab.

An I/O guest gets a raw, file-backed virtio disk (:func:`make_disk`) and a
virtio NIC of type ``ethernet``: a tap device on the machine with no address,
no bridge and no route, so its frames reach the machine's kernel and stop
there (the sender addresses a MAC nobody has, see
:data:`lab.image.SINK_MAC`).  libvirt names the tap (``vnetN``)
and finds a free name itself, so several lab daemons on one machine do not
collide.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypervisor.xmltext import escape, quoteattr
from vcsched.errors import VcschedError

#: The guest kernel command line: serial console for the boot marker, reboot-free
#: panic so a broken guest stops instead of looping.  ``no_timer_check``: a TCG vCPU
#: starved by a loaded machine misses the early IO-APIC timer check, and the kernel
#: panics ("IO-APIC + timer doesn't work!"); seen with five guests booting at once
#: beside other work, where one never came up.  ``cryptomgr.notests``: the kernel's
#: crypto self-tests were its slowest initcalls under TCG (crypto_algapi_init 0.76 s,
#: crypto_kdf108_init 0.19 s); without them a boot took 5.6 s instead of 6.7 s (mean
#: of 4 each, machine at load 6).  The guest runs no crypto worth testing.
GUEST_CMDLINE = "console=ttyS0 panic=-1 quiet no_timer_check cryptomgr.notests"

#: Printed on the guest's serial console once it runs its workload.
BOOT_MARKER = "VCSCHED-GUEST-UP"
#: Printed instead of the boot marker when an I/O workload finds no device or driver to run on.
NO_DRIVER_MARKER = "VCSCHED-GUEST-NO-DEVICE"
#: The workloads ``vcsched.work=`` selects (see the module docstring).
WORKLOADS = ("cpu", "disk", "net", "sink")


@dataclass(frozen=True)
class GuestImage:
    """The default guest boot of a lab: a TCG-bootable kernel and busybox initramfs."""

    kernel: Path
    initrd: Path
    cmdline: str = GUEST_CMDLINE
    domain_type: str = "qemu"


class GuestError(VcschedError):
    """The lab guest did not start or boot."""


#: Size of a lab guest's scratch disk: the disk writer wraps around at its end.
DISK_BYTES = 64 << 20


def make_disk(path: Path, size: int = DISK_BYTES) -> Path:
    """A raw disk file for one guest, every block written (each guest needs its own: QEMU locks a writable image).

    Written, not sparse: the guest writes with O_DIRECT, and on ext4 a direct
    write into a hole (or a fallocated, still unwritten extent) must commit a
    journal transaction first.  While the host does other I/O those commits
    stall a write for hundreds of milliseconds, so the measured rate dropped
    below a disk cap for seconds: the lab measured the host's file system,
    not the cap.  Overwriting written blocks is data I/O only.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk = bytes(1 << 20)
    with path.open("wb") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(bytes(size % len(chunk)))
        f.flush()
        os.fsync(f.fileno())
    return path


def guest_xml(name: str, image: GuestImage, *, partition: str | None = None, memory_mib: int = 128,
              vcpus: int = 1, console_log: Path | None = None, workload: str = "cpu", disk: Path | None = None,
              nic: bool = False, metadata: str = "") -> str:
    """Domain XML of the minimal guest (docs/lab.md): TCG, kernel+initrd boot; a disk and a NIC if asked for.

    No USB controller and no balloon: fewer emulated devices means a faster TCG
    boot and less emulator-thread CPU on top of the vCPU's.  ``workload`` goes
    on the kernel command line (``vcsched.work=``, read by the guest's /init);
    ``metadata`` is put in ``<metadata>`` as is (a template for vcsched's own
    create steps, which replace it).
    """
    if memory_mib < 32:
        raise GuestError(f"memory_mib: {memory_mib} is below the 32 MiB the guest kernel needs")
    if vcpus < 1:
        raise GuestError(f"vcpus: {vcpus} is below 1")
    if workload not in WORKLOADS:
        raise GuestError(f"workload: {workload!r} is not one of {', '.join(WORKLOADS)}")
    resource = f"<resource><partition>{escape(partition)}</partition></resource>" if partition else ""
    serial = (f"<serial type='file'><source path={quoteattr(str(console_log))}/><target port='0'/></serial>"
              if console_log else "<serial type='null'/>")
    cmdline = image.cmdline if workload == "cpu" else f"{image.cmdline} vcsched.work={workload}"
    # cache='none': the guest's writes reach the file with O_DIRECT, as on a production host; the
    # limit itself is QEMU's block throttling, which acts before any cache.
    devices = (f"<disk type='file' device='disk'><driver name='qemu' type='raw' cache='none'/>"
               f"<source file={quoteattr(str(disk))}/><target dev='vda' bus='virtio'/></disk>" if disk else "")
    if nic:
        devices += "<interface type='ethernet'><model type='virtio'/></interface>"
    return f"""<domain type={quoteattr(image.domain_type)}>
  <name>{escape(name)}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>{vcpus}</vcpu>
  {f"<metadata>{metadata}</metadata>" if metadata else ""}
  {resource}
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>{escape(str(image.kernel))}</kernel>
    <initrd>{escape(str(image.initrd))}</initrd>
    <cmdline>{escape(cmdline)}</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    {devices}
    {serial}
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
"""


def start_guest(conn: Any, name: str, image: GuestImage, *, partition: str | None, console_log: Path | None = None,
                memory_mib: int = 128, vcpus: int = 1, persistent: bool = False, workload: str = "cpu",
                disk: Path | None = None, nic: bool = False) -> Any:
    """Define (if ``persistent``) and start the minimal guest on ``conn``; returns the ``virDomain``."""
    xml = guest_xml(name, image, partition=partition, memory_mib=memory_mib, vcpus=vcpus, console_log=console_log,
                    workload=workload, disk=disk, nic=nic)
    if persistent:
        dom = conn.defineXML(xml)
        dom.create()
        return dom
    return conn.createXML(xml, 0)


def wait_for_boot(console_log: Path, timeout_s: float = 120.0) -> float:
    """Seconds until the guest printed its boot marker on the serial console file."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            text = console_log.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        if BOOT_MARKER in text:
            return time.monotonic() - t0
        if NO_DRIVER_MARKER in text:
            line = next(ln for ln in text.splitlines() if NO_DRIVER_MARKER in ln)
            raise GuestError(f"guest cannot run its workload: {line.split(NO_DRIVER_MARKER, 1)[1].strip()}")
        time.sleep(0.2)
    raise GuestError(f"guest did not print {BOOT_MARKER} on {console_log} within {timeout_s:g} s")
