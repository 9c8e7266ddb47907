"""Migration port blocks of labs (lab/ports.py): every running lab on the machine holds its own.

Two labs that hashed to one block made a drain fail with "unable to connect to server at '127.0.0.1:P':
Connection refused": the other lab's QEMU held P's IPv4 side when this lab's QEMU bound P, which then listened
on IPv6 only.  These tests hold the claims to a private claims directory (no root, no libvirt).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hypervisor.journal import process_started
from lab import _claim_live, daemons
from lab.ports import (
    BLOCKS,
    CLAIMS_FILE,
    Claim,
    PortBlocksHeld,
    choose_block,
    claim_block,
    claimer_alive,
    held_blocks,
    migration_ports,
    parse_claims,
    preferred_block,
    release_block,
    render_claims,
)
from lab.state import LabLayout
from vcsched.errors import InputError


def always(_: Claim) -> bool:
    return True


def never(_: Claim) -> bool:
    return False


def test_each_lab_host_receives_migrations_on_ports_of_its_own() -> None:
    """Two migrations arriving at two hosts of one unix lab at once (a drain's wave) must not pick one port."""
    ports = [set(range(low, high + 1)) for low, high in (migration_ports(3, i) for i in range(8))]
    assert all(len(p) == 64 and min(p) >= 49152 and max(p) <= 65535 for p in ports)
    assert all(a.isdisjoint(b) for i, a in enumerate(ports) for b in ports[i + 1:])
    assert 'migration_port_min = ' in daemons.qemu_conf(ports=migration_ports(3, 0))
    with pytest.raises(InputError, match="host index"):
        migration_ports(3, 8)


def test_two_blocks_share_no_port_and_every_block_fits_the_port_space() -> None:
    blocks = [{p for i in range(8) for p in range(migration_ports(b, i)[0], migration_ports(b, i)[1] + 1)}
              for b in range(BLOCKS)]
    assert all(a.isdisjoint(b) for i, a in enumerate(blocks) for b in blocks[i + 1:])
    assert max(max(b) for b in blocks) <= 65535
    with pytest.raises(InputError, match="port block: 32"):
        migration_ports(BLOCKS, 0)


def test_a_lab_gets_the_block_its_id_hashes_to_while_no_one_holds_it() -> None:
    assert choose_block(5, []) == 5
    assert choose_block(5, [4, 6]) == 5


def test_a_held_block_sends_the_next_lab_to_the_next_free_one_wrapping_around() -> None:
    assert choose_block(5, [5, 6]) == 7
    assert choose_block(BLOCKS - 1, [BLOCKS - 1, 0]) == 1
    assert choose_block(0, range(BLOCKS)) is None


def test_two_labs_hashing_to_one_block_hold_different_blocks(tmp_path: Path) -> None:
    a = claim_block(Path("/var/tmp/vcl-a"), 9, always, tmp_path)
    b = claim_block(Path("/var/tmp/vcl-b"), 9, always, tmp_path)
    assert (a, b) == (9, 10)
    assert sorted((c.dir, c.block) for c in held_blocks(tmp_path)) == [("/var/tmp/vcl-a", 9), ("/var/tmp/vcl-b", 10)]


def test_a_lab_up_again_keeps_its_block(tmp_path: Path) -> None:
    first = claim_block(Path("/var/tmp/vcl-a"), 9, always, tmp_path)
    claim_block(Path("/var/tmp/vcl-b"), 12, always, tmp_path)
    assert claim_block(Path("/var/tmp/vcl-a"), 12, always, tmp_path) == first
    assert len(held_blocks(tmp_path)) == 2


def test_a_lab_taken_down_frees_its_block_for_the_next(tmp_path: Path) -> None:
    claim_block(Path("/var/tmp/vcl-a"), 9, always, tmp_path)
    release_block(Path("/var/tmp/vcl-a"), tmp_path)
    assert held_blocks(tmp_path) == []
    assert claim_block(Path("/var/tmp/vcl-b"), 9, always, tmp_path) == 9


def test_taking_down_a_lab_that_holds_no_block_writes_nothing(tmp_path: Path) -> None:
    release_block(Path("/var/tmp/vcl-a"), tmp_path)
    assert not (tmp_path / CLAIMS_FILE).exists()


def test_the_claim_of_a_lab_that_is_gone_is_taken_over(tmp_path: Path) -> None:
    claim_block(Path("/var/tmp/vcl-a"), 9, always, tmp_path)
    assert claim_block(Path("/var/tmp/vcl-b"), 9, never, tmp_path) == 9
    assert [c.dir for c in held_blocks(tmp_path)] == ["/var/tmp/vcl-b"]


def test_with_every_block_held_a_lab_is_refused_naming_the_holders(tmp_path: Path) -> None:
    for b in range(BLOCKS):
        claim_block(Path(f"/var/tmp/vcl-{b}"), b, always, tmp_path)
    with pytest.raises(PortBlocksHeld, match=r"all 32 migration port blocks are held .*/var/tmp/vcl-7") as exc:
        claim_block(Path("/var/tmp/vcl-new"), 3, always, tmp_path)
    assert exc.value.exit_code == 1
    assert len(held_blocks(tmp_path)) == BLOCKS  # nothing changed


def _claim_in_child(where: str, i: int) -> int:
    return claim_block(Path(f"/var/tmp/vcl-c{i}"), 4, always, Path(where))


def test_labs_coming_up_at_once_on_one_machine_never_get_one_block(tmp_path: Path) -> None:
    """The claims file is read, changed and written under one machine-wide lock: 8 processes asking for the same
    block at once get 8 blocks."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8) as pool:
        got = pool.starmap(_claim_in_child, [(str(tmp_path), i) for i in range(8)])
    assert sorted(got) == list(range(4, 12))
    assert sorted(c.block for c in held_blocks(tmp_path)) == list(range(4, 12))


def test_a_claims_file_that_is_not_claims_claims_nothing() -> None:
    assert parse_claims("not json") == []
    assert parse_claims('{"claims": [{"block": 99, "dir": "/x", "pid": 1, "started": 1}, {"block": 1}]}') == []
    claims = [Claim(2, "/var/tmp/vcl-a", 10, 20), Claim(1, "/var/tmp/vcl-b", 11, 21)]
    assert parse_claims(render_claims(claims)) == sorted(claims, key=lambda c: c.block)


def test_preferred_block_comes_from_the_lab_id() -> None:
    lid = LabLayout(Path("/var/tmp/vcl-a")).id
    assert preferred_block(lid) == int(lid, 16) % BLOCKS


def test_a_claim_lives_while_its_claiming_process_does_and_not_after(tmp_path: Path) -> None:
    me = os.getpid()
    assert claimer_alive(Claim(0, str(tmp_path), me, process_started(me) or -1))
    assert not claimer_alive(Claim(0, str(tmp_path), me, (process_started(me) or 0) + 1))  # a reused pid
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(child.stdout)
    assert process_started(gone) is None or not claimer_alive(Claim(0, str(tmp_path), gone, 0))


def test_a_lab_whose_directory_is_gone_or_whose_claimer_and_daemons_are_dead_holds_nothing(tmp_path: Path) -> None:
    me = os.getpid()
    started = process_started(me) or -1
    assert _claim_live(Claim(0, str(tmp_path), me, started))  # an `up` under way: no daemon runs yet
    assert not _claim_live(Claim(0, str(tmp_path / "gone"), me, started))
    (tmp_path / "h0").mkdir()
    (tmp_path / "h0" / "libvirtd.pid").write_text(f"{me}\n")  # a pid that is no libvirtd of this lab
    assert not _claim_live(Claim(0, str(tmp_path), me, started + 1))


def test_a_lab_whose_claimer_died_holds_its_block_while_one_of_its_libvirtds_runs(tmp_path: Path) -> None:
    pid_file = LabLayout(tmp_path).pid_file(1, "libvirtd")
    pid_file.parent.mkdir()
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(pid_file)])
    try:  # a process whose command line names the pid file, as the lab starts its daemons
        pid_file.write_text(f"{stand_in.pid}\n")
        assert _claim_live(Claim(0, str(tmp_path), stand_in.pid, -1))
    finally:
        stand_in.kill()
        stand_in.wait()
    assert not _claim_live(Claim(0, str(tmp_path), stand_in.pid, -1))
