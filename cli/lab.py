"""``vcsched lab up|down|status``: a real local cluster of namespaced libvirt hosts."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

import lab as labmod
from cli.app import console, emit_json, err_console, fail
from cli.params import json_option
from cli.tables import FitTable
from lab.state import DEFAULT_LAB_DIR, LAB_DIR_ENV
from vcsched.formats.units import parse_size

DIR_HELP = (f"State directory of the lab (default: ${LAB_DIR_ENV} or {DEFAULT_LAB_DIR}). "
            "Each directory is an independent lab with its own cgroup partitions.")


def _dir_option() -> Any:
    return click.option("--dir", "dir_", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=DIR_HELP)


@click.group("lab")
def lab_cmd() -> None:
    """A real local cluster: N libvirt hosts on this machine, for trying placements end to end.

    \b
    Each host is its own libvirtd + virtlogd in a private mount/UTS namespace,
    with its own configuration, sockets and cgroup partition, so guests can be
    created, capped and live-migrated between "hosts" as on a real cluster.
    Guests are TCG (software-emulated) and each burns up to a full core.

    \b
      vcsched lab up --hosts 2      start it, write <dir>/cluster.toml
      vcsched lab status            what runs: daemons, guests
      vcsched lab down              stop everything it started (idempotent)

    Needs root and the packages of scripts/install-system-deps ('make test' installs them).

    Exit codes (every lab command): 0 done, 1 refused (`up`: every migration
    port block is held by a running lab), 2 bad input or a prerequisite
    missing (one line on stderr, nothing started).
    """


@lab_cmd.command("up")
@click.option("--hosts", "n_hosts", type=click.IntRange(1, labmod.MAX_HOSTS), default=None,
              help="How many hosts to start (default: the running lab's, else 2). Each lab host is declared "
                   "with cores = 1, so 2 hosts on a 2-core machine never oversubscribe it.")
@click.option("--cores", type=click.IntRange(min=1), default=None,
              help="Cores each host declares (its 'cores' in the cluster file; default: the running lab's, "
                   "else 1).")
@click.option("--memory", "memory", default=None, metavar="SIZE",
              help="Memory each host declares, e.g. 2GiB (default: the running lab's, else an equal share of "
                   "this machine's).")
@click.option("--recreate", is_flag=True,
              help="Replace a lab that already runs here: destroys its guests (without it, `up` repairs it).")
@click.option("--resize", is_flag=True,
              help="With --memory on a running lab: change what each host declares, guests kept, if every "
                   "host's running guests still fit in it.")
@click.option("--transport", type=click.Choice(labmod.TRANSPORTS), default=None,
              help="How vcsched reaches the hosts: unix sockets, or tls: each host listens for TLS on its own "
                   "loopback address (127.0.K.2 upward) with certificates the lab makes, like separate machines "
                   "(default: the running lab's, else unix).")
@click.option("--shared-storage/--local-storage", "shared_storage", default=None,
              help="All hosts share one images directory (cluster file: the same storage name), or each host "
                   "keeps its disks in its own /var/lib/libvirt/images, so moves copy the disks (default: the "
                   "running lab's, else local).")
@_dir_option()
@json_option("Print the lab (hosts, URIs, cluster file) as JSON.")
def up_cmd(n_hosts: int | None, cores: int | None, memory: str | None, recreate: bool, resize: bool,
           transport: str | None, shared_storage: bool | None, dir_: Path | None, as_json: bool) -> None:
    """Start a lab of N hosts, or repair the one that runs here.

    Builds (once, then cached in <dir>/image) the guest kernel + initramfs, starts
    the hosts, checks each answers libvirt's getInfo, and writes <dir>/cluster.toml,
    which other commands use by default while the lab runs.

    \b
    On a lab that already runs, `up` repairs it: a host whose libvirtd died or
    hangs gets its daemons restarted inside its namespace, and its guests keep
    running (the new libvirtd takes them over). Guests are destroyed only with
    --recreate. A flag that differs from the running lab (--hosts, --cores,
    --memory, --transport, storage) is refused, naming both shapes: --recreate
    replaces the lab, and --memory SIZE --resize changes only the memory when
    every host's guests still fit. A lab whose hosts declare more cores or
    memory than this machine has is started with a warning.

    Each lab holds migration ports no other running lab holds (docs/lab.md).

    Exit codes: 0 up (started or repaired), 1 every migration port block is
    held by a running lab, 2 bad input, a refused reshape or a prerequisite
    missing (nothing started).
    """
    problem = labmod.prerequisites_problem()
    if problem:
        fail(problem)
    if resize and memory is None:
        raise click.BadParameter("--resize changes the memory each host declares: give --memory SIZE",
                                 param_hint="'--resize'")
    running = None if recreate else labmod.recorded_shape(dir_)
    if resize and running is None:
        raise click.BadParameter("no lab runs here to resize (start one without --resize)", param_hint="'--resize'")
    n_hosts = n_hosts if n_hosts is not None else running.hosts if running else 2
    cores = cores if cores is not None else running.cores if running else 1
    transport = transport if transport is not None else running.transport if running else "unix"
    shared_storage = shared_storage if shared_storage is not None else running.shared_storage if running else False
    steps = n_hosts + 2  # clean up, guest image, one per host
    with Progress(SpinnerColumn(), TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("lab up", total=steps)
        done = iter(range(steps))

        def step(message: str) -> None:
            progress.update(task, description=message, completed=next(done, steps - 1))

        memory_mib = None if memory is None else parse_size("--memory", memory) >> 20
        lab = labmod.up(n_hosts, dir_, progress=step, cores=cores, memory_mib=memory_mib, recreate=recreate,
                        transport=transport, shared_storage=shared_storage, resize=resize)
        progress.update(task, completed=steps)
    st = labmod.status(lab.dir)
    dead, unknown = found_dead(lab, st)
    if as_json:
        emit_json({**_plain(asdict(lab)), "found_dead": dead, "found_dead_unknown": unknown})
        return
    for warning in lab.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}")
    on = {h.name: h.domains for h in st.hosts}
    for name in lab.repaired:
        kept = ", ".join(on.get(name, ())) or "none"
        line = f"repaired {name}: daemons restarted; guests kept: {kept}"
        if dead.get(name):
            line += (f"; [red]found dead[/]: {', '.join(dead[name])} (recorded there by vcsched, no longer running: "
                     "lost, see `vcsched status`; `vcsched restart VM --apply` starts one again)")
        console.print(line, highlight=False)
    if unknown:
        err_console.print(f"[yellow]warning:[/] guests found dead unknown: {unknown}")
    _render_status(st)
    console.print(f"cluster file: [bold]{lab.cluster_file}[/]")


def found_dead(lab: labmod.Lab, st: labmod.LabStatus) -> tuple[dict[str, list[str]], str | None]:
    """Per repaired host, the VMs the definitions store records on it that no lab host runs now (a fence or a
    power cut killed them while its daemons were down), and why that is unknown if the store cannot be read.

    ``lab up`` restarts a dead host's daemons and libvirtd takes over the guests whose QEMU still runs; the
    others are gone, and only the store remembers them (docs/failures.md, "Lost VMs")."""
    if not lab.repaired:
        return {}, None
    from acting.definitions import DefinitionStore, StoreError
    from acting.lock import resolve_url
    from cli.common import load_cluster
    from vcsched.errors import InputError

    try:
        cluster = load_cluster(str(lab.cluster_file))
        store = DefinitionStore.for_url(resolve_url(None, cluster.coordination), cluster.name)
        running = {d for h in st.hosts for d in h.domains}
        return {h: [d.vm for d in store.on(h) if d.vm not in running] for h in lab.repaired}, None
    except (StoreError, InputError) as exc:
        return {}, str(exc)


@lab_cmd.command("down")
@_dir_option()
@click.option("--purge", is_flag=True, help="Also delete the state directory with its guest image cache.")
@json_option("Print what was stopped as JSON.")
def down_cmd(dir_: Path | None, purge: bool, as_json: bool) -> None:
    """Destroy the lab's guests, stop its daemons, remove its cgroup partitions and state.

    Only what this lab directory started is touched (found by its pid files,
    partition names and namespaces); the guest image cache is kept unless
    --purge. Running it twice is harmless.

    Exit codes: 0 done (or nothing to stop), 2 not root.
    """
    problem = labmod.root_problem()
    if problem:
        fail(problem)
    with console.status("stopping the lab", spinner="dots") if not as_json else contextlib.nullcontext():
        report = labmod.down(dir_, purge=purge)
    if as_json:
        emit_json(_plain(asdict(report)))
        return
    console.print(f"stopped {len(report.daemons)} daemons, destroyed {len(report.guests)} guests, "
                  f"killed {len(report.killed)} orphaned processes, removed {len(report.partitions)} partitions")


@lab_cmd.command("status")
@_dir_option()
@json_option("Print the status as JSON.")
def status_cmd(dir_: Path | None, as_json: bool) -> None:
    """Show the lab's hosts: daemon pids, whether each answers, its CPUs, memory and guests.

    Exit codes: 0 shown (also when no lab runs), 2 bad input.
    """
    st = labmod.status(dir_)
    if as_json:
        emit_json(_plain(asdict(st)))
        return
    _render_status(st)


def _plain(value: Any) -> Any:
    """JSON-ready copy of a dataclass dict: paths as strings, tuples as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _render_status(st: labmod.LabStatus) -> None:
    if not st.hosts:
        console.print(f"no lab running in {st.dir}"
                      + (f" (leftover partitions: {', '.join(st.partitions)}; run 'vcsched lab down')"
                         if st.partitions else ""))
        return
    table = FitTable(title=f"lab {st.id} in {st.dir}" + ("" if st.running else " [red](not all hosts answer)[/]"))
    for col in ("host", "answers", "libvirtd/virtlogd", "CPUs", "memory", "partition", "guests"):
        table.add_column(col, no_wrap=col == "partition", overflow="fold")
    for h in st.hosts:
        table.add_row(h.name, "[green]yes[/]" if h.answers else "[red]no[/]",
                      f"{h.libvirtd_pid or '-'}/{h.virtlogd_pid or '-'}",
                      str(h.cpus) if h.cpus is not None else "-",
                      f"{h.memory_mib} MiB" if h.memory_mib is not None else "-",
                      h.partition, ", ".join(h.domains) or "-")
    console.print(table)
