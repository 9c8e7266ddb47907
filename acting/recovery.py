"""The one sequence of each way a VM runs again: a failed host's recovery, and the restart of lost VMs.

`vcsched recover HOST`, `vcsched restart VM...`, the controller (its failed hosts and the lost VMs it finds each
interval) and the fault simulation (docs/faultsim.md) all run these functions, each in a unit of work it has
opened already (acting/unit_of_work.py): so the simulation exercises the sequence the product runs, not a copy.

A recovery (:func:`recover_host`), under the lock:

1. the host must still have failed, on the inventory read under the lock (else :class:`NotFailed`);
2. the plan, from the definitions store's records of its VMs (:func:`plan_host_recovery`: the one call of the core's
   :func:`vcsched.control.failover.plan_recovery`);
3. the plan validated whole against the live cluster, *then* the host fenced (the unit of work's irreversible
   action: a plan refused fences nothing), the fence marked in the store (its VMs not restarted then count as
   lost, vcsched/control/lost.py), then the creates;
4. in a dry run, only step 3's check: whether ``--apply`` would refuse (so the two always agree).

A restart (:func:`restart_lost`): the lost VMs (all of them, or those named), planned by
:func:`vcsched.control.failover.plan_restart` (:func:`plan_lost_restart`), validated whole and applied (a dry run:
validated only).

What differs between callers is passed in: the fence (the real agent, the controller's failover, the simulated
one), the inventory the plan is made on (the controller's carries its measured reservations), what is said as
it happens (``planned``: once planned, before anything changes — the CLI renders the plan, the controller says
the VMs stranded; ``on_step``: each step as it ends), and the result is returned for the caller to render.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from acting.definitions import StoreError
from acting.executor import PlanRefused
from vcsched.control.failover import Recovery, Restart, plan_recovery, plan_restart
from vcsched.control.lost import unseen_holders
from vcsched.errors import VcschedError
from vcsched.plans.claims import PlanMismatch

if TYPE_CHECKING:
    from acting.definitions import DefinitionStore
    from acting.executor import ApplyReport, StepResult
    from acting.fence import FenceResult
    from acting.unit_of_work import UnitOfWork
    from vcsched.control.lost import Lost
    from vcsched.formats.cluster import Cluster, ClusterHost
    from vcsched.inventory import Inventory
    from vcsched.plans.steps import CreateStep


class NotFailed(VcschedError):
    """The host to recover answers, or sleeps (vcsched's power saving put it off, empty: docs/power.md): it has not
    failed, and nothing is planned nor done (exit 1).  ``asleep`` says which."""

    exit_code = 1

    def __init__(self, message: str, *, asleep: bool) -> None:
        super().__init__(message)
        self.asleep = asleep


@dataclass(frozen=True)
class RecoveryRun:
    """What a recovery of ``host`` did.  ``records``: the definitions it was planned from; ``fence``: what the fence
    agent said (None: not fenced here — a dry run, a plan refused or with nothing to do, or a host the caller
    fenced earlier in this failure); ``refused``: why the plan does not hold on the live cluster (nothing
    restarted; a dry run: ``--apply`` would refuse); ``report``: the apply's (None: not applied — a dry run, no
    plan, refused, or the fence failed)."""

    host: str
    records: tuple[CreateStep, ...]
    recovery: Recovery
    fence: FenceResult | None = None
    refused: PlanRefused | PlanMismatch | None = None
    report: ApplyReport | None = None


@dataclass(frozen=True)
class RestartRun:
    """What a restart of lost VMs did.  ``records``: the lost VMs' records it planned; ``not_lost``: ``(vm, why)``
    for VMs named that are not lost (running, or awaiting their host's recovery); ``refused``: why ``--apply`` would
    refuse the plan (dry runs only: an apply refused raises, nothing having changed); ``report``: the apply's."""

    records: tuple[CreateStep, ...]
    restart: Restart
    not_lost: tuple[tuple[str, str], ...] = ()
    refused: PlanRefused | PlanMismatch | None = None
    report: ApplyReport | None = None

    @property
    def not_restarted(self) -> tuple[tuple[str, str], ...]:
        """``(vm, why)`` for every VM that is not restarted: not lost, or refused by the plan (no room, a disk)."""
        return (*self.not_lost, *self.restart.refused)


def _nothing(*_: object) -> None:
    return None


# ------------------------------------------------------------------ a failed host's recovery


def plan_host_recovery(cluster: Cluster, store: DefinitionStore, inventory: Inventory, host: str, *,
                       waited_on: bool) -> RecoveryRun:
    """The recovery of ``host`` planned on ``inventory`` from the store's records (nothing done): the one call of
    :func:`vcsched.control.failover.plan_recovery` (``waited_on`` is its).  Raises :class:`NotFailed` when
    ``host`` answers or sleeps."""
    state = inventory.host(host)
    if state.down is None:
        raise NotFailed(f"host {host} answers: it has not failed", asleep=False)
    if state.asleep:  # powered off by vcsched, empty: not a failure (docs/power.md)
        raise NotFailed(f"host {host} is asleep (vcsched power saving put it to sleep, empty): it has not failed",
                        asleep=True)
    records = tuple(store.to_recover(host, inventory))
    return RecoveryRun(host, records, plan_recovery(cluster, inventory, host, records, waited_on=waited_on,
                                                    fenced=store.fenced()))


def recover_host(uow: UnitOfWork, cluster: Cluster, store: DefinitionStore, inventory: Inventory, host: str, *,
                 fence: Callable[[ClusterHost], FenceResult], already_fenced: bool = False,
                 planned: Callable[[RecoveryRun], None] = _nothing,
                 on_step: Callable[[StepResult], None] | None = None,
                 unmarked: Callable[[StoreError], None] | None = None, threads: bool | None = None) -> RecoveryRun:
    """Recover failed ``host`` through ``uow`` (open; a dry run only checks), planned on ``inventory`` (read through
    ``uow``, under its lock): the module's sequence.  ``fence`` runs the host's fence agent, only once the plan is
    validated whole; ``already_fenced``: the caller fenced it earlier in this same failure (the controller, once per
    failure): not fenced nor marked again.  ``planned`` is called once the recovery is planned, before anything
    changes; ``on_step`` as each step ends; ``unmarked`` when the store cannot record the fence (default: a note of
    the unit of work; the recovery goes on, the host is off either way); ``threads`` as the executor's (None: the
    unit of work's, :class:`acting.unit_of_work.UnitOfWork`).

    Raises :class:`NotFailed` (nothing planned), and what the unit of work raises; a plan that does not hold on
    the live cluster is returned as ``refused``, with whether the host was fenced before (``fence``)."""
    run = plan_host_recovery(cluster, store, inventory, host, waited_on=uow.waits_for(host))
    planned(run)
    plan = run.recovery.plan
    if plan is None:
        return run
    if uow.dry_run:  # as --apply checks before fencing
        return replace(run, refused=uow.would_refuse(plan))
    said: list[FenceResult] = []

    def fence_it() -> bool:
        if already_fenced:
            return True
        said.append(fence(cluster.host(host)))
        if said[0].fenced:
            try:  # its VMs not restarted now count as lost (vcsched/control/lost.py)
                store.mark_fenced(host)
            except StoreError as exc:
                (unmarked or _unmarked(uow))(exc)
        return said[0].fenced

    try:  # checked whole on the live cluster before the host is fenced (acting/unit_of_work.py)
        report = uow.apply(plan, planned_here=True, irreversible=fence_it, on_step=on_step, threads=threads)
    except (PlanRefused, PlanMismatch) as exc:
        return replace(run, fence=said[0] if said else None, refused=exc)
    return replace(run, fence=said[0] if said else None, report=report)


def _unmarked(uow: UnitOfWork) -> Callable[[StoreError], None]:
    def note(exc: StoreError) -> None:
        uow.reporting.note(f"{exc}: its stranded VMs will not be listed as lost")
    return note


# ------------------------------------------------------------------ lost VMs


def plan_lost_restart(cluster: Cluster, store: DefinitionStore, inventory: Inventory,
                      records: Sequence[CreateStep] | None = None, *, lost: Sequence[Lost] | None = None,
                      below_floor_ok: bool | None = None) -> RestartRun:
    """The restart of lost VMs planned on ``inventory`` (nothing done): every lost VM's record (``records`` None),
    or those of ``records`` that are lost (the others in ``not_lost``, with why).  ``lost``: the store's lost VMs
    on ``inventory`` when the caller read them already (the controller, which says each).  ``below_floor_ok`` as
    :func:`vcsched.control.failover.plan_restart`'s (None: the cluster file's ``on_failure``)."""
    lost = store.lost(inventory) if lost is None else lost
    not_lost: list[tuple[str, str]] = []
    if records is None:
        chosen = [d.step for d in (store.get(x.vm) for x in lost) if d is not None]
    else:
        lost_names = {x.vm for x in lost}
        where = {v.name: v.host for v in inventory.vms}
        chosen = []
        holders: tuple[str, ...] | None = None  # read once, for the first VM that awaits a host
        for r in records:
            if r.vm in lost_names:
                chosen.append(r)
            elif r.vm in where:
                not_lost.append((r.vm, f"it is on {where[r.vm]} (not lost)"))
            else:
                holders = unseen_holders(inventory, store.fenced()) if holders is None else holders
                not_lost.append((r.vm, _awaiting_why(r, holders)))
    return RestartRun(tuple(chosen), plan_restart(cluster, inventory, chosen, below_floor_ok=below_floor_ok),
                      tuple(not_lost))


def _awaiting_why(record: CreateStep, holders: tuple[str, ...]) -> str:
    """Why a recorded VM that runs on no answering host is not lost (vcsched/control/lost.py): its own host, or
    another host, does not answer and was not fenced (``holders``), so it may still run there."""
    if record.host in holders or not holders:
        return (f"its host {record.host} does not answer and was not fenced: it may still run there "
                f"(`vcsched recover {record.host}` fences the host and restarts its VMs)")
    return (f"host(s) {', '.join(holders)} do not answer and were not fenced: it may run there (a migration cut "
            f"after its switch-over, not recorded); `vcsched recover {holders[0]}` fences it, then it is lost")


def restart_lost(uow: UnitOfWork, cluster: Cluster, store: DefinitionStore, inventory: Inventory,
                 records: Sequence[CreateStep] | None = None, *, below_floor_ok: bool | None = None,
                 planned: Callable[[RestartRun], None] = _nothing,
                 on_step: Callable[[StepResult], None] | None = None, threads: bool | None = None) -> RestartRun:
    """Restart lost VMs through ``uow`` (open; a dry run only checks), planned on ``inventory`` (read through
    ``uow``, under its lock) by :func:`plan_lost_restart` (``records``, ``below_floor_ok``: its).  ``planned``,
    ``on_step`` and ``threads`` as :func:`recover_host`'s.  Raises what the unit of work raises (an apply refused
    changed nothing); a dry run returns why ``--apply`` would refuse as ``refused``."""
    run = plan_lost_restart(cluster, store, inventory, records, below_floor_ok=below_floor_ok)
    planned(run)
    plan = run.restart.plan
    if plan is None:
        return run
    if uow.dry_run:  # the dry run exits as --apply would (docs/cli.md)
        return replace(run, refused=uow.would_refuse(plan))
    report = uow.apply(plan, planned_here=True, on_step=on_step, threads=threads)
    assert report is not None  # no irreversible action: always a report
    return replace(run, report=report)
