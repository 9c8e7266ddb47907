"""Whether a VM a plan creates can boot: its files exist, can be read and fit in its memory — checked before the
plan's first step.

A create step used to find out at run time, after the plan's earlier steps
had lowered other VMs' caps for it: a template that is not domain XML, an
initrd larger than the VM's memory ("initrd is too large" from QEMU).  These
checks run first, on every VM the plan creates, and a problem refuses the
plan whole (one line naming the step's field, exit 2, nothing changed).

What is read, for each kind of boot (:class:`vcsched.plans.steps.Boot`):

* ``template``: vcsched reads the file itself (it sends libvirt the XML), so
  it must be domain XML (:func:`hypervisor.devices.read_template`); a kernel,
  initrd or disk file the template names is checked like the others;
* ``kernel`` (the cluster's ``[guest]``): the kernel and initrd;
* ``image``: the disk image.

Each file must exist, be a regular file and be readable by vcsched; the
kernel must be one (:func:`kernel_problem`: a bzImage's boot header, or an
ELF vmlinux).  The kernel and initrd must **fit the VM's memory**: the kernel's footprint — an
ELF kernel (booted by its PVH entry) up to the end of its highest loaded
segment, a bzImage from its preferred load address up to its ``init_size``
(the memory it needs to decompress and run, boot protocol 2.10+), anything
else its file size — plus the initrd's size, plus, for a gzip initramfs, its
unpacked size (the kernel unpacks it while the packed copy is still in
memory), plus :data:`RUNNING_MARGIN` for the kernel to run at all, must not
exceed the VM's memory.  That is a floor, not a promise that the guest boots:
measured with the lab's kernel (74 MiB) and initramfs (3.6 MiB packed and
unpacked), a 64 MiB VM printed nothing, 78-82 MiB ones panicked out of
memory, 84 MiB and up booted; vcsched refuses below 81.6 MiB.

Boot files live on the host that starts the VM.  They are checked here only
for hosts on this machine (a URI without a host name, or a loopback address,
as the lab's are); for a host on another machine vcsched cannot look, and
libvirt's own check when it creates the VM is the first (the plan then stops
there, and the caps it lowered for that VM are put back:
:mod:`acting.executor`).  The domain XML itself is checked by libvirt on
the target host's driver in every case (``LibvirtHypervisor.create_problems``).
"""

from __future__ import annotations

import os
import stat
import struct
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from hypervisor.devices import boot_root
from vcsched.errors import InputError
from vcsched.formats.units import format_size
from vcsched.plans.steps import Boot

#: How much of a kernel file is read to find its footprint (ELF program headers, the bzImage setup header).
HEAD_BYTES = 64 << 10
_ELF_MAGIC = b"\x7fELF"
_PT_LOAD = 1


def file_problem(where: str, path: str | None) -> str | None:
    """Why ``path`` cannot be a boot file: missing, not a regular file, or unreadable; None when it can."""
    if not path:
        return f"{where}: no file given"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{where}: {path!r} does not exist"
    except OSError as exc:
        return f"{where}: {path!r} cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"{where}: {path!r} is not a regular file"
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"{where}: {path!r} cannot be read ({exc.strerror})"
    return None


def kernel_problem(where: str, path: str) -> str | None:
    """Why ``path`` is not a kernel QEMU can boot directly, or None: a Linux bzImage carries its setup header's
    magic ``HdrS`` at offset 0x202 (the x86 boot protocol), a vmlinux is an ELF (booted by its PVH entry), an
    arm64 ``Image`` its magic ``ARM\\x64`` at 0x38.  Anything else (``kernel = "/etc/passwd"``) would pass every
    other check and fail only when the VM starts, after the plan's earlier steps had run."""
    with open(path, "rb") as f:
        head = f.read(0x206)
    if head[:4] == _ELF_MAGIC or head[0x202:0x206] == b"HdrS" or head[0x38:0x3C] == b"ARM\x64":
        return None
    return (f"{where}: {path!r} is not a Linux kernel (neither a bzImage, with its boot header \"HdrS\" at "
            "offset 0x202, nor an ELF vmlinux, nor an arm64 Image)")


def kernel_footprint(path: str) -> int:
    """Bytes of guest memory a kernel occupies once loaded and running (see the module docstring)."""
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    size = os.path.getsize(path)
    if head[:4] == _ELF_MAGIC and len(head) >= 64 and head[4] == 2:  # 64-bit ELF: PVH loads it by physical address
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        ends = []
        for k in range(phnum):
            off = phoff + k * phentsize
            if off + 56 > len(head):
                break
            p_type, = struct.unpack_from("<I", head, off)
            paddr, _filesz, memsz = struct.unpack_from("<QQQ", head, off + 24)
            if p_type == _PT_LOAD:
                ends.append(paddr + memsz)
        if ends:
            return max(ends)
    if len(head) >= 0x268 and head[0x202:0x206] == b"HdrS":
        version, = struct.unpack_from("<H", head, 0x206)
        if version >= 0x20A:
            pref, = struct.unpack_from("<Q", head, 0x258)
            init_size, = struct.unpack_from("<I", head, 0x260)
            return max(pref, 1 << 20) + init_size
    return size


def initrd_footprint(path: str) -> int:
    """Bytes an initrd occupies while the kernel unpacks it: its size, plus its unpacked size if gzip (its
    trailer's ISIZE: exact below 4 GiB)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        magic = f.read(2)
        if magic == b"\x1f\x8b" and size >= 18:
            f.seek(-4, os.SEEK_END)
            unpacked, = struct.unpack("<I", f.read(4))
            return size + unpacked
    return size


#: What a booting kernel needs beyond its image and its initrd (page tables, per-CPU areas, its first allocations):
#: a floor, not a guarantee.  The lab's kernel (77.6 MiB with its initramfs) panicked at 79-82 MiB, booted at 84.
RUNNING_MARGIN = 4 << 20


def fit_problem(where: str, kernel: str, initrd: str | None, memory_bytes: int) -> str | None:
    """Why a kernel (+ initrd) does not fit ``memory_bytes`` of guest memory, or None."""
    need = kernel_footprint(kernel) + RUNNING_MARGIN
    parts = [f"the kernel {format_size(need - RUNNING_MARGIN)}"]
    if initrd is not None:
        extra = initrd_footprint(initrd)
        need += extra
        parts.append(f"the initrd {format_size(extra)} (packed and unpacked)")
    parts.append(f"{format_size(RUNNING_MARGIN)} to run")
    if need > memory_bytes:
        return (f"{where}: {' + '.join(parts)} need {format_size(need)} of guest memory, the VM has "
                f"{format_size(memory_bytes)} (memory_bytes {memory_bytes})")
    return None


def _template_files(root: ET.Element) -> tuple[str | None, str | None, list[str]]:
    """The kernel, initrd and disk files a domain template names (disks of type file only)."""
    os_el = root.find("os")
    kernel = os_el.findtext("kernel") if os_el is not None else None
    initrd = os_el.findtext("initrd") if os_el is not None else None
    disks = []
    for d in root.findall("devices/disk"):
        source = d.find("source")
        if d.get("type", "file") == "file" and source is not None and source.get("file"):
            disks.append(str(source.get("file")))
    return kernel or None, initrd or None, disks


def boot_problems(where: str, boot: Boot, memory_bytes: int, *, local: bool = True,
                  fields: Mapping[str, str] | None = None) -> list[str]:
    """Every problem of ``boot`` for a VM of ``memory_bytes`` (module docstring); ``where`` names the step
    (``plan.steps[3]``), and each problem the boot's field (``plan.steps[3].boot.kernel``) — or, for a request,
    ``fields`` maps ``path``, ``kernel``, ``initrd`` to the names the operator wrote (``template``,
    ``guest.kernel``).  ``local``: the boot files are on this machine (else only the template is read)."""
    name = {k: f"{where}.boot.{k}" for k in ("path", "kernel", "initrd")} | dict(fields or {})

    def missing(pairs: list[tuple[str, str | None]]) -> list[str]:
        return [p for field, path in pairs if (p := file_problem(field, path)) is not None]

    if boot.kind in ("template", "domain"):
        problem = file_problem(name["path"], boot.path) if boot.kind == "template" else None
        if problem is not None:
            return [problem]
        try:
            root = boot_root(boot)
        except InputError as exc:
            return [f"{name['path']}: {exc}"]
        kernel, initrd, disks = _template_files(root)
        if not local:
            return []
        named = f"{name['path']} (template {boot.path})" if boot.kind == "template" else f"{where}.boot.xml"
        files = [(f"{named} {tag}", path) for tag, path in (("<os><kernel>", kernel), ("<os><initrd>", initrd))
                 if path]
        out = missing([*files, *((f"{named} <disk><source>", d) for d in disks)])
        if kernel is not None and not out:
            bad = kernel_problem(f"{named} <os><kernel>", kernel) or fit_problem(named, kernel, initrd, memory_bytes)
            out += [bad] if bad else []
        return out
    if not local:
        return []
    if boot.kind == "image":
        return missing([(name["path"], boot.path)])
    out = missing([(name["kernel"], boot.kernel), (name["initrd"], boot.initrd)])
    if not out and boot.kernel is not None:
        bad = kernel_problem(name["kernel"], boot.kernel) or fit_problem(name["kernel"], boot.kernel, boot.initrd,
                                                                         memory_bytes)
        out += [bad] if bad else []
    return out


def files_local(uri: str) -> bool:
    """Whether the boot files of a VM on the host of ``uri`` are this machine's: a host of this machine (no host
    name, or a loopback address) whose driver boots something (libvirt's test driver and the simulated libvirt,
    ``sim://``, read no file)."""
    from vcsched.formats.cluster import uri_host, uri_scheme

    return uri_scheme(uri) not in ("test", "sim") and is_local(uri_host(uri))


def is_local(uri_host: str | None) -> bool:
    """Whether a host whose URI names machine ``uri_host`` runs on this machine (None: a local URI)."""
    if uri_host is None or uri_host in ("localhost", "localhost.localdomain"):
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(uri_host).is_loopback
    except ValueError:
        return False



#: The name prefix of the throw-away domain libvirt validates a created VM's XML as (defined, then undefined).
CHECK_PREFIX = "vcsched-check-"


def validation_xml(xml: str, token: str) -> str:
    """A create step's domain XML as libvirt is asked to validate it: named ``vcsched-check-<token>``, without
    vcsched's metadata (a copy left behind by a crash is then an unmanaged, inactive domain no plan counts)
    and without a UUID (libvirt makes one)."""
    root = ET.fromstring(xml)
    for tag in ("name", "uuid", "metadata"):
        for el in root.findall(tag):
            root.remove(el)
    name = ET.Element("name")
    name.text = f"{CHECK_PREFIX}{token}"
    root.insert(0, name)
    return ET.tostring(root, encoding="unicode")
