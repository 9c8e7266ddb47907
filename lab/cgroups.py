"""Per-host cgroup partitions for the lab's daemons.

libvirt puts each guest under ``<partition>.partition/<machine>`` in every cgroup
controller it uses, but it only *creates* its default ``/machine`` partition; any
other partition must exist before a guest starts.  Two daemons on one machine
sharing ``/machine`` collide on ``qemu-N-name``, so each lab host gets its own
partition, pre-created in every v1 hierarchy and in the v2 (unified) one
(docs/lab.md).  Removing a partition also ends the processes still inside it,
which is how a crashed lab's orphaned guests are found: they are exactly the
processes in the lab's own partitions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from lab.state import partition_dir_name, pid_gone

PROC_MOUNTS = Path("/proc/mounts")


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: a v1 controller (or named hierarchy) or the v2 tree."""

    mount: Path
    controllers: tuple[str, ...]
    v2: bool


def parse_mounts(text: str) -> list[Hierarchy]:
    """The cgroup hierarchies listed in a ``/proc/mounts`` text."""
    out: list[Hierarchy] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("cgroup", "cgroup2"):
            continue
        opts = fields[3].split(",")
        generic = {"rw", "ro", "relatime", "noexec", "nosuid", "nodev"}
        ctrls = tuple(o for o in opts if o.startswith("name=") or (o not in generic and "=" not in o))
        out.append(Hierarchy(Path(fields[1]), ctrls, fields[2] == "cgroup2"))
    return out


def hierarchies() -> list[Hierarchy]:
    return parse_mounts(PROC_MOUNTS.read_text())


def writable_problem() -> str | None:
    """None when a partition can be created in every hierarchy, else why not (one line)."""
    hs = hierarchies()
    if not hs:
        return "no cgroup hierarchy is mounted (need /sys/fs/cgroup)"
    probe = f"vcsched-probe-{os.getpid()}"
    for h in hs:
        d = h.mount / probe
        try:
            d.mkdir()
            d.rmdir()
        except OSError as exc:
            return f"cgroup hierarchy {h.mount} is not writable ({exc.strerror})"
    return None


def create_partition(partition: str) -> list[Path]:
    """Create ``<partition>.partition`` at the root of every hierarchy; returns the directories.

    A v1 cpuset cgroup starts with empty ``cpus``/``mems`` and then accepts no
    task, so those are copied from the root as libvirt would do for its own.
    """
    name = partition_dir_name(partition)
    made: list[Path] = []
    for h in hierarchies():
        d = h.mount / name
        d.mkdir(exist_ok=True)
        made.append(d)
        if not h.v2 and "cpuset" in h.controllers:
            for f in ("cpuset.cpus", "cpuset.mems"):
                target = d / f
                if not target.read_text().strip():
                    target.write_text((h.mount / f).read_text())
    return made


def partition_dirs(partition: str) -> list[Path]:
    """The partition's existing directories, one per hierarchy that has it."""
    name = partition_dir_name(partition)
    return [h.mount / name for h in hierarchies() if (h.mount / name).is_dir()]


def procs_in(directory: Path) -> set[int]:
    """All pids in a cgroup directory and its descendants."""
    pids: set[int] = set()
    for dirpath, _dirs, _files in os.walk(directory):
        try:
            text = (Path(dirpath) / "cgroup.procs").read_text()
        except OSError:
            continue
        pids.update(int(p) for p in text.split())
    return pids


def remove_partition(partition: str, kill_timeout_s: float = 10.0) -> list[int]:
    """Kill whatever still runs in the partition, then remove its cgroups; returns the pids killed.

    Only processes inside this lab's own partitions are signalled, so guests of
    other labs or of the machine's own libvirtd are never touched.
    """
    dirs = partition_dirs(partition)
    victims: set[int] = set()
    for d in dirs:
        victims |= procs_in(d)
    for pid in victims:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + kill_timeout_s
    alive = set(victims)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if not pid_gone(p)}
        time.sleep(0.05)
    for d in dirs:
        _rmdir_tree(d, deadline)
    return sorted(victims)


def _rmdir_tree(root: Path, deadline: float) -> None:
    """Remove a cgroup directory bottom-up (cgroup dirs hold only virtual files; rmdir is the removal)."""
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
        while True:
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:
                # A killed process leaves its cgroup a moment after it is reaped.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
