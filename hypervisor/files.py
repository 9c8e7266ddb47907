"""The one way vcsched writes a file: whole or not at all.

Every file vcsched writes — plans (``-o PLAN.json``), the cluster file that
``cordon`` edits, the lab's ``cluster.toml`` and ``state.json``, the lock's
holder record, remembered host identities, experiment records and reports,
the guest image cache — goes through :func:`write_atomic`: the bytes go to a
uniquely named temporary file in the same directory, are flushed to disk,
and the temporary file is renamed over the target.  A reader (another
command, a second test session filling the same cache, an operator's
editor) sees the old file or the new one, never half of one, and a command
killed mid-write leaves the old file in place.

It lives here, outside the pure core (:mod:`vcsched` does no I/O), where both
:mod:`cli` and :mod:`hypervisor` import it; it imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vcsched.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically (module docstring).

    ``mode``: the new file's permission bits; by default an existing file keeps its own, and a new one gets
    what ``open()`` would give it (0o666 less the umask).  Raises :class:`OSError` as ``open()`` would.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if mode is None:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` of ``path`` (created if missing) for a read-modify-write of the file it guards:
    two processes that both read, change and :func:`write_atomic` one document would otherwise each write their
    own view, and the first one's change would be lost.  Raises :class:`OSError` when the file cannot be opened."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_output(where: str, path: str | Path, data: str | bytes) -> None:
    """:func:`write_atomic` for a file the user named (``where``: the option, e.g. ``--output``): a file that
    cannot be written is bad input naming the option, the path and why (exit 2, nothing else changed)."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise InputError(f"{where} {path}: cannot write ({exc.strerror or exc})") from None


def write_figure(where: str, path: str | Path, fig: Any, dpi: int = 100) -> None:
    """A matplotlib figure written like every other file (:func:`write_output`: atomically, a failure naming
    ``where``), in the format of ``path``'s suffix (PNG without one); the figure is closed either way."""
    import io

    import matplotlib.pyplot as plt  # lazy: only the commands that plot need matplotlib

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi)
    finally:
        plt.close(fig)
    write_output(where, path, buf.getvalue())


#: Where vcsched keeps its own state (the lock's files, identities, journals) unless told otherwise.
STATE_DIR_ENV = "VCSCHED_STATE_DIR"

def state_dir() -> Path:
    """vcsched's own state: ``$VCSCHED_STATE_DIR``, else /var/lib/vcsched for root, else ~/.local/state/vcsched."""
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/vcsched")
    return Path.home() / ".local" / "state" / "vcsched"
