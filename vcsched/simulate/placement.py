"""Where an arriving VC's VMs go, and re-placement under a migration byte budget at every event.

Memory is rigid (:mod:`vcsched.model`): a VC is admitted only when all its
VMs fit in the hosts' free memory; otherwise it waits (FIFO, but a later VC
that fits goes first).  Fluid resources never refuse a VM: the policy shares
them.  Strategies:

* ``pack`` (default): the VC on as few hosts as its own demand allows — at
  most as many VMs per host as fit in a host's fluid capacities at full speed
  (and its memory) — each chunk on the host whose most loaded fluid resource
  would be least loaded (loads counted at full speed: the VCs' *demand*).
  VCs then share hosts with few others, so an event touches a small
  connected component and re-allocating it is cheap;
* ``spread``: VM by VM, each on the host with memory room whose most loaded
  resource would be least loaded;
* ``mcb8``: vcsched's own placement of arrivals around running VMs
  (:func:`vcsched.adaptation.heuristic.pack_residual`: MCB8 over the residual
  capacities, binary search on the CPU yield, or the least-relative-load
  greedy if better; Stillwell et al., "Resource Allocation using Virtual
  Clusters", §3.4, §6.1), on every fluid resource the hosts declare.

With a migration budget, every arrival and departure runs vcsched's
adaptation (:func:`vcsched.adaptation.solve.solve_adapt`, the heuristic: §6.1's
problem, at most ``budget`` bytes migrated, a VM costing its memory in bytes
at :data:`HOST_MEMORY_BYTES` per reference host) on all running VCs, the
arrival included; migrations are instantaneous in the fluid model, their
bytes are counted.  Adaptation, like ``mcb8``, maximises the minimum yield over every
fluid resource (the policy then shares the resources on the placement found).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vcsched.adaptation.heuristic import pack_residual
from vcsched.adaptation.problem import AdaptProblem
from vcsched.adaptation.solve import solve_adapt
from vcsched.model import Host, Instance, Job
from vcsched.simulate.state import VC
from vcsched.simulate.workload import Workload
from vcsched.units import GIB, MEMORY_TOLERANCE

PLACEMENTS = ("pack", "spread", "mcb8")
#: The adaptation at every event: the heuristic (MCB8 from scratch as its re-placement), or with the anytime
#: search ``best`` (docs/results.md) as its re-placement, at best's default time limit per event.
ADAPT_ALGORITHMS = ("heuristic", "heuristic-best")
HOST_MEMORY_BYTES = 16 * GIB


class Placer:
    """Free memory and full-speed demand per host; places and releases VCs."""

    def __init__(self, workload: Workload, strategy: str, class_need: np.ndarray) -> None:
        self.workload = workload
        self.strategy = strategy
        hosts = workload.host_list
        self.capacity = workload.capacity_matrix()
        self.mem_free = np.array([h.memory for h in hosts], dtype=float)
        self.demand = np.zeros_like(self.capacity)
        self.class_need = class_need  # classes x resources: the work-weighted mean per-VM need
        self.class_mem = [c.memory for c in workload.classes]
        self.class_vms = [c.vms for c in workload.classes]
        self.hosts_model = tuple(Host(h.name, h.cpu, h.memory, h.capacity) for h in hosts)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.inv_cap = np.where(self.capacity > 0, 1.0 / self.capacity, np.inf)
            # how many VMs of a class one host can run at full speed (at least 1: a VM always fits somewhere)
            limit = []
            for k in range(len(workload.classes)):
                used = class_need[k] > 0
                per = (np.min(self.capacity[:, used] / class_need[k][used], axis=1) if used.any()
                       else np.full(len(hosts), np.inf))
                limit.append(np.maximum(np.floor(per + 1e-9), 1.0))
        self.chunk_limit = limit

    def _score(self, need: np.ndarray, count: int) -> np.ndarray:
        """Per host: the most loaded resource's load after adding ``count`` VMs of ``need``."""
        used = need > 0
        if not used.any():
            return np.zeros(len(self.mem_free))
        after = (self.demand[:, used] + count * need[used]) * self.inv_cap[:, used]
        return np.max(np.nan_to_num(after, nan=0.0, posinf=np.inf), axis=1)

    def place(self, cls: int, running: Sequence[VC]) -> dict[int, int] | None:
        """Hosts for a new VC of class ``cls`` (host -> VM count), or None if its memory does not fit now."""
        k, mem, need = self.class_vms[cls], self.class_mem[cls], self.class_need[cls]
        if len(self.mem_free) == 1:
            return {0: k} if self.mem_free[0] >= k * mem - MEMORY_TOLERANCE else None
        if self.strategy == "mcb8":
            return self._mcb8(cls, running)
        if self.strategy == "pack":
            return self._pack(cls, k, mem, need)
        return self._spread(k, mem, need)

    def _pack(self, cls: int, k: int, mem: float, need: np.ndarray) -> dict[int, int] | None:
        """Biggest chunks first (as few hosts as possible), the least loaded host among equal chunks."""
        used = need > 0
        inv = self.inv_cap[:, used]
        mem_fit = np.floor((self.mem_free + MEMORY_TOLERANCE) / mem) if mem > 0 else np.full(len(self.mem_free), k)
        chunk = np.minimum(np.minimum(self.chunk_limit[cls], mem_fit), k)
        if chunk.sum() < k:
            return None
        if used.any():
            after = (self.demand[:, used] + chunk[:, None] * need[used]) * inv
            score = np.max(np.nan_to_num(after, nan=0.0, posinf=np.inf), axis=1)
        else:
            score = np.zeros(len(chunk))
        order = np.lexsort((score, -chunk))
        out: dict[int, int] = {}
        left = k
        for h in order.tolist():
            c = int(min(chunk[h], left))
            if c <= 0:
                break
            out[h] = c
            left -= c
            if not left:
                return out
        return None  # pragma: no cover - chunk.sum() >= k

    def _spread(self, k: int, mem: float, need: np.ndarray) -> dict[int, int] | None:
        free = self.mem_free.copy()
        demand = self.demand.copy()
        out: dict[int, int] = {}
        used = need > 0
        for _ in range(k):
            room = free >= mem - MEMORY_TOLERANCE
            if not room.any():
                return None
            if used.any():
                score = np.max(np.nan_to_num((demand[:, used] + need[used]) * self.inv_cap[:, used], nan=0.0,
                                             posinf=np.inf), axis=1)
            else:
                score = np.zeros(len(free))
            h = int(np.argmin(np.where(room, score, np.inf)))
            out[h] = out.get(h, 0) + 1
            free[h] -= mem
            demand[h] += need
        return out

    def _extra_needs(self, cls: int) -> tuple[tuple[str, float], ...]:
        """A class's needs beyond CPU (disk, net, ...), so that MCB8 and the adaptation place on the vector."""
        return tuple((r, float(v)) for r, v in zip(self.workload.resources[1:], self.class_need[cls][1:],
                                                    strict=True) if v > 0)

    def _instance(self, running: Sequence[VC], extra: int | None = None) -> tuple[Instance, np.ndarray]:
        jobs, current = [], []
        for vc in running:
            jobs.append(Job(f"vc{vc.id}", float(self.class_need[vc.cls][0]), self.class_mem[vc.cls],
                            sum(vc.hosts.values()), needs=self._extra_needs(vc.cls)))
            for h, c in sorted(vc.hosts.items()):
                current.extend([h] * c)
        if extra is not None:
            jobs.append(Job("arrival", float(self.class_need[extra][0]), self.class_mem[extra],
                            self.class_vms[extra], needs=self._extra_needs(extra)))
            current.extend([-1] * self.class_vms[extra])
        return Instance(self.hosts_model, tuple(jobs)), np.array(current, dtype=np.int64)

    def _mcb8(self, cls: int, running: Sequence[VC]) -> dict[int, int] | None:
        if self.mem_free.sum() < self.class_vms[cls] * self.class_mem[cls] - MEMORY_TOLERANCE:
            return None
        inst, current = self._instance(running, cls)
        pool = np.flatnonzero(current < 0)
        placed = pack_residual(inst, current.clip(min=0), pool)
        if placed is None:
            return None
        out: dict[int, int] = {}
        for h in placed[pool].tolist():
            out[int(h)] = out.get(int(h), 0) + 1
        return out

    def add(self, vc: VC) -> None:
        for h, c in vc.hosts.items():
            self.mem_free[h] -= c * self.class_mem[vc.cls]
            self.demand[h] += c * self.class_need[vc.cls]

    def remove(self, vc: VC) -> None:
        for h, c in vc.hosts.items():
            self.mem_free[h] += c * self.class_mem[vc.cls]
            self.demand[h] -= c * self.class_need[vc.cls]

    def adapt(self, running: Sequence[VC], budget: int, arrival: int | None = None, algorithm: str = "heuristic"
              ) -> tuple[list[dict[int, int]], dict[int, int] | None, int] | None:
        """vcsched's adaptation within ``budget`` bytes: new hosts for every running VC (same order), for the
        arrival of class ``arrival`` if any, and the bytes migrated; None if it finds no placement."""
        inst, current = self._instance(running, arrival)
        task_bytes = np.round(inst.task_mem * HOST_MEMORY_BYTES).astype(np.int64)
        result = solve_adapt(AdaptProblem(inst, current, task_bytes, budget), algorithm)
        if result.result.allocation is None:
            return None
        hosts = np.asarray(result.result.allocation.hosts)
        out: list[dict[int, int]] = []
        first = 0
        for job in inst.jobs:
            d: dict[int, int] = {}
            for h in hosts[first:first + job.tasks].tolist():
                d[int(h)] = d.get(int(h), 0) + 1
            out.append(d)
            first += job.tasks
        new = out.pop() if arrival is not None else None
        return out, new, int(result.migrated_bytes)
