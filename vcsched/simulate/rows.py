"""One allocation problem as the simulator hands it to a policy: groups of identical VCs over capacity rows.

At every event the policy re-allocates the VCs of one connected component
(VCs linked by sharing a host).  Identical VCs — same weight, same rows and
coefficients — get the same yield under every policy here (the optimum is
unique and symmetric for ``pf``/``alpha-fair``; the water-filling treats them
alike), so they are solved once, as a **group** of multiplicity ``m``.  On
one host, where Bonald & Roberts' configurations live, a component of
hundreds of VCs is then a handful of groups: one per class.

Rows are (host, resource) pairs, as in :mod:`vcsched.constraints`:
``Σ_g m_g coef_gp y_g ≤ C_p``, ``0 ≤ y_g ≤ 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Groups:
    """Groups of identical VCs over local pair indices ``0 .. len(pairs) - 1``.

    ``entries[g]``: ``(local pair, coef)`` of *one* VC of group ``g``; ``pairs[i]``: the global pair id of
    local index ``i`` (``host × R + resource``); ``capacity[i]``: its capacity.
    """

    mult: list[int]
    weight: list[float]
    entries: list[list[tuple[int, float]]]
    pairs: list[int]
    capacity: list[float]

    @property
    def n(self) -> int:
        return len(self.mult)


Key = tuple[float, tuple[tuple[int, float], ...]]


def _localise(rows: list[tuple[tuple[int, float], ...]], capacity: Sequence[float]
              ) -> tuple[list[list[tuple[int, float]]], list[int], list[float]]:
    local: dict[int, int] = {}
    entries = []
    for row in rows:
        out = []
        for p, c in row:
            i = local.get(p)
            if i is None:
                i = local[p] = len(local)
            out.append((i, c))
        entries.append(out)
    pairs = list(local)
    return entries, pairs, [capacity[p] for p in pairs]


def singles(keys: Sequence[Key], capacity: Sequence[float]) -> Groups:
    """Every VC its own group (no hashing: on many hosts nearly every VC is unique anyway)."""
    entries, pairs, cap = _localise([k[1] for k in keys], capacity)
    return Groups([1] * len(keys), [k[0] for k in keys], entries, pairs, cap)


def group(keys: Sequence[Key], capacity: Sequence[float], *, signature: bool = False
          ) -> tuple[Groups, list[int], frozenset[tuple[Key, int]] | None]:
    """Group VCs by ``(weight, rows)``, groups in order of first appearance.

    Returns the groups, each VC's group index, and (if asked) the problem's
    *signature*, the set of ``(key, multiplicity)`` pairs: equal signatures are
    the same problem whatever the VCs' order, so results can be cached by it.
    """
    index: dict[Key, int] = {}
    mult: list[int] = []
    of: list[int] = []
    for key in keys:
        g = index.get(key)
        if g is None:
            g = index[key] = len(mult)
            mult.append(0)
        mult[g] += 1
        of.append(g)
    ordered = list(index)
    entries, pairs, cap = _localise([k[1] for k in ordered], capacity)
    groups = Groups(mult, [k[0] for k in ordered], entries, pairs, cap)
    sig = frozenset(zip(ordered, mult, strict=True)) if signature else None
    return groups, of, sig
