"""A minimal TCG guest on a lab host that burns CPU, writes to its disk or sends packets (tests, calibration).

This is the lab's own canary, not the controller's way of creating VMs (that
is the plan applier in :mod:`hypervisor`): it is what an integration test or
the calibration needs when it just wants "a guest that uses CPU, here" (or
disk, or network: :data:`lab.image.WORKLOADS`).

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
import subprocess
import time
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from lab.image import BOOT_MARKER, NO_DRIVER_MARKER, WORKLOADS
from lab.state import GuestImage
from vcsched.errors import VcschedError


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


def boot_directly(image: GuestImage, timeout_s: float = 120.0) -> float:
    """Boot the image once under bare ``qemu-system-x86_64`` (TCG); seconds to the boot marker.

    This is the lab's canary: it proves a guest boots here without involving
    libvirt, so a failing lab test can tell "no guest can boot" from "the lab
    is broken".
    """
    accel = "kvm" if image.domain_type == "kvm" else "tcg"
    cmd = ["qemu-system-x86_64", "-accel", accel, "-m", "128", "-smp", "1", "-kernel", str(image.kernel),
           "-initrd", str(image.initrd), "-append", image.cmdline, "-display", "none", "-nodefaults",
           "-serial", "stdio", "-no-reboot"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    seen = b""
    try:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() - t0 < timeout_s:
            if not sel.select(timeout=0.5):
                continue
            chunk = proc.stdout.read1(4096)  # type: ignore[attr-defined]
            if not chunk:
                break
            seen = (seen + chunk)[-8192:]
            if BOOT_MARKER.encode() in seen:
                return time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    tail = seen.decode(errors="replace").strip().splitlines()[-1:] or ["no console output"]
    raise GuestError(f"{accel} guest did not boot within {timeout_s:g} s (last console line: {tail[0]})")
