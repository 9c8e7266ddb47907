"""Which lab on this machine receives migrations on which ports: each running lab holds a block of its own.

Every host of a unix-socket lab shares the machine's network namespace, and its libvirtd picks an incoming
migration port (and an NBD port for a disk copy) from ``migration_port_min``-``migration_port_max`` after
checking, by a test ``bind()``, that the port is free.  QEMU binds it only later, once the destination QEMU has
started (``-incoming defer``, then ``migrate-incoming tcp:[::]:PORT``), and when the IPv4 half of that
dual-stack bind is taken by then, QEMU quietly falls back to listening on IPv6 only (``try_bind`` in QEMU's
util/qemu-sockets.c).  The source libvirt then connects to ``127.0.0.1:PORT`` and gets "Connection refused".
Another lab's QEMU listening on the same port number in that window (a TLS lab's QEMU listens on its host's own
127.0.K.x address) does exactly that: a drain in one lab failed so while other labs ran beside it, and the same
failure comes back every time something listens on 127.0.0.2:PORT once the destination QEMU has appeared.  Two
unix labs on one port fail otherwise (the second QEMU finds no free port, or a source reaches the other lab's
QEMU), and labs hashed to blocks (1 in 32 for two labs) met often enough to fail CI now and then.

So the ports are split: 32 *blocks* of 512 ports in 49152-65535 (libvirt's default range and above), a block a
lab, 64 ports a host (at most 8 hosts).  A lab *claims* its block at ``lab up`` under a machine-wide ``flock``,
in a claims file that outlives no reboot (under /run), and frees it at ``lab down``.  A claim whose lab is gone
(its directory removed, its claiming process and every libvirtd of it dead) is taken over.  A lab prefers the
block its id hashes to, so a lab re-upped while its block is free keeps its ports.  Not ruled out: blocks 0-23
lie in Linux's default ephemeral range (32768-60999), where an outgoing connection's local port could take a
port in that window (none was seen).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from hypervisor.files import write_atomic
from hypervisor.journal import process_started
from lab.state import pid_gone
from vcsched.errors import InputError, VcschedError

PORT_BASE, PORTS_PER_HOST, HOSTS_PER_BLOCK, BLOCKS = 49152, 64, 8, 32
#: Where the claims live: tmpfs, so a reboot (which ends every lab's daemons) forgets them.
CLAIMS_DIR = Path("/run/vcsched-lab")
CLAIMS_FILE, LOCK_FILE = "port-blocks.json", "port-blocks.lock"


class PortBlocksHeld(VcschedError):
    """Every port block is held by a running lab (exit 1: nothing was started; take a lab down first)."""

    exit_code = 1


@dataclass(frozen=True)
class Claim:
    """Lab directory ``dir`` holds ``block``; ``pid`` (started at ``started``, clock ticks after boot, since pids
    are reused) claimed it and keeps it held while it lives, even before the lab's daemons run."""

    block: int
    dir: str
    pid: int
    started: int


def migration_ports(block: int, index: int) -> tuple[int, int]:
    """The (min, max) incoming-migration ports of host ``index`` of the lab holding ``block``."""
    if not 0 <= block < BLOCKS:
        raise InputError(f"port block: {block} is outside [0, {BLOCKS})")
    if not 0 <= index < HOSTS_PER_BLOCK:
        raise InputError(f"host index: {index} is outside [0, {HOSTS_PER_BLOCK})")
    low = PORT_BASE + (block * HOSTS_PER_BLOCK + index) * PORTS_PER_HOST
    return low, low + PORTS_PER_HOST - 1


def preferred_block(lid: str) -> int:
    """The block a lab asks for first: its id's hash (the block every lab had before claims)."""
    return int(lid, 16) % BLOCKS


def choose_block(preferred: int, held: Iterable[int]) -> int | None:
    """``preferred`` if no one holds it, else the next free block after it (wrapping), None when all are held."""
    taken = set(held)
    return next((b for b in ((preferred + k) % BLOCKS for k in range(BLOCKS)) if b not in taken), None)


def parse_claims(text: str) -> list[Claim]:
    """The claims of a claims file; an unreadable file or entry claims nothing (its lab re-claims at ``up``)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    out = []
    for entry in doc.get("claims", []) if isinstance(doc, dict) else []:
        try:
            c = Claim(int(entry["block"]), str(entry["dir"]), int(entry["pid"]), int(entry["started"]))
        except (KeyError, TypeError, ValueError):
            continue
        if 0 <= c.block < BLOCKS:
            out.append(c)
    return out


def render_claims(claims: Iterable[Claim]) -> str:
    return json.dumps({"claims": [asdict(c) for c in sorted(claims, key=lambda c: c.block)]}, indent=1) + "\n"


def claimer_alive(claim: Claim) -> bool:
    """Whether the process that made ``claim`` still runs: the same process (its start time, as the journals
    tell theirs: pids are reused), and not a zombie."""
    return not pid_gone(claim.pid) and process_started(claim.pid) == claim.started


@contextlib.contextmanager
def _locked(where: Path) -> Iterator[Path]:
    """The claims file, under an exclusive ``flock`` of its lock file for the block (every lab on the machine)."""
    where.mkdir(parents=True, exist_ok=True)
    fd = os.open(where / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield where / CLAIMS_FILE
    finally:
        os.close(fd)


def _read(path: Path) -> list[Claim]:
    try:
        return parse_claims(path.read_text())
    except FileNotFoundError:
        return []


def claim_block(root: Path, prefer: int, live: Callable[[Claim], bool], where: Path = CLAIMS_DIR) -> int:
    """Claim a block for the lab in ``root`` (its own claim's block, else ``prefer``, else the next free one) and
    return it; claims ``live`` says are dead are dropped.  :class:`PortBlocksHeld` names the holders when none
    is free."""
    with _locked(where) as path:
        claims = _read(path)
        mine = [c.block for c in claims if c.dir == str(root)]
        others = [c for c in claims if c.dir != str(root) and live(c)]
        block = choose_block(mine[0] if mine else prefer, (c.block for c in others))
        if block is None:
            holders = ", ".join(sorted(c.dir for c in others))
            raise PortBlocksHeld(f"lab {root}: all {BLOCKS} migration port blocks are held by running labs "
                                 f"({holders}); take one down first")
        pid = os.getpid()
        write_atomic(path, render_claims([*others, Claim(block, str(root), pid, process_started(pid) or 0)]))
        return block


def release_block(root: Path, where: Path = CLAIMS_DIR) -> None:
    """Free the block the lab in ``root`` holds, if any (``lab down``; read first, so a ``down`` of a lab that
    holds none takes no lock and writes nothing)."""
    if not any(c.dir == str(root) for c in _read(where / CLAIMS_FILE)):
        return
    with _locked(where) as path:
        claims = _read(path)
        if any(c.dir == str(root) for c in claims):
            write_atomic(path, render_claims(c for c in claims if c.dir != str(root)))


def held_blocks(where: Path = CLAIMS_DIR) -> list[Claim]:
    """The claims recorded now, live or not (what tests and an operator look at)."""
    with _locked(where) as path:
        return _read(path)
