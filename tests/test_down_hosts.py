"""A dead host paid once (hypervisor/down_hosts.py): after a full wait found a host down, the next commands give
it one short probe, not ``host_timeout``, and name it as known down.

A hung host is a unix socket that accepts connections and never answers (libvirt's open then waits, as on a
stopped libvirtd); a dead one is a socket path where nothing listens (the connection is refused at once).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypervisor import down_hosts
from hypervisor.files import state_dir
from hypervisor.libvirt_backend import LibvirtHypervisor
from hypervisor.pool import run_bounded
from hypervisor.testhosts import node_xml
from vcsched.formats.cluster import Cluster, cluster_from_dict

HOST_TIMEOUT = 6.0


@pytest.fixture(autouse=True)
def fresh_record() -> Iterator[None]:
    (state_dir() / down_hosts.FILE).unlink(missing_ok=True)
    yield
    (state_dir() / down_hosts.FILE).unlink(missing_ok=True)


@pytest.fixture
def hung_socket(tmp_path: Path) -> Iterator[Path]:
    """A unix socket that accepts and never answers (a hung libvirtd)."""
    path = tmp_path / "hung.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield path
    stop.set()
    t.join()
    for s in held:
        s.close()
    server.close()


def cluster(tmp_path: Path, far_uri: str) -> Cluster:
    (tmp_path / "h0.xml").write_text(node_xml(0, 2))
    return cluster_from_dict({"name": "t", "host_timeout": HOST_TIMEOUT,
                              "hosts": [{"name": "h0", "uri": f"test://{tmp_path}/h0.xml"},
                                        {"name": "far", "uri": far_uri}]})


def read(c: Cluster) -> tuple[float, str | None, int]:
    """Seconds an inventory took, host far's down reason, and how many VMs the others showed."""
    t0 = time.monotonic()
    with LibvirtHypervisor(c) as hv:
        inv = hv.inventory()
    far = next(h for h in inv.hosts if h.name == "far")
    return time.monotonic() - t0, far.down, len(inv.vms)


def test_a_hung_host_costs_host_timeout_once_then_one_short_probe(tmp_path: Path, hung_socket: Path) -> None:
    c = cluster(tmp_path, f"qemu+unix:///system?socket={hung_socket}")
    took, why, vms = read(c)
    assert took >= HOST_TIMEOUT - 0.1 and vms == 2
    assert why is not None and f"did not answer within {HOST_TIMEOUT:g} s" in why
    for _ in range(2):  # the probe does not renew the record: still known down, still one probe
        took, why, vms = read(c)
        assert took < HOST_TIMEOUT - 1.5, took  # one probe of PROBE_S (1 s), not host_timeout
        assert vms == 2 and why is not None and why.startswith("host far: known down since ")
        assert f"did not answer within {HOST_TIMEOUT:g} s" in why and "one probe of 1 s got no answer" in why


def test_a_host_that_answers_again_is_read_in_full_and_forgotten(tmp_path: Path) -> None:
    (tmp_path / "far.xml").write_text(node_xml(1, 1))
    dead = f"qemu+unix:///system?socket={tmp_path}/nothing-here"
    c = cluster(tmp_path, dead)
    _, why, _ = read(c)
    assert why is not None and "cannot connect" in why
    assert set(down_hosts.known_down(state_dir())) == {dead}
    took, why, _ = read(c)  # probed: its own answer (refused at once) is the reason, the record kept as it was
    assert why is not None and why.startswith("host far: cannot connect") and took < HOST_TIMEOUT - 1.5
    assert set(down_hosts.known_down(state_dir())) == {dead}
    # The same entry, now answering (its URI the one recorded): read, and the record dropped.
    alive = cluster(tmp_path, f"test://{tmp_path}/far.xml")
    down_hosts.update(state_dir(), {f"test://{tmp_path}/far.xml": "was down"}, [])
    _, why, vms = read(alive)
    assert why is None and vms == 3 and set(down_hosts.known_down(state_dir())) == {dead}


def test_a_record_older_than_its_memory_costs_the_full_wait_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    down_hosts.update(state, {"qemu:///a": "refused"}, [], now=1000.0)
    assert set(down_hosts.known_down(state, now=1000.0 + down_hosts.DOWN_MEMORY_S - 1)) == {"qemu:///a"}
    assert down_hosts.known_down(state, now=1000.0 + down_hosts.DOWN_MEMORY_S + 1) == {}
    limits, known = down_hosts.probe_timeouts(state, {"a": "qemu:///a", "b": "qemu:///b"}, 15.0, now=1001.0)
    assert limits == {"a": down_hosts.PROBE_S, "b": 15.0} and set(known) == {"a"}
    limits, _ = down_hosts.probe_timeouts(state, {"a": "qemu:///a"}, 0.5, now=1001.0)
    assert limits == {"a": 0.5}  # never longer than host_timeout


def test_two_commands_recording_at_once_lose_neither_finding(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue (QA, several commands on one machine): the record was read, changed and written with no lock, so two
    commands that found different hosts down at once each wrote their own view and one finding was lost — a
    sleeping host's asleep mark among them (each lost finding costs a later command the full host_timeout)."""
    state = tmp_path / "state"
    slow_read = down_hosts._read

    def read(where: Path) -> dict[str, down_hosts.KnownDown]:
        got = slow_read(where)
        time.sleep(0.3)  # both read before either writes, unless the second waits for the first
        return got

    monkeypatch.setattr(down_hosts, "_read", read)
    writers = [threading.Thread(target=down_hosts.update, args=(state, {"qemu:///a": "refused"}, [])),
               threading.Thread(target=down_hosts.asleep, args=(state, "qemu:///b", "powered off"))]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    monkeypatch.setattr(down_hosts, "_read", slow_read)
    known = down_hosts.known_down(state)
    assert set(known) == {"qemu:///a", "qemu:///b"} and known["qemu:///b"].asleep


def test_an_unreadable_record_is_ignored(tmp_path: Path) -> None:
    (tmp_path / down_hosts.FILE).write_text("{not json")
    assert down_hosts.known_down(tmp_path) == {}
    down_hosts.update(tmp_path / "not-a-dir" / "x", {}, [])  # nothing to write: nothing written, no error


def test_each_task_is_abandoned_at_its_own_deadline() -> None:
    gate = threading.Event()
    t0 = time.monotonic()
    got = run_bounded({"probe": gate.wait, "slow": lambda: time.sleep(0.6) or 1, "ok": lambda: 2}, 3,
                      {"probe": 0.2, "slow": 5.0, "ok": 5.0})
    took = time.monotonic() - t0
    gate.set()
    assert got == {"slow": 1, "ok": 2} and took < 3.0


def test_a_host_recorded_asleep_keeps_its_short_probe_however_long_it_sleeps(tmp_path: Path) -> None:
    down_hosts.asleep(tmp_path, "qemu+tcp://h9/system", "asleep (vcsched power saving)", now=0.0)
    later = down_hosts.DOWN_MEMORY_S * 10
    limits, known = down_hosts.probe_timeouts(tmp_path, {"h9": "qemu+tcp://h9/system"}, 15.0, now=later)
    assert limits == {"h9": down_hosts.PROBE_S} and known["h9"].asleep
    down_hosts.update(tmp_path, {}, ["qemu+tcp://h9/system"])  # it answers: forgotten
    assert down_hosts.known_down(tmp_path, now=later) == {}
