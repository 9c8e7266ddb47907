"""Recommend mode and its approval in the fault simulation (docs/faultsim.md, "Approvals").

The **approve** schedules (index :data:`APPROVE_AT` modulo :data:`APPROVE_EVERY`; they were place, drain or adapt
schedules) start with every managed VM capped at half its need (squeezed: the controller has something to propose
in every scenario) and run, in each simulated process, `vcsched run --mode recommend`'s controller (the real
:class:`acting.controller.Controller` with ``recommend=True``) for :data:`CYCLES` intervals: it samples the busy
guests, decides and records what it would do as recommendations, in a book kept on the simulation's coordination
backend (:class:`MemoryBook`, beside the definitions store, outliving every process as etcd does).  Then each open
recommendation is approved by a process of its own — `vcsched approve ID`: its own unit of work
(:meth:`faultsim.simulation.Schedule.unit_of_work`: the lock, the lease, in-doubt VMs settled first) and the real
:func:`acting.approval.approve` (the floors, the whole-plan check against the live inventory, the executor, the
book settled) — under the same faults as every schedule (kills, hangs, errors, hosts down, lease loss, readers and
actors), the invariants checked after every call.

**Stale approvals.**  In :data:`STALE_SHARE` of the schedules, the first process that has proposals to approve
places a VM of its own (``late0-0``, `vcsched place --apply` of a one-VM request) between the controller's
proposals and their approval: the cluster changed since they were made; the final process does the same
(``late1-0``, without faults).  Each such approval must be refused (or killed), changing no host once its unit of
work settled the in-doubt VMs — checked whenever the placement ended ``ok``, its VM's host answered, and no fault
that may hide a host (:data:`HIDING`) was injected during the approval (else the approval's inventory may
legitimately not show the new VM).  The hazard ``approve-unvalidated`` (approving without the whole-plan check) is
caught there.

At the end, as everywhere, faults stop and every host answers; the final process repairs, runs the controller
again and approves what it proposes, which must be applied (its plan's every VM on its planned host with its
planned cap) or refused with a reason.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hypervisor.simlibvirt import Call, ProcessKilled
from vcsched.control.recommend import Book

if TYPE_CHECKING:
    from faultsim.simulation import MemoryBackend, Schedule

T = TypeVar("T")

#: Schedules whose index is APPROVE_AT modulo APPROVE_EVERY are approve schedules (command schedules before: not
#: probe, twin, recover or power; no schedule pinned by a test).
APPROVE_EVERY, APPROVE_AT = 32, 6
#: Intervals the recommending controller runs per process: a new leader's first interval only samples, the second
#: decides (and proposes).
CYCLES = 2
#: Its sampling period (simulated seconds): two rounds per interval (the act-mode controller schedules sample every
#: second; here only the estimates that decide a proposal are needed, and the rounds are most of a schedule's cost).
SAMPLE_S = 2.0
#: The share of approve schedules whose first process places a VM between the proposals and their approval.
STALE_SHARE = 0.5
MIB = 1 << 20
#: The faults that may hide a host from an approval's read (module docstring, "Stale approvals").
HIDING = ("host_down", "hang", "error")


class MemoryBook:
    """The recommendations book (:class:`acting.recommendations.RecommendationStore`'s contract: the book read whole,
    changed by a pure function, a refusal leaving it as it was) on the simulation's in-memory coordination backend,
    as one JSON document, like the ``file://`` and etcd stores."""

    KEY = "recommendations/sim"

    def __init__(self, backend: MemoryBackend) -> None:
        self.backend = backend

    def read(self) -> Book:
        text = self.backend.get(self.KEY)
        return Book() if text is None else Book.from_dict(json.loads(text))

    def update(self, change: Callable[[Book], tuple[Book, T]]) -> T:
        book, out = change(self.read())
        self.backend.put(self.KEY, json.dumps(book.to_dict()))
        return out


class ApproveWork:
    """The approve workload of one schedule (module docstring)."""

    def __init__(self, s: Schedule) -> None:
        from faultsim.simulation import SimLockService

        self.s = s
        self.book = MemoryBook(s.store.backend)
        # The VMs start squeezed, capped at half their need: at their needs, a third of the scenarios gave the
        # controller nothing to propose, hence nothing to approve.
        for h in s.world.hosts.values():
            for d in h.domains.values():
                if d.meta is not None:
                    d.quota //= 2
                    d.changed()
        s.leader = SimLockService(s.world)
        self.stale = s.rng.random() < STALE_SHARE
        #: The VMs placed under proposals (``late0-0``, ``late1-0``, ...).
        self.placed: list[str] = []
        #: Calls that changed a host, per process (a refused approval changes nothing once it settled).
        self.changes: collections.Counter[int] = collections.Counter()
        #: How each approval ended: applied, failed, stale (refused as such), refused (otherwise), locked, killed; and
        #: ``stale_checked``: approvals after a placement that the stale check applied to (module docstring).
        self.outcomes: collections.Counter[str] = collections.Counter()

    def changed(self, c: Call) -> None:
        self.changes[c.process] += 1

    def run(self, pid: int, *, final: bool = False) -> str:
        """One process: the recommending controller's intervals, in a stale schedule a placement (by the first process
        that has proposals, and by the final one), then one `vcsched approve` per open recommendation (the final
        process repairs first)."""
        s = self.s
        if final:
            s.plan = None
            self._repair(pid)
        self.recommend(pid)
        from faultsim.simulation import SimClock
        from vcsched.control.recommend import open_ones

        ids = sorted(r.id for r in open_ones(self.book.read(), SimClock(s.world).time()))
        if not ids:
            return "no plan"
        placed = None
        if self.stale and (final or not self.placed):  # the cluster changes under these proposals
            placed = self.place(s.new_pid())
        results = [self.approve(s.new_pid(), rec_id, placed=placed, final=final) for rec_id in ids]
        return "ok" if "ok" in results else results[-1]

    def _repair(self, pid: int) -> None:
        """The final process settles what the faults left in doubt first (a recommending controller changes no
        host, and there may be nothing to approve): `vcsched repair --apply`."""
        s = self.s
        hv = s.hypervisor()
        try:
            with s.unit_of_work(hv, pid):
                s.check("after the final repair", quiescent=True)
        finally:
            hv.close()

    def recommend(self, pid: int) -> None:
        """``vcsched run --mode recommend`` for :data:`CYCLES` intervals (acting/controller.py): it records what it
        would apply in the book and changes no host."""
        from acting.controller import RunOptions
        from faultsim.simulation import CONTROLLER_INTERVAL_S
        from vcsched.control.rebalance import RebalanceOptions
        from vcsched.formats.windows import ALWAYS

        s = self.s
        options = RunOptions(CONTROLLER_INTERVAL_S, RebalanceOptions(1 << 40, 0.05, 1, 0.0, schedule=ALWAYS),
                             sample=SAMPLE_S, recommend=True)

        def said(e: dict[str, Any]) -> None:
            if e["event"] in ("recommendation", "error"):
                s.note(f"p{pid} event {e['event']}: " + json.dumps({k: v for k, v in e.items()
                                                                   if k in ("id", "kind", "new", "withheld",
                                                                            "error", "during")}))

        s.run_controller(pid, options, CYCLES, said, recommendations=self.book)

    def place(self, pid: int) -> str | None:
        """`vcsched place --apply` of one VM (``lateN-0``) between the proposals and their approval, which go stale:
        its name when it was placed (the command ended ``ok``)."""
        from vcsched.control.admission import admit
        from vcsched.formats.request import Request
        from vcsched.model import SolveOptions

        s = self.s

        def body(hv: Any) -> str:
            with s.unit_of_work(hv, pid) as uow:
                request = Request(f"late{len(self.placed)}", 1, 1, 256 * MIB, cpu_cores=0.5)
                plan = admit(s.cluster, uow.inventory(), request, "mcb8", SolveOptions(seed=0)).plan
                if plan is None:
                    return "no plan"
                report = uow.apply(plan, planned_here=True, threads=False)
                assert report is not None  # no irreversible action: always a report
                return "ok" if report.ok else "stopped"

        vm = f"late{len(self.placed)}-0"
        result = self._own(pid, body)
        s.note(f"p{pid} (place {vm}) ends: {result}")
        self.placed.append(vm)
        return vm if result == "ok" else None

    def approve(self, pid: int, rec_id: str, *, placed: str | None, final: bool) -> str:
        """`vcsched approve ID` (cli/recommend.py): its unit of work, then :func:`acting.approval.approve`.  With
        ``placed`` (a VM placed since ``rec_id`` was made: it is stale) it must be refused, no host changed after
        the settlement on entry (module docstring)."""
        from acting.approval import approve
        from faultsim.simulation import SimClock
        from vcsched.control import recommend as rc
        from vcsched.plans.plan import plan_from_dict

        s = self.s
        settled: list[int] = []
        hiding = self._hiding()
        late = next((h for h in s.world.hosts.values() for d in h.domains.values() if d.name == placed), None)
        seen = late is not None and late.up

        def body(hv: Any) -> str:
            with s.unit_of_work(hv, pid) as uow:
                settled.append(self.changes[pid])
                done = approve(uow, s.cluster, self.book, rec_id, member=f"p{pid}", clock=SimClock(s.world).time,
                               threads=False)
                self.outcomes[done.recommendation.state] += 1
                assert done.report is not None  # the controller proposes no sleep or wake here
                if done.ok and final:
                    s.plan = plan_from_dict(dict(done.recommendation.plan))  # its goal: checked at the end
                if done.ok:
                    return "ok"
                failed = done.report.failed()
                return f"stopped: {done.report.stopped or (failed.detail if failed else '?')}"

        result = "killed"
        try:
            result = self._own(pid, body)
        finally:
            s.note(f"p{pid} (approve {rec_id}) ends: {result}")
            if result.startswith("refused"):
                self.outcomes["stale" if " is stale: " in result else "refused"] += 1
            elif result in ("locked", "killed"):
                self.outcomes[result] += 1
            if seen and settled and self._hiding() == hiding:
                self.outcomes["stale_checked"] += 1
                changed = self.changes[pid] - settled[0]
                if changed or not (result.startswith("refused") or result == "killed"):
                    book = self.book.read()
                    state = book.get(rec_id).state if any(r.id == rec_id for r in book.recommendations) else "?"
                    s.violate(f"recommendation {rec_id}, stale ({placed} placed since it was made), was not refused: "
                              f"{result}, {changed} host change(s), left {state} "
                              f"(p{pid} approve; {rc.summary(book.get(rec_id)) if state != '?' else ''})")
        return result

    def _hiding(self) -> int:
        """Faults injected so far that may hide a host from a read (it does not answer, or its read fails): with one
        during an approval, its inventory may not show the VM that made the recommendation stale."""
        return sum(self.s.out.faults[k] for k in HIDING)

    def _own(self, pid: int, body: Callable[[Any], str]) -> str:
        """``body`` as process ``pid`` (:meth:`Schedule.process`), which, killed, is cleaned up here (its lock freed)
        before the kill ends the schedule's process (the run loop cleans up that one)."""
        s = self.s
        try:
            return s.process(pid, body)
        except ProcessKilled:
            s.note(f"p{pid} killed")
            s.world.process_died(pid)
            if s.lock.holder == pid:
                s.lock.holder = None
            s.check(f"after p{pid} was killed")
            raise
        finally:
            s.rt.alive.discard(pid)
