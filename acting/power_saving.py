"""Power saving in `vcsched run`: what the controller needs to sleep and wake hosts on its own (``power_saving =
"auto"``), to propose it (``"recommend"``) and to carry out an approved proposal (`vcsched approve`).

The decision is pure (:func:`vcsched.control.power.decide`), and so is acting on one host
(:mod:`acting.power`: :func:`sleep_host`, :func:`wake_host`, through the unit of work); this module holds what
sits between them and the controller (acting/controller.py calls it once an interval, docs/power.md §8):

* **when not to sleep at all** (:func:`sleep_held`): while a host is down (it may be failing: recovery first,
  and its VMs need the room), while recorded VMs are lost, while a VM is in doubt, and while any managed VM
  runs below its floor — a sleep only ever takes room away, and the room is what those need;
* **wakes cut short** (:func:`settle_waking`): a controller stopped (SIGTERM, SIGKILL, lost leadership) while a
  host was waking leaves it recorded *waking*; the next interval settles it — on once it answers with the UUID
  it slept with, wake-failed once its deadline has passed without that — so that the record never stays
  *waking* (which would hold every later sleep);
* **the periodic wake test** (:func:`wake_test_due`, cluster field ``wake_test_every``): a host asleep that long
  is woken and put back to sleep, so that a host that no longer wakes is found by a test, not by the demand that
  needed it;
* **proposals** (:func:`proposal`): a sleep or a wake as a recommendation (kinds :data:`SLEEP_KIND`,
  :data:`WAKE_KIND`): its plan (the evacuation, and ``power``: the action and the host), one reason per step,
  the predicted yields and what it saves;
* **approving one** (:func:`carry_out`): re-validated against the live inventory under the cluster lock (the
  host may still sleep, or still sleeps), then carried out by the same :func:`sleep_host` / :func:`wake_host`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from acting.power import Agent, Emit, PowerStore, SleepResult, WakeResult, sleep_host, wake_host
from vcsched.control.power import (
    SLEEP,
    SLEEPING,
    WAKING,
    PowerDecision,
    PowerState,
    overdue,
    sleep_check,
    wake_deadline,
    wake_failed,
    wake_time,
    with_needs,
    woke,
)
from vcsched.errors import VcschedError
from vcsched.formats.cluster import Cluster
from vcsched.formats.units import UNLIMITED
from vcsched.inventory import Inventory
from vcsched.plans.plan import Plan, plan_from_dict
from vcsched.plans.reasons import effect, step_reasons

if TYPE_CHECKING:
    from acting.unit_of_work import UnitOfWork

#: Recommendation kinds of power saving (vcsched/control/recommend.py): approving one sleeps or wakes its host.
SLEEP_KIND, WAKE_KIND = "sleep", "wake"
POWER_KINDS = frozenset({SLEEP_KIND, WAKE_KIND})
#: Intervals of measured needs the demand trend is fitted on (vcsched.control.power.demand_trend).
TREND_INTERVALS = 6


def _quiet(*_: object, **__: object) -> None:
    return None


class Stale(VcschedError):
    """An approved power proposal that no longer holds on the live inventory (exit 1; nothing changed)."""

    exit_code = 1


@dataclass(frozen=True)
class PowerSaving:
    """What `vcsched run` manages power with: the cluster file (its ``power_saving`` mode and settings), the
    cluster's power record, the hosts' power agents, and the bytes an evacuation may migrate."""

    cluster: Cluster
    store: PowerStore
    agent: Agent
    budget: int = UNLIMITED


def sleep_held(inventory: Inventory, below_floor: list[str], lost: int | None) -> str | None:
    """Why no host may sleep this interval whatever the decision says (module docstring), or None.  Waking is
    never held: it only adds room."""
    down = [h.name for h in inventory.down_hosts()]
    if down:
        return f"host(s) {', '.join(down)} down: recovery first, and it needs the room"
    if lost:
        return f"{lost} recorded VM(s) run nowhere: they need the room"
    if [d for d in inventory.in_doubt if d.resolved is None]:
        return "VMs in doubt: settled first"
    if below_floor:
        return f"VM(s) below their floor ({', '.join(sorted(below_floor)[:3])}): they need the room"
    return None


def settle_waking(cluster: Cluster, store: PowerStore, inventory: Inventory, now: float, emit: Emit) -> PowerState:
    """Settle hosts recorded *waking* that no wake is waiting for any more (module docstring): on when they answer
    with the UUID they slept with (the wake's time counted to now, an over-estimate on the safe side — but at most
    its deadline: a controller stopped for an hour mid-wake would otherwise record an hour's wake, kept as the
    host's longest for good), wake-failed once :func:`vcsched.control.power.overdue` (past twice their wake time).
    Returns the record after."""
    state = store.read()
    for host in state.in_state(WAKING):
        record = state.of(host)
        read = next((h for h in inventory.hosts if h.name == host), None)
        if read is not None and read.down is None and read.uuid in (None, record.uuid) and not read.asleep:
            state = store.change(functools.partial(woke, host=host, now=now,
                                                   most=wake_deadline(cluster, state, host)))
            emit("power_woke", host=host, seconds=round(now - record.since, 3), longest=state.of(host).wake_s,
                 settled=True)
    for host in overdue(cluster, state, now):
        record = state.of(host)
        why = (f"its wake was cut short and it did not answer as {record.uuid or 'itself'} within "
               f"{wake_deadline(cluster, state, host):g} s")
        state = store.change(functools.partial(wake_failed, host=host, now=now, reason=why))
        emit("power_wake_failed", host=host, reason=why, seconds=round(now - record.since, 3))
    return state


def wake_test_due(cluster: Cluster, state: PowerState, now: float) -> str | None:
    """The sleeping host to wake and put back to sleep now (``wake_test_every``), the one asleep longest; None when
    the test is off or no host is due.  A host whose wake failed is not tested again until cleared."""
    every = cluster.power.wake_test_every
    if every is None:
        return None
    due = [h for h in state.hosts if h.state == SLEEPING and not h.failed and h.host in cluster.host_names
           and cluster.host(h.host).power.agent is not None and now - h.since >= every]
    return min(due, key=lambda h: (h.since, h.host)).host if due else None


def empty_plan(cluster: Cluster) -> Plan:
    """A plan with nothing to move: putting back to sleep a host just woken for its test (it is empty: nothing
    is planned onto a host while its wake is under the same cluster lock)."""
    return Plan("adapt", cluster.name, "", 1.0, 1.0, {}, ())


# ------------------------------------------------------------------------------------------------ proposals


def proposal(cluster: Cluster, decision: PowerDecision, inventory: Inventory, needs: Mapping[str, float],
             state: PowerState) -> tuple[str, dict[str, Any], tuple[str, ...], dict[str, Any]]:
    """``(kind, plan, step reasons, effect)`` of a recommendation for ``decision`` (a sleep or a wake): the plan
    is the evacuation's (none for a wake) with ``power`` naming the action and the host; the effect is the
    predicted yields before and after (vcsched.plans.reasons.effect) with ``power``: what sleeping it saves
    (its idle_watts), or how long it takes to wake."""
    assert decision.host is not None
    host = decision.host
    evacuation = decision.plan.plan if decision.plan is not None and decision.plan.plan is not None \
        else empty_plan(cluster)
    kind = SLEEP_KIND if decision.action == SLEEP else WAKE_KIND
    doc = evacuation.to_dict() | {"power": {"action": kind, "host": host}}
    reasons = tuple(step_reasons(evacuation, inventory, needs))
    predicted = effect(evacuation, inventory, needs).to_dict()
    power: dict[str, Any] = {"action": kind, "host": host, "reason": decision.reason}
    if kind == SLEEP_KIND:
        power |= {"watts_saved": cluster.host(host).power.idle_watts,
                  "migrated_bytes": int(evacuation.extra.get("migrated_bytes", 0))}
    else:
        power |= {"wake_s": wake_time(cluster, state, host), "measured": state.of(host).wake_s is not None}
    return kind, doc, reasons, predicted | {"power": power}


def power_target(plan: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(action, host)`` of a power proposal's plan; None for any other plan."""
    p = plan.get("power")
    if not isinstance(p, Mapping):
        return None
    return str(p["action"]), str(p["host"])


def carry_out(uow: UnitOfWork, cluster: Cluster, plan: Mapping[str, Any], *, store: PowerStore, agent: Agent,
              needs: Mapping[str, float] | None = None, clock: Callable[[], float] = time.time,
              sleep: Callable[[float], None] = time.sleep, emit: Emit = _quiet) -> SleepResult | WakeResult:
    """Carry out an approved power proposal ``plan`` through ``uow`` (open, the lock held), re-validated first
    against the live inventory: a sleep only if the host may still sleep (:func:`sleep_check`, with ``needs``:
    the controller's current estimates) and its evacuation plan still holds (:meth:`UnitOfWork.apply` replays it
    whole: InputError or PlanMismatch when it does not); a wake only if the host still sleeps and its wake has
    not failed.  :class:`Stale` (nothing changed) otherwise."""
    target = power_target(plan)
    assert target is not None, "not a power proposal"
    action, host = target
    state = store.read()
    if action == SLEEP_KIND:
        why, _ = sleep_check(cluster, uow.inventory(), state, host, clock(), UNLIMITED, needs=needs)
        if why is not None:
            raise Stale(f"{host} may no longer sleep: {why}")
        evacuation = plan_from_dict({k: v for k, v in plan.items() if k != "power"})
        return sleep_host(uow, cluster, host, evacuation, store=store, agent=agent, clock=clock, emit=emit)
    record = state.of(host)
    if record.state != SLEEPING or record.failed:
        now = "wake-failed (`vcsched power clear` first)" if record.failed else record.state
        raise Stale(f"{host} is {now}, no longer asleep: nothing to wake")
    return wake_host(uow, cluster, host, store=store, agent=agent, clock=clock, sleep=sleep, emit=emit)


def room_short_now(cluster: Cluster, inventory: Inventory, needs: Mapping[str, float]) -> bool:
    """Whether the hosts on lack the ``failures_tolerated`` room now, with the measured needs (the metric
    ``vcsched_failover_room_short``: with hosts asleep, an alert)."""
    from vcsched.control.failover import failover_refusal

    if cluster.failures_tolerated <= 0:
        return False
    try:
        return failover_refusal(cluster, with_needs(inventory.up(), needs)) is not None
    except VcschedError:
        return True
