"""The lab guest's kernel boots uncompressed by its PVH entry (lab/image.py): unpacking and checking it."""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

import pytest

from lab import image
from lab.image import PVH_NOTE, _ensure_initramfs, _ensure_vmlinux, extract_vmlinux, has_pvh_entry


def elf(note_kind: int | None) -> bytes:
    """A minimal 64-bit ELF: one PT_NOTE program header over one note owned by "Xen" (or none)."""
    notes = b""
    if note_kind is not None:
        notes = (4).to_bytes(4, "little") + (4).to_bytes(4, "little") + note_kind.to_bytes(4, "little") \
            + b"Xen\0" + (0x1000000).to_bytes(4, "little")
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    head[0x20:0x28] = (64).to_bytes(8, "little")  # e_phoff
    head[0x36:0x38] = (56).to_bytes(2, "little")  # e_phentsize
    head[0x38:0x3A] = (1).to_bytes(2, "little")  # e_phnum
    ph = bytearray(56)
    ph[0:4] = (4).to_bytes(4, "little")  # PT_NOTE
    ph[8:16] = (64 + 56).to_bytes(8, "little")  # p_offset
    ph[0x20:0x28] = len(notes).to_bytes(8, "little")  # p_filesz
    return bytes(head) + bytes(ph) + notes + b"\0" * 64


def bzimage(payload: bytes) -> bytes:
    """A bzImage-shaped file: a setup header (protocol 2.15, 3 setup sectors) and ``payload`` where it points."""
    setup = bytearray(4 * 512)
    setup[0x1F1] = 3
    setup[0x202:0x206] = b"HdrS"
    setup[0x206:0x208] = (0x20F).to_bytes(2, "little")
    setup[0x248:0x24C] = (0x40).to_bytes(4, "little")  # payload_offset, from the protected-mode code
    setup[0x24C:0x250] = len(payload).to_bytes(4, "little")
    return bytes(setup) + b"\0" * 0x40 + payload + b"\0" * 16


@pytest.mark.parametrize("pack", [gzip.compress, lambda b: lzma.compress(b, lzma.FORMAT_XZ)], ids=["gzip", "xz"])
def test_the_elf_kernel_is_unpacked_from_a_bzimage_and_its_pvh_entry_found(pack: object) -> None:
    kernel = elf(PVH_NOTE)
    out = extract_vmlinux(bzimage(pack(kernel)))  # type: ignore[operator]
    assert out == kernel and has_pvh_entry(out)


def test_a_kernel_without_a_pvh_note_or_an_unknown_payload_is_not_booted_that_way() -> None:
    assert not has_pvh_entry(elf(None)) and not has_pvh_entry(elf(PVH_NOTE + 1))
    assert extract_vmlinux(bzimage(b"\x28\xb5\x2f\xfd" + b"zstd frame")) is None  # zstd: not in the standard library
    assert extract_vmlinux(bzimage(gzip.compress(b"not an ELF"))) is None
    assert extract_vmlinux(b"MZ" + b"\0" * 1000) is None


def test_the_cache_unpacks_once_links_from_another_cache_and_follows_a_new_kernel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "vmlinuz").write_bytes(bzimage(gzip.compress(elf(PVH_NOTE))))
    made = _ensure_vmlinux(a, ())
    assert made == a / "vmlinux" and made.read_bytes() == elf(PVH_NOTE)
    linked = _ensure_vmlinux(b, (a,))
    assert linked == b / "vmlinux" and linked.stat().st_ino == made.stat().st_ino  # one copy on disk
    (a / "vmlinuz").write_bytes(bzimage(gzip.compress(elf(None))))  # a new kernel, with no PVH entry
    assert _ensure_vmlinux(a, ()) is None and not (a / "vmlinux").exists()
    # That answer is kept: the next call does not unpack the kernel again.
    unpacked: list[bytes] = []
    monkeypatch.setattr("lab.image.extract_vmlinux", unpacked.append)
    assert _ensure_vmlinux(a, ()) is None and not unpacked
    assert (b / "vmlinux").read_bytes() == elf(PVH_NOTE)  # the other cache's kernel is untouched


def test_the_initramfs_is_copied_from_a_cache_of_the_same_recipe_and_built_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    built: list[int] = []

    def build(modules: Path | None = None) -> bytes:
        built.append(1)
        return f"initramfs {len(built)}".encode()

    monkeypatch.setattr("lab.image.build_initramfs", build)
    assert _ensure_initramfs(a, tmp_path / "modules", ()).read_bytes() == b"initramfs 1"
    assert _ensure_initramfs(b, tmp_path / "modules", (a,)).read_bytes() == b"initramfs 1" and len(built) == 1
    assert _ensure_initramfs(b, tmp_path / "modules", (a,)) == b / "initrd.gz" and len(built) == 1  # up to date
    (a / "initrd.recipe").write_text("another init script")  # a's is not what this one would hold: built
    assert _ensure_initramfs(c, tmp_path / "modules", (a,)).read_bytes() == b"initramfs 2"


# ---- a kernel or its modules that cannot be had is an error, never a silently CPU-only image --------------------


def fake_kernel_tree(root: Path, version: str, modules: list[str], builtin: tuple[str, ...] = ()) -> Path:
    """An unpacked kernel package as apt would leave it: lib/modules/VERSION/.../*.ko (+ modules.builtin)."""
    d = root / "lib" / "modules" / version / "kernel" / "drivers"
    d.mkdir(parents=True)
    for m in modules:
        (d / f"{m}.ko").write_bytes(b"\x7fELF" + m.encode())
    (root / "lib" / "modules" / version / "modules.builtin").write_text(
        "".join(f"kernel/drivers/{m}.ko\n" for m in builtin))
    return root


def test_a_kernel_package_without_a_needed_module_is_an_error_naming_it(tmp_path: Path) -> None:
    present = [m for m in image.MODULES if m != "virtio_net"]
    tree = fake_kernel_tree(tmp_path / "x", "6.1.0-99-amd64", present)
    with pytest.raises(image.ImageError, match=r"kernel 6\.1\.0-99-amd64 has no virtio_net module"):
        image._keep_modules(tree, tmp_path / "modules", "6.1.0-99-amd64")


def test_a_module_built_into_the_kernel_is_not_missing(tmp_path: Path) -> None:
    present = [m for m in image.MODULES if m != "virtio_net"]
    tree = fake_kernel_tree(tmp_path / "x", "6.1.0-99-amd64", present, builtin=("virtio_net",))
    image._keep_modules(tree, tmp_path / "modules", "6.1.0-99-amd64")
    assert (tmp_path / "modules" / "version").read_text() == "6.1.0-99-amd64"


def test_modules_that_cannot_be_downloaded_fail_the_image_with_apts_reason(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the failure was swallowed and the lab came up without the virtio drivers, so every disk and network
    lab test skipped ("no disk/network workloads in the guest image") and the run stayed green."""
    cache = tmp_path / "image"
    cache.mkdir()
    (cache / "vmlinuz").write_bytes(b"not a real kernel")
    monkeypatch.setattr(image, "kernel_version", lambda _k: "6.1.0-99-amd64")

    def no_network(pkg: str, _workdir: Path) -> Path:
        raise image.ImageError(f"apt-get download {pkg} failed: E: Failed to fetch (network unreachable)")

    monkeypatch.setattr(image, "_fetch_package", no_network)
    with pytest.raises(image.ImageError, match=r"apt-get download linux-image-6.1.0-99-amd64 failed: .*network "
                                               r"unreachable.*remove .*image to fetch the current one"):
        image.ensure_image(cache, sources=())


def test_guests_keep_time_by_the_hosts_tsc_only_where_it_is_constant_and_non_stop() -> None:
    from lab.state import clock_options

    good = "processor\t: 0\ncpu MHz\t\t: 2445.402\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n"
    assert clock_options(good) == "tsc_early_khz=2445402 tsc=reliable clocksource=tsc"
    assert clock_options(good.replace(" nonstop_tsc", "")) == ""  # a TSC that stops in deep sleep: no promise
    assert clock_options(good.replace("cpu MHz\t\t: 2445.402\n", "")) == ""
