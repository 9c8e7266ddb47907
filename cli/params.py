"""Click parameter types for durations and byte sizes, on the core's one parser each (exit 2 naming the option)."""

from __future__ import annotations

from typing import Any

import click

from vcsched.errors import InputError
from vcsched.formats.duration import parse_duration
from vcsched.formats.units import parse_size


def _where(param: click.Parameter | None) -> str:
    if param is None:
        return "value"
    opts = [o for o in param.opts if o.startswith("--")]
    return opts[0] if opts else (param.name or "value")


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
    """A byte count: 0, 134217728, 256MiB, 1GiB (no "unlimited": a budget per interval is a real limit)."""

    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_size(_where(param), str(value), allow_zero=True)
        except InputError as exc:
            self.fail(str(exc), param, ctx)
