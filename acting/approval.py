"""Approving a recommendation: the operator's half of `vcsched run --mode recommend` (docs/recommendations.md).

One use case, one function (Cosmic Python's service layer): :func:`approve` takes an open unit of work (the lock
held, in-doubt VMs settled) and the recommendations book, and runs the whole sequence — resolve the id, check the
floors with the controller's current estimates, mark it approved, re-validate and apply its plan through the unit
of work (or carry out a power proposal), settle the book.  `vcsched approve` calls it and renders the result; the
fault simulation (faultsim/simulation.py, the ``approve`` schedules) calls the same function under faults, so the
sequence an operator runs is the one the simulation checks.

A recommendation was decided on an inventory read when it was made; the cluster may have changed since.  Its plan
is therefore validated whole against the live inventory, under the lock, before its first step (the snapshot, the
plan replayed, its claims: :meth:`acting.unit_of_work.UnitOfWork.apply`), and one that no longer holds is settled
**stale** and refused, nothing changed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from hypervisor import hazards
from vcsched.control import recommend as rc

if TYPE_CHECKING:
    from acting.executor import ApplyReport
    from acting.power import Agent, PowerStore, SleepResult, WakeResult
    from acting.unit_of_work import UnitOfWork
    from vcsched.formats.cluster import Cluster
    from vcsched.inventory import Inventory
    from vcsched.plans.plan import Plan

T = TypeVar("T")


class Book(Protocol):
    """What approving needs of a :class:`acting.recommendations.RecommendationStore` (the simulation keeps one in
    memory)."""

    def read(self) -> rc.Book: ...

    def update(self, change: Callable[[rc.Book], tuple[rc.Book, T]]) -> T: ...


@dataclass(frozen=True)
class Approval:
    """What an approval did: the recommendation as settled in the book (applied or failed), the note when the id
    given was superseded by the same proposal made again (the one acted on), and the apply report of its plan or
    the result of its sleep or wake."""

    recommendation: rc.Recommendation
    note: str | None
    report: ApplyReport | None = None
    power: SleepResult | WakeResult | None = None

    @property
    def ok(self) -> bool:
        if self.power is not None:
            return _carried_out(self.power)
        return self.report is not None and self.report.ok


def _nothing(_: str) -> None:
    return None


def approve(uow: UnitOfWork, cluster: Cluster, store: Book, rec_id: str, *, member: str,
            clock: Callable[[], float] = time.time, note: Callable[[str], None] = _nothing,
            apply: Callable[[Plan], ApplyReport] | None = None, threads: bool | None = None,
            power: Callable[[], PowerStore] | None = None, agent: Agent | None = None,
            carrying_out: Callable[[str], AbstractContextManager[object]] | None = None) -> Approval:
    """Approve recommendation ``rec_id`` of ``store`` and carry it out through ``uow`` (open, its lock held).

    Refuses (:class:`vcsched.control.recommend.Refused`, exit 1, nothing changed) a recommendation already decided,
    past its validity, superseded by a different proposal, one that would put a VM it touches below its floor
    with the current needs, or — settled **stale** in the book — one whose plan no longer holds on the live
    inventory.  Anything else that stops it before it is applied (a host down, the lock lost, Ctrl-C) settles it
    **failed** and is raised again.

    ``member``: who approves (in the book); ``clock``: the time validity and the needs' freshness are judged at;
    ``note``: said at once when ``rec_id`` was superseded by the same proposal (before a refusal, too);
    ``apply``: how the plan goes through ``uow`` (the CLI: with its progress bar; default
    ``uow.apply(plan, threads=threads)``; ``threads`` None: the unit of work's); ``power``: the cluster's power
    record, read only for a sleep or a wake
    (with ``agent``, default the cluster file's agents); ``carrying_out``: a context around a sleep or a wake
    (the CLI's spinner), given its description."""
    book = store.read()
    target, said = rc.resolve(book, rec_id, clock())
    if said is not None:
        note(said)
    inventory = uow.inventory()  # read once, under the lock: the floors, and a power proposal's needs
    check_floors(cluster, inventory, book, target, clock())
    rec = store.update(lambda book: rc.approve(book, rec_id, clock(), member))
    rec_id = rec.id  # the same proposal made again, when rec_id was superseded by it
    from acting.power_saving import power_target

    if power_target(rec.plan) is not None:
        return _approve_power(uow, cluster, store, rec, said, inventory, clock, power, agent, carrying_out)
    from vcsched.plans.plan import plan_from_dict

    with settled_if_not_applied(store, rec_id):
        plan = plan_from_dict(dict(rec.plan))
        if hazards.on(hazards.APPROVE_UNVALIDATED):  # the mutation switch (tests/test_faultsim_approve.py)
            report: ApplyReport | None = _unvalidated(uow, plan, threads)
        else:
            report = apply(plan) if apply is not None else uow.apply(plan, threads=threads)
        assert report is not None  # no irreversible action: always a report
    bad = report.failed()
    detail = "applied" if report.ok else (report.stopped or (bad.detail if bad is not None else "failed"))
    done = store.update(lambda book: rc.settle(book, rec_id, rc.APPLIED if report.ok else rc.FAILED, detail))
    return Approval(done, said, report=report)


def check_floors(cluster: Cluster, inventory: Inventory, book: rc.Book, rec: rc.Recommendation, now: float) -> None:
    """Refuse ``rec`` if a VM it touches would end below its floor with the current needs
    (:func:`vcsched.control.recommend.check_floors`); the floor: the VM's own, at least the cluster file's."""
    from vcsched.plans.plan import plan_from_dict

    try:
        plan = plan_from_dict({k: v for k, v in rec.plan.items() if k != "power"})  # a sleep: its evacuation
    except Exception:
        return  # not a plan any more: applying it says why (stale)
    touched = {s.vm for s in plan.steps}
    caps = {vm: p.cap_cores for vm, p in plan.per_vm.items() if vm in touched}
    declared, floors = {}, {}
    for v in inventory.managed():
        if v.meta is not None:
            declared[v.name] = v.meta.cpu_need_cores
            floors[v.name] = max(v.meta.min_yield or 0.0, cluster.min_yield)
    needs, source = rc.current_needs(book, declared, now)
    rc.check_floors(rec, caps, needs, floors, source)


@contextlib.contextmanager
def settled_if_not_applied(store: Book, rec_id: str) -> Iterator[None]:
    """An approved recommendation that is not carried out is settled in the book: **stale** when it no longer holds
    on the live inventory (the snapshot, the plan replayed, its claims; a power proposal's host) — refused, exit 1,
    nothing changed — and **failed** on anything else (a host down, the lock lost, Ctrl-C), re-raised."""
    from acting.power_saving import Stale
    from vcsched.errors import InputError
    from vcsched.plans.claims import PlanMismatch

    try:
        yield
    except (InputError, PlanMismatch, Stale) as exc:
        why = f"the cluster changed since it was made: {exc}"
        store.update(lambda book: rc.settle(book, rec_id, rc.STALE, why))
        raise rc.Refused(f"recommendation {rec_id} is stale: {why}") from None
    except BaseException as exc:
        failed = f"not applied: {exc or type(exc).__name__}"
        store.update(lambda book: rc.settle(book, rec_id, rc.FAILED, failed))
        raise


def _approve_power(uow: UnitOfWork, cluster: Cluster, store: Book, rec: rc.Recommendation, said: str | None,
                   inventory: Inventory, clock: Callable[[], float], power: Callable[[], PowerStore] | None,
                   agent: Agent | None,
                   carrying_out: Callable[[str], AbstractContextManager[object]] | None) -> Approval:
    """Carry out an approved sleep or wake (acting/power_saving.py), re-validated on the live inventory under the
    lock held by ``uow``: stale (nothing changed) when the host may no longer sleep, no longer sleeps, or its
    evacuation no longer holds; otherwise through the same sleep_host / wake_host as `vcsched run`."""
    from acting.power import agents
    from acting.power_saving import carry_out

    if power is None:
        raise rc.Refused(f"recommendation {rec.id} is a {rec.kind}: no power record to carry it out with")
    declared = {v.name: v.meta.cpu_need_cores for v in inventory.managed() if v.meta is not None}
    needs, _ = rc.current_needs(store.read(), declared, clock())
    record = power()
    what = f"{rec.kind} {rec.plan['power']['host']} ..."
    with settled_if_not_applied(store, rec.id), (carrying_out or _silent)(what):
        result = carry_out(uow, cluster, rec.plan, store=record, agent=agent or agents(cluster), needs=needs)
    ok = _carried_out(result)
    done = store.update(lambda book: rc.settle(book, rec.id, rc.APPLIED if ok else rc.FAILED, result.reason))
    return Approval(done, said, power=result)


def _carried_out(result: SleepResult | WakeResult) -> bool:
    """Whether a sleep slept, or a wake woke."""
    return bool(getattr(result, "slept", False) or getattr(result, "woke", False))


def _silent(_: str) -> AbstractContextManager[object]:
    return nullcontext()


def _unvalidated(uow: UnitOfWork, plan: Plan, threads: bool | None) -> ApplyReport:
    """The hazard :data:`hypervisor.hazards.APPROVE_UNVALIDATED`: the plan applied step by step on the inventory read
    now, without the whole-plan check (its snapshot, the plan replayed, its claims): a stale recommendation is
    applied as if it still held."""
    from acting.executor import apply_plan

    return apply_plan(uow.hv, plan, guard=uow.guard, threads=uow.threads if threads is None else threads,
                      checked=(uow.hv.inventory(), True))
