"""A real terminal for tests of full-screen commands (`vcsched top`): tmux, on a server of the test's own.

The command runs in a tmux pane of the given size under ``bash``, which then
prints its exit code and the terminal's settings (``stty -a``), so a test can
check both after the command ends.  Keys go in with ``send-keys``; the screen
comes out with ``capture-pane``.  Each :class:`Pane` has its own tmux server
(``-L``), so tests never touch a tmux the person running them uses.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tmux_or_skip() -> str:
    path = shutil.which("tmux")
    if path is None:
        pytest.skip("tmux not installed (scripts/install-system-deps installs it)")
    return path


class Pane:
    """``command`` (a list) running in a ``width`` x ``height`` terminal; close() ends it and the server."""

    def __init__(self, command: list[str], width: int = 120, height: int = 40,
                 env: Mapping[str, str] | None = None, cwd: Path = ROOT) -> None:
        self.tmux = tmux_or_skip()
        self.socket = f"vcsched-test-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        script = (f"cd {shlex.quote(str(cwd))}; unset COLUMNS LINES; {'export ' + exports + '; ' if exports else ''}"
                  f"{shlex.join(command)}; echo EXIT=$?; stty -a; sleep 600")
        self._run("new-session", "-d", "-x", str(width), "-y", str(height), "bash", "--norc", "-c", script)
        self.socket_path = Path(self._run("display-message", "-p", "#{socket_path}").strip())

    def _run(self, *args: str) -> str:
        r = subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:2])}: {r.stderr.strip()}")
        return r.stdout

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-t", "0")

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", "0", *keys)

    def wait_for(self, what: Callable[[str], bool], timeout: float, poll: float = 0.1) -> str:
        """The first screen for which ``what`` holds; AssertionError with the last screen after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if what(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"not on the screen within {timeout:g} s; the screen:\n{text}")
            time.sleep(poll)

    def command_pid(self) -> int:
        """The pid of the command (the child of the pane's shell)."""
        import psutil

        shell = int(self._run("display-message", "-p", "-t", "0", "#{pane_pid}").strip())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = psutil.Process(shell).children()
            if children:
                return int(children[0].pid)
            time.sleep(0.05)
        raise AssertionError("the command did not start")

    def exit_code(self, timeout: float = 30) -> tuple[int, str]:
        """The command's exit code once it ended, and ``stty -a`` after it."""
        # stty prints a moment after the exit code: wait for both, or a slow machine reads a half-drawn screen
        text = self.wait_for(lambda s: "EXIT=" in s and "icanon" in s[s.index("EXIT="):], timeout)
        tail = text[text.index("EXIT="):]
        return int(tail.split("=", 1)[1].split()[0]), tail

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
        self.socket_path.unlink(missing_ok=True)  # the server leaves its socket file behind


def restored(stty: str) -> bool:
    """The terminal is back in its usual (canonical, echoing) mode: ``icanon`` and ``echo``, not ``-icanon``."""
    words = stty.split()
    return "icanon" in words and "echo" in words
