"""Apply a plan to a cluster: check the snapshot, then each step's pre-condition, action, post-condition.

Shaped after OpenStack Watcher's actions (pre-condition / execute /
post-condition), but without whole-plan rollback, which Watcher's own notes
admit does not work.  Instead every step is idempotent:

* **pre**: look at the live state; if the step's effect is already there
  (the VM exists on its host with the planned cap) the step is *skipped*;
* **act**: make the change;
* **post**: read the result back through the hypervisor (the cap exactly the
  grid point the host realises for the planned one, :mod:`vcsched.caps`;
  each disk and network cap the step names exactly what the host holds for
  it, :mod:`vcsched.iocaps`) — a step is *done* only when verified.

Before the first step the whole plan is replayed on the live inventory
(:mod:`vcsched.plans.check`): a plan that names an unknown or down host, a
cap beyond a VM or a host, or that would over-commit any host at any point,
is refused whole and nothing changes.  Right before each step (each wave of
migrations) the hosts it touches are read again and the same replay is its
pre-condition, so a change someone else made meanwhile stops the plan
instead of over-committing a host.  Then the plan's claims are recomputed
(:mod:`vcsched.plans.claims`: bytes per migration, caps on the quota grid,
waves, predictions; a false one is refused, exit 1), and every VM it creates
is checked to be creatable (:meth:`hypervisor.base.Hypervisor.create_problems`:
boot files, domain XML validated by libvirt).

The migrations of one wave run at once (threads; libvirt connections are
thread-safe), as many at a time as the cluster's migration throttles allow
(:mod:`vcsched.plans.throttle`: in flight in the cluster and per host; the
next starts when one ends), everything else one step at a time.  The first failure stops
the plan (after the rest of its wave); no VM is stopped (a running VM with
its old cap is always a safe state, because the plan is ordered so that caps
never overrun a host at any prefix, see :mod:`vcsched.plans.ordering`), and
the one thing undone is what a stopped plan's creates leave pointless: the
caps it lowered to make room for VMs it did not create
(:func:`restore_lowered`).  Re-running the same plan skips what is done and
continues where it stopped, so it converges.

A VM in doubt (copies on several hosts, or a paused arrival: an interrupted
migration) is never acted on: the hypervisor's lookup refuses it naming its
copies (:class:`hypervisor.base.VmInDoubt`), so its step fails with that
reason and the plan stops; ``vcsched repair`` settles it under the lock.

Each step kind has a :class:`StepRunner` in :data:`RUNNERS`, a literal
table by ``op`` like the plan's own (:data:`vcsched.plans.steps.STEP_PARSERS`).
A ``remove`` (a departed virtual cluster's VM) is the one step that stops a
VM, and it only ever stops one whose metadata names the departed cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from hypervisor import hazards
from hypervisor.base import HostReadBug, Hypervisor, HypervisorError, VmInDoubt
from vcsched.errors import InputError, VcschedError
from vcsched.inventory import Inventory, VmState, snapshot_hash
from vcsched.iocaps import IoCaps, VmDevices
from vcsched.plans.check import batches, check_plan, replay_problems
from vcsched.plans.claims import check_claims
from vcsched.plans.plan import Plan
from vcsched.plans.steps import (
    AdoptStep,
    CreateStep,
    MigrateStep,
    ReleaseStep,
    RemoveStep,
    SetCapStep,
    SetNeedStep,
    Step,
)
from vcsched.plans.throttle import admit
from vcsched.units import CAP_TOLERANCE

#: A read-back cap equals the grid point the host realises, up to float noise.
CAP_READBACK_TOLERANCE = 1e-9

DONE, SKIPPED, FAILED, NOT_RUN, INTERRUPTED = "done", "skipped", "failed", "not run", "interrupted"
CTRL_C = "interrupted (Ctrl-C)"  # ApplyReport.stopped when the operator interrupted the run


class PlanRefused(InputError):
    """A well-formed plan that does not hold on the live cluster as it is now: it no longer fits (a host would be
    over-committed, a VM is gone or is not vcsched's, ...), or the cluster changed since it was computed.  A
    refusal, not bad input: exit 1, nothing changed (docs/cli.md).  An :class:`InputError` still, for callers
    that refuse every plan problem alike."""

    exit_code = 1


class SnapshotMismatch(PlanRefused):
    """The cluster changed since the plan was computed (exit 1; ``--force`` applies anyway)."""


class ClusterChangedMeanwhile(PlanRefused):
    """The plan a command computed itself (``place``/``adapt``/``drain --apply``) went stale before its first
    step: a host stopped answering or came back, or a VM changed, between the command's planning read and the
    apply's read.  A race (exit 1, nothing changed): running the command again plans from the cluster as it is
    then — not :class:`SnapshotMismatch`'s advice for a saved plan (recompute, or ``--force``)."""


class StepFailed(VcschedError):
    """A step's pre-condition cannot be met or its post-condition did not hold."""


class WaveStopped(VcschedError):
    """The guard refused to start a throttled wave's next migration: the ones that ran are in ``results``."""

    def __init__(self, reason: str, results: list[StepResult]) -> None:
        super().__init__(reason)
        self.results = results


class StepRunner(Protocol):
    def already_done(self, hv: Hypervisor, step: Any) -> bool:
        """Pre-condition: True if the step's effect is already in place (raise StepFailed if it cannot run)."""
        ...

    def act(self, hv: Hypervisor, step: Any) -> None: ...

    def verify(self, hv: Hypervisor, step: Any) -> None:
        """Post-condition: raise StepFailed naming what is wrong."""
        ...


def _cap_matches(hv: Hypervisor, v: VmState, cap: float) -> bool:
    now = hv.read_cap(v.host, v.name)
    return now is not None and abs(now - hv.realised_cap(v.host, v.vcpus, cap)) <= CAP_READBACK_TOLERANCE


def _verify_cap(hv: Hypervisor, host: str, vm: str, cap: float) -> None:
    v = hv.find_vm(vm)
    if v is None or v.host != host:
        raise StepFailed(f"{vm} is not on host {host} after the step")
    if not v.active:
        raise StepFailed(f"{vm} on host {host} is not running")
    if not _cap_matches(hv, v, cap):
        now = hv.read_cap(host, vm)
        shown = "none (uncapped)" if now is None else f"{now:.5f}"
        raise StepFailed(f"{vm} on host {host}: cap reads back as {shown} cores, planned {cap:.5f}")


def _io_differs(hv: Hypervisor, v: VmState, caps: IoCaps) -> IoCaps:
    """The fields of ``caps`` the VM does not hold yet (as the host realises them): what is left to set."""
    if not caps:
        return IoCaps()
    want = hv.realised_io_caps(v.host, v.devices, caps).given()
    now = hv.read_io_caps(v.host, v.name).given()
    return caps.only({k for k, value in want.items() if now.get(k) != value})


def _verify_io(hv: Hypervisor, host: str, vm: str, caps: IoCaps) -> None:
    if not caps:
        return
    v = hv.find_vm(vm)
    if v is None or v.host != host:
        raise StepFailed(f"{vm} is not on host {host} after the step")
    want = hv.realised_io_caps(host, v.devices, caps).given()
    now = hv.read_io_caps(host, vm).given()
    for k, value in want.items():
        if now.get(k) != value:
            shown = "none (unlimited)" if now.get(k) is None else str(now[k])
            raise StepFailed(f"{vm} on host {host}: {k} reads back as {shown}, planned {value}")


def _where(hv: Hypervisor, vm: str, host: str) -> VmState | None:
    """``vm`` as it runs on ``host``, None if absent; StepFailed if it is elsewhere, stopped or unmanaged."""
    v = hv.find_vm(vm)
    if v is None:
        return None
    if v.host != host:
        raise StepFailed(f"{vm} is on host {v.host}, the plan expects it on {host}")
    if not v.active:
        raise StepFailed(f"{vm} exists on host {host} but is not running (start it, or remove it, and re-run)")
    if not v.managed:
        raise StepFailed(f"{vm} on host {host} is not managed by vcsched; refusing to touch it")
    return v


def _fix_caps(hv: Hypervisor, v: VmState, cap_cores: float | None, io: IoCaps) -> None:
    """Set whichever of the step's caps the VM does not hold yet: CPU first, then disk and network."""
    if cap_cores is not None and not _cap_matches(hv, v, cap_cores):
        hv.set_cap(v.host, v.name, cap_cores)
    missing = _io_differs(hv, v, io)
    if missing:
        hv.set_io_caps(v.host, v.name, missing)


class CreateRunner:
    def already_done(self, hv: Hypervisor, step: CreateStep) -> bool:
        v = _where(hv, step.vm, step.host)
        return v is not None and _cap_matches(hv, v, step.cap_cores) and not _io_differs(hv, v, step.io_caps)

    def act(self, hv: Hypervisor, step: CreateStep) -> None:
        v = _where(hv, step.vm, step.host)
        if v is not None:  # created by an earlier, interrupted run: only its caps are left
            _fix_caps(hv, v, step.cap_cores, step.io_caps)
        else:
            hv.create_vm(step)

    def verify(self, hv: Hypervisor, step: CreateStep) -> None:
        _verify_cap(hv, step.host, step.vm, step.cap_cores)
        _verify_io(hv, step.host, step.vm, step.io_caps)


class SetCapRunner:
    """Every resource the step names: CPU (``cap_cores``), disk and network; each is set only if it differs."""

    def _vm(self, hv: Hypervisor, step: SetCapStep) -> VmState:
        v = _where(hv, step.vm, step.host)
        if v is None:
            raise StepFailed(f"{step.vm} is not on host {step.host} (nor anywhere else)")
        return v

    def already_done(self, hv: Hypervisor, step: SetCapStep) -> bool:
        v = self._vm(hv, step)
        cpu_done = step.cap_cores is None or _cap_matches(hv, v, step.cap_cores)
        return cpu_done and not _io_differs(hv, v, step.io_caps)

    def act(self, hv: Hypervisor, step: SetCapStep) -> None:
        _fix_caps(hv, self._vm(hv, step), step.cap_cores, step.io_caps)

    def verify(self, hv: Hypervisor, step: SetCapStep) -> None:
        if step.cap_cores is not None:
            _verify_cap(hv, step.host, step.vm, step.cap_cores)
        _verify_io(hv, step.host, step.vm, step.io_caps)


class RemoveRunner:
    """A departed VM: done once no host has it.  Only a managed VM of the step's virtual cluster is touched."""

    def already_done(self, hv: Hypervisor, step: RemoveStep) -> bool:
        v = hv.find_vm(step.vm)
        if v is None:
            return True
        if v.meta is None:
            raise StepFailed(f"{step.vm} on host {v.host} is not managed by vcsched; refusing to remove it")
        if v.meta.cluster != step.cluster:
            raise StepFailed(f"{step.vm} on host {v.host} belongs to virtual cluster {v.meta.cluster!r}, "
                             f"not the departed {step.cluster!r}; refusing to remove it")
        if v.host != step.host:
            raise StepFailed(f"{step.vm} is on host {v.host}, the plan removes it from {step.host}")
        return False

    def act(self, hv: Hypervisor, step: RemoveStep) -> None:
        hv.remove_vm(step.host, step.vm)

    def verify(self, hv: Hypervisor, step: RemoveStep) -> None:
        v = hv.find_vm(step.vm)
        if v is not None:
            raise StepFailed(f"{step.vm} still exists on host {v.host} after removing it")


NEED_TOLERANCE = 1e-9


class SetNeedRunner:
    """Rewrite the recorded need of a managed VM that runs on the step's host."""

    def _need(self, hv: Hypervisor, step: SetNeedStep) -> float:
        v = _where(hv, step.vm, step.host)
        if v is None:
            raise StepFailed(f"{step.vm} is not on host {step.host} (nor anywhere else)")
        assert v.meta is not None  # _where: managed
        if step.cpu_need_cores > v.vcpus + NEED_TOLERANCE:
            raise StepFailed(f"{step.vm}: a need of {step.cpu_need_cores:g} cores is more than its {v.vcpus} "
                             "vCPUs can use")
        return v.meta.cpu_need_cores

    def already_done(self, hv: Hypervisor, step: SetNeedStep) -> bool:
        return abs(self._need(hv, step) - step.cpu_need_cores) <= NEED_TOLERANCE

    def act(self, hv: Hypervisor, step: SetNeedStep) -> None:
        hv.set_need(step.host, step.vm, step.cpu_need_cores)

    def verify(self, hv: Hypervisor, step: SetNeedStep) -> None:
        now = self._need(hv, step)
        if abs(now - step.cpu_need_cores) > NEED_TOLERANCE:
            raise StepFailed(f"{step.vm} on host {step.host}: need reads back as {now:g} cores, "
                             f"planned {step.cpu_need_cores:g}")


class MigrateRunner:
    """A live migration, idempotent like the others.

    Already running on the destination = skipped (its arrival cap is
    transient: later set-cap steps of the plan own the final cap); on the
    source = migrated, then capped to the arrival cap; anywhere else =
    failure naming where it is.  A failed migration leaves the VM running on
    its source, or paused on its destination when the failure came at the end
    (:meth:`hypervisor.base.Hypervisor.migrate_vm`): the step fails, the plan
    stops; the VM is then in doubt, no step acts on it (the lookup refuses it,
    naming its copies) until repair settles it, and re-running continues from
    there.
    """

    def already_done(self, hv: Hypervisor, step: MigrateStep) -> bool:
        v = hv.find_vm(step.vm)
        if v is None:
            raise StepFailed(f"{step.vm} is on no host (expected on {step.source} or {step.target})")
        if step.final is not None and v.host == step.final:
            return True  # a relay hop a previous run already went past
        if v.host not in (step.source, step.target):
            raise StepFailed(f"{step.vm} is on host {v.host}, the plan moves it from {step.source} to {step.target}")
        if not v.managed:
            raise StepFailed(f"{step.vm} on host {v.host} is not managed by vcsched; refusing to migrate it")
        if not v.active:
            raise StepFailed(f"{step.vm} on host {v.host} is not running")
        # Done once it runs on the destination: its arrival cap is transient (a later set-cap step of the
        # plan raises it), so re-running must not put it back.
        return v.host == step.target

    def act(self, hv: Hypervisor, step: MigrateStep) -> None:
        v = hv.find_vm(step.vm)
        if v is not None and v.host == step.source:  # arrives with its cap; aborted past the cluster's timeout
            hv.migrate_vm(step.vm, step.source, step.target, step.cap_cores,
                          timeout_s=hv.throttles.timeout_for(step.bytes))
        hv.set_cap(step.target, step.vm, step.cap_cores)  # a re-run found it arrived: (re)set the arrival cap

    def verify(self, hv: Hypervisor, step: MigrateStep) -> None:
        _verify_cap(hv, step.target, step.vm, step.cap_cores)
        if hv.lists(step.source, step.vm):  # not even paused or defined: one copy only
            raise StepFailed(f"{step.vm} still exists on host {step.source} after migrating to {step.target}")


class AdoptRunner:
    """A running unmanaged domain made managed where it runs (docs/introducing.md).

    Done when it is managed by the step's virtual cluster on the step's host with the step's cap; a domain
    managed by the same virtual cluster but not yet at that cap (an interrupted earlier run) only gets its cap;
    anything else (gone, elsewhere, stopped, managed by another virtual cluster) fails naming it."""

    def _vm(self, hv: Hypervisor, step: AdoptStep) -> VmState:
        v = hv.find_vm(step.vm)
        if v is None:
            raise StepFailed(f"{step.vm} is on no host (expected on {step.host})")
        if v.host != step.host:
            raise StepFailed(f"{step.vm} is on host {v.host}, the plan adopts it on {step.host}")
        if not v.active:
            raise StepFailed(f"{step.vm} on host {v.host} is not running")
        if v.in_doubt:
            raise StepFailed(f"{step.vm} is in doubt (on more than one host): `vcsched repair` settles it first")
        if v.meta is not None and v.meta.cluster != step.definition.cluster:
            raise StepFailed(f"{step.vm} on host {v.host} is already managed by vcsched (virtual cluster "
                             f"{v.meta.cluster!r})")
        return v

    def already_done(self, hv: Hypervisor, step: AdoptStep) -> bool:
        v = self._vm(hv, step)
        return v.meta is not None and _cap_matches(hv, v, step.cap_cores)

    def act(self, hv: Hypervisor, step: AdoptStep) -> None:
        v = self._vm(hv, step)
        if v.meta is None:
            hv.adopt_vm(step.host, step.vm, step.definition.meta(), step.cap_cores)
        else:
            hv.set_cap(step.host, step.vm, step.cap_cores)

    def verify(self, hv: Hypervisor, step: AdoptStep) -> None:
        v = self._vm(hv, step)
        if v.meta is None:
            raise StepFailed(f"{step.vm} on host {step.host} is still unmanaged after adopting it")
        _verify_cap(hv, step.host, step.vm, step.cap_cores)


class ReleaseRunner:
    """A managed VM handed back: uncapped and unmanaged, still running where it was.  Done once it has no
    vcsched metadata; a VM of another virtual cluster (a reused name) is refused."""

    def _vm(self, hv: Hypervisor, step: ReleaseStep) -> VmState:
        v = hv.find_vm(step.vm)
        if v is None:
            raise StepFailed(f"{step.vm} is on no host (expected on {step.host})")
        if v.host != step.host:
            raise StepFailed(f"{step.vm} is on host {v.host}, the plan releases it on {step.host}")
        if v.meta is not None and v.meta.cluster != step.cluster:
            raise StepFailed(f"{step.vm} on host {v.host} belongs to virtual cluster {v.meta.cluster!r}, not "
                             f"{step.cluster!r}; refusing to release it")
        return v

    def already_done(self, hv: Hypervisor, step: ReleaseStep) -> bool:
        return self._vm(hv, step).meta is None

    def act(self, hv: Hypervisor, step: ReleaseStep) -> None:
        hv.release_vm(step.host, step.vm)

    def verify(self, hv: Hypervisor, step: ReleaseStep) -> None:
        v = self._vm(hv, step)
        if v.meta is not None:
            raise StepFailed(f"{step.vm} on host {step.host} still carries vcsched's metadata after releasing it")
        if v.active and hv.read_cap(step.host, step.vm) is not None:
            raise StepFailed(f"{step.vm} on host {step.host} is still capped after releasing it")


#: How each step kind is carried out, by ``op``.
RUNNERS: dict[str, StepRunner] = {
    CreateStep.op: CreateRunner(),
    SetCapStep.op: SetCapRunner(),
    MigrateStep.op: MigrateRunner(),
    RemoveStep.op: RemoveRunner(),
    SetNeedStep.op: SetNeedRunner(),
    AdoptStep.op: AdoptRunner(),
    ReleaseStep.op: ReleaseRunner(),
}


@dataclass(frozen=True)
class StepResult:
    step: Step
    outcome: str  # DONE, SKIPPED, FAILED or NOT_RUN
    detail: str = ""
    seconds: float | None = None  # wall time of the step (pre-condition to post-condition); None if not run


@dataclass(frozen=True)
class ApplyReport:
    results: tuple[StepResult, ...]
    snapshot_matched: bool
    stopped: str | None = None  # why the plan stopped before its end without a failed step (Ctrl-C, lock lost)
    #: After a failed step of a plan whose VMs were not all created: the caps the plan had lowered (to make room
    #: for them) put back, one set-cap result each (:func:`restore_lowered`).
    restored: tuple[StepResult, ...] = ()

    @property
    def ok(self) -> bool:
        return self.stopped is None and all(r.outcome in (DONE, SKIPPED) for r in self.results)

    def failed(self) -> StepResult | None:
        """The first step that failed or was interrupted, if any."""
        return next((r for r in self.results if r.outcome in (FAILED, INTERRUPTED)), None)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "snapshot_matched": self.snapshot_matched, "stopped": self.stopped,
                "steps": [_result_dict(r) for r in self.results],
                "restored": [_result_dict(r) for r in self.restored]}


def _result_dict(r: StepResult) -> dict[str, Any]:
    return {**r.step.to_dict(), "outcome": r.outcome, "detail": r.detail, "seconds": r.seconds}


def created_devices(hv: Hypervisor, steps: Sequence[Step]) -> dict[str, VmDevices]:
    """The devices of the VMs ``steps`` create with disk or network caps (the plan check needs them)."""
    return {s.vm: hv.planned_devices(s) for s in steps if isinstance(s, CreateStep) and s.io_caps}


def check_creates(hv: Hypervisor, steps: Sequence[Step], inventory: Inventory, *, define: bool = True) -> None:
    """Raise :class:`InputError` when a VM the plan creates could not be (its boot files, its domain XML:
    :meth:`hypervisor.base.Hypervisor.create_problems`), before anything changes.  A VM that exists already (an
    earlier run created it) is not checked again.  ``define=False``: a dry run's check, which changes nothing on
    any host (:meth:`hypervisor.base.Hypervisor.create_problems`)."""
    problems = [p for i, s in enumerate(steps) if isinstance(s, CreateStep) and inventory.vm(s.vm) is None
                for p in hv.create_problems(s, f"plan.steps[{i}]", define=define)]
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InputError("; ".join(problems[:3]) + more)


def _precondition(hv: Hypervisor, group: Sequence[Step], first: int,
                  cluster_hosts: frozenset[str] | None = None) -> str | None:
    """The group's steps replayed on the hosts they touch as they are *now*; the first problem, or None.

    A migrating VM's ``migrating_to`` host (where its last, cut-short attempt may have left a copy) is read
    too, so that the replay can refuse the migration while that host does not answer
    (:meth:`vcsched.plans.check._Replay.holder_answers`); ``cluster_hosts``: the hosts such a mark may name
    (a mark naming another host cannot be read and holds nothing back)."""
    try:
        found = [v for v in (hv.find_vm(step.vm) for step in group) if v is not None]
        marks = {v.meta.migrating_to for v in found
                 if v.meta is not None and v.meta.migrating_to is not None
                 and (cluster_hosts is None or v.meta.migrating_to in cluster_hosts)
                 and any(isinstance(s, MigrateStep) and s.vm == v.name for s in group)}
        now = hv.inventory(sorted({v.host for v in found} | marks | {h for step in group for h in _hosts_of(step)}))
        created = created_devices(hv, group)
    except VmInDoubt as exc:
        return f"pre-condition: {exc} (nothing was done)"
    except (HypervisorError, InputError) as exc:
        return f"pre-condition: cannot read the hosts it touches: {exc}"
    problems = replay_problems(group, now, first_index=first, created=created, copy_holders=_copy_holders())
    return None if not problems else f"pre-condition: {problems[0]} (the cluster changed; nothing was done)"


def _copy_holders() -> bool:
    """Whether a migration waits for the host that may hold another copy of its VM (always, but for the fault
    simulation's mutation switch :data:`hypervisor.hazards.MIGRATE_WHILE_HOLDER_DOWN`)."""
    return not hazards.on(hazards.MIGRATE_WHILE_HOLDER_DOWN)


def _hosts_of(step: Step) -> tuple[str, ...]:
    return (step.source, step.target) if isinstance(step, MigrateStep) else (step.host,)


def _snapshot_matches(inventory: Inventory, plan: Plan) -> bool:
    if inventory.cluster != plan.cluster:
        raise InputError(f"plan.cluster: plan is for cluster {plan.cluster!r}, this is {inventory.cluster!r}")
    now = snapshot_hash(inventory, plan.snapshot_exclusions(), plan.moved_vms(), plan.renewed_vms())
    return now == plan.snapshot


def check_snapshot(hv: Hypervisor, plan: Plan) -> bool:
    """Does the live cluster still match the inventory the plan was computed from?

    The VMs the plan creates, and the hosts of the VMs it moves, are left out
    of the comparison (see :mod:`vcsched.inventory`), so a half-applied plan
    still matches.  Whoever computes a plan that moves VMs must hash with the
    same ``moving`` set: ``snapshot_hash(inventory, moving=plan.moved_vms())``;
    the VMs it removes are left out like the ones it creates, and the needs it
    rewrites too.
    """
    return _snapshot_matches(hv.inventory(), plan)


def check_whole(hv: Hypervisor, plan: Plan, *, force: bool = False,
                inventory: Inventory | None = None, define: bool = True) -> tuple[Inventory, bool]:
    """The plan checked whole against the live inventory, before its first step: the live inventory it was
    checked on, and whether the snapshot matched (``force``: a mismatch is allowed, and said).  ``inventory``:
    the one a dry run read moments ago and planned on (it holds no lock, so a second read of every host would
    only cost time); applying always reads afresh, under the lock.

    Raises (nothing changed): :class:`SnapshotMismatch` (unless ``force``), :class:`PlanRefused` when the plan
    replayed on the live cluster does not hold at some step, :class:`vcsched.plans.claims.PlanMismatch` for a
    false claim, :class:`InputError` for a VM it cannot create.  :func:`apply_plan` runs it first; the unit of
    work (acting/unit_of_work.py) runs it on its own before an irreversible action that the plan must follow.
    """
    for i, step in enumerate(plan.steps):
        if step.op not in RUNNERS:
            raise InputError(f"plan.steps[{i}].op: no runner for {step.op!r} in this vcsched")
    if inventory is None:
        inventory = hv.inventory()
    matched = _snapshot_matches(inventory, plan)
    if not matched and not force:
        again = "place" if plan.kind == "place" else "adapt"
        raise SnapshotMismatch(f"plan.snapshot: cluster {plan.cluster!r} changed since this plan was computed "
                               f"(compute a new one with `vcsched {again}`, or apply anyway with --force)")
    try:
        check_plan(plan.steps, inventory, created=created_devices(hv, plan.steps), copy_holders=_copy_holders())
    except InputError as exc:
        raise PlanRefused(str(exc)) from None  # the message names the step and the field, as bad input does
    check_claims(plan, inventory)
    check_creates(hv, plan.steps, inventory, define=define)
    return inventory, matched


def apply_plan(hv: Hypervisor, plan: Plan, *, force: bool = False,
               on_step: Callable[[StepResult], None] | None = None,
               guard: Callable[[], None] | None = None, threads: bool = True,
               checked: tuple[Inventory, bool] | None = None,
               restore_guard: Callable[[], None] | None = None) -> ApplyReport:
    """Run ``plan`` on ``hv``; returns what happened to every step (see the module docstring).

    Raises (nothing changed): :class:`SnapshotMismatch` when the cluster
    changed since the plan was computed (unless ``force``), and
    :class:`PlanRefused` when the plan does not hold on the live cluster as a
    whole (even with ``force``: that would over-commit); both exit 1.

    ``guard`` is called before every step (every wave); if it raises a
    :class:`VcschedError` (the cluster lock was lost) no further step starts
    and the report says why.  Ctrl-C (KeyboardInterrupt) stops the plan the
    same way: the report lists what was done, and the step that was running
    is marked interrupted.

    ``threads=False`` runs a wave's migrations one after the other, in plan order, in the caller's thread (a
    deterministic simulation); by default they run at once.

    ``restore_guard``: checked instead of ``guard`` before putting back the caps a failed plan lowered
    (:func:`restore_lowered`): only the lock's, since a clean-up must still run when the caller's own condition
    (the controller's SIGTERM) refuses further steps.  Default: ``guard``.

    ``checked``: what :func:`check_whole` returned for this plan moments ago under the same lock (the unit of
    work checks a plan before an irreversible action it must follow): not read and checked again, since reading
    a host that does not answer — the failed host of a recovery — costs its whole ``host_timeout``.
    """
    inventory, matched = checked if checked is not None else check_whole(hv, plan, force=force)
    results: list[StepResult] = []
    failed = False
    stopped: str | None = None
    for batch in batches(plan.steps):
        group = [step for _, step in batch]
        if failed or stopped is not None:
            results += [StepResult(step, NOT_RUN) for step in group]
            continue
        try:
            if guard is not None:
                guard()
            done = _run_group(hv, group, batch[0][0], threads, guard, frozenset(h.name for h in inventory.hosts))
        except HostReadBug:
            raise  # a bug in vcsched's reading code: reported as such (exit 70), not as a stopped plan
        except WaveStopped as exc:
            stopped = str(exc)
            done = exc.results
        except VcschedError as exc:
            stopped = str(exc)
            results += [StepResult(step, NOT_RUN) for step in group]
            continue
        except KeyboardInterrupt:
            stopped = CTRL_C
            done = [StepResult(step, INTERRUPTED, "interrupted while running: it may or may not have taken effect; "
                                                  "every VM is still running somewhere, re-run the plan to converge")
                    for step in group]
        for result in done:
            results.append(result)
            failed = failed or result.outcome in (FAILED, INTERRUPTED)
            if on_step is not None:
                on_step(result)
    restored: tuple[StepResult, ...] = ()
    if failed and stopped is None and not any(r.outcome == INTERRUPTED for r in results):
        try:
            cleanup_guard = restore_guard if restore_guard is not None else guard
            if cleanup_guard is not None:
                cleanup_guard()  # only while the lock is still ours
            restored = restore_lowered(hv, inventory, results)
        except VcschedError as exc:
            stopped = f"the caps lowered for the VMs not created were not put back: {exc}"
    return ApplyReport(tuple(results), matched, stopped, restored)


def restore_lowered(hv: Hypervisor, before: Inventory, results: Sequence[StepResult]) -> tuple[StepResult, ...]:
    """Put back the caps a stopped plan lowered to make room for VMs it did not create.

    A ``place`` plan lowers running VMs' caps first, then creates the new
    VMs in the room made.  When a create fails (a host died, libvirt refused
    what it could not be asked in advance), the room it was made for stays
    empty, and the lowered VMs would keep their lower caps for a VM that
    never came.  So, for a plan with ``create`` steps that did not all
    happen: every VM a ``set-cap`` step lowered gets its cap from before the
    plan back — host by host, only where the host's caps, as read now, stay
    within its cores with all of them restored (a create that did happen
    there keeps its room).  Each restore is a verified ``set-cap`` like any
    step; a host where they do not fit is left as the plan left it.
    """
    if not any(isinstance(r.step, CreateStep) and r.outcome not in (DONE, SKIPPED) for r in results):
        return ()
    lowered: dict[str, tuple[str, float]] = {}  # vm -> (host, cap before the plan)
    for r in results:
        if isinstance(r.step, SetCapStep) and r.step.cap_cores is not None and r.outcome == DONE:
            v = before.vm(r.step.vm)
            if v is not None and v.host == r.step.host and r.step.cap_cores < v.cap_or_vcpus - CAP_READBACK_TOLERANCE:
                lowered.setdefault(r.step.vm, (r.step.host, v.cap_or_vcpus))
    if not lowered:
        return ()
    hosts = sorted({host for host, _ in lowered.values()})
    now = hv.inventory(hosts)
    out: list[StepResult] = []
    for h in now.hosts:
        if h.down is not None:
            continue
        on = [v for v in now.vms_on(h.name) if v.managed and v.active]
        back = {v.name: lowered[v.name][1] for v in on if v.name in lowered and v.cap_or_vcpus < lowered[v.name][1]}
        total = sum(back.get(v.name, v.cap_or_vcpus) for v in on)
        if not back or total > h.cores + CAP_TOLERANCE:
            continue
        out += [_run_step(hv, SetCapStep(vm, h.name, cap)) for vm, cap in sorted(back.items())]
    return tuple(out)


def _run_group(hv: Hypervisor, group: list[Step], first: int, threads: bool = True,
               guard: Callable[[], None] | None = None,
               cluster_hosts: frozenset[str] | None = None) -> list[StepResult]:
    """One step, or one wave of migrations at once, after its pre-condition on the hosts as they are now."""
    problem = _precondition(hv, group, first, cluster_hosts)
    if problem is not None:
        return [StepResult(step, FAILED, problem, 0.0) for step in group]
    if len(group) == 1 or not threads:
        return [_run_step(hv, step) for step in group]
    return _run_wave(hv, group, guard)


def _run_wave(hv: Hypervisor, group: list[Step], guard: Callable[[], None] | None) -> list[StepResult]:
    """A wave's migrations in threads, started as the cluster's throttles admit them (:func:`admit`), each as soon
    as a slot frees; results in plan order.  Without throttles all start at once, as the wave was planned.

    ``guard`` is asked again before each migration that starts after the first ones (a throttled wave can last
    long): once it refuses, no further one starts, the running ones finish, and :class:`WaveStopped` carries
    the results (the rest not run)."""
    ends = [(step.source, step.target) for step in group if isinstance(step, MigrateStep)]
    assert len(ends) == len(group), "a wave holds migrations only"
    results: dict[int, StepResult] = {}
    pending = list(range(len(group)))
    running: dict[Future[StepResult], int] = {}
    refused: str | None = None
    with ThreadPoolExecutor(max_workers=len(group), thread_name_prefix="vcsched-wave") as pool:
        while pending or running:
            start = admit([ends[i] for i in pending], [ends[i] for i in running.values()], hv.throttles)
            if not start and not running and pending:  # cannot happen with limits >= 1; never stall a wave
                start = [0]
            if start and results and guard is not None and refused is None:
                try:
                    guard()
                except VcschedError as exc:
                    refused = str(exc)
            if refused is not None:
                start = []
                for i in pending:
                    results[i] = StepResult(group[i], NOT_RUN, f"not started: {refused}")
                pending = []
            for k in sorted(start, reverse=True):
                i = pending.pop(k)
                running[pool.submit(_run_step, hv, group[i])] = i
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                results[running.pop(f)] = f.result()
    done = [results[i] for i in range(len(group))]
    if refused is not None:
        raise WaveStopped(refused, done)
    return done


def _run_step(hv: Hypervisor, step: Step) -> StepResult:
    runner = RUNNERS[step.op]
    start = time.monotonic()
    try:
        if runner.already_done(hv, step):
            return StepResult(step, SKIPPED, "already in place", time.monotonic() - start)
        runner.act(hv, step)
        runner.verify(hv, step)
        return StepResult(step, DONE, seconds=time.monotonic() - start)
    except (StepFailed, HypervisorError) as exc:
        return StepResult(step, FAILED, str(exc), time.monotonic() - start)
