"""``vcsched observe``: sample what the managed VMs use and estimate their needs (docs/needs.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from cli.app import EXIT_OK, console, emit_json, err_console
from cli.common import apply_exit_code, load_cluster, notice, reporting
from cli.params import Duration, cluster_option, json_option, lock_options

if TYPE_CHECKING:
    from hypervisor.cpu_signals import HostPressure


@click.command("observe")
@cluster_option()
@click.option("--window", type=Duration(), default="60s", show_default=True,
              help="How long to sample (30s, 2m, ...).")
@click.option("--sample", type=Duration(), default=None,
              help="Time between samples (default: a twelfth of the window, between 0.5 and 5 s).")
@click.option("--probe", is_flag=True,
              help="Give each VM that uses its whole cap its host's unused capacity for --probe-seconds, to see "
                   "whether it uses more; caps are put back afterwards (changes hosts: takes the cluster lock).")
@click.option("--probe-seconds", type=Duration(), default="5s", show_default=True)
@click.option("--record", is_flag=True,
              help="Write the estimates as the VMs' recorded needs (set-need steps, under the cluster lock).")
@json_option("Print one JSON object.")
@lock_options()
def observe_cmd(cluster_file: str | None, window: float, sample: float | None, probe: bool, probe_seconds: float,
                record: bool, as_json: bool, wait: float, coordination: str | None, lock_ttl: float | None) -> int:
    """Measure every managed VM's CPU use over a window and estimate what it needs.

    \b
    A VM using less than its cap shows its need: the 90th percentile of its
    use plus 10 % and 0.03 core.  One at its cap may need more: its estimate
    is a lower bound (its cap plus headroom, or its declared need if higher)
    unless --probe gives it its host's unused capacity for a few seconds and
    it uses less than that.  One whose vCPUs waited for a host CPU (starved:
    the host is busy with other work) used less than it needs: its estimate
    stays its declared need, raised to what it used if that is more.  Such
    estimates are *censored* (a lower bound: the need may be higher).

    
    Prints per VM the CPU it used (90th percentile), the share of CFS
    periods its own cap throttled it, the cores its vCPUs waited for a host
    CPU, the declared (recorded) need, the estimate, whether it is censored,
    and a confidence (the share of samples that neither hit the cap nor
    waited).  A signal a host does not provide is named, not guessed
    (docs/contention.md).  Without --probe and --record nothing changes and
    no lock is taken.

    \b
    Examples:
      vcsched observe --window 60s
      vcsched observe --window 2m --probe --record

    \b
    SIGTERM or Ctrl-C ends the sampling early; probe caps are put back first
    and nothing is recorded (exit 143 or 130).  The caps a probe raises are
    written to a journal under the state directory before they are raised,
    so that after a SIGKILL the next `observe --probe`, `run` or `repair`
    puts them back.

    Exit codes: 0 done, 1 every host is down, a step failed or the cluster
    is locked, 2 bad input, 130 interrupted by Ctrl-C, 143 ended by SIGTERM
    (probe caps put back first in both cases; nothing recorded).
    """
    from acting.executor import ApplyReport
    from acting.sampling import CpuSampler, probe_and_restore, record_estimates
    from acting.unit_of_work import for_cluster
    from cli.signals import stopping_on_signals
    from hypervisor.cpu_signals import host_pressure
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.control.admission import HostsDown
    from vcsched.control.observe import estimate_all

    every = sample if sample is not None else sample_interval(window)
    cluster = load_cluster(cluster_file)
    stop = threading.Event()
    out: dict[str, Any] = {"cluster": cluster.name, "window": window, "sample": every}
    reports: dict[str, ApplyReport] = {}
    changing = probe or record
    with stopping_on_signals(stop) as received, LibvirtHypervisor(cluster, on_notice=notice) as hv:
        sampler = CpuSampler(window + every, None)
        if not as_json:
            err_console.print(f"sampling CPU use every {every:g} s for {window:g} s ...", highlight=False)
        pressure_before, started_at = host_pressure(), time.monotonic()
        inventory = sampler.sample_for(hv, window, every, stop)
        assert inventory is not None
        out["machine"] = machine_pressure(pressure_before, host_pressure(), time.monotonic() - started_at)
        out["signals_missing"] = {host: list(names) for host, names in sorted(sampler.missing.items())}
        _stop_if_asked(received, "nothing changed")
        if not inventory.up().hosts:
            raise HostsDown(f"every host of cluster {cluster.name!r} is down: "
                            + "; ".join(f"{h.name}: {h.down}" for h in inventory.hosts))
        estimates = estimate_all(inventory, sampler.samples())
        work = for_cluster(cluster, hv, apply=changing, coordination=coordination, wait=wait, ttl=lock_ttl,
                           reporting=reporting())
        if work.dry_run:  # reading only: in-doubt VMs are reported, never settled
            work.note_in_doubt(inventory)
        with work as uow:
            guard = uow.lock_guard if changing else None
            if probe:
                restore_left_probes(hv, guard, quiet=as_json)

                def started(caps: Mapping[str, float]) -> None:
                    if not as_json:
                        err_console.print(f"probing {', '.join(sorted(caps))} for {probe_seconds:g} s ...",
                                          highlight=False)

                done, inventory, estimates = probe_and_restore(
                    hv, sampler, probe_seconds, min(every, max(probe_seconds / 5, 0.2)), stop, guard,
                    on_start=started)
                out["probe"] = {"caps": dict(done.caps), "before": dict(done.before), "seconds": probe_seconds,
                                "not_put_back": list(done.waiting)}
                reports.update(done.reports())
                for line in done.waiting:  # journaled: the next probe, `run` or `repair` puts it back
                    err_console.print(f"vcsched: warning: probe cap not put back yet: {line}", highlight=False,
                                      markup=False)
                _stop_if_asked(received, _probe_outcome(done))
            if record:
                plan, reports["record"] = record_estimates(uow, estimates)
                out["record"] = plan.to_dict()
    out["hosts_down"] = [{"host": h.name, "reason": h.down} for h in inventory.down_hosts()]
    out["vms"] = [{**e.to_dict(), "vc": inventory.vm(e.vm).cluster if inventory.vm(e.vm) else None}  # type: ignore[union-attr]
                  for e in sorted(estimates.values(), key=lambda e: (e.host, e.vm))]
    out["apply"] = {what: r.to_dict() for what, r in reports.items()}
    out["ok"] = all(r.ok for r in reports.values()) and not out.get("probe", {}).get("not_put_back")
    if as_json:
        emit_json(out)
    else:
        _render(out)
    return max((apply_exit_code(r) for r in reports.values()), default=EXIT_OK)


def machine_pressure(before: HostPressure, after: HostPressure, seconds: float) -> dict[str, float | None]:
    """This machine's CPU pressure over ``seconds``: the share of time some task waited for a CPU
    (/proc/pressure/cpu ``some``) and the cores stolen by the hypervisor below it (/proc/stat ``steal``, in
    USER_HZ = 100 ticks a second); None where not available."""
    def rate(a: int | None, b: int | None, per_second: float) -> float | None:
        if a is None or b is None or seconds <= 0 or b < a:
            return None
        return round((b - a) / per_second / seconds, 4)

    return {"cpu_pressure_some": rate(before.some_us, after.some_us, 1e6),
            "steal_cores": rate(before.steal_ticks, after.steal_ticks, 100.0)}


def _stop_if_asked(received: list[int], outcome: str) -> None:
    """After a signal (cli.signals): end now, saying what became of the changes (exit 128 + the signal)."""
    if received:
        from cli.signals import Interrupted, signal_name

        raise Interrupted(received[0], f"interrupted by {signal_name(received[0])}: {outcome}")


def _probe_outcome(done: Any) -> str:
    restored = done.restored
    if not done.caps:
        return "nothing changed"
    if (restored is not None and not restored.ok) or done.waiting:
        why = "; ".join(done.waiting) if done.waiting else restored.stopped or "a step failed"
        return (f"probe caps NOT all put back ({why}); the journal keeps them "
                "for the next `vcsched observe --probe`, `vcsched run` or `vcsched repair`")
    return f"probe caps put back ({', '.join(sorted(done.caps))}); nothing recorded"


def restore_left_probes(hv: Any, guard: Any, quiet: bool = False) -> None:
    """Put back the caps of probes whose process died before it could (SIGKILL, a crash), under the caller's
    lock (hypervisor.journal); says what it did on stderr."""
    from acting.restore import restore_journal
    from hypervisor.journal import PROBE

    report = restore_journal(hv, kinds=(PROBE,), guard=guard)
    for line in report.restored:
        if not quiet:
            err_console.print(f"a killed probe's {line}", highlight=False, markup=False)
    for line in report.problems:
        err_console.print(f"vcsched: warning: a killed probe's {line}", highlight=False, markup=False)


def _render(out: dict[str, Any]) -> None:
    from cli.tables import FitTable

    for h in out["hosts_down"]:
        console.print(f"[yellow]host {h['host']} is down[/]: {h['reason']} (its VMs are not observed)")
    table = FitTable(title=f"cluster {out['cluster']!r}: needs over {out['window']:g} s "
                        f"(sample every {out['sample']:g} s), in cores")
    for col in ("VM", "VC", "host", "cap", "used p90", "throttled", "waited", "declared", "estimated", "censored",
                "confidence", "basis"):
        table.add_column(col, justify="left" if col in ("VM", "VC", "host", "basis") else "right", key=col == "VM")

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    for v in out["vms"]:
        throttled = "-" if v["throttled_share"] is None else f"{v['throttled_share']:.0%}"
        table.add_row(v["vm"], v["vc"] or "-", v["host"], f(v["cap_cores"]), f(v["used_cores"]), throttled,
                      f(v["waited_cores"]), f(v["declared_need_cores"]),
                      ("≥" if v["censored"] else "") + f(v["estimated_need_cores"]),
                      "yes" if v["censored"] else "no", f"{v['confidence']:.2f}", v["basis"])
    console.print(table)
    for host, names in out.get("signals_missing", {}).items():
        console.print(f"host {host}: not measured there: {', '.join(names)} (docs/contention.md)", highlight=False)
    machine = out.get("machine", {})
    if machine.get("cpu_pressure_some") is not None or machine.get("steal_cores") is not None:
        some, steal = machine.get("cpu_pressure_some"), machine.get("steal_cores")
        console.print("this machine: " + ", ".join(
            part for part in (None if some is None else f"some task waited for a CPU {some:.0%} of the time",
                              None if steal is None else f"{steal:.2f} core stolen") if part), highlight=False)
    for what, r in out["apply"].items():
        state = "done" if r["ok"] else f"[red]stopped[/]: {r['stopped'] or 'a step failed'}"
        console.print(f"{what}: {len(r['steps'])} steps, {state}")
    if "record" in out and not out["record"]["steps"]:
        console.print("record: every recorded need already matches its estimate")


def sample_interval(window: float) -> float:
    """``--sample``'s default: a twelfth of the window, between 0.5 and 5 s, to 0.01 s (a twelfth of 10 s is
    said and used as 0.83 s, not 0.833333)."""
    return round(min(5.0, max(0.5, window / 12)), 2)
