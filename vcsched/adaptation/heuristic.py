"""Our heuristic for the adaptation problem (paper section 6.1; the problem is in :mod:`vcsched.adaptation.problem`).

Some tasks already run: ``current[t]`` is the host task ``t`` runs on, or -1
for a new arrival (departed jobs are simply absent).  Moving a running task
costs its memory size in bytes (a live migration copies at least that much);
placing a new arrival costs nothing.  The total cost of the new placement must
stay within ``budget`` bytes.  Budget 0 keeps every running task where it is
and only re-caps CPU; a budget of at least the total running bytes allows a
free re-placement.

The paper solves this only as a MILP (:mod:`vcsched.adaptation.milp`) and leaves
heuristics to future work.  :func:`adapt_heuristic` is ours:

1. keep every running task where it is (evicting the cheapest tasks per unit
   of memory from hosts whose memory is over capacity, which costs bytes);
2. place new arrivals (and evicted tasks) into the *residual* capacity, with
   the better of an MCB8 packing (section 3.4, binary search on the yield)
   and a "least relative load" greedy;
3. improvement moves: repeatedly take a task off the bottleneck host (the one
   that sets the minimum yield) to the host and task that buy the most yield
   per migrated byte (when no single move helps, exchange it with a smaller
   task elsewhere), until nothing improves within the budget; moves after
   the last one that raised the minimum yield are dropped (they cost bytes
   and bought nothing);
4. compute a from-scratch MCB8 placement (or another registry algorithm's), relabel its hosts and tasks to
   overlap the current placement as much as possible, and take it instead
   when its cost fits the budget and it gives a higher yield (or the same
   yield for fewer bytes).

On the resource vector (extra fluid resources such as disk and network,
docs/policies.md) every step is the same with a host's yield
``min_r C_hr / L_hr`` over its fluid resources: the residual packing packs
the vectors (:func:`vcsched.solvers.mcb_vector.pack_vector`), the greedy and
the improvement moves weigh every resource, and a host without a resource a
task needs is never a destination for it.  Instances whose only fluid
resource is CPU take exactly the old paths.

Placement rules (docs/rules.md, :mod:`vcsched.adaptation.problem`): step 1
also evicts the tasks that may not stay where they run (those that must
``leave`` their host in a drain, and those on a host without a fluid resource
they need: :func:`~vcsched.adaptation.problem.may_stay`) and the extra tasks
of a spread job sharing a host (a repair); step 2 packs into hosts not in
maintenance, skipping hosts that hold the spread job already (the MCB
kernel's groups); step 3 only moves tasks that are not pinned, to hosts
:func:`~vcsched.adaptation.problem.task_allowed` allows and that do not hold
their spread job; step 4 places from scratch with the registry's rule
handling and relabels only hosts equal in maintenance that hold no pinned
task.  A candidate that still breaks a rule is dropped.  Where a task may go
is one mask for the rules and the resources (:func:`vcsched.rules.allowed_matrix`,
:func:`~vcsched.adaptation.problem.task_allowed`).

Everything here is pure: problems in, placements and migration lists out.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from vcsched.adaptation.problem import AdaptProblem, adapt_rule_problems, may_stay, move_cost, task_allowed
from vcsched.errors import InputError
from vcsched.model import Instance, SolveOptions
from vcsched.rules import allowed_matrix, spread_groups
from vcsched.solvers.registry import get, place_with_rules
from vcsched.solvers.search import ResidualRoom, search
from vcsched.solvers.yield_search import bisect_yield
from vcsched.units import MEMORY_TOLERANCE, SEARCH_PRECISION, YIELD_TOLERANCE
from vcsched.yields import common_yield, fluid_loads, placement_min_yield

# ---------------------------------------------------------------------------------------------- packing

def _yield_of(instance: Instance, cpu_load: np.ndarray) -> float:
    """The common yield of per-host loads: CPU needs (a vector), or hosts x fluid resources (a matrix)."""
    return common_yield(instance.host_cpu if cpu_load.ndim == 1 else instance.host_capacity, cpu_load)


def fluid_layout(instance: Instance) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(capacity, need per task, vector)``: hosts x and tasks x fluid resources on the resource vector,
    else the flat ``host_cpu`` and ``task_alpha`` (the CPU-only arithmetic and speed, unchanged)."""
    if instance.has_extra_resources:
        return instance.host_capacity, instance.job_need[instance.task_job], True
    return instance.host_cpu, instance.task_alpha, False


def placed_loads(instance: Instance, hosts: np.ndarray) -> np.ndarray:
    """The fluid loads of a placement in :func:`fluid_layout`'s layout."""
    if instance.has_extra_resources:
        return fluid_loads(instance, hosts)
    return np.bincount(hosts, weights=instance.task_alpha, minlength=instance.n_hosts)


def host_ratio(cap: np.ndarray, load: np.ndarray, vector: bool, floor: float = 0.0) -> np.ndarray:
    """``C / L`` (``min_r C_r / L_r`` over the last axis when ``vector``), ``inf`` where a load is at most ``floor``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(load > floor, cap / load, np.inf)
    return np.min(r, axis=-1) if vector else r


def pack_residual(
    instance: Instance, hosts: np.ndarray, pool: np.ndarray, precision: float = SEARCH_PRECISION
) -> np.ndarray | None:
    """Place the ``pool`` tasks around the fixed tasks of ``hosts`` (entries of ``pool`` ignored there).

    Binary search on the yield ``Y`` (section 3.4, :func:`~vcsched.solvers.yield_search.bisect_yield`,
    the upper end first: what the fixed tasks allow, and the LP bound of section 3.1) with the one probe
    (:class:`vcsched.solvers.search.ResidualRoom`): the pool packed by MCB8 with needs ``Y * need`` into
    what the fixed tasks leave at that ``Y``, on CPU and memory or on the resource vector.  A pool task
    pinned to a host is placed there.  The "least relative load" greedy (a host's yield
    ``min_r C_hr / L_hr``; hosts without a resource the task needs are not candidates) is also tried and
    the better kept.
    """
    if len(pool) == 0:
        return hosts.copy()
    fixed = np.ones(instance.n_tasks, dtype=bool)
    fixed[pool] = False
    base_h = hosts[fixed]
    cap = instance.host_capacity
    fluid = fluid_loads(instance, hosts, np.flatnonzero(fixed))
    mem_load = np.bincount(base_h, weights=instance.task_mem[fixed], minlength=instance.n_hosts)
    need, mem = instance.job_need[instance.task_job[pool]], instance.task_mem[pool]
    mem_free = instance.host_mem - mem_load
    candidates = []
    ruled = instance.has_rules
    # Where each pool task may go: maintenance, pins and the fluid resources it needs, one mask.
    allowed = allowed_matrix(instance, pool) if ruled or instance.has_extra_resources else None
    groups = spread_groups(instance)
    on_host: dict[int, set[int]] = {}
    if ruled:
        for h, g in zip(base_h.tolist(), groups[fixed].tolist(), strict=True):
            if g >= 0:
                on_host.setdefault(g, set()).add(h)

    # Least relative load: biggest need first, onto the host where it lowers the yield least.
    greedy = hosts.copy()
    load, mfree = fluid.copy(), mem_free.copy()
    ok = True
    for i in np.argsort(-need.max(axis=1), kind="stable"):
        room = mfree >= mem[i] - MEMORY_TOLERANCE
        if allowed is not None:
            room &= allowed[i]
        if ruled:
            g = int(groups[pool[i]])
            if g >= 0 and g in on_host:
                room[list(on_host[g])] = False
        if not room.any():
            ok = False
            break
        ratio = np.where(room, host_ratio(cap, load + need[i], True), -np.inf)
        h = int(np.argmax(ratio))
        greedy[pool[i]] = h
        load[h] += need[i]
        mfree[h] -= mem[i]
        if ruled and groups[pool[i]] >= 0:
            on_host.setdefault(int(groups[pool[i]]), set()).add(h)
    if ok:
        candidates.append(greedy)

    # MCB8 around the fixed tasks (and the pool's pinned ones), binary search on Y from the upper end.
    fixed_hosts = np.asarray(hosts, dtype=np.int64).copy()
    fixed_hosts[pool] = instance.task_pinned[pool]
    residual = ResidualRoom(instance, fixed_hosts)
    upper = residual.ceiling()
    if upper is not None:
        packed = bisect_yield(residual.probe("mcb8"), 0.0, upper, precision, probe_upper=True).found
        if packed is not None:
            candidates.append(packed)
    if not candidates:
        return None
    return max(candidates, key=lambda c: placement_min_yield(instance, c))


def mcb8_from_scratch(instance: Instance, precision: float = SEARCH_PRECISION) -> np.ndarray | None:
    """A full MCB8 placement (section 3.4's binary search), ignoring where tasks run now (on every fluid resource)."""
    return search(instance, "mcb8", None, precision).hosts


def from_scratch(instance: Instance, precision: float = SEARCH_PRECISION, algorithm: str = "mcb8") -> np.ndarray | None:
    """A full placement by ``algorithm`` (any placing algorithm of the registry, e.g. ``best``; MCB8 by default)."""
    if instance.has_rules:  # maintenance, pins, spread (and preferred ones tried first)
        return place_with_rules(instance, get(algorithm).placer, SolveOptions(precision=precision), algorithm)[0].hosts
    if algorithm == "mcb8":
        return mcb8_from_scratch(instance, precision)
    return get(algorithm).placer(instance, SolveOptions(precision=precision)).hosts


def align_to_current(problem: AdaptProblem, target: np.ndarray) -> np.ndarray:
    """Relabel ``target`` so that it moves as few bytes as possible away from ``problem.current``.

    Hosts of equal capacity are interchangeable, so a placement computed from
    scratch can be renamed host for host (an assignment problem on the bytes
    that would stay), and the tasks of one job are interchangeable, so each
    job keeps as many tasks as possible where they already are.
    """
    inst = problem.instance
    target = np.asarray(target, dtype=np.int64).copy()
    run = problem.running
    # 1. Host relabelling within classes of equal capacities (cpu, memory, every other fluid resource).
    stay = np.zeros((inst.n_hosts, inst.n_hosts))  # [target host, current host] -> bytes
    np.add.at(stay, (target[run], problem.current[run]), problem.task_bytes[run].astype(float))
    if problem.copies_disks:  # a task kept in its storage group also keeps its disks where they are
        assert problem.disk_bytes is not None and problem.host_storage is not None
        groups = problem.host_storage
        kept = np.zeros((inst.n_hosts, int(groups.max()) + 1))  # [target host, storage group] -> disk bytes
        np.add.at(kept, (target[run], groups[problem.current[run]]), problem.disk_bytes[run].astype(float))
        stay += kept[:, groups]
    from scipy.optimize import linear_sum_assignment  # here: `status` imports this module and never renames

    rename = np.arange(inst.n_hosts)
    classes: dict[tuple[object, ...], list[int]] = {}
    fixed = set(inst.task_pinned[inst.task_pinned >= 0].tolist()) | set(problem.current[problem.leaving].tolist())
    for h, host in enumerate(inst.hosts):
        if h not in fixed:  # a host holding a pinned task, or one being drained, keeps its name
            classes.setdefault((host.cpu, host.memory, host.capacity, host.maintenance), []).append(h)
    for members in classes.values():
        if len(members) < 2:
            continue
        idx = np.array(members)
        rows, cols = linear_sum_assignment(stay[np.ix_(idx, idx)], maximize=True)
        rename[idx[rows]] = idx[cols]
    target = rename[target]
    # 2. Within each parallel job, keep tasks on hosts the job still uses there.
    for j, job in enumerate(inst.jobs):
        if job.tasks == 1:
            continue
        first = int(inst.job_first_task[j])
        sl = slice(first, first + job.tasks)
        cur, tgt = problem.current[sl], target[sl]
        slots: dict[int, int] = {}
        for h in tgt:
            slots[int(h)] = slots.get(int(h), 0) + 1
        new = np.full(job.tasks, -1, dtype=np.int64)
        for t in np.argsort(cur < 0, kind="stable"):  # running tasks first
            c = int(cur[t])
            if c >= 0 and slots.get(c, 0) > 0:
                new[t] = c
                slots[c] -= 1
        rest = [h for h, k in slots.items() for _ in range(k)]
        new[new < 0] = rest
        target[sl] = new
    return target


# ---------------------------------------------------------------------------------------------- heuristic

def _evict_overfull(problem: AdaptProblem) -> np.ndarray:
    """Running tasks to take off hosts whose memory is over capacity, cheapest bytes per unit of memory first.

    This only happens when host capacities shrank since the tasks were placed
    (a host reserved more memory); the evicted tasks must migrate.  So must
    the tasks that may not stay where they run (:func:`~vcsched.adaptation.problem.may_stay`:
    those that must ``leave`` in a drain, and those on a host without a fluid
    resource they need, where they could only run at yield 0), which come
    first, and, for a spread job with several tasks on one host, all but one
    of them there (a repair).  Pinned tasks are never evicted.
    """
    inst = problem.instance
    run = problem.running
    pinned = inst.task_pinned >= 0
    stay = run & may_stay(problem)
    evicted: list[int] = [int(t) for t in np.flatnonzero(run & ~stay & ~pinned)]
    groups = spread_groups(inst) if inst.has_rules else None
    if groups is not None:
        seen: set[tuple[int, int]] = set()
        for t in np.flatnonzero(stay & (groups >= 0))[np.argsort(pinned[stay & (groups >= 0)] * -1, kind="stable")]:
            key = (int(groups[t]), int(problem.current[t]))
            if key in seen and not pinned[t]:
                evicted.append(int(t))
                stay[t] = False
            seen.add(key)
    mem_load = np.bincount(problem.current[stay], weights=inst.task_mem[stay], minlength=inst.n_hosts)
    for h in np.flatnonzero(mem_load > inst.host_mem + MEMORY_TOLERANCE):
        on = np.flatnonzero((problem.current == h) & stay & ~pinned)
        order = on[np.argsort(problem.cheapest_move(on) / inst.task_mem[on], kind="stable")]
        excess = mem_load[h] - inst.host_mem[h]
        for t in order:
            if excess <= MEMORY_TOLERANCE:
                break
            evicted.append(int(t))
            excess -= inst.task_mem[t]
    return np.array(evicted, dtype=np.int64)


CANDIDATE_HOSTS = 48  # destinations/exchange partners tried first: the hosts with the most CPU to spare


def improve(problem: AdaptProblem, hosts: np.ndarray, max_moves: int | None = None,
            deadline: float | None = None) -> np.ndarray:
    """Improvement moves off the bottleneck host, best yield gain per migrated byte first, within the budget.

    A move takes task ``t`` from the host ``b`` that sets the minimum yield to
    a host ``h`` with memory room; its gain is how much it raises ``b``'s
    yield without pushing ``h`` below the old level, its cost the change in
    migrated bytes (moving a task back to where it runs now refunds it, and
    new arrivals move for free).  When no move helps, the best exchange with
    a smaller task elsewhere is tried.  Moves after the last one that raised
    the global minimum yield are undone: they spent bytes for nothing.

    For speed on large clusters, destinations are first sought among the
    :data:`CANDIDATE_HOSTS` hosts with the highest yield (the best gains are
    there) plus the tasks' current hosts (free returns), then among all.

    ``deadline`` (a :func:`time.perf_counter` value): no move starts after it.
    The moves are an anytime improvement of a valid placement, so stopping
    early only leaves yield unbought (a drain bounds them this way,
    :data:`vcsched.adaptation.drain.IMPROVE_S`).
    """
    inst = problem.instance
    hosts = np.asarray(hosts, dtype=np.int64).copy()
    cap, need, vec = fluid_layout(inst)
    load = placed_loads(inst, hosts)
    mem = np.bincount(hosts, weights=inst.task_mem, minlength=inst.n_hosts)
    spent = move_cost(problem, hosts)
    history: list[tuple[int, int, int]] = []  # (task, from, to)
    best_y, best_len = _yield_of(inst, load), 0
    limit = max_moves if max_moves is not None else 4 * inst.n_tasks + 100
    all_hosts = np.arange(inst.n_hosts)
    groups = spread_groups(inst) if inst.has_rules else None  # once: the moves below only read it
    if groups is not None and not (groups >= 0).any():
        groups = None
    while len(history) < limit and (deadline is None or time.perf_counter() < deadline):
        ratio = host_ratio(cap, load, vec)
        b = int(np.argmin(ratio))
        if ratio[b] >= 1.0:
            break
        on = np.flatnonzero(hosts == b)
        if inst.has_rules:
            on = on[inst.task_pinned[on] < 0]  # pinned tasks never move
        if inst.n_hosts > CANDIDATE_HOSTS:
            top = np.argpartition(-ratio, CANDIDATE_HOSTS - 1)[:CANDIDATE_HOSTS]
            homes = problem.current[on]
            candidates = np.unique(np.concatenate((top, homes[homes >= 0])))
        else:
            candidates = all_hosts
        move = _best_move(problem, load, mem, b, on, spent, candidates, hosts, groups)
        if move is None and len(candidates) < inst.n_hosts:
            move = _best_move(problem, load, mem, b, on, spent, all_hosts, hosts, groups)
        if move is not None:
            t, h, dcost = move
            steps = [(t, b, h)]
        else:
            partners = np.flatnonzero(np.isin(hosts, candidates) & (hosts != b))
            if inst.has_rules:
                partners = partners[inst.task_pinned[partners] < 0]
            swap = _best_swap(problem, hosts, load, mem, b, on, partners, spent, groups)
            if swap is None and len(candidates) < inst.n_hosts:
                rest = np.flatnonzero(hosts != b)
                swap = _best_swap(problem, hosts, load, mem, b, on,
                                  rest[inst.task_pinned[rest] < 0] if inst.has_rules else rest, spent, groups)
            if swap is None:
                break
            t, u, h, dcost = swap
            steps = [(t, b, h), (u, h, b)]
        for task, src, dst in steps:
            hosts[task] = dst
            load[src] -= need[task]
            load[dst] += need[task]
            mem[src] -= inst.task_mem[task]
            mem[dst] += inst.task_mem[task]
            history.append((task, src, dst))
        spent += dcost
        y = _yield_of(inst, load)
        if y > best_y + YIELD_TOLERANCE:
            best_y, best_len = y, len(history)
    for t, src, _ in reversed(history[best_len:]):
        hosts[t] = src
    return hosts


def move_allowed(problem: AdaptProblem, hosts: np.ndarray, tasks: np.ndarray, dests: np.ndarray,
             groups: np.ndarray | None) -> np.ndarray:
    """``ok[i, k]``: task ``tasks[i]`` may move to ``dests[k]`` (maintenance, pins, drain, resources, and its
    spread job not there already).  ``groups``: :func:`vcsched.rules.spread_groups`, None when no job is spread."""
    inst = problem.instance
    ok = task_allowed(problem, tasks, dests)
    if groups is None:
        return ok
    for i, t in enumerate(tasks):
        g = int(groups[t])
        if g < 0:
            continue
        first = int(inst.job_first_task[g])
        mates = np.arange(first, first + inst.jobs[g].tasks)
        mates = mates[mates != t]
        ok[i] &= ~np.isin(dests, hosts[mates])
    return ok


def _best_move(problem: AdaptProblem, load: np.ndarray, mem: np.ndarray, b: int, on: np.ndarray, spent: int,
               dests: np.ndarray, hosts: np.ndarray | None = None,
               groups: np.ndarray | None = None) -> tuple[int, int, int] | None:
    """The move of a task on ``b`` to one of ``dests`` that buys the most yield per byte: (task, host, bytes)."""
    inst = problem.instance
    cap, need, vec = fluid_layout(inst)
    y_b = host_ratio(cap[b], load[b], vec)
    a = need[on][:, None, ...]
    m = inst.task_mem[on][:, None]
    to_dest = problem.move_bytes(on[:, None], dests[None, :])  # what moving there costs, disks included
    at_b = problem.move_bytes(on, b)[:, None]  # what being on b costs now (refunded by leaving)
    cur = problem.current[on][:, None]
    running = cur >= 0
    dest = dests[None, :]
    dc = np.where(running & (cur != dest), to_dest, 0.0) - np.where(running & (cur != b), at_b, 0.0)
    after_b = host_ratio(cap[b], load[b] - a, vec, floor=1e-12)
    after_h = host_ratio(cap[dests][None, ...], load[dests][None, ...] + a, vec)  # 0 where a needed resource is absent
    gain = np.minimum(np.minimum(after_b, after_h), 1.0) - y_b
    ok = ((mem[dests][None, :] + m <= inst.host_mem[dests][None, :] + MEMORY_TOLERANCE) & (dest != b)
          & (spent + dc <= problem.budget) & (gain > YIELD_TOLERANCE))
    if inst.has_rules and hosts is not None and ok.any():
        ok &= move_allowed(problem, hosts, on, dests, groups)
    if not ok.any():
        return None
    free = ok & (dc <= 0)
    # Free moves (new arrivals, returns home) first: most gain, then the largest refund.
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(free, gain - 1e-15 * dc, -np.inf) if free.any() else np.where(ok, gain / dc, -np.inf)
    i, k = np.unravel_index(int(np.argmax(score)), score.shape)
    return int(on[i]), int(dests[k]), int(dc[i, k])


def _best_swap(problem: AdaptProblem, hosts: np.ndarray, load: np.ndarray, mem: np.ndarray, b: int,
               on: np.ndarray, others: np.ndarray, spent: int,
               groups: np.ndarray | None = None) -> tuple[int, int, int, int] | None:
    """The exchange of a task ``t`` on the bottleneck ``b`` with a smaller task ``u`` among ``others`` that buys the
    most yield per byte within the budget, as (t, u, u's host, change in bytes); None if none improves.

    Tried when no single move helps: typically memory is tight, and only an
    exchange keeps both hosts within memory.
    """
    inst = problem.instance
    if not len(others) or not len(on):
        return None
    hu = hosts[others][None, :]
    cap, need, vec = fluid_layout(inst)
    at, au = need[on][:, None, ...], need[others][None, ...]
    mt, mu = inst.task_mem[on][:, None], inst.task_mem[others][None, :]
    ct, cu = problem.current[on][:, None], problem.current[others][None, :]
    t_to_h, t_at_b = problem.move_bytes(on[:, None], hu), problem.move_bytes(on, b)[:, None]
    u_to_b, u_at_h = problem.move_bytes(others, b)[None, :], problem.move_bytes(others, hosts[others])[None, :]
    # Byte cost change: t goes b -> hu, u goes hu -> b (each relative to where it runs now).
    dc = (np.where((ct >= 0) & (ct != hu), t_to_h, 0.0) - np.where((ct >= 0) & (ct != b), t_at_b, 0.0)
          + np.where((cu >= 0) & (cu != b), u_to_b, 0.0) - np.where((cu >= 0) & (cu != hu), u_at_h, 0.0))
    y_b = host_ratio(cap[b], load[b], vec)
    new_b = load[b] - at + au
    new_h = load[hosts[others]][None, ...] - au + at
    floor = 0.0 if vec else -np.inf  # CPU alone: plain division, as always (0 / 0 only on the vector)
    gain = np.minimum(np.minimum(host_ratio(cap[b], new_b, vec, floor), host_ratio(cap[hu], new_h, vec, floor)),
                      1.0) - y_b
    smaller = np.any(au < at, axis=-1) if vec else au < at
    ok = (smaller & (gain > YIELD_TOLERANCE) & (spent + dc <= problem.budget)
          & (mem[b] - mt + mu <= inst.host_mem[b] + MEMORY_TOLERANCE)
          & (mem[hosts[others]][None, :] - mu + mt <= inst.host_mem[hu] + MEMORY_TOLERANCE))
    if inst.has_rules and ok.any():
        ok &= _swap_rule_ok(problem, hosts, b, on, others, groups)
    if not ok.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(ok, np.where(dc <= 0, np.inf, gain / dc), -np.inf)
    best = score.max()
    if np.isinf(best):  # free exchanges: the one with the most gain
        score = np.where(ok & (dc <= 0), gain, -np.inf)
    i, k = np.unravel_index(int(np.argmax(score)), score.shape)
    return int(on[i]), int(others[k]), int(hosts[others[k]]), int(dc[i, k])


def _swap_rule_ok(problem: AdaptProblem, hosts: np.ndarray, b: int, on: np.ndarray, others: np.ndarray,
                  groups: np.ndarray | None) -> np.ndarray:
    """``ok[i, k]``: swapping ``on[i]`` (on ``b``) with ``others[k]`` keeps every rule.

    ``groups`` as in :func:`move_allowed`.
    """
    inst = problem.instance
    hu = hosts[others]
    back = task_allowed(problem, others, np.array([b]))[:, 0]  # each partner may come to b
    ok = task_allowed(problem, on, hu) & back[None, :]
    if groups is None:
        return ok
    gu = groups[others]
    for i, t in enumerate(on):
        g = int(groups[t])
        if g >= 0:
            first = int(inst.job_first_task[g])
            mates = np.arange(first, first + inst.jobs[g].tasks)
            ok[i] &= ~np.isin(hu, hosts[mates[mates != t]])
        on_b = set(int(x) for x in groups[hosts == b] if x >= 0) - ({g} if g >= 0 else set())
        ok[i] &= ~((gu >= 0) & np.isin(gu, list(on_b)))
    return ok


def _scratch_instance(problem: AdaptProblem) -> Instance:
    """The instance step 4 places from scratch: tasks running on a host in maintenance, not leaving, stay there.

    (From scratch a host in maintenance takes only pinned tasks; in the adaptation its own tasks may stay.)
    """
    inst = problem.instance
    if not inst.host_cordoned.any():
        return inst
    stay = problem.running & inst.host_cordoned[problem.current.clip(min=0)] & may_stay(problem)
    if not stay.any():
        return inst
    pins = np.where(stay & (inst.task_pinned < 0), problem.current, inst.task_pinned)
    return dataclasses.replace(inst, pinned=tuple(int(p) for p in pins))


def adapt_heuristic(problem: AdaptProblem, precision: float = SEARCH_PRECISION, scratch: str = "mcb8",
                    improve_s: float | None = None) -> tuple[np.ndarray | None, dict[str, object]]:
    """Our heuristic for section 6.1 (see the module docstring); returns a placement or None, and details.

    ``scratch`` names the registry algorithm of step 4's from-scratch placement (``best`` for the anytime
    search, at its default budget).  ``improve_s``: the most seconds step 3's improvement moves may take
    (None: until no move helps).
    """
    problem = problem.cordoned()  # a drained host takes nothing new, as in maintenance
    inst = problem.instance
    evicted = _evict_overfull(problem)
    pool = np.concatenate((np.flatnonzero(~problem.running), evicted)).astype(np.int64)
    candidates: list[tuple[str, np.ndarray]] = []
    cut: str | None = None
    if int(problem.task_bytes[evicted].sum()) <= problem.budget:
        placed = pack_residual(inst, problem.current.clip(min=0), pool, precision)
        if placed is not None and move_cost(problem, placed) <= problem.budget:
            deadline = None if improve_s is None else time.perf_counter() + improve_s
            candidates.append(("incremental", improve(problem, placed, deadline=deadline)))
            if deadline is not None and time.perf_counter() >= deadline:
                cut = f"improvement moves stopped after {improve_s:g} s"
    try:
        placed_anew = from_scratch(_scratch_instance(problem), precision, scratch)
    except InputError:  # staying put would contradict a rule (two VMs of a spread job on one such host)
        placed_anew = from_scratch(inst, precision, scratch)
    if placed_anew is not None:
        aligned = align_to_current(problem, placed_anew)
        if move_cost(problem, aligned) <= problem.budget:
            candidates.append(("scratch", aligned))
    if inst.has_rules or problem.leave:
        candidates = [c for c in candidates if not adapt_rule_problems(problem, c[1])]
    if not candidates:
        return None, {"path": "none"}
    name, best = max(candidates, key=lambda c: (round(placement_min_yield(inst, c[1]), 9), -move_cost(problem, c[1])))
    return best, {"path": name, **({"improve_stopped": cut} if cut else {})}

