"""MCB on the resource vector: Leinberger et al.'s multi-capacity bin packing in ``d`` dimensions.

The paper's MCB (section 3.4, :mod:`vcsched.solvers.mcb`) packs two
dimensions, CPU and memory.  Leinberger's algorithm is multi-capacity to
begin with, so an instance with extra fluid resources (disk, network:
docs/policies.md) packs the whole vector: every task of job ``j`` at yield
``y_j`` needs ``y_j * need_jr`` of every fluid resource ``r`` (CPU first, then
the extra ones in :attr:`Instance.resources` order) and its memory ``m_j``,
which stays rigid (it never scales with the yield).

The generalisation keeps every convention of the 2-D kernel, so that with
``d = 2`` it makes exactly the 2-D kernel's decisions (a test checks it):

* a task goes into the list of its **largest dimension**, ties going to the
  later dimension (2-D: ``c > m`` is CPU-heavy, a tie memory-heavy);
* each list is sorted by the variant's key over the whole vector (sum,
  max - min, max / min, max; ascending or descending), ties by task index;
* the first task of every host is the first fitting task of the lists taken
  in dimension order (CPU first); afterwards a host scans the lists in
  decreasing order of its free capacity per dimension, ties to the later
  dimension ("look first in the list that goes against the host's
  imbalance");
* a task fits when every need is at most the free capacity plus ``FIT_TOLERANCE``,
  and free capacities are updated by subtraction in placement order.

The 2-D C kernel is left as it is: instances whose only fluid resource is CPU
never come here.  This one has two implementations that make the same
decisions (a test checks them on random instances, with rules, NaN and
infinite capacities): the C kernel ``vcsched.solvers._mcbc.pack_vector``
(the default when built), which keeps each list as a min-tree of the
needs, dimension by dimension, so a search skips whole runs of placed or
too-large tasks; and the numpy reference :func:`pack_vector_python`, which
keeps per host and per list the positions of the tasks that still fit that
host (a host's free capacity only shrinks, so a task that does not fit now
never will) and looks at the first few candidates before filtering the rest.
The adaptation heuristic and the simulator call this kernel once per probe
of their searches, many times per event, which is why it is in C.

The search that calls it, on a fill level, is :func:`vcsched.solvers.search.search`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.model import Instance
from vcsched.solvers.mcb import KernelRules, c_kernels
from vcsched.units import FIT_TOLERANCE

_PEEK = 16  # candidates looked at before filtering a whole list

VectorKey = Callable[[np.ndarray], np.ndarray]


def _sum(v: np.ndarray) -> np.ndarray:
    return v.sum(axis=1)


def _diff(v: np.ndarray) -> np.ndarray:
    return v.max(axis=1) - v.min(axis=1)


def _ratio(v: np.ndarray) -> np.ndarray:
    # A zero need (a job that needs no disk) makes the ratio infinite: the most unbalanced item there is.
    lo, hi = v.min(axis=1), v.max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.inf)


def _max(v: np.ndarray) -> np.ndarray:
    return v.max(axis=1)


#: The eight variants' keys over the need vector, and whether descending (section 3.4's table).
VECTOR_KEYS: dict[str, tuple[VectorKey, bool]] = {
    "mcb1": (_sum, False), "mcb2": (_diff, False), "mcb3": (_ratio, False), "mcb4": (_max, False),
    "mcb5": (_sum, True), "mcb6": (_diff, True), "mcb7": (_ratio, True), "mcb8": (_max, True),
}


@dataclass(frozen=True)
class VectorLists:
    """One probe's items: the need matrix (tasks x dimensions) and one sorted list of task indices per dimension."""

    need: np.ndarray  # float64, n_tasks x d
    lists: tuple[np.ndarray, ...]  # d arrays of task indices (int64), in scan order


def vector_lists(variant: str, need: np.ndarray) -> VectorLists:
    """Split the tasks by their largest dimension (ties: the later one) and sort each list by the variant's key."""
    if variant not in VECTOR_KEYS:
        raise InputError(f"variant: unknown MCB variant {variant!r} (known: {', '.join(VECTOR_KEYS)})")
    fn, descending = VECTOR_KEYS[variant]
    v = np.ascontiguousarray(need, dtype=np.float64)
    n, d = v.shape
    key = fn(v) if n else np.zeros(0)
    if descending:
        key = -key
    largest = d - 1 - np.argmax(v[:, ::-1], axis=1) if n else np.zeros(0, dtype=np.int64)  # last max wins ties
    lists = []
    for dim in range(d):
        idx = np.flatnonzero(largest == dim)
        lists.append(idx[np.argsort(key[idx], kind="stable")].astype(np.int64))
    return VectorLists(v, tuple(lists))


def pack_vector_python(items: VectorLists, capacity: np.ndarray,
                       rules: KernelRules | None = None) -> np.ndarray | None:
    """Fill hosts in index order from the ``d`` lists (module docstring); a host per task, or None.

    ``capacity`` is hosts x d, the same dimensions as ``items.need``; ``rules``: spread groups (module docstring).
    """
    need = items.need
    n, d = need.shape
    cap = np.asarray(capacity, dtype=np.float64).reshape(-1, d)
    hosts = np.full(n, -1, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    lists = [lst.copy() for lst in items.lists]
    left = n
    grp = rules.group if rules is not None else None
    mark = None if rules is None else rules.marks()

    def allowed(idx: np.ndarray, h: int) -> np.ndarray:
        if grp is None or mark is None:
            return np.ones(len(idx), dtype=bool)
        g = grp[idx]
        return ~((g >= 0) & (mark[np.maximum(g, 0)] == h))

    for h in range(len(cap)):
        if left == 0:
            break
        if rules is not None and mark is not None:
            rules.mark_present(mark, h)
        # Drop the tasks placed on earlier hosts, then keep only the tasks that fit this empty host.
        lists = [lst[alive[lst]] for lst in lists]
        free = cap[h].copy()
        with np.errstate(invalid="ignore"):  # a NaN capacity fits nothing
            cand = [lst[np.all(need[lst] <= free + FIT_TOLERANCE, axis=1) & allowed(lst, h)] for lst in lists]
        first = True
        while left:
            if first:
                scan: list[int] = list(range(d))
            else:  # most free dimension first; ties to the later dimension
                scan = sorted(range(d), key=lambda k: (-free[k], -k))
            chosen = -1
            for li in scan:
                c = cand[li]
                if not len(c):
                    continue
                with np.errstate(invalid="ignore"):
                    head = np.all(need[c[:_PEEK]] <= free + FIT_TOLERANCE, axis=1) & allowed(c[:_PEEK], h)
                if head.any():
                    pos = int(np.argmax(head))
                else:
                    with np.errstate(invalid="ignore"):
                        ok = np.all(need[c] <= free + FIT_TOLERANCE, axis=1) & allowed(c, h)
                    c = cand[li] = c[ok]  # the rest never fits this host again
                    if not len(c):
                        continue
                    pos = 0
                chosen = int(c[pos])
                cand[li] = np.delete(c, pos)
                break
            if chosen < 0:
                break  # nothing fits on this host: next host
            hosts[chosen] = h
            alive[chosen] = False
            if grp is not None and mark is not None and grp[chosen] >= 0:
                mark[grp[chosen]] = h
            for k in range(d):
                free[k] -= need[chosen, k]
            left -= 1
            first = False
    return hosts if left == 0 else None


def pack_vector_c(items: VectorLists, capacity: np.ndarray, rules: KernelRules | None = None) -> np.ndarray | None:
    """The C kernel (``vcsched.solvers._mcbc.pack_vector``), same contract as :func:`pack_vector_python`."""
    _mcbc = c_kernels()
    if _mcbc is None:
        raise RuntimeError("the C kernel vcsched.solvers._mcbc is not built (pip install -e . builds it)")
    need = items.need
    n, d = need.shape
    hosts = np.empty(n, dtype=np.int64)
    order = np.ascontiguousarray(np.concatenate(items.lists) if items.lists else np.zeros(0), dtype=np.int64)
    ptr = np.zeros(d + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(lst) for lst in items.lists])
    cap = np.ascontiguousarray(np.asarray(capacity, dtype=np.float64).reshape(-1, d))
    args: list[object] = [np.ascontiguousarray(need, dtype=np.float64), d, order, ptr, cap, FIT_TOLERANCE, hosts]
    if rules is not None:
        args += [np.ascontiguousarray(rules.group, dtype=np.int64),
                 np.ascontiguousarray(rules.present.ptr, dtype=np.int64),
                 np.ascontiguousarray(rules.present.groups, dtype=np.int64)]
    return hosts if _mcbc.pack_vector(*args) else None


def pack_vector(items: VectorLists, capacity: np.ndarray, rules: KernelRules | None = None) -> np.ndarray | None:
    """Fill hosts in index order from the ``d`` lists (module docstring): the C kernel when it is built."""
    _mcbc = c_kernels()
    if _mcbc is not None and hasattr(_mcbc, "pack_vector"):
        return pack_vector_c(items, capacity, rules)
    return pack_vector_python(items, capacity, rules)


def vector_capacity(instance: Instance) -> np.ndarray:
    """Hosts x (fluid resources + memory): every fluid capacity, then memory last."""
    return np.column_stack((instance.host_capacity, instance.host_mem))


def vector_need(instance: Instance, yields: np.ndarray) -> np.ndarray:
    """Tasks x (fluid resources + memory) for jobs at ``yields``: ``y_j * need_jr``, then ``m_j``."""
    fluid = (np.asarray(yields, dtype=float)[:, None] * instance.job_need)[instance.task_job]
    return np.column_stack((fluid, instance.task_mem))
