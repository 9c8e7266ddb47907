"""The lab's canary: boot the guest image once under bare QEMU, without libvirt (docs/lab.md).

The guest itself (its domain XML, starting it, waiting for its boot) is :mod:`hypervisor.guest`: the
calibration boots it too, and calibration does not import the lab.
"""

from __future__ import annotations

import subprocess
import time

from hypervisor.guest import BOOT_MARKER, GuestError, GuestImage


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
