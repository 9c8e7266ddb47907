"""``vcsched headroom``: how many more VMs of one shape fit, asked of admission (vcsched/control/headroom.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from cli.app import EXIT_OK, console, emit_json
from cli.params import FiniteFloatRange, VmShape, cluster_option, json_option
from vcsched.formats.request import Request

if TYPE_CHECKING:
    from acting.unit_of_work import UnitOfWork
    from vcsched.control.headroom import Headroom
    from vcsched.formats.cluster import Cluster
    from vcsched.inventory import Inventory


@click.command("headroom")
@click.option("--vm", "shape", type=VmShape(), required=True, metavar="SHAPE",
              help="The VM: cpu_cores=1,memory=2GiB (or cpu_need=0.25 of the largest host); optional vcpus=2 "
                   "(default 1), disk_bps=20MiB, net_bps=10MiB: a request file's per-VM fields.")
@click.option("--failures", type=click.IntRange(min=0), default=None, metavar="N",
              help="Keep room for the loss of any N hosts (default: the cluster file's failures_tolerated).")
@click.option("--min-yield", "min_yield", type=FiniteFloatRange(min=0, max=1), default=None, metavar="Y",
              help="Every VM, new and running, keeps at least this yield (a request's min_yield; the cluster "
                   "file's min_yield still applies when higher).  Default: the cluster file's min_yield, else "
                   "the lowest yield a running VM has now, else 1.")
@cluster_option()
@json_option("Print one JSON object: count, per_host, min_yield, min_yield_floor, floor_from, limit.")
def headroom_cmd(shape: Request, failures: int | None, min_yield: float | None, cluster_file: str | None,
                 as_json: bool) -> int:
    """Say how many more VMs of one shape fit now, where, and at what minimum yield.

    \b
      vcsched headroom --vm cpu_cores=1,memory=2GiB --failures 1

    The answer is admission's (`vcsched place`), not an estimate: N is the
    largest count for which a request of N such VMs would be admitted now,
    with the running VMs where they are, their floors kept and, with
    --failures N (else the cluster file's failures_tolerated), room for their
    restart after the loss of any N hosts; N+1 is refused, and the reason is
    shown (the limit).  Per host: how many of the N land there.  The
    predicted minimum yield is the whole cluster's with the N placed.
    Nothing is changed and no lock is taken.

    Every VM is counted at a floor, which the answer names: --min-yield,
    else the cluster file's min_yield, else the lowest yield a running
    managed VM has now (1 when none runs).  Without one a CPU-bound shape
    would be counted by memory alone, at whatever yield is left.

    Hosts that vcsched's power saving put to sleep are capacity that costs a
    wake (docs/power.md): counted apart, as how many more fit with them woken
    ("with_wakes" in --json; never a host whose wake failed: such a host is
    named, with why, as not counted).

    Exit codes: 0 answered (even when none fits), 1 every host is down,
    2 bad input (an unknown key or a value the request would refuse).
    """
    from cli.common import acting_on, hosts_down, load_cluster
    from vcsched.control.headroom import headroom_for

    cluster = load_cluster(cluster_file)
    with acting_on(cluster, apply=False, coordination=None, wait=0.0, ttl=None, quiet=as_json) as (uow, inv):
        answer = headroom_for(cluster, inv, shape, failures=failures, min_yield=min_yield)
        wakes = _with_wakes(cluster, uow, inv, lambda woken: headroom_for(cluster, woken, shape, failures=failures,
                                                                          min_yield=min_yield))
    if as_json:
        emit_json({"ok": True, **answer.to_dict(), "limit": said_plainly(answer.limit, answer.shape.name),
                   "hosts_down": hosts_down(inv), "with_wakes": wakes})
        return EXIT_OK
    from vcsched.formats.units import format_size
    from vcsched.formats.words import plural

    s = answer.shape
    cpu = f"{s.cpu_cores:g} cores" if s.cpu_cores is not None else f"cpu_need {s.cpu_need:g}"
    io = "".join(f", {r} {format_size(v)}/s" for r, v in (("disk", s.disk_bps), ("network", s.net_bps)) if v)
    what = f"{'VM' if answer.count == 1 else 'VMs'} of {s.vcpus} vCPU, {cpu}, {format_size(s.memory_bytes)}{io}"
    room = f", keeping room for {plural(answer.failures, 'host failure')}" if answer.failures else ""
    floor = f", every yield at least {answer.floor:g}: {answer.floor_from}"
    console.print(f"[bold]{answer.count}[/] more {what} fit{room}{floor}", highlight=False)
    if answer.count:
        console.print(f"  predicted minimum yield {answer.min_yield:.4f}, average {answer.avg_yield:.4f} "
                      "over the whole cluster", highlight=False)
        console.print("  per host: " + ", ".join(f"{h} {n}" for h, n in answer.per_host.items()), highlight=False)
    console.print(f"  one more is refused: {said_plainly(answer.limit, s.name)}", highlight=False)
    if wakes is not None and wakes["hosts"]:
        took = (f"a wake takes up to {wakes['wake_s']:.0f} s" if wakes["wake_measured"] else
                f"a wake assumed to take {wakes['wake_s']:.0f} s, the cluster's wake_time: none measured yet")
        console.print(f"  with {', '.join(str(h) for h in wakes['hosts'])} woken (asleep; {took}): "  # type: ignore[attr-defined]
                      f"[bold]{wakes['count']}[/] more "
                      "(`vcsched place --apply` wakes one when that is the only way to admit)", highlight=False)
    for host, why in (wakes or {}).get("not_counted", {}).items():  # type: ignore[attr-defined]
        console.print(f"  {host} is asleep, not counted: {why}", highlight=False)
    return EXIT_OK


def _with_wakes(cluster: Cluster, uow: UnitOfWork, inventory: Inventory,
                count: Callable[[Inventory], Headroom]) -> dict[str, object] | None:
    """The headroom with every sleeping host that may be woken awake: capacity that costs a wake (docs/power.md),
    counted apart; None when no host sleeps."""
    if not inventory.asleep_hosts() or uow.power is None:
        return None
    from vcsched.control.power import unwakeable, wake_time, wakeable, woken

    state = uow.power()
    hosts = wakeable(cluster, inventory, state)
    left_out = unwakeable(cluster, inventory, state)
    if not hosts:
        return {"hosts": [], "count": 0, "per_host": {}, "wake_s": None, "wake_measured": False,
                "not_counted": left_out} if left_out else None
    answer = count(woken(inventory, state, hosts))
    return {"hosts": list(hosts), "count": answer.count, "per_host": answer.per_host,
            "wake_s": max(wake_time(cluster, state, h) for h in hosts),
            "wake_measured": all(state.of(h).wake_s is not None for h in hosts), "not_counted": left_out}


def said_plainly(limit: str, request: str) -> str:
    """Admission's reason for refusing one more, in the operator's words: the question is asked as a request
    named ``request`` (``headroom``) whose VMs are ``headroom-1``, ``headroom-2``, ...; those names are
    vcsched's, never the operator's, so a reason says "new VM 3" and "the new VMs" instead."""
    import re

    said = re.sub(rf"\b{re.escape(request)}-(\d+)\b", r"new VM \1", limit)
    said = said.replace(f"request {request!r} min_yield", "the new VMs' min_yield")
    return said.replace(f"request {request!r}", "the new VMs")
