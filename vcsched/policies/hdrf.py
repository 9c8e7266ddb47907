"""``hdrf``: static hierarchical DRF over the tenant tree (H-DRF, Algorithm 1).

Source: A. Bhattacharya et al., "Hierarchical Scheduling for Diverse
Datacenter Workloads", §3.1 (static H-DRF) and §3.3 (why the simpler designs
fail).  The tree: the instance's ``tenants`` are the internal nodes (roots
hang under one implicit root), the jobs are the leaves; a job without a
tenant hangs directly under the root.  Weights: tenants' and jobs' own.

**Progressive filling with epsilon** (Algorithm 1, fluid): repeatedly walk
down from the root, at each node taking the non-blocked child with the
smallest ``s / w`` (ties: the first in document order), and give the leaf it
reaches ``epsilon`` of dominant share (its yield grows by ``epsilon / D_j``).
A leaf's consumption vector is ``y_j * sigma_j`` (cluster shares,
:mod:`vcsched.policies.shares`); an internal node's is the *sum* of its
children's, and its ``s`` the largest component of that sum.  A leaf is
**blocked** at yield 1 or as soon as a (host, resource) pair it needs is
saturated; an internal node when all its children are.  The last step
before a pair saturates is cut to fit exactly, so capacities hold exactly
and the result is Pareto-efficient; the shares are within about
``epsilon`` of the limit epsilon -> 0.

vcsched recomputes whole allocations, so the static definition is the one
that matters (the paper's Theorem 1: the dynamic Algorithms 2–4 reach the
same allocation when resources are fully allocated).

How it stays fast: the tree walk is plain Python over lists, and the
capacity rows (every (host, resource) pair a leaf's VMs touch, possibly
hundreds) are not checked per step.  Steps run in batches ignoring the rows;
one sparse product per batch checks them; on a violation, a bisection over
the batch's steps finds the first step that overflows, the state rolls back
to just before it (shares are recomputed from the yields), and that step is
cut to fit.  Until that step the rows were not binding, so the result is the
same as checking every step.

:func:`collapsed_weights` is the *flattened* hierarchy of §3.2 (weights
multiplied along the path, then weighted DRF); it violates the hierarchical
share guarantee with several resources and exists only so the tests can
show that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vcsched.constraints import Capacities, capacities
from vcsched.model import Instance
from vcsched.policies.allocation import PolicyOptions, PolicyResult
from vcsched.policies.shares import cluster_shares
from vcsched.units import FIT_TOLERANCE, SATURATION_TOLERANCE

if TYPE_CHECKING:
    from scipy.sparse import csr_matrix

BATCH = 512  # steps between two capacity checks


@dataclass(frozen=True)
class Tree:
    """Node 0 is the implicit root; tenants follow in document order, then one leaf per job."""

    names: tuple[str, ...]
    parent: tuple[int, ...]  # -1 for the root
    weight: tuple[float, ...]
    children: tuple[tuple[int, ...], ...]
    leaf_node: tuple[int, ...]  # node index of job j

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    def ancestors(self, node: int) -> list[int]:
        """``node`` and every node above it up to and including the root."""
        path = [node]
        while self.parent[path[-1]] >= 0:
            path.append(self.parent[path[-1]])
        return path


def tenant_tree(instance: Instance) -> Tree:
    """The tree of an instance whose tenants passed :func:`vcsched.formats.instance.check_instance`."""
    n_t = len(instance.tenants)
    index = {t.name: 1 + i for i, t in enumerate(instance.tenants)}
    names = ("", *(t.name for t in instance.tenants), *(j.name for j in instance.jobs))
    parent = [-1] + [index[t.parent] if t.parent is not None else 0 for t in instance.tenants] + [
        index[j.tenant] if j.tenant is not None else 0 for j in instance.jobs]
    weight = (1.0, *(t.weight for t in instance.tenants), *(j.weight for j in instance.jobs))
    children: list[list[int]] = [[] for _ in names]
    for node, p in enumerate(parent):
        if p >= 0:
            children[p].append(node)
    return Tree(names=names, parent=tuple(parent), weight=weight, children=tuple(tuple(c) for c in children),
                leaf_node=tuple(range(1 + n_t, 1 + n_t + instance.n_jobs)))


def collapsed_weights(instance: Instance) -> np.ndarray:
    """Flattened hierarchy (§3.2): each job's weight is the product along its path of w / (sum of sibling w).

    Only subtrees holding jobs count as siblings (every job demands, statically).
    """
    tree = tenant_tree(instance)
    has_job = [False] * tree.n_nodes
    for leaf in tree.leaf_node:
        for a in tree.ancestors(leaf):
            has_job[a] = True
    out = np.ones(instance.n_jobs)
    for j, leaf in enumerate(tree.leaf_node):
        for node in tree.ancestors(leaf)[:-1]:
            siblings = [c for c in tree.children[tree.parent[node]] if has_job[c]]
            out[j] *= tree.weight[node] / sum(tree.weight[c] for c in siblings)
    return out


def _membership(tree: Tree, n_jobs: int) -> csr_matrix:
    """(nodes x jobs): 1 where the job's leaf lies in the node's subtree."""
    from scipy.sparse import csr_matrix  # lazy: scipy costs ~0.4 s to import

    rows, cols = [], []
    for j, leaf in enumerate(tree.leaf_node):
        for a in tree.ancestors(leaf):
            rows.append(a)
            cols.append(j)
    return csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(tree.n_nodes, n_jobs))


def _first_overflow(caps: Capacities, y0: np.ndarray, leaves: np.ndarray, steps: np.ndarray) -> int:
    """Smallest m such that taking the first m steps overflows some row (loads only grow with m)."""
    n = len(y0)

    def overflows(m: int) -> bool:
        y = y0 + np.bincount(leaves[:m], weights=steps[:m], minlength=n)
        return bool(np.any(caps.load(y) > caps.capacity * (1 + FIT_TOLERANCE) + 1e-15))

    lo, hi = 0, len(leaves)  # overflows(lo) is False, overflows(hi) is True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if overflows(mid):
            hi = mid
        else:
            lo = mid
    return hi


def hdrf_fill(instance: Instance, caps: Capacities, tree: Tree, epsilon: float) -> tuple[np.ndarray, dict[str, object]]:
    """Algorithm 1 by epsilon-progressive filling; returns the yields and details."""
    n_jobs = instance.n_jobs
    sigma = cluster_shares(instance)  # consumption vector per unit yield
    dom = sigma.max(axis=1) if n_jobs else np.zeros(0)
    member = _membership(tree, n_jobs)
    n_res = sigma.shape[1]
    leaf_of = list(tree.leaf_node)
    job_of = {leaf: j for j, leaf in enumerate(leaf_of)}
    parent = list(tree.parent)
    children = [list(c) for c in tree.children]
    inv_w = [1.0 / w for w in tree.weight]
    sig = sigma.tolist()
    step_y = (epsilon / dom).tolist() if n_jobs else []

    def is_blocked(y: np.ndarray) -> np.ndarray:
        """Leaves at yield 1 or needing a saturated pair (a pair of capacity 0 is saturated from the start)."""
        out = y >= 1.0
        full = caps.saturated(y, rtol=SATURATION_TOLERANCE)
        if full.any():
            out[caps.matrix[full].indices] = True
        return out

    y = np.zeros(n_jobs)
    leaf_blocked = is_blocked(y)

    def rebuild() -> tuple[list[list[float]], list[float], list[bool]]:
        use = np.asarray(member @ (y[:, None] * sigma)) if n_jobs else np.zeros((tree.n_nodes, n_res))
        u = use.tolist()
        s = use.max(axis=1).tolist() if n_res else [0.0] * tree.n_nodes
        blocked = [True] * tree.n_nodes  # a node with no job below it never demands
        for j in np.flatnonzero(~leaf_blocked):
            for a in tree.ancestors(leaf_of[int(j)]):
                if not blocked[a]:
                    break
                blocked[a] = False
        return u, s, blocked

    use, share, blocked = rebuild()
    yl = y.tolist()
    steps_total = 0
    rollbacks = 0
    while not blocked[0]:
        y_start = np.asarray(yl)
        traj_leaf: list[int] = []
        traj_dy: list[float] = []
        for _ in range(BATCH):
            if blocked[0]:
                break
            node = 0
            while children[node]:
                best, best_key = -1, 0.0
                for c in children[node]:
                    if not blocked[c]:
                        key = share[c] * inv_w[c]
                        if best < 0 or key < best_key:
                            best, best_key = c, key
                node = best
            j = job_of[node]
            dy = min(step_y[j], 1.0 - yl[j])
            yl[j] += dy
            traj_leaf.append(j)
            traj_dy.append(dy)
            sj = sig[j]
            a = node
            while a >= 0:
                ua = use[a]
                for r in range(n_res):
                    ua[r] += dy * sj[r]
                share[a] = max(ua)
                a = parent[a]
            if yl[j] >= 1.0:  # capped: block the leaf, and every ancestor left with no demanding child
                leaf_blocked[j] = True
                blocked[node] = True
                a = parent[node]
                while a >= 0 and all(blocked[c] for c in children[a]):
                    blocked[a] = True
                    a = parent[a]
        kept = len(traj_leaf)
        y = np.asarray(yl)
        if np.any(caps.load(y) > caps.capacity * (1 + FIT_TOLERANCE) + 1e-15):
            rollbacks += 1
            leaves, dys = np.asarray(traj_leaf), np.asarray(traj_dy)
            m = _first_overflow(caps, y_start, leaves, dys)
            kept = m
            y = y_start + np.bincount(leaves[: m - 1], weights=dys[: m - 1], minlength=n_jobs)
            j = int(leaves[m - 1])
            col = caps.matrix[:, [j]].tocoo()  # the rows job j is in, and its coefficients there
            slack = caps.capacity[col.row] - caps.load(y)[col.row]
            y[j] += max(0.0, min(float(dys[m - 1]), float(np.min(slack / col.data))))
            # Rolled back: block again from the state itself (a leaf capped later in the batch is not).
            leaf_blocked = is_blocked(y)
            use, share, blocked = rebuild()
            yl = y.tolist()
        steps_total += kept
    y = np.minimum(np.asarray(yl), 1.0)
    detail: dict[str, object] = {
        "epsilon": epsilon,
        "steps": steps_total,
        "capacity_rollbacks": rollbacks,
        "node_share": {tree.names[n]: share[n] for n in range(1, tree.n_nodes) if n not in job_of},
    }
    return y, detail


def hdrf(instance: Instance, hosts: np.ndarray, options: PolicyOptions) -> PolicyResult:
    caps = capacities(instance, hosts)
    y, detail = hdrf_fill(instance, caps, tenant_tree(instance), options.epsilon)
    return PolicyResult(y, detail)
