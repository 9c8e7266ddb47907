"""libvirt's QEMU capabilities cache, shared between lab hosts so each does not probe QEMU again.

The first time a libvirtd needs QEMU (the first guest it starts, a
``getDomainCapabilities``, or a ``getCapabilities``, which asks every QEMU binary
installed) it runs the QEMU binary and asks it, over QMP,
everything it can do; on this machine kind that takes 3.9 s, under TCG.  The
answer is cached in ``/var/cache/libvirt/qemu/capabilities/<hash>.xml``, and
every lab host has its own empty ``/var/cache/libvirt``: without sharing,
every host of every ``lab up`` paid those seconds at its first guest (the
tests bring up a dozen labs).

libvirt checks a cached file before using it (the QEMU binary's ctime,
libvirt's own version, the kernel, KVM, the CPU microcode) and probes again
if any changed, so a copy made by another host of this machine is either
right or replaced.  The copies kept between labs live beside the guest image
(``<lab>/image/qemu-capabilities``), and in the default lab's image cache,
which every lab already reads its kernel from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from hypervisor.files import write_atomic
from lab.image import CACHE_MODE

#: Where a lab host's libvirtd keeps the cache, relative to its host dir (``cache`` is bound over /var/cache/libvirt).
HOST_CACHE = Path("cache") / "qemu" / "capabilities"
#: Where copies are kept between labs, relative to an image cache.
KEPT = "qemu-capabilities"


def _entries(d: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return sorted(p for p in d.iterdir() if p.suffix == ".xml" and p.is_file())
    return []


def seed(host_dir: Path, sources: Iterable[Path]) -> int:
    """Copy the cache files kept in the first of ``sources`` (image caches) that has any into a host; how many."""
    dest = host_dir / HOST_CACHE
    for src in sources:
        files = _entries(src / KEPT)
        if files:
            dest.mkdir(parents=True, exist_ok=True)
            for f in files:
                if not (dest / f.name).exists():
                    _copy(f, dest / f.name)
            return len(files)
    return 0


def warm(uri: str) -> None:
    """Make the host's libvirtd fill its cache now (free when a seeded file is still valid).

    ``getCapabilities`` probes *every* QEMU binary installed (here also qemu-system-i386: 4.8 s on a fresh host
    under load, measured), ``getDomainCapabilities`` only the default one; vcsched reads every host's
    capabilities (its UUID) at every command, so both are filled and kept for the other hosts.
    """
    import libvirt

    conn = libvirt.open(uri)
    try:
        conn.getDomainCapabilities(None, None, None, None, 0)
        conn.getCapabilities()
    finally:
        conn.close()


def keep(host_dir: Path, image_dirs: Iterable[Path]) -> None:
    """Keep a host's cache files in each image cache that exists and can be written (others skipped)."""
    files = _entries(host_dir / HOST_CACHE)
    if not files:
        return
    for image_dir in image_dirs:
        if not image_dir.is_dir():
            continue
        kept = image_dir / KEPT
        with contextlib.suppress(OSError):
            kept.mkdir(exist_ok=True)
            for f in files:  # named by the QEMU binary: a newer probe replaces the file it supersedes
                _copy(f, kept / f.name)


def _copy(src: Path, dest: Path) -> None:
    """Atomically: another lab's ``up`` may be reading ``dest`` at the same moment."""
    write_atomic(dest, src.read_bytes(), mode=CACHE_MODE)
