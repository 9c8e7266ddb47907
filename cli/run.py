"""``vcsched run``: the controller as a foreground daemon (docs/controller.md)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TextIO

import click

from cli.app import EXIT_OK
from cli.common import load_cluster, notice
from cli.params import Bytes, Duration, FiniteFloatRange, check_coordination, cluster_option
from cli.signals import stopping_on_signals
from vcsched.errors import InputError


def open_log(path: str | None) -> TextIO:
    """The event log: ``path`` opened for appending (line-buffered), or stdout; unwritable is bad input."""
    if path is None or path == "-":
        return sys.stdout
    try:
        return Path(path).open("a", buffering=1, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--log {path}: cannot write ({exc.strerror})") from None


@click.command("run")
@cluster_option()
@click.option("--interval", type=Duration(), default="30s", show_default=True,
              help="How often to decide and act (30, 30s, 2m, 500ms).")
@click.option("--budget-per-interval", "budget", type=Bytes(), required=True,
              help="Most bytes the live migrations of one interval may move (0: caps only; 512MiB, 2GiB).")
@click.option("--threshold", type=FiniteFloatRange(min=0, max=1), default=0.05, show_default=True,
              help="Migrate only when the predicted minimum yield beats the caps-only one by this much "
                   "(min-yield points, 0..1).")
@click.option("--settle", type=click.IntRange(min=1), default=2, show_default=True,
              help="Hysteresis: the same gainful migrations must be proposed this many intervals in a row.")
@click.option("--cooldown", type=Duration(allow_zero=True), default="10m", show_default=True,
              help="A migrated VM is not migrated again for this long (its libvirt metadata says when it moved).")
@click.option("--window", type=Duration(), default=None,
              help="Samples the need estimate uses (default: one interval).")
@click.option("--sample", type=Duration(), default=None,
              help="Time between CPU samples (default: a quarter interval, at most 2 s).")
@click.option("--probe-seconds", type=Duration(allow_zero=True), default=None,
              help="How long a probe raises a saturated VM's cap into unused capacity (default: a third of an "
                   "interval, at most 5 s; 0: never probe).")
@click.option("-a", "--algorithm", type=click.Choice(("heuristic", "milp")), default="heuristic", show_default=True,
              help="The adaptation solver (section 6.1).")
@click.option("--parallel", type=click.IntRange(min=1, max=16), default=1, show_default=True,
              help="Most live migrations at once between one pair of hosts.")
@click.option("--dry-run", is_flag=True, help="Observe and decide, log the plans, change nothing (no probes).")
@click.option("--mode", type=click.Choice(("act", "recommend")), default="act", show_default=True,
              help="act: apply each decision.  recommend: record each decision it would act on as a "
                   "recommendation (reason, predicted yields, bytes) for `vcsched approve ID` or `vcsched skip "
                   "ID`; change nothing (no probes).")
@click.option("--valid-for", type=Duration(), default="10m", show_default=True,
              help="How long a recommendation may be approved after it was made.")
@click.option("--audit-after", "audit_windows", type=click.IntRange(min=1), default=2, show_default=True,
              metavar="WINDOWS", help="Audit each applied plan and each approved recommendation this many "
              "windows after it was applied: predicted against achieved yield (`vcsched audit`).")
@click.option("--duration", type=Duration(), default=None,
              help="Stop on its own after this long, as on SIGTERM (a trial: --dry-run --duration 1h, then read "
                   "the log).  Default: run until stopped.")
@click.option("--log", "log_file", default=None, metavar="FILE",
              help="Append the JSON-lines events here (default: stdout).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None, metavar="PORT",
              help="Serve Prometheus metrics on this port (0: any free port, logged in the start event).")
@click.option("--metrics-addr", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address the metrics endpoint binds to.")
@click.option("--coordination", metavar="URL", default=None, callback=check_coordination,
              help="Where the leader and cluster locks live (file:///DIR, etcd3+http://HOST:2379). Default: "
                   "$VCSCHED_COORDINATION, the cluster file's 'coordination', else a file lock under "
                   "/var/lib/vcsched; controllers on several machines need etcd.")
@click.option("--lock-ttl", "lock_ttl", type=FiniteFloatRange(min=1), default=None, metavar="SECONDS",
              help="etcd: seconds a dead leader keeps leadership (default: the cluster file's lock_ttl, else 10).")
@click.option("--wait", "lock_wait", type=FiniteFloatRange(min=0), default=None, metavar="SECONDS",
              help="How long to wait for the cluster lock before skipping an interval's action "
                   "(default: half an interval, at most 5 s).")
def run_cmd(cluster_file: str | None, interval: float, budget: int, threshold: float, settle: int, cooldown: float,
            window: float | None, sample: float | None, probe_seconds: float | None, algorithm: str, parallel: int,
            dry_run: bool, mode: str, valid_for: float, audit_windows: int, duration: float | None,
            log_file: str | None, metrics_port: int | None, metrics_addr: str, coordination: str | None,
            lock_ttl: float | None, lock_wait: float | None) -> int:
    """Run the controller: measure needs, follow them with caps, re-balance within a byte budget per interval.

    \b
    A foreground daemon (stop it with SIGTERM or Ctrl-C: the running step
    finishes, no further one starts, caps a probe raised are put back, and
    it exits 0; a host's wake is not waited for: it stays recorded waking,
    and the next leader records it on once it answers as itself).  Every
    --interval, as the leader:
      1. estimate each managed VM's CPU need from its use over the last
         --window (probing a VM that uses its whole cap with its host's
         unused capacity for --probe-seconds),
      2. re-cap every VM to the measured needs (no migration),
      3. re-balance with live migrations of at most --budget-per-interval
         bytes when that raises the minimum yield by --threshold, the same
         moves were proposed --settle intervals in a row, no moved VM
         migrated within --cooldown, and now is inside the cluster file's
         maintenance windows and outside its blackouts (otherwise caps
         only, and the decision event says why).
    With --mode recommend it changes nothing: each plan it would apply is
    recorded as a recommendation (`vcsched recommendations`, `vcsched
    approve ID`, `vcsched skip ID`).  Vetoes recorded by `vcsched skip` are
    respected in both modes.  With power_saving = "auto" in the cluster
    file it also puts a host to sleep when the others hold every VM at
    power_yield with the failover room kept (evacuated, seen empty, powered
    off through its agent), and wakes one before demand needs it; with
    "recommend" it proposes those for `vcsched approve ID` (docs/power.md).
    Plans go through the executor's checks under
    the cluster lock.  One
    controller per cluster acts: the holder of the leader lock (etcd lease,
    --lock-ttl); the others stand by and take over within a TTL and an
    interval.  Events are JSON lines (--log); metrics on --metrics-port.

    \b
    Examples:
      vcsched run --budget-per-interval 512MiB --interval 30s --metrics-port 9187
      vcsched run --budget-per-interval 0 --dry-run --duration 1h --log run.jsonl

    Exit codes: 0 stopped, 2 bad input (nothing started).
    """
    from acting.audits import AuditStore
    from acting.controller import Controller, RunOptions
    from acting.definitions import DefinitionStore
    from acting.events import EventLog
    from acting.failure import Failover
    from acting.lock import DEFAULT_TTL, member_id, resolve_url
    from acting.lock_names import admission, cluster_locks, leader_locks, lock_keys
    from acting.metrics import ControllerMetrics, MetricsServer
    from acting.power import PowerStore, agents
    from acting.power_saving import PowerSaving
    from acting.recommendations import RecommendationStore
    from acting.sampling import SystemClock
    from acting.window import publish as publish_window
    from hypervisor.files import state_dir
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.control.rebalance import RebalanceOptions

    cluster = load_cluster(cluster_file)
    options = RunOptions(interval, RebalanceOptions(budget, threshold, settle, cooldown, algorithm, parallel,
                                                    storage=cluster, schedule=cluster.schedule,
                                                    spare=cluster.power.spare_goal),
                         window=window, sample=sample, probe_seconds=probe_seconds, lock_wait=lock_wait,
                         dry_run=dry_run, recommend=mode == "recommend", valid_for=valid_for,
                         audit_windows=audit_windows)
    url = resolve_url(coordination, cluster.coordination)
    books = RecommendationStore.supports(url)  # vetoes and recommendations live beside the lock
    if mode == "recommend" and not books:
        raise InputError(f"--mode recommend: coordination {url} keeps no recommendations (use file:///DIR or "
                         "etcd3+http://HOST:2379)")
    if cluster.power.mode != "off" and not books:
        raise InputError(f"power_saving: {cluster.power.mode!r}: coordination {url} keeps no power record (use "
                         "file:///DIR or etcd3+http://HOST:2379)")
    ttl = lock_ttl or cluster.lock_ttl or DEFAULT_TTL
    member = member_id()
    metrics = ControllerMetrics(cluster.name, cluster.min_yield)
    server = MetricsServer(metrics, metrics_port, metrics_addr) if metrics_port is not None else None
    try:
        stream = open_log(log_file)
    except InputError:
        if server is not None:
            server.close()
        raise
    clock = SystemClock()
    events = EventLog(stream, member, clock.time)
    stop = threading.Event()
    timer = threading.Timer(duration, stop.set) if duration is not None else None
    try:
        if timer is not None:
            timer.daemon = True
            timer.start()
        with stopping_on_signals(stop), LibvirtHypervisor(cluster, on_notice=notice) as hv:
            identities = hv.identities()  # the locks are the hosts', not the file name's (acting/lock_names.py)
            keys = lock_keys(url, cluster.name, identities)
            hv.act_only_as(identities.known, admission(url, keys))
            key = keys[0]  # where the shared documents are
            record = PowerStore(url, key, timeout=min(1.0, ttl / 10)) if books else None  # the power record
            controller = Controller(
                cluster.name, hv, options,
                leader_lock=lambda: leader_locks(url, cluster.name, keys, member, ttl),
                cluster_lock=lambda: cluster_locks(url, cluster.name, keys, member, ttl),
                events=events, metrics=metrics, clock=clock, stop=stop,
                failover=Failover(cluster, DefinitionStore.for_url(url, cluster.name)),
                recommendations=RecommendationStore(url, key, timeout=min(1.0, ttl / 10)) if books else None,
                audits=AuditStore(url, key, timeout=min(1.0, ttl / 10)) if books else None,
                window=lambda used: publish_window(state_dir(), cluster, options.interval, used),
                power=record.read if record is not None else None,
                power_saving=PowerSaving(cluster, record, agents(cluster), budget) if record is not None else None)
            metrics_at = {"metrics": {"addr": server.addr, "port": server.port}} if server is not None else {}
            controller.run(**metrics_at)
    finally:
        if timer is not None:
            timer.cancel()
        if server is not None:
            server.close()
        if stream is not sys.stdout:
            stream.close()
    return EXIT_OK
