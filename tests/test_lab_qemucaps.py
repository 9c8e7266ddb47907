"""The QEMU capabilities cache kept between lab hosts: plain file handling, no libvirt needed."""

from __future__ import annotations

from pathlib import Path

from lab.qemucaps import HOST_CACHE, KEPT, keep, seed


def probed(host_dir: Path, name: str = "abc.xml", text: str = "<qemuCaps/>") -> Path:
    d = host_dir / HOST_CACHE
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)
    return d / name


def test_a_probe_kept_in_an_image_cache_seeds_a_new_host(tmp_path: Path) -> None:
    image = tmp_path / "image"
    image.mkdir()
    probed(tmp_path / "h0")
    keep(tmp_path / "h0", [image])
    assert (image / KEPT / "abc.xml").read_text() == "<qemuCaps/>"
    assert seed(tmp_path / "h1", [tmp_path / "nothing-here", image]) == 1
    assert (tmp_path / "h1" / HOST_CACHE / "abc.xml").read_text() == "<qemuCaps/>"


def test_a_newer_probe_replaces_the_kept_copy_but_seeding_never_overwrites_a_hosts_own(tmp_path: Path) -> None:
    image = tmp_path / "image"
    image.mkdir()
    probed(tmp_path / "h0", text="old")
    keep(tmp_path / "h0", [image])
    probed(tmp_path / "h0", text="new")  # libvirt probed again (QEMU changed): the kept copy follows
    keep(tmp_path / "h0", [image])
    assert (image / KEPT / "abc.xml").read_text() == "new"
    own = probed(tmp_path / "h1", text="the host's own")
    seed(tmp_path / "h1", [image])
    assert own.read_text() == "the host's own"
    assert [p.name for p in (image / KEPT).iterdir()] == ["abc.xml"]  # no temporary files left


def test_nothing_to_seed_from_and_nowhere_to_keep_are_not_errors(tmp_path: Path) -> None:
    assert seed(tmp_path / "h0", [tmp_path / "image"]) == 0
    assert not (tmp_path / "h0").exists()
    probed(tmp_path / "h0")
    keep(tmp_path / "h0", [tmp_path / "missing-image-dir"])  # a lab without the default lab's cache
    assert not (tmp_path / "missing-image-dir").exists()
