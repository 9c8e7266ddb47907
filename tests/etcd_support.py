"""A real etcd for tests: started on a free loopback port with a throw-away data directory, stopped by pid.

Skips, with the reason, where the machine has no etcd (Debian's etcd-server; `make test` installs it).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass
class Etcd:
    url: str  # the tooz URL of this etcd
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def etcd() -> Iterator[Etcd]:
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server; `make test` installs it)")
    data = tempfile.mkdtemp(prefix="vcsched-etcd-")
    client, peer = _free_port(), _free_port()
    proc = subprocess.Popen(
        [binary, "--data-dir", data, "--name", "t",
         "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"t=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"etcd did not start on 127.0.0.1:{client}")
            time.sleep(0.1)
        yield Etcd(f"etcd3+http://127.0.0.1:{client}", proc)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)
