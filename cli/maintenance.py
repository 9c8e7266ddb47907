"""``vcsched cordon`` / ``uncordon``: a host out for maintenance and back (docs/rules.md); ``drain`` is cli/drain.py.

These commands edit one line of the cluster file: they import neither numpy nor the solvers
(tests/test_cli_contract.py checks it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.app import EXIT_OK, console, emit_json
from cli.common import cluster_path, load_cluster, notice
from cli.params import cluster_option, json_option, lock_options
from hypervisor.files import write_atomic


def set_maintenance(path: Path, host: str, on: bool) -> bool:
    """Write ``maintenance = true`` into (or drop it from) ``host``'s table, keeping the rest of the file as it is.

    Returns whether the file changed.  tomlkit keeps comments, order and formatting.
    """
    import tomlkit

    cluster = load_cluster(str(path))  # the whole file is valid before it is touched
    cluster.host(host)  # unknown host: InputError naming the hosts
    doc = tomlkit.parse(path.read_text())
    hosts = doc["hosts"]
    assert isinstance(hosts, list)
    for table in hosts:
        if table.get("name") != host:
            continue
        if bool(table.get("maintenance", False)) == on:
            return False
        if on:
            table["maintenance"] = True
        else:
            del table["maintenance"]
    write_atomic(path, tomlkit.dumps(doc))  # a reader sees the old file or the new one
    return True


def _cordon(host: str, cluster_file: str | None, on: bool, as_json: bool, wait: float, coordination: str | None,
            lock_ttl: float | None) -> int:
    path = cluster_path(cluster_file)
    cluster = load_cluster(str(path))
    cluster.host(host)
    from acting.unit_of_work import for_cluster
    from hypervisor.libvirt_backend import LibvirtHypervisor

    # The lock only: nothing on the hosts changes, so in-doubt VMs are left to the next command that acts.
    with LibvirtHypervisor(cluster, on_notice=notice) as hv, \
            for_cluster(cluster, hv, apply=True, coordination=coordination, wait=wait, ttl=lock_ttl, settle=False):
        changed = set_maintenance(path, host, on)
    state = "in maintenance" if on else "back in service"
    if as_json:
        emit_json({"ok": True, "host": host, "maintenance": on, "changed": changed, "cluster_file": str(path)})
    else:
        console.print(f"{host} {'is now' if changed else 'was already'} {state} ({path})", highlight=False)
        if on:
            console.print(f"  no new VM and no migration will land on it; `vcsched drain {host} --budget B` empties it")
    return EXIT_OK


def _maintenance_options(command: Any) -> Any:
    """HOST, --cluster, --json and the lock options: what cordon and uncordon both take."""
    for option in reversed((click.argument("host"),
                            cluster_option("Cluster file (TOML) to edit.  Default: the running lab's "
                                           "(`vcsched lab up`)."),
                            json_option(),
                            lock_options())):
        command = option(command)
    return command


@click.command("cordon")
@_maintenance_options
def cordon_cmd(host: str, cluster_file: str | None, as_json: bool, wait: float, coordination: str | None,
               lock_ttl: float | None) -> int:
    """Put HOST in maintenance: no new VM and no migration lands on it (its VMs keep running).

    \b
    Writes maintenance = true into HOST's [[hosts]] table of the cluster file
    (the rest of the file is kept as it is), holding the cluster lock.  Every
    later place, adapt and drain reads it.  Then empty the host with
    `vcsched drain HOST --budget B --apply`, and bring it back with
    `vcsched uncordon HOST`.

    Exit codes: 0 done (or already so), 1 the cluster is locked, 2 bad input.
    """
    return _cordon(host, cluster_file, True, as_json, wait, coordination, lock_ttl)


@click.command("uncordon")
@_maintenance_options
def uncordon_cmd(host: str, cluster_file: str | None, as_json: bool, wait: float, coordination: str | None,
                 lock_ttl: float | None) -> int:
    """Take HOST out of maintenance: it receives VMs again (`vcsched adapt` can move some back).

    Removes maintenance = true from HOST's table of the cluster file, holding
    the cluster lock.  Exit codes: 0 done, 1 the cluster is locked, 2 bad input.
    """
    return _cordon(host, cluster_file, False, as_json, wait, coordination, lock_ttl)
