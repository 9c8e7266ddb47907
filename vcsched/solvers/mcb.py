"""MCB1-MCB8's packing: multi-capacity bin packing of tasks with fixed needs (paper section 3.4).

For a fixed yield ``Y`` every task has a fixed CPU need ``c = Y * alpha`` and
memory ``m``, so Leinberger et al.'s two-list multi-capacity bin packing
applies directly; a binary search on ``Y`` in ``(0, Y_LP]`` (section 3.1's
bound) finds the highest ``Y`` the packing achieves.  The eight variants
differ only in the key that orders the two lists.

The work splits in three, each in exactly one place:

* :func:`vcsched.solvers.search.search` — the binary search (first probe
  ``Y_LP / 2``, stop when ``hi - lo < precision``, keep the placement of the
  highest successful probe), whose probe (:func:`vcsched.solvers.search.residual_probe`)
  every search of vcsched shares;
* :func:`probe_lists` — for one ``Y``: the CPU needs, the split into the
  CPU-heavy list (``c > m``) and the memory-heavy list, and each list sorted
  by the variant's key, ties broken by task index so results are
  reproducible;
* the *kernel* that fills hosts from the two sorted lists: :func:`pack_python`
  (the reference, a literal transcription) or the C extension
  ``vcsched.solvers._mcbc.pack`` (same decisions, faster: see docs/mcb.md).

Conventions the paper leaves open (section 3.4 says "starting arbitrarily
with any list"):

* the first task of every host is the first fitting task of the CPU-heavy
  list, else of the memory-heavy list;
* afterwards, a host with strictly more free CPU than free memory scans the
  CPU-heavy list first; otherwise (including a tie) the memory-heavy list
  first;
* a task fits when ``c <= free_cpu + EPS`` and ``m <= free_mem + EPS``
  (``EPS`` = :data:`vcsched.units.FIT_TOLERANCE`), and free capacities are updated by subtraction in task
  order — both kernels do exactly the same floating-point operations.

Placement rules (docs/rules.md; :mod:`vcsched.rules`): the probe places
pinned tasks before the kernel runs (at probe ``Y`` they take ``Y * alpha`` CPU and
their memory off their host), a host in maintenance gets capacity -1 (nothing
fits), and a spread job's tasks carry a *group*: the kernel skips a task
whose group is already on the host it fills (both kernels: the first fitting
task in list order whose group is not there yet).  Hosts are filled one after
another, so "already there" is one mark per group, set to the host index.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from vcsched.errors import InputError
from vcsched.model import Instance
from vcsched.rules import HostGroups
from vcsched.units import FIT_TOLERANCE

try:  # the optional C kernel (setup.py builds it when a compiler is available)
    _mcbc: ModuleType | None = importlib.import_module("vcsched.solvers._mcbc")
except ImportError:  # pragma: no cover - depends on the build
    _mcbc = None



def c_kernels() -> ModuleType | None:
    """The C extension ``vcsched.solvers._mcbc`` (the 2-D and the vector kernel), None when it is not built."""
    return _mcbc


# --- sort keys (section 3.4) --------------------------------------------------------------------


def _sum(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    return m + c


def _diff(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    return np.maximum(m, c) - np.minimum(m, c)


def _ratio(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    # c = Y * alpha > 0 and m > 0 by the model's ranges, so min(m, c) > 0.
    return np.maximum(m, c) / np.minimum(m, c)


def _max(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    return np.maximum(m, c)


@dataclass(frozen=True)
class Variant:
    """One MCB variant: the key each list is sorted by, and the direction."""

    name: str
    key: Callable[[np.ndarray, np.ndarray], np.ndarray]
    descending: bool
    summary: str


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("mcb1", _sum, False, "memory + CPU, ascending"),
        Variant("mcb2", _diff, False, "max(memory, CPU) - min(memory, CPU), ascending"),
        Variant("mcb3", _ratio, False, "max(memory, CPU) / min(memory, CPU), ascending"),
        Variant("mcb4", _max, False, "max(memory, CPU), ascending"),
        Variant("mcb5", _sum, True, "memory + CPU, descending (Leinberger et al.'s original)"),
        Variant("mcb6", _diff, True, "max(memory, CPU) - min(memory, CPU), descending"),
        Variant("mcb7", _ratio, True, "max(memory, CPU) / min(memory, CPU), descending"),
        Variant("mcb8", _max, True, "max(memory, CPU), descending (the paper's best)"),
    )
}


# --- one probe --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeLists:
    """What the kernel needs for one probe ``Y``: per-task needs and the two sorted lists."""

    cpu: np.ndarray  # c = Y * alpha per task (float64)
    mem: np.ndarray  # m per task (float64)
    cpu_heavy: np.ndarray  # task indices with c > m, in scan order (int64)
    mem_heavy: np.ndarray  # the other tasks, in scan order (int64)


def probe_lists(instance: Instance, variant: Variant, y: float) -> ProbeLists:
    """Split and sort the tasks for probe ``y`` (section 3.4): each task needs ``c = y * alpha``, ``m``.

    Re-done for every probe: the split and the keys depend on ``c``.
    """
    return sorted_lists(variant, y * instance.task_alpha, instance.task_mem)


def sorted_lists(variant: Variant, cpu: np.ndarray, mem: np.ndarray) -> ProbeLists:
    """The CPU-heavy (``c > m``) and memory-heavy lists, each sorted by the variant's key.

    A stable sort over increasing task indices breaks key ties by task index;
    descending order sorts the negated key (exact in floating point), so ties
    still go to the lower index.  Needs ``cpu > 0`` and ``mem > 0`` (MCB3/7 divide).
    """
    c = np.ascontiguousarray(cpu, dtype=np.float64)
    m = np.ascontiguousarray(mem, dtype=np.float64)
    key = variant.key(c, m)
    if variant.descending:
        key = -key
    heavy = c > m
    cpu_idx = np.flatnonzero(heavy)
    mem_idx = np.flatnonzero(~heavy)
    cpu_order = cpu_idx[np.argsort(key[cpu_idx], kind="stable")]
    mem_order = mem_idx[np.argsort(key[mem_idx], kind="stable")]
    return ProbeLists(c, m, cpu_order.astype(np.int64), mem_order.astype(np.int64))


@dataclass(frozen=True)
class KernelRules:
    """Spread groups for a kernel: ``group`` per item (-1: none); ``present`` the groups each host already holds."""

    group: np.ndarray  # int64 per item
    present: HostGroups

    def marks(self) -> np.ndarray:
        """One mark per group, the host that holds it (-1: none yet), for the Python kernels to fill host by host."""
        top = max(int(self.group.max(initial=-1)), int(self.present.groups.max(initial=-1)))
        return np.full(top + 2, -1, dtype=np.int64)

    def mark_present(self, mark: np.ndarray, h: int) -> None:
        """Mark on ``h`` the groups it already holds, as the kernel starts filling it."""
        present = self.present.groups[self.present.ptr[h]:self.present.ptr[h + 1]]
        mark[present[present >= 0]] = h


def pack_python(lists: ProbeLists, host_cpu: np.ndarray, host_mem: np.ndarray,
                rules: KernelRules | None = None) -> np.ndarray | None:
    """The reference kernel: fill hosts in index order from the two lists; None if a task is left over.

    A literal transcription of section 3.4: every search scans its list from
    the start for the first task still unplaced that fits.  (The C kernel
    finds the same task in a min-tree over list positions, skipping runs of
    tasks that cannot fit; the tests check the two agree.)
    """
    n = len(lists.cpu)
    hosts = np.full(n, -1, dtype=np.int64)
    order = (lists.cpu_heavy, lists.mem_heavy)
    need_c = (lists.cpu[order[0]], lists.cpu[order[1]])
    need_m = (lists.mem[order[0]], lists.mem[order[1]])
    alive = (np.ones(len(order[0]), dtype=bool), np.ones(len(order[1]), dtype=bool))
    group = (rules.group[order[0]], rules.group[order[1]]) if rules is not None else None
    mark = None if rules is None else rules.marks()
    left = n
    for h in range(len(host_cpu)):
        if left == 0:
            break
        if rules is not None and mark is not None:
            rules.mark_present(mark, h)
        free_c, free_m = float(host_cpu[h]), float(host_mem[h])
        first = True
        while left:
            scan = (0, 1) if first or free_c > free_m else (1, 0)
            for li in scan:
                ok = alive[li] & (need_c[li] <= free_c + FIT_TOLERANCE) & (need_m[li] <= free_m + FIT_TOLERANCE)
                if group is not None and mark is not None and len(ok):
                    g = group[li]
                    ok &= ~((g >= 0) & (mark[np.maximum(g, 0)] == h))
                pos = int(np.argmax(ok)) if len(ok) else 0
                if len(ok) and ok[pos]:
                    break
            else:
                break  # nothing fits on this host: next host
            alive[li][pos] = False
            hosts[order[li][pos]] = h
            if group is not None and mark is not None and group[li][pos] >= 0:
                mark[group[li][pos]] = h
            free_c -= float(need_c[li][pos])
            free_m -= float(need_m[li][pos])
            left -= 1
            first = False
    return hosts if left == 0 else None


def pack_c(lists: ProbeLists, host_cpu: np.ndarray, host_mem: np.ndarray,
           rules: KernelRules | None = None) -> np.ndarray | None:
    """The C kernel (``vcsched.solvers._mcbc.pack``), same contract as :func:`pack_python`."""
    if _mcbc is None:
        raise RuntimeError("the C kernel vcsched.solvers._mcbc is not built (pip install -e . builds it)")
    hosts = np.empty(len(lists.cpu), dtype=np.int64)
    args = [
        lists.cpu, lists.mem, lists.cpu_heavy, lists.mem_heavy,
        np.ascontiguousarray(host_cpu, dtype=np.float64), np.ascontiguousarray(host_mem, dtype=np.float64),
        FIT_TOLERANCE, hosts,
    ]
    if rules is not None:
        args += [np.ascontiguousarray(rules.group, dtype=np.int64),
                 np.ascontiguousarray(rules.present.ptr, dtype=np.int64),
                 np.ascontiguousarray(rules.present.groups, dtype=np.int64)]
    ok = _mcbc.pack(*args)
    return hosts if ok else None


Kernel = Callable[..., "np.ndarray | None"]  # (lists, host_cpu, host_mem, rules=None)
KERNELS: dict[str, Kernel] = {"python": pack_python}
if _mcbc is not None:
    KERNELS["c"] = pack_c
DEFAULT_BACKEND = "c" if _mcbc is not None else "python"


def pack(
    cpu: np.ndarray,
    mem: np.ndarray,
    host_cpu: np.ndarray,
    host_mem: np.ndarray,
    variant: str = "mcb8",
    backend: str | None = None,
    *,
    rules: KernelRules | None = None,
) -> np.ndarray | None:
    """One MCB packing of items with fixed needs into given capacities (no search): a host per item, or None.

    For callers that already know each item's CPU need, e.g. packing new
    tasks into the capacity left free by running ones (section 6.1).
    ``rules``: spread groups per item and those already on each host.
    """
    kernel = KERNELS[kernel_backend(backend)]
    return kernel(sorted_lists(_variant(variant), cpu, mem), np.asarray(host_cpu), np.asarray(host_mem), rules)


def _variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise InputError(f"variant: unknown MCB variant {name!r} (known: {', '.join(VARIANTS)})")
    return VARIANTS[name]


def kernel_backend(name: str | None) -> str:
    """The 2-D kernel to use: ``name``, else the C one when built."""
    name = name or DEFAULT_BACKEND
    if name not in KERNELS:
        raise InputError(f"backend: {name!r} is not available (available: {', '.join(KERNELS)})")
    return name
