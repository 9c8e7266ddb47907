"""The lab's guest: a stock Debian kernel and a busybox initramfs that burns CPU, writes to disk or sends packets.

The guest does one thing the controller needs to observe: it boots under TCG
(``type='qemu'``; this machine's ``/dev/kvm`` is a nested scheme a stock kernel
does not boot on, docs/lab.md), prints a marker on its serial console, and then
runs its *workload*, chosen on the kernel command line (``vcsched.work=``):

* ``cpu`` (the default, what every CPU test uses): one busy loop per vCPU, so
  libvirt's CPU accounting shows what a cap allows;
* ``disk``: ``dd`` of zeros onto ``/dev/vda`` with O_DIRECT, over and over, so
  ``blockStats`` shows what a ``<iotune>`` limit allows;
* ``net``: the kernel's packet generator (pktgen) sends 1500-byte frames out of
  ``eth0`` as fast as it can, to a unicast MAC address nobody has
  (:data:`SINK_MAC`): the host's tap drops them at layer 2, so nothing is
  routed anywhere, and ``interfaceStats`` shows what left the guest;
* ``sink``: ``eth0`` up and nothing else (a receiver for inbound tests).

The I/O workloads need the virtio drivers, which Debian builds as modules:
they are taken from the same kernel package as ``vmlinuz`` (:data:`MODULES`,
loaded with ``insmod`` in dependency order) and only for those workloads, so
the CPU guest boots exactly as before.  It is ~9 MB of kernel plus ~1.3 MB of
initramfs.

**The kernel boots uncompressed, by its PVH entry.**  A bzImage boots
through the BIOS and then decompresses itself, which under TCG is most of the
boot: the bare-QEMU boot to the marker took 5.6-6.2 s, 3.5-4.0 s of it
before the kernel printed anything.  Debian's kernel is built with a PVH
entry point (an ELF note, ``XEN_ELFNOTE_PHYS32_ENTRY``), so the ELF image
inside the bzImage (:func:`extract_vmlinux`), given to QEMU as ``-kernel``
(libvirt's ``<kernel>``), starts in protected mode with nothing to
decompress: 2.5-2.7 s to the marker, measured the same way.  A kernel whose
payload cannot be unpacked here (zstd) or that has no PVH entry boots as the
bzImage, as before.

The kernel package is downloaded once (``apt-get download``) and only its
``vmlinuz`` and those modules kept; later labs copy them from any lab's image
cache.  A cache holding a kernel but not its modules (written by an older
vcsched) gets the modules of that exact kernel version from apt; if apt does
not have it any more, the I/O workloads say so on the console
(:data:`NO_DRIVER_MARKER`) instead of running.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path

from hypervisor.files import write_atomic
from hypervisor.guest import BOOT_MARKER, NO_DRIVER_MARKER, GuestImage
from lab.state import DEFAULT_LAB_DIR, guest_cmdline
from vcsched.errors import VcschedError

#: The image cache's files are readable by everyone (the lab's daemons read them); several test sessions may
#: fill one cache at once, so each file is written atomically (hypervisor/files.py).
CACHE_MODE = 0o644

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
#: Destination of the packet sender: a locally administered unicast address no interface has, so the
#: host's kernel drops every frame at layer 2 (PACKET_OTHERHOST) and nothing is routed or bridged anywhere.
SINK_MAC = "02:00:5e:00:53:01"
#: Kernel modules the I/O workloads load, in dependency order (``depends=`` of each .ko in Debian's 6.1).
MODULES = ("virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "virtio_blk",
           "failover", "net_failover", "virtio_net", "pktgen")
#: The initramfs' /init.  It mounts what busybox tools expect, reads its workload from the kernel command
#: line, announces itself on the serial console (what a boot check waits for), and runs the workload
#: (``cpu``: one CPU loop per vCPU, or its load pattern).
INIT_SCRIPT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
work=cpu
for arg in $(cat /proc/cmdline); do
  case "$arg" in vcsched.work=*) work="${{arg#vcsched.work=}}" ;; esac
done
nodev() {{ echo "{NO_DRIVER_MARKER} $1" > /dev/console; while :; do sleep 3600; done; }}
if [ "$work" != cpu ]; then
  for m in {" ".join(MODULES)}; do
    [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko
  done
fi
case "$work" in
disk)
  i=0; while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  [ -b /dev/vda ] || nodev "no /dev/vda (no virtio disk, or no virtio_blk module)"
  echo {BOOT_MARKER} > /dev/console
  while :; do dd if=/dev/zero of=/dev/vda bs=64k oflag=direct 2>/dev/null; done
  ;;
net|sink)
  i=0; while [ ! -d /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  [ -d /sys/class/net/eth0 ] || nodev "no eth0 (no virtio NIC, or no virtio_net module)"
  echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6
  ip link set eth0 up
  if [ "$work" = sink ]; then echo {BOOT_MARKER} > /dev/console; while :; do sleep 3600; done; fi
  [ -d /proc/net/pktgen ] || nodev "no pktgen module"
  echo "add_device eth0" > /proc/net/pktgen/kpktgend_0
  for c in "count 0" "pkt_size 1500" "delay 0" "dst_mac {SINK_MAC}"; do echo "$c" > /proc/net/pktgen/eth0; done
  echo {BOOT_MARKER} > /dev/console
  while :; do echo start > /proc/net/pktgen/pgctrl; sleep 1; done
  ;;
*)
  echo {BOOT_MARKER} > /dev/console
{LOAD_PATTERN}
  n=$(grep -c ^processor /proc/cpuinfo)
  i=1
  while [ "$i" -lt "$n" ]; do (while :; do :; done) & i=$((i + 1)); done
  while :; do :; done
  ;;
esac
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


def build_initramfs(busybox: Path = BUSYBOX, modules: Path | None = None) -> bytes:
    """A gzip'd newc cpio holding busybox, /init and the :data:`MODULES` found in ``modules`` (the format the
    kernel unpacks)."""
    if not busybox.is_file():
        raise ImageError(f"{busybox} is missing (install busybox-static)")
    with tempfile.TemporaryDirectory(prefix="vcl-initrd-") as tmp:
        root = Path(tmp)
        for d in ("bin", "dev", "proc", "sys", "lib", "lib/modules"):
            (root / d).mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        (root / "bin" / "sh").symlink_to("busybox")
        init = root / "init"
        init.write_text(INIT_SCRIPT)
        init.chmod(0o755)
        for ko in _module_files(modules):
            shutil.copy2(ko, root / "lib" / "modules" / ko.name)
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        cpio = _cpio(busybox, root, names)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(cpio)
    return buf.getvalue()


def _module_files(modules: Path | None) -> list[Path]:
    if modules is None:
        return []
    return [modules / f"{m}.ko" for m in MODULES if (modules / f"{m}.ko").is_file()]


def _cpio(busybox: Path, root: Path, names: list[str]) -> bytes:
    proc = subprocess.run([str(busybox), "cpio", "-o", "-H", "newc"], cwd=root,
                          input=("\n".join(names) + "\n").encode(), capture_output=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"busybox cpio failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def kernel_version(vmlinuz: Path) -> str | None:
    """The release a bzImage announces (``6.1.0-56-amd64``), from its x86 boot header; None if not a bzImage.

    The setup header's ``kernel_version`` field (offset 0x20E) points, 0x200
    bytes further, to the ``uname -r`` string followed by the build banner.
    """
    try:
        with vmlinuz.open("rb") as f:
            head = f.read(0x10000)
    except OSError:
        return None
    if head[0x202:0x206] != b"HdrS":
        return None
    at = int.from_bytes(head[0x20E:0x210], "little") + 0x200
    words = head[at:at + 256].split(b"\0", 1)[0].decode(errors="replace").split()
    return words[0] if words else None


#: ``XEN_ELFNOTE_PHYS32_ENTRY``: the ELF note (owner "Xen") of a kernel's 32-bit PVH entry point, which QEMU boots.
PVH_NOTE = 18


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The ELF kernel inside a bzImage (its compressed payload, unpacked), or None if it cannot be had here.

    The setup header gives the payload's place (``setup_sects`` at 0x1F1,
    ``payload_offset`` and ``payload_length`` at 0x248, boot protocol 2.08+);
    gzip, xz and lzma payloads are unpacked with the standard library.
    """
    protocol = int.from_bytes(bzimage[0x206:0x208], "little")
    if len(bzimage) < 0x250 or bzimage[0x202:0x206] != b"HdrS" or protocol < 0x208:
        return None
    setup = (bzimage[0x1F1] or 4) + 1
    start = setup * 512 + int.from_bytes(bzimage[0x248:0x24C], "little")
    payload = bzimage[start:start + int.from_bytes(bzimage[0x24C:0x250], "little")]
    try:
        if payload.startswith(b"\x1f\x8b"):
            out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(payload)
        elif payload.startswith(b"\xfd7zXZ\x00"):
            out = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(payload)
        elif payload.startswith(b"\x5d\x00\x00"):
            out = lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(payload)
        else:
            return None
    except (lzma.LZMAError, zlib.error):
        return None
    return out if out.startswith(b"\x7fELF") else None


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF kernel carries a PVH entry note (QEMU can boot it as ``-kernel``)."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    phoff, phentsize, phnum = (int.from_bytes(elf[0x20:0x28], "little"), int.from_bytes(elf[0x36:0x38], "little"),
                               int.from_bytes(elf[0x38:0x3A], "little"))
    for i in range(phnum):
        ph = elf[phoff + i * phentsize:phoff + (i + 1) * phentsize]
        if len(ph) < 0x30 or int.from_bytes(ph[0:4], "little") != 4:  # PT_NOTE
            continue
        at = int.from_bytes(ph[8:16], "little")  # p_offset
        end = at + int.from_bytes(ph[0x20:0x28], "little")  # + p_filesz
        while at + 12 <= end:
            namesz, descsz, kind = (int.from_bytes(elf[at + k:at + k + 4], "little") for k in (0, 4, 8))
            name = elf[at + 12:at + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and kind == PVH_NOTE:
                return True
            at += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def _ensure_vmlinux(image_dir: Path, others: Iterable[Path]) -> Path | None:
    """``image_dir/vmlinux``, the cached vmlinuz's ELF kernel with a PVH entry, made (or hard-linked from another
    cache holding the same one) if missing or stale; None if this kernel cannot boot that way (module docstring).

    ``vmlinux.from`` holds the sha256 of the vmlinuz it was made from; with no ``vmlinux`` beside it, that this
    vmlinuz has none, so a kernel that cannot boot by PVH is not unpacked again at every ``lab up``.
    """
    vmlinuz, vmlinux, stamp = image_dir / "vmlinuz", image_dir / "vmlinux", image_dir / "vmlinux.from"
    bzimage = vmlinuz.read_bytes()
    key = hashlib.sha256(bzimage).hexdigest()

    def made_from_this(d: Path) -> bool:
        with contextlib.suppress(OSError):
            return (d / "vmlinux.from").read_text() == key
        return False

    if made_from_this(image_dir):
        return vmlinux if vmlinux.is_file() else None
    for src in others:
        if made_from_this(src) and (src / "vmlinux").is_file():
            with contextlib.suppress(OSError):  # another file system: unpack it here instead
                tmp = image_dir / f".vmlinux.{os.getpid()}"
                tmp.unlink(missing_ok=True)
                os.link(src / "vmlinux", tmp)
                os.replace(tmp, vmlinux)
                write_atomic(stamp, key.encode(), mode=CACHE_MODE)
                return vmlinux
    elf = extract_vmlinux(bzimage)
    if elf is None or not has_pvh_entry(elf):
        vmlinux.unlink(missing_ok=True)
        write_atomic(stamp, key.encode(), mode=CACHE_MODE)
        return None
    write_atomic(vmlinux, elf, mode=CACHE_MODE)
    write_atomic(stamp, key.encode(), mode=CACHE_MODE)
    return vmlinux


def _fetch_package(pkg: str, workdir: Path) -> Path:
    """``apt-get download`` ``pkg`` into ``workdir`` and unpack it; returns the unpacked tree."""
    proc = subprocess.run(["apt-get", "download", "-q", pkg], cwd=workdir, capture_output=True, text=True,
                          check=False)
    debs = list(workdir.glob("*.deb"))
    if proc.returncode != 0 or not debs:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImageError(f"apt-get download {pkg} failed: {last}")
    x = subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(workdir / "x")], capture_output=True, text=True,
                       check=False)
    if x.returncode != 0:
        raise ImageError(f"dpkg-deb -x {debs[0].name} failed: {x.stderr.strip()}")
    return workdir / "x"


def _keep_modules(tree: Path, modules: Path, version: str) -> None:
    """Copy :data:`MODULES` of kernel ``version`` out of an unpacked kernel package into ``modules``."""
    found = {ko.name[:-3]: ko for ko in (tree / "lib" / "modules" / version).rglob("*.ko")}
    builtin = tree / "lib" / "modules" / version / "modules.builtin"
    inside = {Path(line).stem for line in builtin.read_text().split()} if builtin.is_file() else set()
    missing = [m for m in MODULES if m not in found and m not in inside]
    if missing:
        raise ImageError(f"kernel {version} has no {', '.join(missing)} module (needed by the guests' disk and "
                         "network workloads)")
    modules.mkdir(exist_ok=True)
    for m in MODULES:
        if m in found:
            write_atomic(modules / f"{m}.ko", found[m].read_bytes(), mode=CACHE_MODE)
    write_atomic(modules / "version", version.encode(), mode=CACHE_MODE)


def download_kernel(dest: Path) -> Path:
    """Download the newest kernel package with apt; keep its vmlinuz as ``dest`` and :data:`MODULES` beside it."""
    pkg = kernel_package()
    with tempfile.TemporaryDirectory(prefix="vcl-kernel-", dir=dest.parent) as tmp:
        tree = _fetch_package(pkg, Path(tmp))
        kernels = sorted((tree / "boot").glob("vmlinuz-*"))
        if not kernels:
            raise ImageError(f"{pkg} holds no boot/vmlinuz-*")
        version = kernels[0].name.removeprefix("vmlinuz-")
        _keep_modules(tree, dest.parent / "modules", version)
        write_atomic(dest, kernels[0].read_bytes(), mode=CACHE_MODE)
    return dest


def download_modules(image_dir: Path, version: str) -> None:
    """The :data:`MODULES` of kernel ``version`` (the cached vmlinuz's) from its Debian package."""
    with tempfile.TemporaryDirectory(prefix="vcl-kernel-", dir=image_dir) as tmp:
        _keep_modules(_fetch_package(f"linux-image-{version}", Path(tmp)), image_dir / "modules", version)


def modules_version(modules: Path) -> str | None:
    try:
        return (modules / "version").read_text().strip() or None
    except OSError:
        return None


def io_workloads_problem(image: GuestImage) -> str | None:
    """None when the image's disk and network workloads can run (its modules are there), else why not."""
    modules = image.initrd.parent / "modules"
    version = kernel_version(image.initrd.parent / "vmlinuz")
    missing = [m for m in MODULES if not (modules / f"{m}.ko").is_file()]
    if missing:
        return (f"the guest image in {image.initrd.parent} has no {', '.join(missing)} module(s) "
                f"(apt could not provide linux-image-{version}); rebuild it with "
                "'vcsched lab down --purge' and 'vcsched lab up'")
    if modules_version(modules) != version:
        return f"the guest image's modules ({modules_version(modules)}) are not its kernel's ({version})"
    return None


def ensure_image(image_dir: Path, sources: Iterable[Path] = (DEFAULT_LAB_DIR / "image",)) -> GuestImage:
    """The lab's guest image in ``image_dir``, built on first use and cached there.

    The kernel (and its modules) are copied from another lab's cache (``sources``)
    when one has them, else downloaded; the initramfs is rebuilt whenever its
    content would change.  A kernel or modules that cannot be had is an
    :class:`ImageError` with the reason (apt's message): a lab whose guests
    lack the virtio drivers would pass for one that can test disk and network
    caps, and its tests would skip instead of running.
    """
    image_dir.mkdir(parents=True, exist_ok=True)
    kernel = image_dir / "vmlinuz"
    initrd = image_dir / "initrd.gz"
    modules = image_dir / "modules"
    others = [src for src in sources if src.resolve() != image_dir.resolve()]
    if not kernel.is_file():
        for src in others:
            if (src / "vmlinuz").is_file():
                write_atomic(kernel, (src / "vmlinuz").read_bytes(), mode=CACHE_MODE)
                break
        else:
            download_kernel(kernel)
    version = kernel_version(kernel)
    if version is not None and modules_version(modules) != version:
        for src in others:
            if modules_version(src / "modules") == version:
                modules.mkdir(exist_ok=True)
                for ko in [*_module_files(src / "modules"), src / "modules" / "version"]:
                    write_atomic(modules / ko.name, ko.read_bytes(), mode=CACHE_MODE)
                break
        else:
            try:
                download_modules(image_dir, version)
            except ImageError as exc:
                raise ImageError(f"{exc}; the cached kernel {kernel} is {version}: remove {image_dir} to fetch "
                                 "the current one") from None
    _ensure_initramfs(image_dir, modules, others)
    return GuestImage(kernel=_ensure_vmlinux(image_dir, others) or kernel, initrd=initrd, cmdline=guest_cmdline())


def _ensure_initramfs(image_dir: Path, modules: Path, others: Iterable[Path]) -> Path:
    """``image_dir/initrd.gz``, rebuilt when its recipe changed; copied from another cache whose initramfs has
    the same recipe instead of built (gzip takes ~2 s of CPU, at every ``lab up`` in a fresh directory: every
    test's own lab)."""
    initrd, stamp = image_dir / "initrd.gz", image_dir / "initrd.recipe"
    recipe = initramfs_recipe(modules=modules)
    if initrd.is_file() and _read_text(stamp) == recipe:
        return initrd
    same = [src / "initrd.gz" for src in others
            if (src / "initrd.gz").is_file() and _read_text(src / "initrd.recipe") == recipe]
    write_atomic(initrd, same[0].read_bytes() if same else build_initramfs(modules=modules), mode=CACHE_MODE)
    write_atomic(stamp, recipe.encode(), mode=CACHE_MODE)
    return initrd


def _read_text(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text()
    return None


def initramfs_recipe(busybox: Path = BUSYBOX, modules: Path | None = None) -> str:
    """A digest of what goes into the initramfs, so a cached one is rebuilt only when it would differ."""
    h = hashlib.sha256(INIT_SCRIPT.encode())
    if busybox.is_file():
        h.update(busybox.read_bytes())
    for ko in _module_files(modules):
        h.update(ko.name.encode())
        h.update(ko.read_bytes())
    return h.hexdigest()
