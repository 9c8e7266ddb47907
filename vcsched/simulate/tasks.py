"""Task-based sharing: "serve the most deprived job" with whole tasks (Bonald & Roberts §4).

Source: T. Bonald and J. Roberts, "Enhanced Cluster Computing Performance
through Proportional Fairness", §4.1–4.2.  Resources are pooled, with
capacities ``C_j``; a class-k job has ``σ_k`` tasks, each needing ``A_kj`` of
resource ``j`` for a random time of mean ``τ_k`` (exponential, or Erlang-m: the
sum of m exponentials, the same mean).  ``φ_i`` is now the *integer* number of
job i's tasks in progress.  When a job arrives or a task ends, tasks are
started one at a time for the **most deprived** job:

* DRF: the job with the smallest ``φ_i max_j a_ij`` (``a_ij = A_ij / C_j``);
* PF: the smallest ``φ_i Σ_j a_ij ν_j``, with ``ν`` the resource prices of the
  fluid PF allocation of the jobs present (the paper iterates its eq. (9) to
  them; here :mod:`vcsched.simulate.dualpf` gives them exactly, recomputed
  when the set of jobs changes).

If the most deprived job's next task does not fit in what is free, nothing
starts until enough tasks end or another job becomes the most deprived
(ties: the oldest job).  A job leaves when its last task ends.

The fluid model's size of a job — its time alone if it could always run
``min_j C_j / A_kj`` tasks — is ``σ_k τ_k / min_j(C_j / A_kj)``: ``1/μ_k`` in the
paper's notation.  Alone, a job of the paper's configuration (500 tasks, 100
at a time) keeps 100 tasks running until 400 have ended, then 99, 98, …, 1,
so its service rate at zero load is :func:`isolated_service_rate`, ≈ 0.544.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.experiments import OnProgress
from vcsched.simulate import dualpf
from vcsched.simulate.metrics import ClassResult, RunResult, class_result
from vcsched.simulate.rows import Groups
from vcsched.simulate.workload import check_load

TASK_POLICIES = ("drf", "pf")
FIT_TOL = 1e-9


@dataclass(frozen=True)
class TaskClass:
    name: str
    rate: float  # jobs per unit time
    demand: tuple[float, ...]  # A_kj per task, per resource
    tasks: int = 500  # σ_k
    task_time: float = 0.2  # τ_k
    erlang: int = 1  # task time: Erlang with this shape (1: exponential)


@dataclass(frozen=True)
class TaskWorkload:
    capacity: tuple[float, ...]  # C_j
    classes: tuple[TaskClass, ...]
    resources: tuple[str, ...] = ("cpu", "ram")

    def parallel(self, k: int) -> float:
        """Tasks a class-k job could run alone: ``min_j C_j / A_kj``."""
        c = self.classes[k]
        return min(cap / a for cap, a in zip(self.capacity, c.demand, strict=True) if a > 0)

    def size(self, k: int) -> float:
        c = self.classes[k]
        return c.tasks * c.task_time / self.parallel(k)

    def loads(self) -> np.ndarray:
        """Per resource: Σ_k λ_k σ_k τ_k A_kj / C_j (Bonald & Roberts eq. 10)."""
        out = np.zeros(len(self.capacity))
        for c in self.classes:
            out += c.rate * c.tasks * c.task_time * np.array(c.demand) / np.array(self.capacity)
        return out

    def scaled_to_load(self, load: float) -> TaskWorkload:
        check_load("load", load)
        cur = float(self.loads().max())
        if cur <= 0:
            raise InputError("load: the classes have no arrivals to scale (every rate is 0)")
        return TaskWorkload(self.capacity, tuple(
            TaskClass(c.name, c.rate * load / cur, c.demand, c.tasks, c.task_time, c.erlang) for c in self.classes),
            self.resources)

    def check(self) -> None:
        if not self.classes:
            raise InputError("classes: at least one class of jobs is needed")
        for i, c in enumerate(self.classes):
            if c.rate < 0 or not math.isfinite(c.rate):
                raise InputError(f"classes[{i}].rate: {c.rate!r} must be a finite number at least 0")
            if len(c.demand) != len(self.capacity) or any(a < 0 for a in c.demand) or not any(c.demand):
                raise InputError(f"classes[{i}].demand: {c.demand!r} needs one amount >= 0 per resource, "
                                 f"not all 0")
            if any(a > cap for a, cap in zip(c.demand, self.capacity, strict=True)):
                raise InputError(f"classes[{i}].demand: a task needs more than the pool has")
        loads = self.loads()
        for r, rho in zip(self.resources, loads, strict=True):
            if rho >= 1:
                raise InputError(f"load: resource {r!r} has load {rho:.4g} >= 1, outside the capacity region "
                                 f"(Bonald & Roberts eq. 10), so the run would never be stable")


def paper_workload(erlang: int = 1, mix: Sequence[float] = (3, 1)) -> TaskWorkload:
    """§4.2: a1 = (1, 1/10), a2 = (1/10, 1), 500 tasks per job, capacity 100, τ = 1/5 (μ = 1), ρ1 = 3ρ2."""
    return TaskWorkload((100.0, 100.0), (
        TaskClass("class1", float(mix[0]), (1.0, 0.1), 500, 0.2, erlang),
        TaskClass("class2", float(mix[1]), (0.1, 1.0), 500, 0.2, erlang),
    ))


def isolated_service_rate(tasks: int, parallel: int) -> float:
    """Zero-load service rate with exponential tasks: fluid time over the expected time alone (§4.2).

    Alone, the job keeps ``parallel`` tasks running until ``tasks − parallel + 1`` have ended, then
    ``parallel − 1``, …, 1: ``(σ/C) / ((σ − C + 1)/C + Σ_{k<C} 1/k)``; 0.5442 for 500 tasks, 100 at a time.
    """
    if tasks < parallel:
        return (tasks / parallel) / sum(1.0 / k for k in range(1, tasks + 1))
    return (tasks / parallel) / ((tasks - parallel + 1) / parallel + sum(1.0 / k for k in range(1, parallel)))


class _Job:
    __slots__ = ("arrival", "cls", "id", "measured", "pending", "running")

    def __init__(self, job_id: int, cls: int, arrival: float, tasks: int, measured: bool) -> None:
        self.id = job_id
        self.cls = cls
        self.arrival = arrival
        self.pending = tasks  # not started yet
        self.running = 0  # φ_i
        self.measured = measured


def simulate_tasks(workload: TaskWorkload, policy: str = "drf", *, arrivals: int = 2_000, warmup: int = 200,
                   seed: int = 0, replication: int = 0, on_progress: OnProgress | None = None) -> RunResult:
    """One replication of the task-based system with Poisson job arrivals."""
    workload.check()
    if policy not in TASK_POLICIES:
        raise InputError(f"policy: task-based mode serves the most deprived job under {' or '.join(TASK_POLICIES)}, "
                         f"not {policy!r}")
    if arrivals < 1 or warmup < 0:
        raise InputError(f"arrivals/warmup: {arrivals}/{warmup} must be at least 1/0")
    start_wall = time.perf_counter()
    k_n, j_n = len(workload.classes), len(workload.capacity)
    ss = np.random.SeedSequence(seed, spawn_key=(replication,))
    rngs = [np.random.default_rng(c) for c in ss.spawn(2 * k_n)]
    arr_rng, task_rng = rngs[:k_n], rngs[k_n:]
    cap = list(workload.capacity)
    a = [[x / c for x, c in zip(cl.demand, cap, strict=True)] for cl in workload.classes]
    dom = [max(row) for row in a]
    free = list(cap)
    jobs: dict[int, _Job] = {}
    price = [0.0] * j_n  # PF's ν
    weight = list(dom)  # deprivation per running task: DRF max_j a_ij; PF Σ_j a_ij ν_j

    prices_of: dict[tuple[int, ...], list[float]] = {}  # the prices depend only on how many jobs of each class

    def reprice() -> None:
        if policy != "pf" or not jobs:
            return
        key = tuple(count)
        hit = prices_of.get(key)
        if hit is not None:
            price[:] = hit
        else:
            price[:] = solve_prices(list(count))
            prices_of[key] = list(price)
        for k in range(k_n):
            weight[k] = sum(a[k][j] * price[j] for j in range(j_n))

    def solve_prices(counts: list[int]) -> list[float]:
        present = [k for k in range(k_n) if counts[k]]
        # In units of dominant share (y = φ max_j a_ij), so that the solver's cap y <= 1 is the pool itself;
        # the prices per unit of capacity are the same.
        groups = Groups([counts[k] for k in present], [1.0] * len(present),
                        [[(j, a[k][j] / dom[k]) for j in range(j_n) if a[k][j] > 0] for k in present],
                        list(range(j_n)), [1.0] * j_n)
        solved = dualpf.solve(groups, 1.0, dict(enumerate(price)))
        if solved is None:  # pragma: no cover - the dual Newton converges on these tiny problems
            raise AssertionError("task-based PF: prices did not converge")
        _, nu = solved
        return [nu.get(j, 0.0) for j in range(j_n)]

    heap: list[tuple[float, int, int]] = []  # task ends: (time, seq, job id)
    seq = 0

    def serve(t: float) -> None:
        nonlocal seq
        while True:
            best, best_key = None, None
            for job in jobs.values():
                if job.pending:
                    key = (job.running * weight[job.cls], job.arrival)
                    if best_key is None or key < best_key:
                        best, best_key = job, key
            if best is None:
                return
            dem = workload.classes[best.cls].demand
            if any(dem[j] > free[j] + FIT_TOL for j in range(j_n)):
                return  # frozen until tasks end or another job becomes the most deprived
            for j in range(j_n):
                free[j] -= dem[j]
            best.pending -= 1
            best.running += 1
            cl = workload.classes[best.cls]
            dur = float(task_rng[best.cls].gamma(cl.erlang, cl.task_time / cl.erlang))
            seq += 1
            heapq.heappush(heap, (t + dur, seq, best.id))

    arr_heap = [(float(arr_rng[k].exponential(1.0 / c.rate)), k) for k, c in enumerate(workload.classes) if c.rate > 0]
    heapq.heapify(arr_heap)
    t = 0.0
    total = warmup + arrivals
    n_arr = 0
    left = 0
    w_start, w_end = math.inf, math.inf
    count = [0] * k_n
    area = [0.0] * k_n
    times: list[list[float]] = [[] for _ in range(k_n)]
    slow: list[list[float]] = [[] for _ in range(k_n)]
    events = 0
    next_id = 0
    if on_progress:
        on_progress(0, total, policy)
    while n_arr < total or left > 0:
        t_arr = arr_heap[0][0] if arr_heap else math.inf
        t_end = heap[0][0] if heap else math.inf
        t_new = min(t_arr, t_end)
        lo, hi = max(t, w_start), min(t_new, w_end)
        if hi > lo:
            for k in range(k_n):
                area[k] += count[k] * (hi - lo)
        t = t_new
        events += 1
        if t_arr <= t_end:
            _, k = heapq.heapreplace(arr_heap, (t_arr + float(arr_rng[arr_heap[0][1]].exponential(
                1.0 / workload.classes[arr_heap[0][1]].rate)), arr_heap[0][1]))
            measured = warmup <= n_arr < total
            if n_arr == warmup:
                w_start = t
            if n_arr == total - 1:
                w_end = t
            n_arr += 1
            left += measured
            jobs[next_id] = _Job(next_id, k, t, workload.classes[k].tasks, measured)
            next_id += 1
            count[k] += 1
            reprice()
            if on_progress and n_arr % 200 == 0:
                on_progress(min(n_arr, total), total, policy)
        else:
            _, _, i = heapq.heappop(heap)
            job = jobs[i]
            dem = workload.classes[job.cls].demand
            for j in range(j_n):
                free[j] += dem[j]
            job.running -= 1
            if job.running == 0 and job.pending == 0:
                del jobs[i]
                count[job.cls] -= 1
                if job.measured:
                    left -= 1
                    span = t - job.arrival
                    times[job.cls].append(span)
                    slow[job.cls].append(span / workload.size(job.cls))
                reprice()
        serve(t)
    span = w_end - w_start
    classes: list[ClassResult] = [
        class_result(c.name, c.rate, workload.size(k), area[k], span, times[k], slow[k], [], 0.0, 0)
        for k, c in enumerate(workload.classes)]
    if on_progress:
        on_progress(total, total, policy)
    return RunResult(policy=policy, replication=replication, seed=seed, classes=tuple(classes), utilisation={},
                     jain=1.0, given={}, window=(w_start, w_end), events=events,
                     wall_s=time.perf_counter() - start_wall)
