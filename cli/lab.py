"""``vcsched lab up|down|status``: a real local cluster of namespaced libvirt hosts."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.app import console, emit_json, err_console, fail
from hypervisor import lab as labmod
from hypervisor.lab.state import DEFAULT_LAB_DIR, LAB_DIR_ENV
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
    """


@lab_cmd.command("up")
@click.option("--hosts", "n_hosts", type=click.IntRange(1, labmod.MAX_HOSTS), default=2, show_default=True,
              help="How many hosts to start. Each lab host is declared with cores = 1, so 2 hosts on a "
                   "2-core machine never oversubscribe it.")
@click.option("--cores", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cores each host declares (its 'cores' in the cluster file).")
@click.option("--memory", "memory", default=None, metavar="SIZE",
              help="Memory each host declares, e.g. 2GiB (default: an equal share of this machine's).")
@click.option("--recreate", is_flag=True,
              help="Replace a lab that already runs here: destroys its guests (without it, `up` repairs it).")
@click.option("--transport", type=click.Choice(labmod.TRANSPORTS), default="unix", show_default=True,
              help="How vcsched reaches the hosts: unix sockets, or tls: each host listens for TLS on its own "
                   "loopback address (127.0.K.2 upward) with certificates the lab makes, like separate machines.")
@click.option("--shared-storage", is_flag=True,
              help="All hosts share one images directory (cluster file: the same storage name). Default: each "
                   "host keeps its disks in its own /var/lib/libvirt/images, so moves copy the disks.")
@_dir_option()
@click.option("--json", "as_json", is_flag=True, help="Print the lab (hosts, URIs, cluster file) as JSON.")
def up_cmd(n_hosts: int, cores: int, memory: str | None, recreate: bool, transport: str, shared_storage: bool,
           dir_: Path | None, as_json: bool) -> None:
    """Start a lab of N hosts, or repair the one that runs here.

    Builds (once, then cached in <dir>/image) the guest kernel + initramfs, starts
    the hosts, checks each answers libvirt's getInfo, and writes <dir>/cluster.toml,
    which other commands use by default while the lab runs.

    \b
    On a lab that already runs, `up` repairs it: a host whose libvirtd died or
    hangs gets its daemons restarted inside its namespace, and its guests keep
    running (the new libvirtd takes them over). Guests are destroyed only with
    --recreate. A lab whose hosts declare more cores or memory than this
    machine has is started with a warning.
    """
    problem = labmod.prerequisites_problem()
    if problem:
        fail(problem)
    steps = n_hosts + 2  # clean up, guest image, one per host
    with Progress(SpinnerColumn(), TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("lab up", total=steps)
        done = iter(range(steps))

        def step(message: str) -> None:
            progress.update(task, description=message, completed=next(done, steps - 1))

        memory_mib = None if memory is None else parse_size("--memory", memory) >> 20
        lab = labmod.up(n_hosts, dir_, progress=step, cores=cores, memory_mib=memory_mib, recreate=recreate,
                        transport=transport, shared_storage=shared_storage)
        progress.update(task, completed=steps)
    if as_json:
        emit_json(_plain(asdict(lab)))
        return
    for warning in lab.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}")
    if lab.repaired:
        console.print(f"repaired {', '.join(lab.repaired)}: daemons restarted, guests kept")
    _render_status(labmod.status(lab.dir))
    console.print(f"cluster file: [bold]{lab.cluster_file}[/]")


@lab_cmd.command("down")
@_dir_option()
@click.option("--purge", is_flag=True, help="Also delete the state directory with its guest image cache.")
@click.option("--json", "as_json", is_flag=True, help="Print what was stopped as JSON.")
def down_cmd(dir_: Path | None, purge: bool, as_json: bool) -> None:
    """Destroy the lab's guests, stop its daemons, remove its cgroup partitions and state.

    Only what this lab directory started is touched (found by its pid files,
    partition names and namespaces); the guest image cache is kept unless
    --purge. Running it twice is harmless.
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
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status_cmd(dir_: Path | None, as_json: bool) -> None:
    """Show the lab's hosts: daemon pids, whether each answers, its CPUs, memory and guests."""
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
    table = Table(title=f"lab {st.id} in {st.dir}" + ("" if st.running else " [red](not all hosts answer)[/]"))
    for col in ("host", "answers", "libvirtd/virtlogd", "CPUs", "memory", "partition", "guests"):
        table.add_column(col, no_wrap=col == "partition", overflow="fold")
    for h in st.hosts:
        table.add_row(h.name, "[green]yes[/]" if h.answers else "[red]no[/]",
                      f"{h.libvirtd_pid or '-'}/{h.virtlogd_pid or '-'}",
                      str(h.cpus) if h.cpus is not None else "-",
                      f"{h.memory_mib} MiB" if h.memory_mib is not None else "-",
                      h.partition, ", ".join(h.domains) or "-")
    console.print(table)
