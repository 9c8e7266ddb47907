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

Placement rules (docs/rules.md, :mod:`vcsched.adaptation.problem`): step 1
also evicts the tasks that must ``leave`` their host (a drain) and the extra
tasks of a spread job sharing a host (a repair); step 2 packs into hosts not
in maintenance, skipping hosts that hold the spread job already (the MCB
kernel's groups); step 3 only moves tasks that are not pinned, to hosts
:func:`~vcsched.adaptation.problem.task_allowed` allows and that do not hold
their spread job; step 4 places from scratch with the registry's rule
handling and relabels only hosts equal in maintenance that hold no pinned
task.  A candidate that still breaks a rule is dropped.

Everything here is pure: problems in, placements and migration lists out.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from vcsched.adaptation.problem import AdaptProblem, adapt_rule_problems, move_cost, task_allowed
from vcsched.errors import InputError
from vcsched.model import Instance
from vcsched.rules import HostGroups, spread_groups
from vcsched.solvers.mcb import KernelRules, pack, search
from vcsched.solvers.yield_search import bisect_yield
from vcsched.yields import MEMORY_TOLERANCE, placement_min_yield

_YIELD_EPS = 1e-9


# ---------------------------------------------------------------------------------------------- packing

def _yield_of(instance: Instance, cpu_load: np.ndarray) -> float:
    used = cpu_load > 0
    if not used.any():
        return 1.0
    return float(min(1.0, np.min(instance.host_cpu[used] / cpu_load[used])))


def pack_residual(
    instance: Instance, hosts: np.ndarray, pool: np.ndarray, precision: float = 1e-4
) -> np.ndarray | None:
    """Place the ``pool`` tasks around the fixed tasks of ``hosts`` (entries of ``pool`` ignored there).

    Binary search on the yield ``Y`` (section 3.4, :func:`~vcsched.solvers.yield_search.bisect_yield`,
    the upper end first): a probe packs the pool with CPU ``Y * alpha`` into
    what the fixed tasks leave at that ``Y``, with the MCB8 kernel of
    :func:`vcsched.solvers.mcb.pack`.  The "least relative load" greedy is
    also tried and the better kept.
    """
    fixed = np.ones(instance.n_tasks, dtype=bool)
    fixed[pool] = False
    base_h = hosts[fixed]
    cpu_load = np.bincount(base_h, weights=instance.task_alpha[fixed], minlength=instance.n_hosts)
    mem_load = np.bincount(base_h, weights=instance.task_mem[fixed], minlength=instance.n_hosts)
    if len(pool) == 0:
        return hosts.copy()
    alpha, mem = instance.task_alpha[pool], instance.task_mem[pool]
    mem_free = instance.host_mem - mem_load
    candidates = []
    ruled = instance.has_rules
    groups = spread_groups(instance)
    kernel_rules = KernelRules(groups[pool], HostGroups.of(instance.n_hosts, base_h, groups[fixed])) if ruled else None
    closed = instance.host_cordoned
    on_host: dict[int, set[int]] = {}
    if ruled:
        for h, g in zip(base_h.tolist(), groups[fixed].tolist(), strict=True):
            if g >= 0:
                on_host.setdefault(g, set()).add(h)

    # Least relative load: biggest CPU need first, onto the host where it lowers the yield least.
    greedy = hosts.copy()
    load, mfree = cpu_load.copy(), mem_free.copy()
    ok = True
    for i in np.argsort(-alpha, kind="stable"):
        room = mfree >= mem[i] - MEMORY_TOLERANCE
        if ruled:
            room &= ~closed
            g = int(groups[pool[i]])
            if g >= 0 and g in on_host:
                room[list(on_host[g])] = False
        if not room.any():
            ok = False
            break
        ratio = np.where(room, instance.host_cpu / (load + alpha[i]), -np.inf)
        h = int(np.argmax(ratio))
        greedy[pool[i]] = h
        load[h] += alpha[i]
        mfree[h] -= mem[i]
        if ruled and groups[pool[i]] >= 0:
            on_host.setdefault(int(groups[pool[i]]), set()).add(h)
    if ok:
        candidates.append(greedy)

    # MCB8 on the residual capacities, binary search on Y.  Upper end, probed first: what the fixed tasks
    # allow, and the LP bound of section 3.1 for the whole instance.
    def residual_mcb8(y: float) -> np.ndarray | None:
        cpu_free = np.maximum(instance.host_cpu - y * cpu_load, 0.0)
        if ruled:
            return pack(y * alpha, mem, np.where(closed, -1.0, cpu_free), np.where(closed, -1.0, mem_free), "mcb8",
                        rules=kernel_rules)
        return pack(y * alpha, mem, cpu_free, mem_free, "mcb8")

    upper = min(_yield_of(instance, cpu_load), float(instance.host_cpu.sum() / instance.task_alpha.sum()))
    packed = bisect_yield(residual_mcb8, 0.0, upper, precision, probe_upper=True).found
    if packed is not None:
        placed = hosts.copy()
        placed[pool] = packed
        candidates.append(placed)
    if not candidates:
        return None
    return max(candidates, key=lambda c: placement_min_yield(instance, c))


def mcb8_from_scratch(instance: Instance, precision: float = 1e-4) -> np.ndarray | None:
    """A full MCB8 placement (section 3.4's binary search), ignoring where tasks run now."""
    return search(instance, "mcb8", precision).hosts


def from_scratch(instance: Instance, precision: float = 1e-4, algorithm: str = "mcb8") -> np.ndarray | None:
    """A full placement by ``algorithm`` (any placing algorithm of the registry, e.g. ``best``; MCB8 by default)."""
    from vcsched.model import SolveOptions
    from vcsched.solvers.registry import get, place_with_rules

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
    # 1. Host relabelling within classes of equal (cpu, memory).
    stay = np.zeros((inst.n_hosts, inst.n_hosts))  # [target host, current host] -> bytes
    np.add.at(stay, (target[run], problem.current[run]), problem.task_bytes[run].astype(float))
    if problem.copies_disks:  # a task kept in its storage group also keeps its disks where they are
        assert problem.disk_bytes is not None and problem.host_storage is not None
        groups = problem.host_storage
        kept = np.zeros((inst.n_hosts, int(groups.max()) + 1))  # [target host, storage group] -> disk bytes
        np.add.at(kept, (target[run], groups[problem.current[run]]), problem.disk_bytes[run].astype(float))
        stay += kept[:, groups]
    rename = np.arange(inst.n_hosts)
    classes: dict[tuple[float, float, bool], list[int]] = {}
    fixed = set(inst.task_pinned[inst.task_pinned >= 0].tolist()) | set(problem.current[problem.leaving].tolist())
    for h, host in enumerate(inst.hosts):
        if h not in fixed:  # a host holding a pinned task, or one being drained, keeps its name
            classes.setdefault((host.cpu, host.memory, host.maintenance), []).append(h)
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
    the tasks that must ``leave`` (a drain) and, for a spread job with several
    tasks on one host, all but one of them there (a repair).  Pinned tasks are never evicted.
    """
    inst = problem.instance
    run = problem.running
    leaving = problem.leaving
    pinned = inst.task_pinned >= 0
    evicted: list[int] = [int(t) for t in np.flatnonzero(leaving & run & ~pinned)]
    stay = run & ~leaving
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


def improve(problem: AdaptProblem, hosts: np.ndarray, max_moves: int | None = None) -> np.ndarray:
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
    """
    inst = problem.instance
    hosts = np.asarray(hosts, dtype=np.int64).copy()
    load = np.bincount(hosts, weights=inst.task_alpha, minlength=inst.n_hosts)
    mem = np.bincount(hosts, weights=inst.task_mem, minlength=inst.n_hosts)
    spent = move_cost(problem, hosts)
    history: list[tuple[int, int, int]] = []  # (task, from, to)
    best_y, best_len = _yield_of(inst, load), 0
    limit = max_moves if max_moves is not None else 4 * inst.n_tasks + 100
    all_hosts = np.arange(inst.n_hosts)
    while len(history) < limit:
        with np.errstate(divide="ignore"):
            ratio = np.where(load > 0, inst.host_cpu / load, np.inf)
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
        move = _best_move(problem, load, mem, b, on, spent, candidates, hosts)
        if move is None and len(candidates) < inst.n_hosts:
            move = _best_move(problem, load, mem, b, on, spent, all_hosts, hosts)
        if move is not None:
            t, h, dcost = move
            steps = [(t, b, h)]
        else:
            partners = np.flatnonzero(np.isin(hosts, candidates) & (hosts != b))
            if inst.has_rules:
                partners = partners[inst.task_pinned[partners] < 0]
            swap = _best_swap(problem, hosts, load, mem, b, on, partners, spent)
            if swap is None and len(candidates) < inst.n_hosts:
                rest = np.flatnonzero(hosts != b)
                swap = _best_swap(problem, hosts, load, mem, b, on,
                                  rest[inst.task_pinned[rest] < 0] if inst.has_rules else rest, spent)
            if swap is None:
                break
            t, u, h, dcost = swap
            steps = [(t, b, h), (u, h, b)]
        for task, src, dst in steps:
            hosts[task] = dst
            load[src] -= inst.task_alpha[task]
            load[dst] += inst.task_alpha[task]
            mem[src] -= inst.task_mem[task]
            mem[dst] += inst.task_mem[task]
            history.append((task, src, dst))
        spent += dcost
        y = _yield_of(inst, load)
        if y > best_y + _YIELD_EPS:
            best_y, best_len = y, len(history)
    for t, src, _ in reversed(history[best_len:]):
        hosts[t] = src
    return hosts


def _rule_ok(problem: AdaptProblem, hosts: np.ndarray, tasks: np.ndarray, dests: np.ndarray,
             leaving_from: np.ndarray | None = None) -> np.ndarray:
    """``ok[i, k]``: task ``tasks[i]`` may move to ``dests[k]`` (maintenance, pins, drain, and its spread job
    not there already, not counting the tasks in ``leaving_from[i, k]``: a swap's partner)."""
    inst = problem.instance
    ok = task_allowed(problem, tasks, dests)
    groups = spread_groups(inst)
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
               dests: np.ndarray, hosts: np.ndarray | None = None) -> tuple[int, int, int] | None:
    """The move of a task on ``b`` to one of ``dests`` that buys the most yield per byte: (task, host, bytes)."""
    inst = problem.instance
    y_b = inst.host_cpu[b] / load[b]
    a = inst.task_alpha[on][:, None]
    m = inst.task_mem[on][:, None]
    to_dest = problem.move_bytes(on[:, None], dests[None, :])  # what moving there costs, disks included
    at_b = problem.move_bytes(on, b)[:, None]  # what being on b costs now (refunded by leaving)
    cur = problem.current[on][:, None]
    running = cur >= 0
    dest = dests[None, :]
    dc = np.where(running & (cur != dest), to_dest, 0.0) - np.where(running & (cur != b), at_b, 0.0)
    with np.errstate(divide="ignore"):
        after_b = np.where(load[b] - a > 1e-12, inst.host_cpu[b] / (load[b] - a), np.inf)
    after_h = inst.host_cpu[dests][None, :] / (load[dests][None, :] + a)
    gain = np.minimum(np.minimum(after_b, after_h), 1.0) - y_b
    ok = ((mem[dests][None, :] + m <= inst.host_mem[dests][None, :] + MEMORY_TOLERANCE) & (dest != b)
          & (spent + dc <= problem.budget) & (gain > _YIELD_EPS))
    if inst.has_rules and hosts is not None and ok.any():
        ok &= _rule_ok(problem, hosts, on, dests)
    if not ok.any():
        return None
    free = ok & (dc <= 0)
    # Free moves (new arrivals, returns home) first: most gain, then the largest refund.
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(free, gain - 1e-15 * dc, -np.inf) if free.any() else np.where(ok, gain / dc, -np.inf)
    i, k = np.unravel_index(int(np.argmax(score)), score.shape)
    return int(on[i]), int(dests[k]), int(dc[i, k])


def _best_swap(problem: AdaptProblem, hosts: np.ndarray, load: np.ndarray, mem: np.ndarray, b: int,
               on: np.ndarray, others: np.ndarray, spent: int) -> tuple[int, int, int, int] | None:
    """The exchange of a task ``t`` on the bottleneck ``b`` with a smaller task ``u`` among ``others`` that buys the
    most yield per byte within the budget, as (t, u, u's host, change in bytes); None if none improves.

    Tried when no single move helps: typically memory is tight, and only an
    exchange keeps both hosts within memory.
    """
    inst = problem.instance
    if not len(others) or not len(on):
        return None
    hu = hosts[others][None, :]
    at, au = inst.task_alpha[on][:, None], inst.task_alpha[others][None, :]
    mt, mu = inst.task_mem[on][:, None], inst.task_mem[others][None, :]
    ct, cu = problem.current[on][:, None], problem.current[others][None, :]
    t_to_h, t_at_b = problem.move_bytes(on[:, None], hu), problem.move_bytes(on, b)[:, None]
    u_to_b, u_at_h = problem.move_bytes(others, b)[None, :], problem.move_bytes(others, hosts[others])[None, :]
    # Byte cost change: t goes b -> hu, u goes hu -> b (each relative to where it runs now).
    dc = (np.where((ct >= 0) & (ct != hu), t_to_h, 0.0) - np.where((ct >= 0) & (ct != b), t_at_b, 0.0)
          + np.where((cu >= 0) & (cu != b), u_to_b, 0.0) - np.where((cu >= 0) & (cu != hu), u_at_h, 0.0))
    y_b = inst.host_cpu[b] / load[b]
    new_b = load[b] - at + au
    new_h = load[hosts[others]][None, :] - au + at
    with np.errstate(divide="ignore"):
        gain = np.minimum(np.minimum(inst.host_cpu[b] / new_b, inst.host_cpu[hu] / new_h), 1.0) - y_b
    ok = ((au < at) & (gain > _YIELD_EPS) & (spent + dc <= problem.budget)
          & (mem[b] - mt + mu <= inst.host_mem[b] + MEMORY_TOLERANCE)
          & (mem[hosts[others]][None, :] - mu + mt <= inst.host_mem[hu] + MEMORY_TOLERANCE))
    if inst.has_rules and ok.any():
        ok &= _swap_rule_ok(problem, hosts, b, on, others)
    if not ok.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(ok, np.where(dc <= 0, np.inf, gain / dc), -np.inf)
    best = score.max()
    if np.isinf(best):  # free exchanges: the one with the most gain
        score = np.where(ok & (dc <= 0), gain, -np.inf)
    i, k = np.unravel_index(int(np.argmax(score)), score.shape)
    return int(on[i]), int(others[k]), int(hosts[others[k]]), int(dc[i, k])


def _swap_rule_ok(problem: AdaptProblem, hosts: np.ndarray, b: int, on: np.ndarray, others: np.ndarray) -> np.ndarray:
    """``ok[i, k]``: swapping ``on[i]`` (on ``b``) with ``others[k]`` keeps every rule."""
    inst = problem.instance
    groups = spread_groups(inst)
    ok = np.zeros((len(on), len(others)), dtype=bool)
    hu = hosts[others]
    back = task_allowed(problem, others, np.array([b]))[:, 0]  # each partner may come to b
    for i, t in enumerate(on):
        row = task_allowed(problem, np.array([t]), hu)[0] & back
        g = int(groups[t])
        if g >= 0:
            first = int(inst.job_first_task[g])
            mates = np.arange(first, first + inst.jobs[g].tasks)
            row &= ~np.isin(hu, hosts[mates[mates != t]])
        gu = groups[others]
        on_b = set(int(x) for x in groups[hosts == b] if x >= 0) - ({g} if g >= 0 else set())
        row &= ~((gu >= 0) & np.isin(gu, list(on_b)))
        ok[i] = row
    return ok


def _scratch_instance(problem: AdaptProblem) -> Instance:
    """The instance step 4 places from scratch: tasks running on a host in maintenance, not leaving, stay there.

    (From scratch a host in maintenance takes only pinned tasks; in the adaptation its own tasks may stay.)
    """
    inst = problem.instance
    if not inst.host_cordoned.any():
        return inst
    import dataclasses

    stay = problem.running & inst.host_cordoned[problem.current.clip(min=0)] & ~problem.leaving
    if not stay.any():
        return inst
    pins = np.where(stay & (inst.task_pinned < 0), problem.current, inst.task_pinned)
    return dataclasses.replace(inst, pinned=tuple(int(p) for p in pins))


def adapt_heuristic(problem: AdaptProblem, precision: float = 1e-4,
                    scratch: str = "mcb8") -> tuple[np.ndarray | None, dict[str, object]]:
    """Our heuristic for section 6.1 (see the module docstring); returns a placement or None, and details.

    ``scratch`` names the registry algorithm of step 4's from-scratch placement (``best`` for the anytime
    search, at its default budget).
    """
    problem = problem.cordoned()  # a drained host takes nothing new, as in maintenance
    inst = problem.instance
    evicted = _evict_overfull(problem)
    pool = np.concatenate((np.flatnonzero(~problem.running), evicted)).astype(np.int64)
    candidates: list[tuple[str, np.ndarray]] = []
    if int(problem.task_bytes[evicted].sum()) <= problem.budget:
        placed = pack_residual(inst, problem.current.clip(min=0), pool, precision)
        if placed is not None and move_cost(problem, placed) <= problem.budget:
            candidates.append(("incremental", improve(problem, placed)))
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
    return best, {"path": name}

