"""The one sequence through which everything that changes hosts goes: a unit of work.

Cosmic Python's service layer and unit of work (chapters 4 and 6): every command that changes hosts (`place`,
`adapt`, `drain`, `apply`, `recover`, `repair`, `approve`, `observe --probe`, `cordon`), the controller's
intervals (probe, rebalance, recovery, putting probe caps back) and the fault simulation open one
:class:`UnitOfWork` and go through it, in this order:

1. take the cluster lock (named by the hosts' identities, acting/lock.py) and keep its lease on the
   adapter (``hv.lease``: a migration that would outlive the lease is aborted);
2. settle the in-doubt VMs that can be (``hv.repair``, docs/repair.md "A VM never runs twice");
3. read the live inventory (:meth:`UnitOfWork.inventory`), on which the caller decides its plan (a pure
   function of the core);
4. validate the whole plan against the live inventory (:func:`acting.executor.check_whole`);
5. only then an irreversible action the plan must follow (fencing a failed host; later, powering hosts):
   "fence, then discover the restart is refused" is what this ordering prevents (Pacemaker's ordering
   constraints);
6. apply it step by step through the executor, each step under the guard (the lock still ours, and the
   caller's own conditions: the controller's leadership and SIGTERM);
7. record each step that took effect in the definitions store (acting/definitions.py), so that a VM it
   created or moved can be restarted if its host fails.

What happens is said through :class:`Reporting`'s callbacks: the CLI turns them into notes and a progress bar,
the controller into events and metrics.  A dry run (``lock=None``) goes through the same object: it takes no
lock, settles nothing (the in-doubt VMs are noted with what `vcsched repair --apply` would do), and refuses to
act; so a dry run and ``--apply`` read, decide and validate along one code path.

Adapters are passed in (the hypervisor, the lock, the definitions store), so tests and the fault simulation
give it the in-memory hypervisor (hypervisor/memory.py) and a fake lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from acting.definitions import StoreError, recorder
from acting.executor import (
    ApplyReport,
    ClusterChangedMeanwhile,
    PlanRefused,
    SnapshotMismatch,
    StepResult,
    apply_plan,
    check_whole,
)
from hypervisor import hazards
from vcsched.errors import InputError, VcschedError
from vcsched.plans.claims import PlanMismatch
from vcsched.plans.steps import CreateStep

if TYPE_CHECKING:
    from acting.definitions import DefinitionStore
    from acting.lock import LockSet
    from hypervisor.base import Hypervisor
    from hypervisor.identity import Identities
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from vcsched.control.power import PowerState
    from vcsched.formats.cluster import Cluster
    from vcsched.inventory import Inventory
    from vcsched.plans.plan import Plan
    from vcsched.plans.repair import RepairReport


class Lock(Protocol):
    """What the unit of work needs of a :class:`acting.lock.ClusterLock` (tests and the simulation pass fakes)."""

    def acquire(self, wait: float = 0.0) -> None: ...

    def guard(self) -> None: ...

    def held(self) -> bool: ...

    def release(self) -> None: ...


class DryRun(VcschedError):
    """A unit of work that cannot act (a dry run, or one not entered) was asked to change hosts: a bug in the
    caller (vcsched's own), never the operator's."""

    exit_code = 70


def _nothing(*_: object) -> None:
    return None


@dataclass(frozen=True)
class Reporting:
    """Where the unit of work says what it does (every callback optional).

    ``note``: a line for a person (a definitions record that could not be written, an in-doubt VM a dry run
    leaves alone, in-doubt VMs that could not be settled); ``settled``: what settling the in-doubt VMs did,
    right after the lock was taken; ``step``: each step of a plan as it ends (the progress bar; the
    controller's events and metrics)."""

    note: Callable[[str], None] = _nothing
    settled: Callable[[RepairReport], None] = _nothing
    step: Callable[[StepResult], None] = _nothing


class UnitOfWork:
    """One change of hosts, or one dry run of it (module docstring).  Use as a context manager::

        with UnitOfWork(hv, lock, wait=5, store=store, reporting=Reporting(note=notice)) as uow:
            inventory = uow.inventory()
            plan = decide(inventory)               # the core, pure
            report = uow.apply(plan)               # validated whole, applied, recorded

    ``lock``: an unacquired cluster lock, taken on entry (waiting up to ``wait`` seconds; busy:
    :class:`acting.lock.LockBusy`) and released on exit; None: a dry run.  ``settle=False``: the caller settles
    in-doubt VMs itself (`vcsched repair`, which reports them as its result), or there is nothing to settle for
    (`cordon`).  ``before_step``: the caller's own condition checked before every step, besides the lock (the
    controller: not stopping, still the leader).  ``store``: where each step that took effect is recorded
    (None: nowhere).  ``power``: reads the cluster's power record (acting/power.py), so that a host that does not
    answer because vcsched put it to sleep is read as asleep, not down (None: no record).  ``threads``: whether
    a wave's migrations run at once, in threads (the default of :meth:`apply`; False: one after the other, in
    plan order, in the caller's thread).  The fault simulation passes False for every unit of work it builds or
    is given (the controller's, a power action's, an approval's): a wave's threads interleave their libvirt
    calls as the OS schedules them, so a schedule would not replay exactly (docs/faultsim.md).
    """

    def __init__(self, hv: Hypervisor, lock: Lock | None, *, wait: float = 0.0, settle: bool = True,
                 store: DefinitionStore | None = None, reporting: Reporting = Reporting(),
                 before_step: Callable[[], None] | None = None,
                 power: Callable[[], PowerState] | None = None, threads: bool = True) -> None:
        self.hv = hv
        self.threads = threads
        self.power = power
        self.lock = lock
        self.wait = wait
        self.settle = settle
        self.store = store
        self.reporting = reporting
        self.before_step = before_step
        self._open = False
        #: What settling the in-doubt VMs found on entry (None: not settled here): a recovery reads which hosts
        #: in-doubt VMs wait for (``plan.blocked``).
        self.repaired: RepairReport | None = None

    @property
    def dry_run(self) -> bool:
        return self.lock is None

    # ------------------------------------------------------------------ 1–2: lock, lease, settle

    def __enter__(self) -> UnitOfWork:
        if self.lock is not None:
            self.lock.acquire(self.wait)
            try:
                self.hv.lease = self.lock.held
                if self.settle:
                    self.settle_in_doubt()
            except BaseException:
                self._close()
                raise
        self._open = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._close()

    def _close(self) -> None:
        self._open = False
        if self.lock is not None:
            self.hv.lease = None
            self.lock.release()

    def settle_in_doubt(self) -> RepairReport:
        """The in-doubt VMs that can be settled, settled under the lock (done on entry unless ``settle=False``);
        with a host down nothing is settled (said in one note), and the work goes on (its plan leaves in-doubt VMs
        alone).  A dry run settles nothing: what would be done is reported, never done."""
        if self.power is None:
            report = self.hv.repair(self.lock_guard, apply=not self.dry_run, fenced=self._fenced())
        else:  # a host asleep holds no copy: it holds no settlement back (docs/power.md)
            report = self.hv.repair(self.lock_guard, apply=not self.dry_run, fenced=self._fenced(),
                                    inventory=self.asleep(self.hv.inventory()))
        self.repaired = report
        self._record_resumed(report)
        self.reporting.settled(report)
        # A refused repair reports applied=False (hypervisor/settlement.py): what says it was meant to act is
        # that this is no dry run.
        if not self.dry_run and report.plan.refused is not None and report.plan.in_doubt:
            self.reporting.note(f"{len(report.plan.in_doubt)} in-doubt VM(s) not settled: {report.plan.refused}; "
                                "`vcsched repair` settles them once every host answers")
        elif not self.dry_run and report.plan.waiting:
            self.reporting.note(f"{len(report.plan.waiting)} in-doubt VM(s) not settled yet: "
                                + "; ".join(report.plan.waiting))
        return report

    def _record_resumed(self, report: RepairReport) -> None:
        """Each VM whose paused arrival repair resumed is recorded where it now runs: the migration that left it
        there was never recorded (its process died, or lost its lease, after the switch-over), so its record still
        names the source.  Left so, a recovery of that source would take it for one of its own VMs, and a status
        would look for it in the wrong place (seed 1, schedule 8245 with SIGTERM, docs/faultsim.md)."""
        from vcsched.plans.repair import RESUME

        if self.store is None or self.dry_run:
            return
        for action, outcome, _ in report.outcomes:
            if action.action == RESUME and outcome == "done":
                try:
                    self.store.moved(action.vm, action.host)
                except (StoreError, InputError) as exc:
                    self.reporting.note(f"{exc}: VM {action.vm}'s record still names the host it left")

    def _fenced(self) -> frozenset[str]:
        """The hosts the definitions store marks fenced: off since, holding no copy of any VM (a mark is cleared when
        its host is seen answering, :meth:`_seen_answering`).  Unreadable: none (repair then waits for them)."""
        if self.store is None:
            return frozenset()
        try:
            return frozenset(self.store.fenced())
        except (StoreError, InputError) as exc:
            self.reporting.note(f"{exc}: in-doubt VMs wait for every host that does not answer")
            return frozenset()

    def lock_guard(self) -> None:
        """The lock is still ours (renewing its lease); a dry run holds none, so has nothing to lose."""
        if self.lock is not None:
            self.lock.guard()

    def guard(self) -> None:
        """Before every step: the caller's condition (``before_step``), then the lock."""
        if self.before_step is not None:
            self.before_step()
        self.lock_guard()

    # ------------------------------------------------------------------ 3: read

    def waits_for(self, host: str) -> bool:
        """Whether an in-doubt VM waits for ``host`` to answer (or be fenced) before it can be settled, or a cut
        migration may have left a copy there (``plan.leftovers``), as the settlement on entry found (a dry run
        settles nothing: False)."""
        return self.repaired is not None and host in (*self.repaired.plan.blocked, *self.repaired.plan.leftovers)

    def inventory(self) -> Inventory:
        """The live inventory, read now (under the lock when there is one).  A dry run notes each in-doubt VM and
        what `vcsched repair --apply` would do about it: it reads only, so nothing is settled."""
        inventory = self.asleep(self.hv.inventory())
        if self.dry_run:
            self.note_in_doubt(inventory)
        else:
            self._seen_answering(inventory)
        return inventory

    def asleep(self, inventory: Inventory) -> Inventory:
        """``inventory`` with the hosts vcsched put to sleep read as asleep, not down
        (:func:`acting.power.asleep_in`)."""
        from acting.power import asleep_in

        return asleep_in(inventory, self.power, self.reporting.note)

    def _seen_answering(self, inventory: Inventory) -> None:
        """Clear the fence mark of every host that answered ``inventory``, read under the lock: a mark says that its
        host holds no VM (it was powered off and has not answered since, vcsched/control/lost.py), which stops
        being true the moment it answers and anything may be placed there.  Done on every read a plan is decided
        or checked on, so no step reaches a host that is still marked.  A mark that cannot be cleared is said: it
        would make a VM moved there count as lost, and be started twice, if that host stopped answering again."""
        if self.store is None or hazards.on(hazards.STALE_FENCE_MARK):  # the mutation switch (tests/test_faultsim.py)
            return
        try:
            fenced = self.store.fenced()
            for h in inventory.hosts:
                if h.down is None and h.name in fenced:
                    self.store.clear_fenced(h.name)
        except (StoreError, InputError) as exc:
            self.reporting.note(f"{exc}: a host fenced earlier answers again but is still marked fenced")

    def note_in_doubt(self, inventory: Inventory) -> None:
        """Each in-doubt VM of ``inventory`` and what `vcsched repair --apply` would do about it, one note each
        (what a dry run says instead of settling; `observe` reads its inventory by sampling)."""
        from vcsched.plans.repair import RepairReport, plan_repair

        if not inventory.in_doubt:
            return
        for d in inventory.in_doubt:
            where = ", ".join(f"{h} ({st})" for h, st in zip(d.hosts, d.states, strict=True))
            self.reporting.note(f"{d.vm} is in doubt (on {where}): nothing acts on it until "
                                "`vcsched repair --apply` settles it")
        for line in RepairReport(plan_repair(inventory), applied=False).lines():
            self.reporting.note(f"vcsched repair: {line}")

    # ------------------------------------------------------------------ 4: validate

    def validate(self, plan: Plan, *, force: bool = False, planned_here: bool = False,
                 inventory: Inventory | None = None) -> bool:
        """The whole plan checked against the live inventory (:func:`acting.executor.check_whole`); whether its
        snapshot matched.  Raises what it raises (nothing changed).  A dry run may validate too: it only reads,
        and may pass the ``inventory`` it read with :meth:`inventory` (it holds no lock: reading every host again
        would only cost time); a unit of work that acts always checks on a read of its own, under the lock.

        ``planned_here``: the plan was computed by this unit of work from a read moments earlier, so a snapshot
        that no longer matches means the cluster changed meanwhile (a host stopped answering or came back):
        :class:`acting.executor.ClusterChangedMeanwhile` ("run it again"), not a saved plan's advice
        (recompute, or ``--force``), which such a command cannot follow."""
        if inventory is not None and not self.dry_run:
            raise DryRun("only a dry run validates on an inventory it read before: acting reads under the lock")
        with _changed_meanwhile(plan, planned_here):
            return check_whole(self.hv, plan, force=force, inventory=inventory, define=not self.dry_run)[1]

    def would_refuse(self, plan: Plan, *, force: bool = False, planned_here: bool = True,
                     inventory: Inventory | None = None) -> PlanRefused | PlanMismatch | None:
        """Why applying ``plan`` would be refused before its first step (:meth:`validate`'s refusal), or None: what
        a dry run checks so that it exits as ``--apply`` would (docs/cli.md), and says why."""
        try:
            self.validate(plan, force=force, planned_here=planned_here, inventory=inventory)
        except (PlanRefused, PlanMismatch) as exc:
            return exc
        return None

    # ------------------------------------------------------------------ 5–7: act, apply, record

    def apply(self, plan: Plan, *, force: bool = False, planned_here: bool = False,
              irreversible: Callable[[], bool] | None = None,
              on_step: Callable[[StepResult], None] | None = None,
              threads: bool | None = None) -> ApplyReport | None:
        """Validate ``plan`` whole, then (with ``irreversible``) perform the irreversible action it must follow,
        then apply it step by step under :meth:`guard`, recording each step that took effect.  The plan is checked
        whole once: by the executor before its first step, or, with ``irreversible``, before that action (the
        lock held throughout; each step still checks its own pre-condition on the hosts it touches).

        ``irreversible`` runs only once the plan is known to hold on the live cluster, under the guard; it
        returns whether it succeeded: False (fencing failed, the host may still run its VMs) applies nothing
        and returns None.  ``on_step``: this plan's own callback, after the reporting's ``step``.  ``threads``: as
        the constructor's (None: the constructor's).
        Raises as :meth:`validate` before anything changed; :class:`DryRun` in a dry run."""
        if not self._open:
            raise DryRun("the unit of work is not open: enter it (`with UnitOfWork(...)`) before applying")
        if self.dry_run:
            raise DryRun("a dry run does not apply: a unit of work without a lock only reads")
        restarts = self._recorded_creates(plan)
        if irreversible is not None and hazards.on(hazards.FENCE_BEFORE_VALIDATE):  # a mutation switch (tests)
            self.guard()
            if not irreversible():
                return None
            irreversible = None
        with _changed_meanwhile(plan, planned_here):
            checked = check_whole(self._reading(), plan, force=force)
        self._seen_answering(checked[0])  # the hosts the steps may reach: no longer fenced
        if irreversible is not None or restarts:
            self.guard()
            if irreversible is not None and not irreversible():
                return None
            if restarts:
                self._record_ahead(restarts)

        def then(result: StepResult) -> None:
            self.reporting.step(result)
            if on_step is not None:
                on_step(result)

        with _changed_meanwhile(plan, planned_here):
            return apply_plan(self._reading(), plan, force=force, guard=self.guard,
                              threads=self.threads if threads is None else threads, checked=checked,
                              on_step=recorder(self.store, self.reporting.note, then), restore_guard=self.lock_guard)


    def _reading(self) -> Hypervisor:
        """The adapter the executor reads the hosts through: its inventories marked as :meth:`inventory`'s are
        (hosts asleep), so that a plan made on the unit of work's inventory is checked against the same view —
        else a host asleep (its size from the record, or answering empty) reads "changed meanwhile"."""
        if self.power is None:
            return self.hv
        return _Marked(self.hv, self.asleep)  # type: ignore[return-value]

    def _recorded_creates(self, plan: Plan) -> list[CreateStep]:
        """The plan's creates of VMs the store already records: restarts (`recover`, `restart`, the controller)."""
        if self.store is None:
            return []
        creates = [s for s in plan.steps if isinstance(s, CreateStep)]
        if not creates:
            return []
        recorded = self.store.all()
        return [s for s in creates if s.vm in recorded]

    def _record_ahead(self, restarts: list[CreateStep]) -> None:
        """Before a restart creates a VM, its record names the host it is created on (a write-ahead): a create cut
        short (its process killed, its host no longer answering before the step is verified) may have started the
        VM there, and a record still naming the failed host would make it *lost* to the next command, which would
        start it a second time elsewhere while that host does not answer (found by the fault simulation,
        docs/faultsim.md).  If nothing was created, the host answering without it shows it lost, and a restart
        runs it; while the host does not answer, the VM awaits that host's recovery."""
        assert self.store is not None
        try:
            self.store.record(restarts)
        except (StoreError, InputError) as exc:
            self.reporting.note(f"{exc}: a restart cut short could be started twice")


@contextmanager
def _changed_meanwhile(plan: Plan, planned_here: bool) -> Iterator[None]:
    """A snapshot mismatch of a plan this command computed moments earlier (:meth:`UnitOfWork.validate`)."""
    try:
        yield
    except SnapshotMismatch:
        if not planned_here:
            raise
        raise ClusterChangedMeanwhile(
            f"cluster {plan.cluster!r} changed while this command ran (a host stopped answering or came back, "
            "or a VM changed, between its planning read and its first step): nothing changed; run it again"
        ) from None


def for_cluster(cluster: Cluster, hv: LibvirtHypervisor, *, apply: bool, coordination: str | None = None,
                wait: float = 0.0, ttl: float | None = None, settle: bool = True,
                reporting: Reporting = Reporting(), before_step: Callable[[], None] | None = None) -> UnitOfWork:
    """The unit of work of a command on ``cluster`` through ``hv`` (``apply=False``: a dry run, no lock).

    The lock is the cluster's on ``coordination`` (else the cluster file's, else the default; acting/lock.py),
    named after its hosts — their libvirt identities, read through ``hv`` (``hv.identities()``) — not after the
    file's ``name`` (hypervisor/identity.py): the lock of every key those hosts are claimed by
    (acting/lock_names.py), and ``hv`` then acts only on the hosts those locks cover (a host with no identity is
    down for the command); its TTL is ``ttl``, else the cluster file's ``lock_ttl``.  Steps are recorded in the
    definitions store of the same coordination backend."""
    def power() -> PowerState:  # read only when a host is down (acting/power.py, imported only then: numpy)
        from acting.power import record_reader, store_for

        if not apply:
            return record_reader(cluster, hv, coordination)()
        return store_for(cluster, identities, coordination).read()

    if not apply:
        return UnitOfWork(hv, None, reporting=reporting, before_step=before_step, power=power)
    from acting.definitions import DefinitionStore

    identities = hv.identities()  # read once: the lock's name, and the power record's (named like the lock)
    lock = cluster_lock(cluster, hv, coordination, ttl, identities)
    return UnitOfWork(hv, lock, wait=wait, settle=settle, store=DefinitionStore.for_url(lock.url, cluster.name),
                      reporting=reporting, before_step=before_step, power=power)


def cluster_lock(cluster: Cluster, hv: LibvirtHypervisor, coordination: str | None = None,
                 ttl: float | None = None, identities: Identities | None = None) -> LockSet:
    """The (unacquired) lock of ``cluster`` on ``coordination`` (else the cluster file's, else the default;
    acting/lock.py): the lock of every key its hosts' identities, read through ``hv``, are claimed by
    (acting/lock_names.py), not a lock named after the file's ``name`` (hypervisor/identity.py); ``hv`` then acts
    only on the hosts those locks cover.  Its TTL is ``ttl``, else the cluster file's ``lock_ttl``.  The lock of
    every unit of work of the cluster (:func:`for_cluster`), and of what else changes its VMs (`vcsched
    calibrate --domain` of a VM it manages).  ``identities``: ``hv.identities()`` as the caller read it already
    (each read asks every host that has no declared UUID)."""
    from acting.lock import DEFAULT_TTL, resolve_url
    from acting.lock_names import admission, cluster_locks, lock_keys

    url = resolve_url(coordination, cluster.coordination)
    identities = identities if identities is not None else hv.identities()
    keys = lock_keys(url, cluster.name, identities)
    hv.act_only_as(identities.known, admission(url, keys))
    return cluster_locks(url, cluster.name, keys, ttl=ttl or cluster.lock_ttl or DEFAULT_TTL)


class _Marked:
    """A hypervisor whose inventories carry the power record's marks (:meth:`UnitOfWork._reading`); everything
    else is the adapter's own."""

    def __init__(self, hv: Hypervisor, mark: Callable[[Inventory], Inventory]) -> None:
        self._hv = hv
        self._mark = mark

    def inventory(self, hosts: Iterable[str] | None = None) -> Inventory:
        return self._mark(self._hv.inventory(hosts))

    def __getattr__(self, name: str) -> object:
        return getattr(self._hv, name)
