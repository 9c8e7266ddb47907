"""The lab's guest: a stock Debian kernel and a busybox initramfs that burns CPU.

The guest does one thing the controller needs to observe: it boots under TCG
(``type='qemu'``; this machine's ``/dev/kvm`` is a nested scheme a stock kernel
does not boot on, docs/lab.md), prints a marker on its serial console, and runs
a busy loop so that libvirt's CPU accounting shows what a cap allows.  It is
~9 MB of kernel plus ~1 MB of initramfs and boots in about 11 s.

The kernel package is downloaded once (``apt-get download``) and only its
``vmlinuz`` kept; later labs copy it from any lab's image cache.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from hypervisor.lab.state import DEFAULT_LAB_DIR, GuestImage
from vcsched.errors import VcschedError

BOOT_MARKER = "VCSCHED-GUEST-UP"
BUSYBOX = Path("/bin/busybox")
#: Printed on the serial console at the start of each phase of a load pattern: ``VCSCHED-LOAD <percent> <seconds>``.
LOAD_MARKER = "VCSCHED-LOAD"
#: A load pattern (kernel command line ``vcsched.load=PHASE,PHASE,...``, repeated forever): each phase is
#: ``LEVEL:SECONDS`` with LEVEL ``busy`` (100), ``idle`` (0) or a percentage of every vCPU, kept by stopping
#: and continuing the CPU loops every 100 ms.  E.g. ``vcsched.load=idle:30,busy:30,50:20``.  Without the
#: option the guest spins flat out, as it always did.
LOAD_PATTERN = f"""
load=
for arg in $(cat /proc/cmdline); do
  case "$arg" in vcsched.load=*) load="${{arg#vcsched.load=}}" ;; esac
done
if [ -n "$load" ]; then
  n=$(grep -c ^processor /proc/cpuinfo)
  pids=
  i=0
  while [ "$i" -lt "$n" ]; do (while :; do :; done) & pids="$pids $!"; i=$((i + 1)); done
  kill -STOP $pids
  while :; do
    for ph in $(echo "$load" | tr , ' '); do
      lv="${{ph%%:*}}"; s="${{ph#*:}}"
      case "$lv" in busy) lv=100 ;; idle) lv=0 ;; esac
      echo "{LOAD_MARKER} $lv $s" > /dev/console
      if [ "$lv" -ge 100 ]; then kill -CONT $pids; sleep "$s"; kill -STOP $pids
      elif [ "$lv" -le 0 ]; then sleep "$s"
      else
        k=$((s * 10))
        while [ "$k" -gt 0 ]; do
          kill -CONT $pids; usleep $((lv * 1000)); kill -STOP $pids; usleep $(((100 - lv) * 1000)); k=$((k - 1))
        done
      fi
    done
  done
fi
"""
#: The initramfs' /init.  It mounts what busybox tools expect, announces itself
#: on the serial console (what a boot check waits for), and then spins one CPU
#: loop per vCPU so the guest uses all the CPU it is allowed (or follows its load pattern).
INIT_SCRIPT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo {BOOT_MARKER} > /dev/console
{LOAD_PATTERN}
n=$(grep -c ^processor /proc/cpuinfo)
i=1
while [ "$i" -lt "$n" ]; do (while :; do :; done) & i=$((i + 1)); done
while :; do :; done
"""

_KERNEL_PKG = re.compile(r"^(linux-image-6\.1\.0-(\d+)-amd64) ")


class ImageError(VcschedError):
    """The guest image cannot be built (no kernel package reachable, no busybox)."""


def kernel_package() -> str:
    """The newest signed Debian 6.1 amd64 kernel image package apt knows about."""
    out = subprocess.run(["apt-cache", "search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$"],
                         capture_output=True, text=True, check=False).stdout
    found = [(int(m.group(2)), m.group(1)) for line in out.splitlines() if (m := _KERNEL_PKG.match(line))]
    if not found:
        raise ImageError("no linux-image-6.1.0-*-amd64 package in apt's lists (run 'apt-get update')")
    return max(found)[1]


def build_initramfs(busybox: Path = BUSYBOX) -> bytes:
    """A gzip'd newc cpio holding busybox and /init (the format the kernel unpacks)."""
    if not busybox.is_file():
        raise ImageError(f"{busybox} is missing (install busybox-static)")
    with tempfile.TemporaryDirectory(prefix="vcl-initrd-") as tmp:
        root = Path(tmp)
        for d in ("bin", "dev", "proc", "sys"):
            (root / d).mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        (root / "bin" / "sh").symlink_to("busybox")
        init = root / "init"
        init.write_text(INIT_SCRIPT)
        init.chmod(0o755)
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        cpio = _cpio(busybox, root, names)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(cpio)
    return buf.getvalue()


def _cpio(busybox: Path, root: Path, names: list[str]) -> bytes:
    proc = subprocess.run([str(busybox), "cpio", "-o", "-H", "newc"], cwd=root,
                          input=("\n".join(names) + "\n").encode(), capture_output=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"busybox cpio failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def download_kernel(dest: Path) -> Path:
    """Download the kernel package with apt and extract only its vmlinuz to ``dest``."""
    pkg = kernel_package()
    with tempfile.TemporaryDirectory(prefix="vcl-kernel-", dir=dest.parent) as tmp:
        proc = subprocess.run(["apt-get", "download", "-q", pkg], cwd=tmp, capture_output=True, text=True,
                              check=False)
        debs = list(Path(tmp).glob("*.deb"))
        if proc.returncode != 0 or not debs:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ImageError(f"apt-get download {pkg} failed: {last}")
        x = subprocess.run(["dpkg-deb", "-x", str(debs[0]), tmp + "/x"], capture_output=True, text=True,
                           check=False)
        kernels = sorted(Path(tmp, "x", "boot").glob("vmlinuz-*"))
        if x.returncode != 0 or not kernels:
            raise ImageError(f"{debs[0].name} holds no boot/vmlinuz-* ({x.stderr.strip()})")
        _install(dest, kernels[0].read_bytes())
    return dest


def ensure_image(image_dir: Path, sources: Iterable[Path] = (DEFAULT_LAB_DIR / "image",)) -> GuestImage:
    """The lab's guest image in ``image_dir``, built on first use and cached there.

    The kernel is copied from another lab's cache (``sources``) when one has it,
    else downloaded; the initramfs is rebuilt whenever its content would change.
    """
    image_dir.mkdir(parents=True, exist_ok=True)
    kernel = image_dir / "vmlinuz"
    initrd = image_dir / "initrd.gz"
    if not kernel.is_file():
        for src in sources:
            if (src / "vmlinuz").is_file() and src.resolve() != image_dir.resolve():
                _install(kernel, (src / "vmlinuz").read_bytes())
                break
        else:
            download_kernel(kernel)
    stamp = image_dir / "initrd.recipe"
    recipe = initramfs_recipe()
    if not initrd.is_file() or not stamp.is_file() or stamp.read_text() != recipe:
        _install(initrd, build_initramfs())
        _install(stamp, recipe.encode())
    return GuestImage(kernel=kernel, initrd=initrd)


def _install(dest: Path, data: bytes) -> None:
    """Write ``dest`` atomically through a uniquely named temporary file.

    Several test sessions may build the same cache at once (each guest_boot_check
    fills the default lab's image dir); a reader then sees the old or the new
    file, never half of one.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def initramfs_recipe(busybox: Path = BUSYBOX) -> str:
    """A digest of what goes into the initramfs, so a cached one is rebuilt only when it would differ."""
    h = hashlib.sha256(INIT_SCRIPT.encode())
    if busybox.is_file():
        h.update(busybox.read_bytes())
    return h.hexdigest()
