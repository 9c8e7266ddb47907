"""What a placing algorithm is: a *placer* from an instance to a :class:`Placement`, and its registry entry.

Every algorithm module returns a :class:`Placement`; the registry
(:mod:`vcsched.solvers.registry`) names them in one literal table and turns a
placement into a :class:`~vcsched.model.SolveResult`.  These types live here,
below both, so that an algorithm module never imports the registry that lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vcsched.model import Instance, SolveOptions


@dataclass(frozen=True)
class Placement:
    """Task -> host indices (None: nothing found), what the method proved, and its own details."""

    hosts: np.ndarray | None
    optimal: bool | None = None
    bound: float | None = None
    detail: dict[str, object] = field(default_factory=dict)


Placer = Callable[[Instance, SolveOptions], Placement]


@dataclass(frozen=True)
class Algorithm:
    name: str
    placer: Placer
    summary: str
    exact: bool = False
    bound_only: bool = False
