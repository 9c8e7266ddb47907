"""``vcsched top``: the cluster live, full screen, refreshed every --interval (read-only: no lock, no change).

Reading and showing are apart: a thread reads the hosts every interval
(:class:`Reader`: one inventory and a CPU-time reading per VM, the need
estimator, `status`'s yields, the controller's log), the main thread shows the
latest view with rich's live display and reads keys.  A host that hangs
holds up a reading for at most the cluster's ``host_timeout`` (then it is
down for that reading), while the screen keeps answering keys and says how
long the reading has taken.  The screen itself is :mod:`cli.top_view`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Group
from rich.text import Text

from acting.events import EventTail
from acting.sampling import CpuSampler
from cli.app import EXIT_OK, EXIT_UNSATISFIED, console
from cli.common import load_cluster
from cli.params import Duration, cluster_option, policy_options
from cli.top_view import Line, Refresh, Sort, frame, on_key
from hypervisor.base import Hypervisor
from vcsched.control.observe import estimate_all
from vcsched.control.power import PowerState
from vcsched.control.sharing import Sharing
from vcsched.control.status import virtual_clusters
from vcsched.control.top import TopView, controller_state, top_view
from vcsched.errors import VcschedError
from vcsched.formats.cluster import Cluster
from vcsched.inventory import HostState, Inventory

if TYPE_CHECKING:
    from acting.power import HasIdentities


class Reader:
    """One reading per call (module docstring), remembering what the next one builds on: the CPU-time readings
    and samples of the window, the last estimates (the estimator's dead band), since when each host is down.

    **A host that hangs** costs one reading ``host_timeout`` (nothing tells it apart from a slow one before
    then).  After that it is *suspect*: readings leave it out, so the others keep refreshing every interval,
    and it is shown down with its reason while a second connection asks it again in the background, one try
    at a time; once it answers, the next reading takes it back.
    """

    def __init__(self, cluster: Cluster, hv: Hypervisor, sharing: Sharing, interval: float, window: float,
                 events: Path | None, prober: Hypervisor | None = None,
                 power: Callable[[], PowerState] | None = None) -> None:
        self.cluster, self.hv, self.sharing = cluster, hv, sharing
        # A sample needs at least half an interval, as the controller's (acting/sampling.py says why).
        self.sampler = CpuSampler(window + interval, min_seconds=interval / 2, every_vm=True)
        self.previous: dict[str, float] = {}
        self.down_since: dict[str, float] = {}
        self.tail = EventTail(events) if events is not None else None
        self.prober = prober
        self.suspect: dict[str, HostState] = {}  # host -> its down row, while it is retried in the background
        self._probing: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Reads the power record (docs/power.md): a host vcsched put to sleep is shown asleep, not down.
        self.power = power

    def _hosts(self) -> Inventory:
        with self._lock:
            suspect = dict(self.suspect) if self.prober is not None else {}
        asked = [h.name for h in self.cluster.hosts if h.name not in suspect] or None  # all suspect: ask all
        inventory = self.sampler.sample(self.hv, hosts=asked)
        if self.prober is not None:
            with self._lock:
                self.suspect.update({h.name: h for h in inventory.down_hosts()})
            self._retry()
        if not suspect:
            return inventory
        read = {h.name: h for h in inventory.hosts}
        return dataclasses.replace(inventory, hosts=tuple(read.get(h.name) or suspect[h.name]
                                                          for h in self.cluster.hosts))

    def _retry(self) -> None:
        """Ask the suspect hosts again in the background (one try at a time); those that answer come back."""
        if self.prober is None or not self.suspect or self.retrying():
            return
        prober = self.prober

        def retry() -> None:
            with self._lock:
                names = list(self.suspect)
            try:
                got = prober.inventory(names)
            except Exception:  # tried again after the next reading
                return
            with self._lock:
                for h in got.hosts:
                    if h.down is None:
                        self.suspect.pop(h.name, None)
                    elif h.name in self.suspect:
                        self.suspect[h.name] = h

        self._probing = threading.Thread(target=retry, name="top-retry", daemon=True)
        self._probing.start()

    def retrying(self) -> bool:
        """A background try is still waiting on a host."""
        return self._probing is not None and self._probing.is_alive()

    def read(self) -> TopView:
        from acting.power import asleep_in

        # A record that cannot be read leaves the hosts down, each with libvirt's reason (as before power saving).
        inventory = asleep_in(self._hosts(), self.power, lambda _note: None)
        now = time.time()
        for h in inventory.hosts:
            if h.down is None:
                self.down_since.pop(h.name, None)
            else:
                self.down_since.setdefault(h.name, now)
        samples = self.sampler.samples()
        estimates = estimate_all(inventory, samples, self.previous)
        self.previous = {name: e.estimate for name, e in estimates.items()}
        problems = []
        try:
            vcs = virtual_clusters(self.cluster, inventory, self.sharing, estimates)
        except VcschedError as exc:  # e.g. a VM's tenant no longer in the cluster file: shown, not fatal
            vcs = []
            problems.append(str(exc))
        controller = None
        if self.tail is not None:
            try:
                self.tail.poll()
            except OSError as exc:
                problems.append(f"--events {self.tail.path}: cannot read ({exc.strerror or exc})")
            controller = controller_state(self.tail.events)
        from cli.common import read_lost

        lost, unknown = read_lost(self.cluster, inventory)
        view = top_view(inventory, self.sharing.policy, samples, estimates, vcs, cordoned=self.cluster.cordoned,
                        down_since=self.down_since, now=now, controller=controller,
                        problem="; ".join(problems) or None, lost=lost)
        return dataclasses.replace(view, lost_unknown=unknown)


def _power_record(cluster: Cluster, hv: HasIdentities) -> Callable[[], PowerState]:
    """What reads the cluster's power record at each refresh that finds a host down.  Its store is named once (its
    key asks every host without a declared UUID for its identity, which a hung one would make every refresh wait
    for); reading it is then a file or etcd read."""
    from acting.power import PowerStore, store_for
    from hypervisor.identity import LockUnnamed

    stores: list[PowerStore] = []

    def read() -> PowerState:
        if not stores:
            try:
                stores.append(store_for(cluster, hv.identities()))
            except LockUnnamed:  # a host down that no command here ever read: none this machine put to sleep
                return PowerState()
        return stores[0].read()

    return read


class Refresher(threading.Thread):
    """Reads every ``interval`` in the background; the latest view (and when it was read) for the screen."""

    def __init__(self, reader: Reader, interval: float) -> None:
        super().__init__(name="top-reader", daemon=True)
        self.reader, self.interval = reader, interval
        self.stop = threading.Event()
        self.changed = threading.Event()
        self.view: TopView | None = None
        self.read_at = 0.0
        self.reading_since: float | None = None
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            self.reading_since = start
            try:
                view = self.reader.read()
            except Exception as exc:  # shown on the screen; the next reading tries again
                self.error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, VcschedError) else str(exc)
            else:
                self.view, self.read_at, self.error = view, time.time(), None
            self.reading_since = None
            self.changed.set()
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - start)))


def _texts(lines: list[Line]) -> list[Text]:
    out = []
    for line in lines:
        t = Text(no_wrap=True, overflow="crop")
        for text, style in line:
            t.append(text, style or None)
        out.append(t)
    return out


def _text(lines: list[Line]) -> Group:
    return Group(*_texts(lines))


def _screen(refresher: Refresher, sort: Sort, interval: float, events: str | None, width: int, height: int
            ) -> Group:
    now = time.time()
    reading = refresher.reading_since
    took = time.monotonic() - reading if reading is not None else None
    if refresher.view is None:
        what = refresher.error or f"reading the hosts of cluster {refresher.reader.cluster.name} ..."
        return _text([(("vcsched top", "bold reverse"), (" " + what, "red" if refresher.error else "dim"))])
    lines = frame(refresher.view, sort, width, height,
                  Refresh(refresher.read_at, interval, took if took is not None and took >= interval else None,
                          events), now)
    if refresher.error:
        lines.insert(1, ((f"last reading failed: {refresher.error}", "red"),))
        lines = lines[:height - 1] + lines[-1:]
    return _text(lines)


def _interactive(refresher: Refresher, sort: Sort, interval: float, events: str | None) -> int:
    from rich.live import Live

    from cli.terminal import cbreak, keys_in, read_key, signals_exit

    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    with signals_exit(), (cbreak(fd) if fd is not None else contextlib.nullcontext()), \
            Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                 redirect_stderr=False) as live:
        refresher.start()
        drawn = 0.0
        try:
            while True:
                if fd is not None:
                    key = read_key(fd, 0.2)
                else:  # no keyboard (stdin is not a terminal): until Ctrl-C or SIGTERM
                    time.sleep(0.2)
                    key = None
                for k in keys_in(key or ""):
                    new = on_key(sort, k)
                    if new is None:
                        return EXIT_OK
                    sort = new
                if key is not None or refresher.changed.is_set() or time.monotonic() - drawn >= 1.0:
                    refresher.changed.clear()
                    # The terminal's own size, read at every redraw (it may have been resized); rich would
                    # prefer $COLUMNS/$LINES, which describe some other terminal when inherited.
                    console.size = os.get_terminal_size(console.file.fileno())
                    live.update(_screen(refresher, sort, interval, events, console.width, console.height),
                                refresh=True)
                    drawn = time.monotonic()
        except KeyboardInterrupt:
            return EXIT_OK


@click.command("top")
@cluster_option()
@click.option("--interval", type=Duration(), default="2s", show_default=True,
              help="How often to read the hosts and redraw (1, 2s, 500ms).")
@click.option("--window", type=Duration(), default="30s", show_default=True,
              help="Samples the need estimate uses (as `vcsched observe --window`).")
@click.option("--events", "events_file", type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="FILE", help="A running controller's event log (`vcsched run --log FILE`): show who leads, "
                                   "its last decisions, steps and faults, and the migrations it is making.")
@click.option("--sort", "sort_key", type=click.Choice(("host", "yield", "use")), default="host", show_default=True,
              help="The VMs' first order (keys y, u, h change it).")
@click.option("--once", is_flag=True, help="Print one frame (two readings, --interval apart) and exit, as when "
                                           "the output is not a terminal.")
@policy_options()
def top_cmd(cluster_file: str | None, interval: float, window: float, events_file: str | None, sort_key: str,
            once: bool, policy: str | None, alpha: float | None) -> int:
    """Watch the cluster live: hosts, VMs, caps, use, needs and yields, refreshed every --interval.

    \b
    Full screen, read-only (no lock is taken, nothing changes):
      hosts: cores, the sum of caps, the cores their VMs used, the cores
             kept for their unmanaged domains (UNMANAGED, measured over
             --window; red and "full of unmanaged" when that is all of
             them; "full of unmanaged disk" / "net" when their measured
             I/O takes a declared disk_bps / net_bps whole), memory used / usable, and DOWN (with libvirt's reason
             and for how long), sleeping / waking / wake-failed (powered off
             by vcsched's power saving, docs/power.md: not down), cordoned
             (maintenance) or failed (a step failed on it, or the controller
             found it down: --events);
      VMs:   virtual cluster, host, cap, the cores used over the last
             interval, whether the cap binds (the VM uses all of it), its need
             as declared and as estimated from its use over --window (the
             estimator of `vcsched observe` and `run`; an unmanaged
             domain's EST is its reservation), its yield (cap / need)
             against its floor, and IN DOUBT, migrating, paused or off;
      the policy in force and the virtual clusters' min and mean yield; with
      --events, the controller's state and last events.
    Keys: y sort by yield (lowest first), u by use (busiest first), h by host,
    r reverses, q quits.  A host that hangs is shown down after the cluster's
    host_timeout; the screen keeps answering meanwhile.  On a narrow terminal
    the least important columns leave the row rather than being cut: a VM's
    values in them go on an indented line under it (floor 0.6 · vcpus 1),
    so nothing is hidden.  Without a terminal (piped) it prints one frame and
    exits (as --once).

    \b
    Examples:
      vcsched top --interval 1
      vcsched top --events /var/log/vcsched/prod.jsonl --sort yield
      vcsched top --once | less -S

    Exit codes: 0 done (q, Ctrl-C), 1 one frame printed with every host down,
    2 bad input, 143 SIGTERM.
    """
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.control.sharing import sharing_for

    cluster = load_cluster(cluster_file)
    sharing = sharing_for(cluster, policy, alpha)  # bad input: exit 2 before anything is read
    sort = Sort(sort_key)
    hv = LibvirtHypervisor(cluster)  # reading only (reads never act)
    reader = Reader(cluster, hv, sharing, interval, window, Path(events_file) if events_file else None,
                    power=_power_record(cluster, hv))
    if once or not console.is_terminal:
        with hv:
            reader.read()
            time.sleep(interval)  # a second reading: each VM's use over the interval between them
            view = reader.read()
        for t in _texts(frame(view, sort, console.width, None,
                              Refresh(time.time(), interval, events_file=events_file), time.time())):
            console.print(t)
        return EXIT_UNSATISFIED if all(h.down is not None for h in view.hosts) else EXIT_OK
    # Interactive: a second connection retries hung hosts in the background (Reader's docstring).
    prober = LibvirtHypervisor(cluster)
    reader.prober = prober
    refresher = Refresher(reader, interval)
    try:
        return _interactive(refresher, sort, interval, events_file)
    finally:
        refresher.stop.set()
        refresher.join(timeout=0.5)
        if refresher.is_alive() or reader.retrying():  # blocked on a host that does not answer: exit past it
            from hypervisor.connections import note_abandoned

            note_abandoned()
        else:
            hv.close()
            prober.close()
