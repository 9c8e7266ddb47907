"""A plan's claims, recomputed from the live inventory before its first step.

A plan file is user input: it may have been edited by hand, carelessly or
not.  The replay (:mod:`vcsched.plans.check`) makes sure a plan is *safe* —
no host over-committed at any step — but a plan also *states* quantities that
vcsched can compute itself, and an operator reads and budgets by them.  A
plan that says a migration moves 1 byte must not move 128 MiB under a 2-byte
budget and report "1 B moved".  So every quantity vcsched can compute is
computed again here, from the inventory as it is now, and a plan whose claim
differs is refused whole (:class:`PlanMismatch`, exit 1), naming the step,
the claimed and the real value:

* **bytes per migration** (``migrate.bytes``): the VM's memory, plus its
  disks' bytes when source and destination do not share storage (the hosts'
  ``storage`` groups, as :mod:`vcsched.control.live` costs a move); the plan's
  ``migrated_bytes`` is their sum, and it must be within the plan's
  ``budget`` — the budget is enforced on the real bytes, not on the claim;
* **caps**: every cap a step sets or predicts is a point of the VM's quota
  grid (:mod:`vcsched.caps`: what the hypervisor holds and reads back), so the
  VM gets exactly the cap the plan names;
* **waves**: migrations are numbered in waves 1, 2, ... in plan order
  (:func:`vcsched.plans.migration.order_changes`), so a wave is what was
  planned to fit in memory together (the replay checks memory per host per
  wave);
* **predictions** (``predicted.per_vm``): each VM's host, virtual cluster,
  CPU need and cap are where the plan's steps leave it (the need: the one the
  plan was computed with, when it says ``"needs": "measured"``: the
  controller plans on measured needs it does not record); its yield is the one
  its cap realises (cap = yield × need, rounded down on the quota grid,
  ``need`` at most the reference host's cores as in the model); its disk and
  network bytes/s are yield × its recorded need, rounded down, and a step
  capping them caps them at exactly that; ``min_yield`` is the least of the
  VMs' yields and ``avg_yield`` the mean over jobs (a virtual cluster's VMs of
  one need and size, docs/model.md); a created VM's floor (``min_yield``) is
  met by its own predicted yield — except for the VMs a recovery plan lists
  as restarted below their floors (:data:`vcsched.plans.plan.BELOW_FLOOR`).

What cannot be computed — the request's own numbers a ``create`` step
carries (vCPUs, memory, need, weight) — is applied exactly as written, after
the same range checks a request gets (:mod:`vcsched.formats.units`).

Pure: the plan and the inventory in, the problems out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from vcsched.caps import CAP_TOLERANCE, grid_problem, grid_step, off_grid, realisable_cap, same_cap
from vcsched.errors import VcschedError
from vcsched.formats.units import format_size
from vcsched.inventory import HostState, Inventory, VmState
from vcsched.plans.plan import BELOW_FLOOR, MEASURED, Plan
from vcsched.plans.steps import AdoptStep, CreateStep, MigrateStep, ReleaseStep, RemoveStep, SetCapStep, SetNeedStep

#: Yields and needs read back from JSON are the floats written: only rounding of arithmetic is tolerated.
YIELD_TOLERANCE = 1e-9
MAX_SHOWN = 5


class PlanMismatch(VcschedError):
    """A plan's claim differs from what vcsched computes from the live cluster (exit 1: nothing changed)."""

    exit_code = 1


@dataclass
class _After:
    """A VM as the plan leaves it."""

    host: str
    cluster: str | None
    vcpus: int
    need: float | None
    cap: float | None
    io_needs: dict[str, int] = field(default_factory=dict)


def move_bytes(vm: VmState, source: HostState, target: HostState) -> int:
    """What one migration of ``vm`` from ``source`` to ``target`` copies: its memory, plus its disks when the two
    hosts do not share storage (hosts of an unknown ``storage`` are taken to share it, as a plan computed without
    the cluster file costs a move: memory only)."""
    return vm.memory_bytes + (0 if source.storage == target.storage else vm.disk_bytes)


def claim_problems(plan: Plan, inventory: Inventory) -> list[str]:
    """Every claim of ``plan`` that differs from what ``inventory`` gives (see the module docstring)."""
    problems: list[str] = []
    hosts = {h.name: h for h in inventory.hosts}
    vms = {v.name: v for v in inventory.vms if v.active}
    problems += _bytes_problems(plan, hosts, vms)
    problems += _wave_problems(plan)
    after = _after(plan, vms, problems)
    problems += _prediction_problems(plan, inventory, after)
    return problems


def check_claims(plan: Plan, inventory: Inventory) -> None:
    """Raise :class:`PlanMismatch` naming the first problems of :func:`claim_problems`, if any."""
    problems = claim_problems(plan, inventory)
    if problems:
        more = f" (+{len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
        raise PlanMismatch("the plan does not match the cluster, nothing changed: " + "; ".join(problems[:MAX_SHOWN])
                           + more)


def _bytes_problems(plan: Plan, hosts: Mapping[str, HostState], vms: Mapping[str, VmState]) -> list[str]:
    """Each migration's bytes, their sum and the budget, on the VMs as they are now.

    A migration the cluster shows done already (a re-run: the VM is on its
    destination, or past it on a relay) moves nothing now; its claim is kept.
    """
    problems: list[str] = []
    at = {name: v.host for name, v in vms.items()}
    total = 0
    for i, s in enumerate(plan.steps):
        if not isinstance(s, MigrateStep):
            continue
        v = vms.get(s.vm)
        where = at.get(s.vm)
        done = where == s.target or (s.final is not None and where == s.final)
        if v is None or done or where != s.source or s.source not in hosts or s.target not in hosts:
            total += s.bytes  # already moved, or a problem the replay names (unknown VM, host, position)
            at[s.vm] = s.target
            continue
        real = move_bytes(v, hosts[s.source], hosts[s.target])
        at[s.vm] = s.target
        total += real
        if s.bytes != real:
            disks = v.disk_bytes if hosts[s.source].storage != hosts[s.target].storage else 0
            what = (f"its memory {v.memory_bytes} + its disks {disks} (other storage)" if disks
                    else f"its memory, {format_size(v.memory_bytes)}")
            problems.append(f"plan.steps[{i}].bytes: migrate {s.vm} {s.source}->{s.target} claims {s.bytes} bytes, "
                            f"it moves {real} ({what})")
    if "budget" in plan.extra:
        budget = int(plan.extra["budget"])
        claimed = int(plan.extra.get("migrated_bytes", 0))
        if claimed != total and not problems:
            problems.append(f"plan.migrated_bytes: claims {claimed} bytes, its migrations move {total}")
        if total > budget:
            problems.append(f"plan.budget: its migrations move {total} bytes, above the plan's budget of {budget}")
    return problems


def _wave_problems(plan: Plan) -> list[str]:
    """Waves numbered 1, 2, ... in plan order, each once: what the ordering writes."""
    last: int | None = None
    for i, s in enumerate(plan.steps):
        if not isinstance(s, MigrateStep) or s.wave is None:
            continue
        expected = (1,) if last is None else (last, last + 1)
        if s.wave not in expected:
            return [f"plan.steps[{i}].wave: {s.wave}, but the migrations before it end with wave "
                    f"{last if last is not None else '(none)'}: waves are numbered 1, 2, ... in plan order"]
        last = s.wave
    return []


def _after(plan: Plan, vms: Mapping[str, VmState], problems: list[str]) -> dict[str, _After]:
    """Every managed VM as the plan's steps leave it; off-grid caps are problems."""
    out = {name: _After(v.host, v.cluster, v.vcpus, v.meta.cpu_need_cores, v.cap_cores,
                        dict(v.meta.io_needs()))
           for name, v in vms.items() if v.meta is not None}

    def grid(i: int, field: str, cap: float, vcpus: int, vm: str) -> None:
        off = grid_problem(f"plan.steps[{i}].{field} (VM {vm!r})", cap, vcpus)
        if off is not None:
            problems.append(off)

    for i, s in enumerate(plan.steps):
        now = out.get(s.vm)
        if isinstance(s, CreateStep):
            grid(i, "cap_cores", s.cap_cores, s.vcpus, s.vm)
            if s.cpu_need_cores > s.vcpus + CAP_TOLERANCE:
                problems.append(f"plan.steps[{i}].cpu_need_cores: {s.cpu_need_cores:g} cores is more than the "
                                f"VM's {s.vcpus} vCPUs can use")
            io = {r: v for r, v in (("disk", s.disk_bps), ("net", s.net_bps)) if v is not None}
            out[s.vm] = _After(s.host, s.cluster, s.vcpus, s.cpu_need_cores, s.cap_cores, io)
        elif isinstance(s, AdoptStep):  # an unmanaged domain becomes managed where it runs
            d = s.definition
            grid(i, "definition.cap_cores", d.cap_cores, d.vcpus, s.vm)
            io = {r: v for r, v in (("disk", d.disk_bps), ("net", d.net_bps)) if v is not None}
            out[s.vm] = _After(d.host, d.cluster, d.vcpus, d.cpu_need_cores, d.cap_cores, io)
        elif now is None:
            continue  # a VM the replay will name (unknown, unmanaged, or removed earlier)
        elif isinstance(s, ReleaseStep):
            del out[s.vm]
        elif isinstance(s, SetCapStep):
            if s.cap_cores is not None:
                grid(i, "cap_cores", s.cap_cores, now.vcpus, s.vm)
                now.cap = s.cap_cores
        elif isinstance(s, MigrateStep):
            grid(i, "cap_cores", s.cap_cores, now.vcpus, s.vm)
            now.host, now.cap = s.target, s.cap_cores
        elif isinstance(s, SetNeedStep):
            now.need = s.cpu_need_cores
        elif isinstance(s, RemoveStep):
            del out[s.vm]
    return out


def _prediction_problems(plan: Plan, inventory: Inventory, after: Mapping[str, _After]) -> list[str]:
    """``predicted``: each VM's host, cluster, need, cap, yield and I/O where the steps leave it; min and mean."""
    problems: list[str] = []
    up = [h for h in inventory.hosts if h.down is None]
    n_ref = max((h.cores for h in up), default=0)
    memory = {v.name: v.memory_bytes for v in inventory.vms}
    memory.update({s.vm: s.memory_bytes for s in plan.steps if isinstance(s, CreateStep)})
    io_caps: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)  # vm -> resource -> (step, bytes/s)
    floors: dict[str, tuple[int, float]] = {}
    # A recovery under on_failure = "restart" says which VMs it runs below their floors; no other plan may.
    below_ok = frozenset(plan.extra.get(BELOW_FLOOR, ())) if plan.kind == "recover" else frozenset()
    for i, s in enumerate(plan.steps):
        if isinstance(s, CreateStep | SetCapStep):
            for r, amount in (("disk", s.disk_bytes_sec), ("net", s.net_bytes_sec)):
                if amount is not None:
                    io_caps[s.vm][r] = (i, amount)
        if isinstance(s, CreateStep) and s.min_yield is not None:
            floors[s.vm] = (i, s.min_yield)
    jobs: dict[tuple[str, float, int], float] = {}
    for name, p in sorted(plan.per_vm.items()):
        w = f"plan.predicted.per_vm.{name}"
        a = after.get(name)
        if a is None:
            problems.append(f"{w}: VM {name!r} is not a managed VM of the cluster once the plan is applied")
            continue
        if p.host != a.host:
            problems.append(f"{w}.host: claims {p.host}, the plan leaves {name} on {a.host}")
        if p.cluster != a.cluster:
            problems.append(f"{w}.cluster: claims {p.cluster!r}, {name} belongs to {a.cluster!r}")
        if a.need is None or abs(p.cpu_need_cores - a.need) > YIELD_TOLERANCE:
            if plan.extra.get("needs") != MEASURED:
                problems.append(f"{w}.cpu_need_cores: claims {p.cpu_need_cores!r}, {name}'s need once the plan "
                                f"is applied is {a.need!r}")
                continue
            a.need = p.cpu_need_cores  # planned on a measured need it does not record: the yield is of that one
        if off_grid(p.cap_cores, a.vcpus):
            problems.append(f"{w}.cap_cores: {p.cap_cores!r} cores is not a cap a {a.vcpus}-vCPU VM can hold "
                            f"(it would hold {realisable_cap(p.cap_cores, a.vcpus)!r})")
        elif a.cap is None or not same_cap(p.cap_cores, a.cap, a.vcpus):
            problems.append(f"{w}.cap_cores: claims {p.cap_cores!r}, the plan leaves {name} at "
                            f"{'no cap' if a.cap is None else repr(a.cap)}")
        effective = min(a.need, float(n_ref)) if n_ref else a.need
        given = p.yield_ * effective
        if not (-YIELD_TOLERANCE <= p.yield_ <= 1 + YIELD_TOLERANCE) or not (
                p.cap_cores - YIELD_TOLERANCE <= given < p.cap_cores + grid_step(a.vcpus) + YIELD_TOLERANCE):
            problems.append(f"{w}.yield: claims {p.yield_!r}, but a cap of {p.cap_cores!r} cores on a need of "
                            f"{effective:g} is a yield of {p.cap_cores / effective if effective else 0:.6f} "
                            f"(cap = yield x need, rounded down to the quota grid)")
        predicted_io = dict(p.io_bytes_sec)
        for r, amount in sorted(predicted_io.items()):
            need = a.io_needs.get(r)
            real = None if need is None else math.floor(p.yield_ * need)
            if real != amount:
                problems.append(f"{w}.{r}_bytes_sec: claims {amount}, "
                                + (f"{name} needs no {r}" if need is None else
                                   f"yield {p.yield_!r} x its need of {need} B/s is {real}"))
        for r, (i, amount) in sorted(io_caps.get(name, {}).items()):
            if r in predicted_io and predicted_io[r] != amount:
                problems.append(f"plan.steps[{i}].{r}_bytes_sec: caps {name} at {amount} B/s, the plan predicts "
                                f"{predicted_io[r]}")
        if name in floors and p.yield_ < floors[name][1] - YIELD_TOLERANCE and name not in below_ok:
            i, floor = floors[name]
            problems.append(f"plan.steps[{i}].min_yield: {floor!r}, but the plan predicts {name} a yield of "
                            f"{p.yield_!r}, below it")
        key = (str(a.cluster), round(a.need, 9), memory.get(name, 0))
        if key in jobs and abs(jobs[key] - p.yield_) > YIELD_TOLERANCE:
            problems.append(f"{w}.yield: claims {p.yield_!r}, another VM of virtual cluster {a.cluster!r} with the "
                            f"same need and memory is predicted {jobs[key]!r} (a job's VMs share one yield)")
        jobs.setdefault(key, p.yield_)
    problems += _summary_problems(plan, jobs)
    return problems


def _summary_problems(plan: Plan, jobs: Mapping[tuple[str, float, int], float]) -> list[str]:
    """``min_yield`` the least predicted yield, ``avg_yield`` the mean over jobs.  A plan that predicts no VM (the
    controller's cap plans) has nothing to summarise, and its two numbers are not read."""
    if not plan.per_vm:
        return []
    out = []
    least = min(p.yield_ for p in plan.per_vm.values())
    if abs(plan.min_yield - least) > YIELD_TOLERANCE:
        out.append(f"plan.predicted.min_yield: claims {plan.min_yield!r}, the least predicted yield is {least!r}")
    if jobs:
        mean = sum(jobs.values()) / len(jobs)
        if abs(plan.avg_yield - mean) > YIELD_TOLERANCE:
            out.append(f"plan.predicted.avg_yield: claims {plan.avg_yield!r}, the mean predicted yield over its "
                       f"{len(jobs)} jobs is {mean!r}")
    return out

