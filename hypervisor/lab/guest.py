"""A minimal CPU-burning TCG guest on a lab host (for tests and calibration).

This is the lab's own canary, not the controller's way of creating VMs (that
is the plan applier in :mod:`hypervisor`): it is what an integration test or
the calibration needs when it just wants "a guest that uses CPU, here".
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from hypervisor.lab.image import BOOT_MARKER
from hypervisor.lab.state import GuestImage
from vcsched.errors import VcschedError


class GuestError(VcschedError):
    """The lab guest did not start or boot."""


def guest_xml(name: str, image: GuestImage, *, partition: str | None = None, memory_mib: int = 128,
              vcpus: int = 1, console_log: Path | None = None) -> str:
    """Domain XML of the minimal guest (docs/lab.md): TCG, kernel+initrd boot, no disk, no NIC.

    No USB controller and no balloon: fewer emulated devices means a faster TCG
    boot and less emulator-thread CPU on top of the vCPU's.
    """
    if memory_mib < 32:
        raise GuestError(f"memory_mib: {memory_mib} is below the 32 MiB the guest kernel needs")
    if vcpus < 1:
        raise GuestError(f"vcpus: {vcpus} is below 1")
    resource = f"<resource><partition>{escape(partition)}</partition></resource>" if partition else ""
    serial = (f"<serial type='file'><source path={quoteattr(str(console_log))}/><target port='0'/></serial>"
              if console_log else "<serial type='null'/>")
    return f"""<domain type={quoteattr(image.domain_type)}>
  <name>{escape(name)}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>{vcpus}</vcpu>
  {resource}
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>{escape(str(image.kernel))}</kernel>
    <initrd>{escape(str(image.initrd))}</initrd>
    <cmdline>{escape(image.cmdline)}</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    {serial}
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
"""


def start_guest(conn: Any, name: str, image: GuestImage, *, partition: str | None, console_log: Path | None = None,
                memory_mib: int = 128, vcpus: int = 1, persistent: bool = False) -> Any:
    """Define (if ``persistent``) and start the minimal guest on ``conn``; returns the ``virDomain``."""
    xml = guest_xml(name, image, partition=partition, memory_mib=memory_mib, vcpus=vcpus, console_log=console_log)
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
            if BOOT_MARKER in console_log.read_text(errors="replace"):
                return time.monotonic() - t0
        except FileNotFoundError:
            pass
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
