"""What ``vcsched top`` shows of a live cluster, as values: one :class:`TopView` per refresh.

``top`` reads the hosts every refresh (one inventory and a CPU-time reading
per VM, :mod:`acting.sampling`), and this module turns what it read into
rows, with no formula of its own:

* an unmanaged domain's *reservation* (and its host's sum) is the one every
  plan keeps for it (:mod:`vcsched.control.unmanaged`), over ``top``'s window;
* a VM's *use* is its latest sample, and its *estimated need*, whether its
  cap *binds* (saturated) and how the estimate was reached are the need
  estimator's (:func:`vcsched.control.observe.estimate_all`, the one
  `vcsched observe` and `vcsched run` use) over ``top``'s own window of
  samples;
* its *yield* (cap over its estimated need, an upper bound ``≤`` where the
  estimate is censored: :func:`vcsched.control.status.vm_yield`, the one the
  controller uses) and whether it is below its floor, each virtual cluster's
  yield under the policy in force, and each host's caps, use and memory are
  `status`'s (:mod:`vcsched.control.status`);
* the *controller's* view comes from its event log (``vcsched run --log``,
  docs/controller.md): who leads, its last decision, the migrations of a plan
  it has started and not finished (a VM *migrating*), and the hosts it found
  down or on which a step failed since (a host *failed*).

A host that did not answer this refresh is a row saying so (with libvirt's
reason and how long ``top`` has seen it down); its VMs are unknown and not
shown.  A VM found active on two hosts is shown on each, marked in doubt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vcsched.control.lost import Lost
from vcsched.control.observe import DEFAULT_PARAMS, Estimate, ObserveParams, Sample, is_saturated
from vcsched.control.status import below_floor, host_load, vm_yield
from vcsched.control.unmanaged import fills, io_full, unmanaged_io_reserves, unmanaged_reserves
from vcsched.inventory import InDoubt, Inventory

#: Controller events that say what happened (the others, ``interval`` and ``observe``, come every interval).
NOTABLE_EVENTS = frozenset({"start", "stop", "leader", "standby", "decision", "probe", "plan", "step", "applied",
                            "host-down", "host-up", "lock-busy", "error"})


@dataclass(frozen=True)
class HostRow:
    name: str
    cores: int
    caps_cores: float  # the sum of its managed running VMs' caps
    used_cores: float | None  # the cores its VMs used over their latest samples (None: none measured yet)
    memory_used_bytes: int
    memory_usable_bytes: int
    vms: int  # running VMs
    down: str | None = None  # why it did not answer this refresh
    down_for: float | None = None  # seconds top has seen it down
    cordoned: bool = False  # in maintenance (the cluster file)
    failed: str | None = None  # what the controller's log says went wrong on it (module docstring)
    #: Cores kept for its unmanaged domains (vcsched/control/unmanaged.py, over top's window).
    unmanaged_cores: float = 0.0
    #: The declared rates (``disk``, ``net``) its unmanaged domains' measured I/O takes whole
    #: (:func:`vcsched.control.unmanaged.io_full`): nothing needing them is planned onto it.
    unmanaged_io_full: tuple[str, ...] = ()
    #: Powered off by vcsched's power saving (docs/power.md): the power record's word for it (``sleeping``,
    #: ``waking``, ``wake-failed``), shown instead of DOWN — it has not failed.  None: not asleep.
    asleep: str | None = None

    @property
    def unmanaged_over(self) -> bool:
        """Its unmanaged domains reserve all its cores: nothing is planned onto it."""
        return fills(self.unmanaged_cores, self.cores)


@dataclass(frozen=True)
class VmRow:
    name: str
    host: str
    vc: str | None  # None: unmanaged (never touched by vcsched)
    vcpus: int
    active: bool
    cap_cores: float | None
    used_cores: float | None  # latest sample
    saturated: bool | None  # the estimator's verdict: it uses all its cap (None: not measured)
    need_cores: float | None  # declared (recorded in its metadata)
    estimated_cores: float | None
    basis: str | None  # how the estimate was reached (vcsched.control.observe)
    yield_: float | None  # cap / estimated need (declared where there is no estimate), at most 1
    floor: float | None  # the min_yield its virtual cluster was admitted with
    below_floor: bool = False
    paused: bool = False
    in_doubt: bool = False
    migrating: str | None = None  # "h0>h1": a migration in flight (libvirt's arriving copy, or the controller's plan)
    reserved_cores: float | None = None  # an unmanaged domain's reservation on its host (None: managed)
    yield_upper_bound: bool = False  # its estimate is censored: its true yield may be lower


@dataclass(frozen=True)
class Controller:
    """What a running controller's event log says, as of its last line."""

    leader: str | None  # the member leading, per its last leader/standby/stop event
    last_event_at: float | None
    decision: Mapping[str, Any] | None  # its last decision event
    migrating: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # vm -> (from, to), started, not logged
    failed: Mapping[str, str] = field(default_factory=dict)  # host -> what went wrong
    recent: tuple[Mapping[str, Any], ...] = ()  # its last notable events, oldest first


@dataclass(frozen=True)
class TopView:
    cluster: str
    policy: str
    hosts: tuple[HostRow, ...]
    vms: tuple[VmRow, ...]
    #: (name, yield, floor) of each running virtual cluster under the policy in force.
    virtual_clusters: tuple[tuple[str, float, float | None], ...]
    in_doubt: tuple[InDoubt, ...] = ()
    controller: Controller | None = None
    problem: str | None = None  # why the yields could not be computed (e.g. a tenant no longer in the file)
    #: Recorded VMs that run nowhere (vcsched/control/lost.py), read from the definitions store.
    lost: tuple[Lost, ...] = ()
    lost_unknown: str | None = None  # why they could not be read (the definitions store did not answer)

    @property
    def min_yield(self) -> float | None:
        return min((y for _, y, _ in self.virtual_clusters), default=None)

    @property
    def mean_yield(self) -> float | None:
        ys = [y for _, y, _ in self.virtual_clusters]
        return sum(ys) / len(ys) if ys else None

    @property
    def below_floor(self) -> tuple[str, ...]:
        """The virtual clusters whose yield misses the floor they were admitted with."""
        return tuple(name for name, y, floor in self.virtual_clusters if below_floor(y, floor))


def last_estimates(events: Iterable[Mapping[str, Any]]) -> dict[str, Estimate]:
    """The need estimates of a controller's last ``observe`` event (its event log, oldest first): what it plans
    with, so that `status --events` shows the controller's yield."""
    last: Mapping[str, Any] | None = None
    for e in events:
        if e.get("event") == "observe":
            last = e
    return {} if last is None else {str(v["vm"]): Estimate.from_dict(v) for v in last.get("vms", [])}


def controller_state(events: Iterable[Mapping[str, Any]], keep: int = 50) -> Controller:
    """Read a controller's event log (oldest first) for :class:`Controller` (module docstring).

    A migration is in flight from the ``plan`` event that lists it until its
    ``step`` event, or the plan's ``applied`` event, or the controller's
    ``stop``.  A host has *failed* from a ``host-down`` event until its
    ``host-up``, and from a failed ``step`` naming it until a plan applies
    without failure.
    """
    leader: str | None = None
    last_at: float | None = None
    decision: Mapping[str, Any] | None = None
    moving: dict[str, tuple[str, str]] = {}
    down: dict[str, str] = {}
    step_failed: dict[str, str] = {}
    recent: list[Mapping[str, Any]] = []
    for e in events:
        kind = e.get("event")
        last_at = e.get("time", last_at)
        member = e.get("member")
        if kind == "leader":
            leader = member
        elif kind in ("standby", "stop") and member == leader:
            leader = None
        if kind == "decision":
            decision = e
        elif kind == "plan" and not e.get("dry_run"):
            steps = (e.get("plan") or {}).get("steps") or []
            moving = {s["vm"]: (s["from"], s["to"]) for s in steps if s.get("op") == "migrate"}
        elif kind == "step":
            moving.pop(e.get("vm", ""), None)
            if e.get("outcome") in ("failed", "interrupted"):
                for h in {e.get("host"), e.get("from"), e.get("to")} - {None}:
                    step_failed[str(h)] = f"{e.get('op')} {e.get('vm')} failed: {e.get('detail') or 'no detail'}"
        elif kind == "applied":
            moving = {}
            if e.get("ok"):
                step_failed = {}
        elif kind == "stop":
            moving = {}
        elif kind == "host-down":
            down[str(e.get("host"))] = f"the controller found it down: {e.get('reason')}"
        elif kind == "host-up":
            down.pop(str(e.get("host")), None)
        if kind in NOTABLE_EVENTS and not (kind == "decision" and e.get("kind") == "nothing"):
            recent.append(e)
            del recent[:-keep]
    failed = {h: why for h, why in step_failed.items()}
    failed.update(down)
    return Controller(leader, last_at, decision, moving, failed, tuple(recent))


def top_view(inventory: Inventory, policy: str, samples: Mapping[str, Sequence[Sample]],
             estimates: Mapping[str, Estimate], virtual_clusters: Sequence[Mapping[str, Any]], *,
             cordoned: Iterable[str] = (), down_since: Mapping[str, float] | None = None, now: float = 0.0,
             controller: Controller | None = None, problem: str | None = None,
             params: ObserveParams = DEFAULT_PARAMS, lost: Sequence[Lost] = ()) -> TopView:
    """One refresh's :class:`TopView`.

    ``samples``: each VM's window of CPU samples (the latest is its use);
    ``estimates``: :func:`vcsched.control.observe.estimate_all` over them;
    ``virtual_clusters``: :func:`vcsched.control.status.virtual_clusters`;
    ``down_since``: when ``top`` first saw each down host down (Unix time, like
    ``now``).  ``params`` decide saturation for a VM the estimator does not
    cover (unmanaged).
    """
    down_since = down_since or {}
    cordoned = frozenset(cordoned)
    inventory = inventory.with_reserves(unmanaged_reserves(inventory, samples, params),
                                        unmanaged_io_reserves(inventory, samples, params))
    used = {name: w[-1].used_cores for name, w in samples.items() if w}
    io_filled = io_full(inventory)
    hosts = []
    for h in inventory.hosts:
        failed = controller.failed.get(h.name) if controller is not None else None
        if h.down is not None:
            since = down_since.get(h.name)
            hosts.append(HostRow(h.name, h.cores, 0.0, None, 0, 0, 0, h.down,
                                 None if since is None else max(0.0, now - since), h.name in cordoned, failed,
                                 asleep=(h.power or "sleeping") if h.asleep else None))
            continue
        load = host_load(inventory, h.name, used)
        hosts.append(HostRow(h.name, h.cores, load.caps_cores, load.measured_cores, load.memory_used_bytes,
                             h.usable_memory, sum(1 for v in inventory.vms_on(h.name) if v.active),
                             cordoned=h.name in cordoned, failed=failed,
                             unmanaged_cores=inventory.unmanaged_cores(h.name),
                             unmanaged_io_full=io_filled.get(h.name, ())))
    moving = dict(controller.migrating) if controller is not None else {}
    vms = []
    for v in inventory.vms:
        e = estimates.get(v.name)
        window = samples.get(v.name)
        saturated = e.saturated if e is not None and e.samples else (
            is_saturated(window[-1], params) if window else None)
        vy = vm_yield(v, e)
        y = None if vy is None else vy.value
        floor = v.meta.min_yield if v.meta is not None else None
        migrating = f"{v.arriving_from}>{v.host}" if v.arriving_from is not None else (
            f"{moving[v.name][0]}>{moving[v.name][1]}" if v.name in moving else None)
        vms.append(VmRow(v.name, v.host, v.cluster, v.vcpus, v.active, v.cap_cores, used.get(v.name),
                         saturated if v.active else None,
                         v.meta.cpu_need_cores if v.meta is not None else None,
                         e.estimate if e is not None else None, e.basis if e is not None else None,
                         y, floor, below_floor(y, floor), v.paused, v.in_doubt, migrating,
                         v.reserved if v.unmanaged else None, vy is not None and vy.upper_bound))
    vcs = tuple((str(vc["name"]), float(vc["yield"]), vc.get("min_yield")) for vc in virtual_clusters)
    return TopView(inventory.cluster, policy, tuple(hosts), tuple(vms), vcs, inventory.in_doubt, controller,
                   problem, tuple(lost))
