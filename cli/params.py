"""Every option more than one command takes, declared once: types and decorators (docs/cli.md, *Options*).

A value that does not parse is bad input: click's one-line error naming the
option and the value, exit 2, before anything else happens.  The types:

* :class:`FiniteFloatRange` — a number in a range; NaN and infinities refused;
* :class:`Duration` — seconds: ``30``, ``30s``, ``500ms``, ``2m``, ``1h``;
* :class:`Bytes` — a byte count: ``0``, ``134217728``, ``256MiB``, ``1GiB`` (``unlimited`` where a budget may be);
* :data:`TIME_LIMIT` — a wall-clock limit in seconds: finite and above 0;
* :class:`VmShape` — one VM's shape: ``cpu_cores=1,memory=2GiB[,vcpus=2][,disk_bps=20MiB]`` (a request's fields).

The decorators: :func:`cluster_option`, :func:`json_option`, :func:`output_option`, :func:`time_limit_option`,
:func:`budget_option`, :func:`policy_options`, :func:`lock_options`.  This module imports only click and the
core's parsers, so a command that needs nothing else starts without numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from vcsched.errors import InputError
from vcsched.formats.cluster import check_coordination_url
from vcsched.formats.duration import parse_duration
from vcsched.formats.units import parse_size

Decorator = Callable[[Any], Any]


def _where(param: click.Parameter | None) -> str:
    if param is None:
        return "value"
    opts = [o for o in param.opts if o.startswith("--")]
    return opts[0] if opts else (param.name or "value")


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, refusing NaN and infinities (they pass its comparisons: ``nan < 0`` is False)."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


class Duration(click.ParamType):
    """Seconds: 30, 30s, 500ms, 2m, 1h."""

    name = "DURATION"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(_where(param), value, allow_zero=self.allow_zero)
        except InputError as exc:
            self.fail(str(exc), param, ctx)


class Bytes(click.ParamType):
    """A byte count: 0, 134217728, 256MiB, 1.5GiB; with ``unlimited=True`` also "unlimited" (a migration budget
    over a whole plan; a budget per interval is a real limit, so `run` takes none)."""

    name = "BYTES"

    def __init__(self, unlimited: bool = False) -> None:
        self.unlimited = unlimited

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_size(_where(param), str(value), allow_zero=True, allow_unlimited=self.unlimited)
        except InputError as exc:
            self.fail(str(exc), param, ctx)


class VmShape(click.ParamType):
    """One VM's shape as a request's per-VM fields: cpu_cores=1,memory=2GiB[,vcpus=2][,disk_bps=...]
    (vcsched.formats.request.parse_vm_shape: the request's own checks, the one size parser)."""

    name = "SHAPE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        from vcsched.formats.request import parse_vm_shape  # imported here: the request model imports numpy

        try:
            return parse_vm_shape(_where(param), value)
        except InputError as exc:
            self.fail(str(exc), param, ctx)


#: A wall-clock limit in seconds: finite and above 0 (``--time-limit nan``, ``0`` and ``inf`` are bad input).
TIME_LIMIT = FiniteFloatRange(min=0, min_open=True)

CLUSTER_HELP = ("Cluster file (TOML: hosts and their libvirt URIs; see docs/files.md). "
                "Default: the running lab's (`vcsched lab up`).")


def cluster_option(help: str = CLUSTER_HELP) -> Decorator:
    """``--cluster FILE`` (parameter ``cluster_file``): a missing or garbled file is bad input when it is read
    (cli.common.load_cluster names the file and the field)."""
    return click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), default=None,
                        metavar="FILE", help=help)


def json_option(help: str = "Print one JSON object on stdout instead of tables.") -> Decorator:
    """``--json`` (parameter ``as_json``): the result as one JSON document on stdout (docs/cli.md, *--json*)."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def output_option(help: str, metavar: str = "FILE", *, directory: bool = False) -> Decorator:
    """``-o/--output`` (parameter ``output``): a file (or a directory) vcsched writes, atomically
    (hypervisor/files.py); one that cannot be written is bad input naming it."""
    kind = click.Path(file_okay=False) if directory else click.Path(dir_okay=False, writable=True)
    return click.option("-o", "--output", type=kind, default=None, metavar=metavar, help=help)


def time_limit_option(help: str = "Wall-clock limit in seconds for milp.",
                      default: float | None = None) -> Decorator:
    """``--time-limit S`` (parameter ``time_limit``): :data:`TIME_LIMIT`."""
    return click.option("--time-limit", type=TIME_LIMIT, default=default, show_default=default is not None,
                        metavar="S", help=help)


def budget_option(help: str = "Most bytes the live migrations may move in all: 0, 512MiB, 2GiB, "
                  "unlimited.") -> Decorator:
    """``--budget BYTES`` (required; ``unlimited`` allowed)."""
    return click.option("--budget", type=Bytes(unlimited=True), required=True, help=help)


POLICY_HELP = ("Sharing policy: yield, drf, drf-pools, asset, pf, alpha-fair, hdrf (docs/policies.md).  "
               "Default: the cluster file's policy, else yield.")


def policy_options(policy_help: str = POLICY_HELP) -> Decorator:
    """``--policy`` and ``--alpha``: the sharing policy that overrides the cluster file's ``policy``; alpha is a
    finite number in (0, 100] (whether the policy takes one is the core's check, vcsched.policies)."""
    def deco(f: Any) -> Any:
        f = click.option("--alpha", type=FiniteFloatRange(min=0, min_open=True, max=100), default=None, metavar="A",
                         help="The exponent of policy alpha-fair, in (0, 100] (1 is pf).")(f)
        return click.option("--policy", default=None, metavar="NAME", help=policy_help)(f)
    return deco


def check_coordination(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Checked when parsed, dry run or not: bad input is refused before anything else happens."""
    return None if value is None else check_coordination_url("--coordination", value)


def lock_options() -> Decorator:
    """``--wait`` and ``--coordination``, for every command that changes hosts (it holds the cluster lock)."""
    def deco(f: Any) -> Any:
        f = click.option("--coordination", metavar="URL", default=None, callback=check_coordination,
                         help="Where the cluster lock lives (tooz URL: file:///DIR, etcd3+http://HOST:2379). "
                              "Default: $VCSCHED_COORDINATION, the cluster file's 'coordination', else a "
                              "file lock under /var/lib/vcsched (docs/plans.md).")(f)
        f = click.option("--lock-ttl", "lock_ttl", type=FiniteFloatRange(min=1), default=None, metavar="SECONDS",
                         help="etcd: seconds the lock outlives a holder that died (default: the cluster file's "
                              "lock_ttl, else 10).")(f)
        return click.option("--wait", "wait", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
                            metavar="SECONDS",
                            help="If another command holds the cluster lock, wait up to this long for it "
                                 "(default: fail at once, naming the holder).")(f)
    return deco
