"""A lab host's own init: runs a command, then stays behind as the child subreaper of what it started.

``python reaper.py CMD...`` runs CMD (the host's start script), exits with its status, and leaves a
detached process that is the *child subreaper* (``PR_SET_CHILD_SUBREAPER``) of everything CMD started: the
daemons (``libvirtd -d`` and the others daemonize) and, through them, every QEMU process of the host.  It reaps
them as soon as they end, and exits once none is left.

Why: libvirt waits until a QEMU process it stops is gone (``kill(pid, 0)`` fails) before a ``destroy``, the end
of a migration or a guest shutdown returns, and a zombie still answers ``kill(pid, 0)``.  Without a subreaper
the orphaned QEMU is reaped by the machine's init, which on some machines (a microVM's init, measured here) does
so only every 1-2 s: each of those operations then took that much longer than on a real host, whose init reaps
at once.  Standalone on purpose (no vcsched import): it starts fast and lives inside the host's namespace.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    read_end, write_end = os.pipe()
    if os.fork() > 0:  # the caller's process: report the command's status once it has run
        os.close(write_end)
        status = os.read(read_end, 16)
        return int(status) if status.strip() else 1
    os.close(read_end)
    os.setsid()  # no terminal, no process group of the caller's: signals to the caller do not reach the host
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(write_end, b"1")
        print(f"reaper: prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        os._exit(1)
    try:
        rc = subprocess.call(argv)
    except OSError as exc:
        print(f"reaper: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        rc = 127
    os.write(write_end, str(rc).encode())
    os.close(write_end)
    # What the command left running (and what it starts later) is ours: reap it as it ends.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
