"""Ethernet frames written into a guest's tap on this machine: the inbound traffic network caps are measured on.

Why inbound: libvirt shapes a guest's *inbound* traffic with an HTB class on
the host side of its tap, which queues and delays, so what the guest receives
(``interfaceStats`` rx, counted after the class) is what the cap allows.  Its
*outbound* traffic is policed on the tap's ingress, which drops the excess
*after* the tap counted it, so ``interfaceStats`` tx shows what the guest
offered, not what got through: an outbound cap cannot be observed through
libvirt's counters at all.

The frames are raw Ethernet (AF_PACKET on the tap, root only) addressed to
the guest's MAC with the IEEE "local experimental" EtherType 0x88B5: no
protocol stack on either side handles them, the guest's kernel counts and
drops them.  They go nowhere but into that one tap: it has no address, no
bridge and no route (docs/lab.md).  Senders are paced by a token bucket so a
flood costs no more CPU than its rate needs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType

from vcsched.errors import InputError

ETHERTYPE_LOCAL_EXPERIMENTAL = 0x88B5
FRAME_BYTES = 1514  # a full 1500-byte payload plus the 14-byte Ethernet header, what the guest's counters see
BATCH = 32  # frames sent between two looks at the clock


def frame(dst_mac: str, src_mac: str = "02:00:5e:00:53:02") -> bytes:
    """One full-size frame to ``dst_mac`` (locally administered source: no machine has it)."""
    def raw(mac: str) -> bytes:
        try:
            out = bytes(int(x, 16) for x in mac.split(":"))
        except ValueError:
            out = b""
        if len(out) != 6:
            raise InputError(f"MAC address {mac!r} is not six hex bytes")
        return out

    header = raw(dst_mac) + raw(src_mac) + ETHERTYPE_LOCAL_EXPERIMENTAL.to_bytes(2, "big")
    return header + bytes(FRAME_BYTES - len(header))


class Flood:
    """A thread writing frames into tap ``ifname`` at ``rate`` bytes/s (None: as fast as it can) until stopped."""

    def __init__(self, ifname: str, dst_mac: str, rate: float | None = None) -> None:
        self.ifname = ifname
        self.rate = rate
        self.frame = frame(dst_mac)
        self.sent = 0  # bytes handed to the tap (the tap may drop some when the guest does not keep up)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            self.sock.bind((ifname, 0))
        except PermissionError:
            raise InputError("sending frames into a guest's tap needs root (CAP_NET_RAW)") from None
        except OSError as exc:
            raise InputError(f"tap {ifname}: cannot send into it ({exc.strerror}); the guest must run on "
                             "this machine") from None

    def start(self) -> Flood:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"flood-{self.ifname}", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.monotonic()
        sent_at_t0 = self.sent
        while not self._stop.is_set():
            for _ in range(BATCH):
                with contextlib.suppress(BlockingIOError, OSError):  # a full tap queue drops; we keep going
                    self.sock.send(self.frame)
                    self.sent += len(self.frame)
            if self.rate is not None:
                ahead = (self.sent - sent_at_t0) / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    self._stop.wait(ahead)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> Flood:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
