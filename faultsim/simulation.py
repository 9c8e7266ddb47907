"""A deterministic fault simulation of vcsched's acting layer (docs/faultsim.md).

The code under test is vcsched's own: :class:`hypervisor.libvirt_backend.LibvirtHypervisor` (inventory,
migration, in-doubt settlement / repair) and :func:`acting.executor.apply_plan`, driven by plans that
vcsched's own planners compute (``place``: creations and cap changes; ``drain`` and ``adapt``:
migrations and cap changes).  What is simulated: libvirt (:mod:`hypervisor.simlibvirt`), the clock, the
bounded pool and a migration wave's threads (run inline, in order), the cluster lock (:class:`SimLock`:
the etcd lease semantics of :class:`acting.lock.ClusterLock` — held until released, lost when its
lease is, ``guard`` raising :class:`acting.lock.LockLost` — without tooz), and the vcsched processes.

One seeded :class:`random.Random` per schedule decides everything: the starting cluster, the command,
and at every simulated libvirt call whether to inject one fault of :data:`KINDS`.  By index, every
:data:`PROBE_EVERY`-th schedule runs ``vcsched observe --probe`` instead (:meth:`Schedule.observe_probe`:
busy guests, the probe journal, the next process's restore; no cap may stay raised), and every
:data:`TWIN_EVERY`-th starts with a VM in doubt and a host down (:meth:`Schedule.twin`); power schedules (a host
put to sleep, or woken, through acting/power.py, with their own faults and invariants) are in
:mod:`faultsim.power`, and approve schedules (`vcsched run --mode recommend` proposes, `vcsched approve` approves
through :func:`acting.approval.approve`) in :mod:`faultsim.approve`.  The faults:

* ``error``: the call fails with a libvirt error (some transient: the backend retries those);
* ``hang``: the call does not answer within ``host_timeout`` (the clock jumps; keepalive closes the
  connection);
* ``host_down`` / ``host_up``: a host's daemon stops answering (its guests keep running) or answers again;
* ``kill``: the vcsched process dies at this call (SIGKILL): its objects are dropped, its connections close
  (libvirt cancels its incoming migrations), its lock is freed; a new process starts from the hosts' state
  only, repairs, and re-runs the command;
* ``reader``: a second vcsched reads every host at this point (``status``, a dry run, ``observe``);
* ``actor``: a second vcsched tries to act at this point (takes the lock if free, repairs);
* ``lease_lost``: the running process's lock lease runs out (another process may then take the lock).

After every call that changed a host, and after every repair, the invariants are checked
(:meth:`Schedule.check`); at the end all hosts answer again and a fresh process repairs and re-runs the
command, which must converge: the plan's goal reached, or a reported refusal.  A schedule is named by
``(seed, index)`` and replays exactly; its trace lists every call and every fault.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt

from hypervisor import hazards
from hypervisor.simlibvirt import (
    PAUSED,
    RUNNING,
    Call,
    ProcessKilled,
    SimConnection,
    SimDomain,
    SimWorld,
    sim_error,
)
from vcsched.errors import VcschedError
from vcsched.inventory import VmMeta

KINDS = ("error", "hang", "host_down", "host_up", "kill", "reader", "actor", "lease_lost")
#: Relative weights of the fault kinds (per injected fault).
WEIGHTS = (4, 2, 2, 2, 3, 2, 1, 1)
MIB = 1 << 20
#: Hosts of a scenario: three, or four (where a host that is down is less often one a plan names).
HOSTS = (3, 4)
HOST_CORES = 4
HOST_MEMORY = 4096 * MIB
HOST_TIMEOUT_S = 5.0
LEASE_TTL_S = 10.0
#: Distinct starting clusters (and their plans, computed once each): the schedules differ in their faults.
SCENARIOS = 48
#: Processes a schedule may start before its final, fault-free one.
MAX_PROCESSES = 4
CAP_TOL = 1e-6
#: Chance of a fault at each libvirt call (times :data:`MIGRATION_BOOST` at a migration's phases).
DEFAULT_RATE = 0.02
#: How much more often a fault is injected at a migration's phases than at other calls.
MIGRATION_BOOST = 8
#: Every PROBE_EVERY-th schedule (index PROBE_EVERY - 1, 2 PROBE_EVERY - 1, ...) runs ``vcsched observe --probe``
#: instead of its scenario's command (the other schedules are the same with or without it).
PROBE_EVERY = 4
#: Schedules whose index is TWIN_AT modulo TWIN_EVERY start with a VM in doubt (:meth:`Schedule.twin`).
TWIN_EVERY, TWIN_AT = 8, 1
#: Schedules whose index is RECOVER_AT modulo RECOVER_EVERY run ``vcsched recover HOST --apply``
#: (:meth:`Schedule.recover`), except every other one (RESTART_AT modulo RESTART_EVERY), which starts after a
#: recovery that fenced a host and restarted nothing, and runs ``vcsched restart VM... --apply``
#: (:meth:`Schedule.restart`).
RECOVER_EVERY, RECOVER_AT = 8, 5
RESTART_EVERY, RESTART_AT = 16, 13
#: Of the other recover schedules, every other one (CONTROLLER_AT modulo CONTROLLER_EVERY) runs ``vcsched run``'s
#: controller instead (:meth:`Schedule.controller`): its intervals detect the failure, fence, restart, probe and
#: rebalance.
CONTROLLER_EVERY, CONTROLLER_AT = 32, 21
#: The controller's options (simulated seconds): ``--interval 4 --sample 1 --probe-seconds 1``, a host failed
#: after 8 s down, and the intervals one process runs (it may be killed before).
CONTROLLER_INTERVAL_S, CONTROLLER_SAMPLE_S, CONTROLLER_PROBE_S, CONTROLLER_FAILURE_S = 4.0, 1.0, 1.0, 8.0
CONTROLLER_CYCLES = 5
#: Per fencing under faults, the chance that the simulated agent fails (off exits 1: the host stays on), hangs
#: (killed at its timeout; it may have switched the host off all the same), or the process is killed right after
#: the power went off (nothing restarted, nothing recorded as fenced).
FENCE_FAIL, FENCE_HANG, FENCE_KILL = 0.1, 0.1, 0.05
#: With ``--sigterm``: in a controller or probe schedule, the chance that a ``kill`` fault is a SIGTERM instead.
SIGTERM_SHARE = 0.5
#: With ``--floors``: the floor (``min_yield``) of every virtual cluster but the first in the recover, restart and
#: controller schedules.
FLOOR = 0.5
#: With ``--floors``: the share of those schedules whose cluster file says ``on_failure = "strand"``.
STRAND_SHARE = 0.5
#: ``observe --window 4s --sample 1s --probe --probe-seconds 2s`` (simulated seconds).
PROBE_WINDOW_S, PROBE_SAMPLE_S, PROBE_SECONDS_S = 4.0, 1.0, 2.0


@dataclass(frozen=True)
class Extras:
    """Workloads and faults a run adds only when asked (so that the schedules of a plain run stay the ones measured
    and pinned, docs/faultsim.md): ``sigterm``, SIGTERM to the controller (:data:`SIGTERM_SHARE` of its kills);
    ``floors``, virtual clusters with floors in the recover, restart and controller schedules (:data:`FLOOR`)."""

    sigterm: bool = False
    floors: bool = False
    #: Only the schedules whose workload (:func:`workload_of`; "command" for place/drain/adapt) is one of these
    #: (empty: all): the others are skipped, not run.
    only: frozenset[str] = frozenset()

    def runs(self, index: int) -> bool:
        from faultsim.power import kind_of

        return not self.only or (workload_of(index) or kind_of(index) or "command") in self.only


class Violation(BaseException):
    """An invariant does not hold (the message says which, where).

    A BaseException, like :class:`hypervisor.simlibvirt.ProcessKilled`: it is raised inside the code under
    test (at the call that broke the invariant) and must reach the schedule unchanged, not be turned into a
    host error or a "down host" by an ``except Exception`` on its way."""


# ------------------------------------------------------------------------------------------ the stores


class MemoryBackend:
    """The definitions store's backend (:class:`acting.definitions.Backend`) in memory: the coordination backend
    outlives every simulated process and host, as etcd does."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def put(self, key: str, text: str) -> None:
        self.keys[key] = text

    def get(self, key: str) -> str | None:
        return self.keys.get(key)

    def delete(self, key: str) -> None:
        self.keys.pop(key, None)

    def items(self, prefix: str) -> Iterator[tuple[str, str]]:
        yield from sorted((k, v) for k, v in self.keys.items() if k.startswith(prefix + "/"))


#: The workloads in which a host fails (and that ``--floors`` gives floors).
FAILURE_WORKLOADS = ("recover", "restart", "controller")


def workload_of(index: int) -> str | None:
    """What schedule ``index`` runs, by its index alone: ``probe``, ``approve`` (faultsim/approve.py), one of
    :data:`FAILURE_WORKLOADS`, or None (its scenario's command: place, drain or adapt)."""
    if index % PROBE_EVERY == PROBE_EVERY - 1:
        return "probe"
    from faultsim.approve import APPROVE_AT, APPROVE_EVERY

    if index % APPROVE_EVERY == APPROVE_AT:
        return "approve"
    if index % RECOVER_EVERY != RECOVER_AT:
        return None
    if index % CONTROLLER_EVERY == CONTROLLER_AT:
        return "controller"
    return "restart" if index % RESTART_EVERY == RESTART_AT else "recover"


def floor_of(vc: str, floors: bool) -> float | None:
    """The floor of virtual cluster ``vc`` with ``--floors`` (every one but vc0, which keeps none): None without."""
    return FLOOR if floors and vc != "vc0" else None


def store_for(sc: Scenario, floors: bool = False) -> Any:
    """The definitions store of a scenario's cluster, holding a record of each VM it starts with (as if vcsched's
    ``place`` had created them): what ``recover`` reads, and what every step of the simulated commands updates."""
    from acting.definitions import DefinitionStore
    from vcsched.plans.steps import Boot, CreateStep

    store = DefinitionStore(MemoryBackend(), "sim", "memory://sim")
    boot = Boot("kernel", "/sim/vmlinuz", "/sim/initrd")
    for name, host, vcpus, mib, need, cap, vc in sc.vms:
        store.put(CreateStep(name, host, vc, vcpus, mib * MIB, need, cap, boot, floor_of(vc, floors)))
    return store


# ------------------------------------------------------------------------------------------ the lock


class SimLockService:
    """The coordination service (etcd's semantics, on the simulated clock): one holder at a time.

    A holder's heartbeat renews its lease in the background (:meth:`acting.lock.ClusterLock._beat`), so
    the lease ends only when released, when its process dies (the kernel frees a file lock; etcd after the
    TTL: here at once, the worse case) or at a ``lease_lost`` fault: the holder's renewals stop.  Its
    ``held()`` is then False at once (it has seen no renewal for the fence, :data:`acting.lock.
    FENCE_FRACTION` of the TTL), and the lease really expires the rest of the TTL later; from then on another
    process may take the lock, and anything the old holder changes on a host is a violation.
    """

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.holder: int | None = None
        self.expires: float | None = None  # when the holder's lease runs out (None: renewed, not lost)

    def free(self) -> bool:
        return self.holder is None or (self.expires is not None and self.world.now >= self.expires)

    def valid(self, process: int) -> bool:
        """Whether ``process`` holds a lease that has not run out (what acting on a host needs)."""
        return self.holder == process and (self.expires is None or self.world.now < self.expires)

    def lose(self) -> None:
        from acting.lock import FENCE_FRACTION

        self.expires = self.world.now + (1 - FENCE_FRACTION) * LEASE_TTL_S


@dataclass
class SimLock:
    """:class:`acting.lock.ClusterLock`'s contract on :class:`SimLockService` (the controller's ``Lock``)."""

    service: SimLockService
    pid: int
    ttl: float = LEASE_TTL_S
    member: str = ""
    _held: bool = False

    def acquire(self, wait: float = 0.0) -> None:
        from acting.lock import LockBusy

        if not self.service.free():
            raise LockBusy(f"cluster 'sim' is locked by process {self.service.holder}; nothing changed")
        self.service.holder, self.service.expires = self.pid, None
        self._held = True

    def held(self) -> bool:
        return self._held and self.service.holder == self.pid and self.service.expires is None

    def guard(self) -> None:
        from acting.lock import LockLost

        if not self.held():
            raise LockLost("cluster 'sim': cannot renew the lock's lease; no further step is started")

    def release(self) -> None:
        if self.service.holder == self.pid:
            self.service.holder, self.service.expires = None, None
        self._held = False


class Runtime:
    """Routes the real code to the simulation.

    Hosts: through the backend's connection factory (``LibvirtHypervisor(connect=, workers=1, clock=,
    sleep=)``: hosts read inline, in cluster order, on the simulated clock); a wave's migrations run in plan
    order (``apply_plan(threads=False)``).  What has no injection point is swapped for the duration of a batch
    (test-only; docs/faultsim.md): a migration's lease watch is a thread polling ``hv.lease``, here polled by
    the simulated migration at each of its phases; and the probe journal's process identity
    (``journal.own_pid``, ``journal.process_started``) is the simulated process's, alive while it runs.  vcsched's
    state directory (:func:`hypervisor.files.state_dir`: the hosts known down, stamped with the wall clock, the
    power saving's asleep marks, the default probe journals) is a private temporary one: the machine's is shared
    with every other vcsched on it, whose records a schedule must neither read nor receive (issue 37).
    """

    def __init__(self) -> None:
        self.world: SimWorld | None = None
        self.pid = 0
        #: The lease callables of running migrations, by process (the simulated lease watch).
        self.leases: dict[int, list[Callable[[], bool]]] = {}
        #: The simulated vcsched processes still running (the journal's "is its process gone?").
        self.alive: set[int] = set()

    def current(self) -> SimWorld:
        assert self.world is not None
        return self.world

    def connect(self, uri: str) -> SimConnection:
        return self.current().open(self.pid, uri)

    def lease_holds(self, process: int) -> bool:
        return all(lease() for lease in self.leases.get(process, ()))

    @contextlib.contextmanager
    def installed(self) -> Iterator[Runtime]:
        from hypervisor import journal, migration

        rt = self

        @contextlib.contextmanager
        def sim_lease_watch(lease: Callable[[], bool] | None, dom: Any, vm: str, lost: list[str],
                            timeout_s: float | None = None) -> Iterator[None]:
            # The simulation's workloads set no migration timeout (throttles); only the lease is watched here.
            if lease is None:
                yield
                return
            pid = rt.pid
            rt.leases.setdefault(pid, []).append(lease)
            try:
                yield
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_OPERATION_ABORTED:
                    lost.append(f"the cluster lock's lease could expire before the migration of {vm!r} ends: "
                                "aborted it")
                raise
            finally:
                rt.leases[pid].remove(lease)

        def sim_started(pid: int) -> int | None:
            return pid if pid in rt.alive else None

        from hypervisor.files import STATE_DIR_ENV

        state = tempfile.mkdtemp(prefix="vcsched-faultsim-state-")
        state_before = os.environ.get(STATE_DIR_ENV)
        os.environ[STATE_DIR_ENV] = state
        saved: dict[tuple[Any, str], Any] = {(migration, "lease_watch"): migration.lease_watch,
                                             (journal, "process_started"): journal.process_started,
                                             (journal, "own_pid"): journal.own_pid}
        migration.lease_watch = sim_lease_watch
        # A probe journal names its process by pid and start time: here, the simulated process's.
        journal.process_started = sim_started
        journal.own_pid = lambda: rt.pid
        try:
            yield self
        finally:
            for (mod, name), value in saved.items():
                setattr(mod, name, value)
            if state_before is None:
                os.environ.pop(STATE_DIR_ENV, None)
            else:
                os.environ[STATE_DIR_ENV] = state_before
            shutil.rmtree(state, ignore_errors=True)


class SimClock:
    """:class:`acting.sampling.Clock` on the simulated clock (a wait is the clock jumping)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def time(self) -> float:
        return 1_800_000_000.0 + self.world.now

    def monotonic(self) -> float:
        return self.world.now

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        if stop.is_set():
            return True
        self.world.now += max(seconds, 0.0)
        return False


# ------------------------------------------------------------------------------------------ scenarios


@dataclass(frozen=True)
class Scenario:
    """A starting cluster and the command run on it."""

    index: int
    command: str  # "place", "drain" or "adapt"
    hosts: int
    vms: tuple[tuple[str, str, int, int, float, float, str], ...]  # name, host, vcpus, MiB, need, cap, cluster
    drain: str = ""


def scenario(index: int) -> Scenario:
    rng = random.Random(f"scenario/{index}")
    command = ("place", "drain", "adapt")[index % 3]
    n_hosts = HOSTS[index // 3 % len(HOSTS)]
    vms = []
    used: dict[str, float] = collections.defaultdict(float)
    for c in range(rng.randint(1, 3)):
        need = rng.choice((0.5, 1.0, 1.5))
        for k in range(rng.randint(1, 3)):
            host = f"h{rng.randrange(n_hosts)}"
            cap = min(need, 1.0)
            if used[host] + cap > HOST_CORES - 1:
                continue
            used[host] += cap
            vms.append((f"vc{c}-{k}", host, 2 if need > 1 else 1, rng.choice((256, 512, 1024)), need, cap, f"vc{c}"))
    drain = max((f"h{i}" for i in range(n_hosts)), key=lambda h: (used[h], h))
    return Scenario(index, command, n_hosts, tuple(vms), drain)


def build_world(sc: Scenario, floors: bool = False) -> SimWorld:
    from hypervisor.libvirt_backend import metadata_xml

    world = SimWorld(host_timeout=HOST_TIMEOUT_S)
    for i in range(sc.hosts):
        world.add_host(f"h{i}", HOST_CORES, HOST_MEMORY)
    import xml.etree.ElementTree as ET

    for name, host, vcpus, mib, need, cap, vc in sc.vms:
        meta = dict(ET.fromstring(metadata_xml(VmMeta(vc, need, mib * MIB, vcpus, floor_of(vc, floors)),
                                               bare=True)).attrib)
        world.add_domain(host, SimDomain(name, world.new_uuid(), vcpus, mib * MIB, RUNNING, False,
                                         round(cap / vcpus * 100000), 100000, meta))
    # One domain vcsched does not manage: nothing may change it.
    world.add_domain("h0", SimDomain("stranger", world.new_uuid(), 1, 256 * MIB, RUNNING, True, 50000, 100000))
    return world


def cluster_for(sc: Scenario) -> Any:
    from vcsched.formats.cluster import Cluster, ClusterHost, FenceConfig, GuestDefaults

    # Every host has a fence agent (the simulated one, :meth:`Schedule.fence_agent`); the VMs boot from a kernel
    # (no disk), so a recovery strands a VM only for lack of room.
    hosts = tuple(ClusterHost(f"h{i}", f"sim://h{i}", fence=FenceConfig("fence_sim"))
                  for i in range(sc.hosts))
    return Cluster("sim", hosts, 0.0, GuestDefaults("/sim/vmlinuz", "/sim/initrd"), host_timeout=HOST_TIMEOUT_S)


_PLANS: dict[tuple[int, Any, Any], Any] = {}


def plan_on(sc: Scenario, cluster: Any, inv: Any) -> Any:
    """:func:`plan_for` remembered by scenario and inventory (the planners are pure: the same inventory gives
    the same plan, and re-planning the same few states costs most of a schedule's time)."""
    key = (sc.index, cluster.power, inv)  # power schedules plan with power saving on (faultsim/power.py)
    if key not in _PLANS:
        if len(_PLANS) > 20000:
            _PLANS.clear()
        _PLANS[key] = plan_for(sc, cluster, inv)
    return _PLANS[key]


def plan_for(sc: Scenario, cluster: Any, inv: Any) -> Any:
    """The plan vcsched's own planner makes for the scenario's command on ``inv`` (None: nothing to do / refused):
    ``place`` admits a request of one to three VMs, ``drain`` empties a host, ``adapt`` re-balances for needs
    half as large again."""
    from vcsched.control.admission import admit
    from vcsched.control.live import adapt_inventory
    from vcsched.formats.request import Request
    from vcsched.model import SolveOptions
    from vcsched.plans.migration import MigrationBlocked

    if sc.command == "place":
        req = Request("new", 1 + sc.index % 3, 1, 512 * MIB, cpu_cores=1.0)
        return admit(cluster, inv, req, "mcb8", SolveOptions(seed=0)).plan
    try:
        if sc.command == "drain":
            return adapt_inventory(cluster.name, inv, 1 << 40, cluster=cluster, drain=sc.drain).plan
        needs = {v.name: min(float(v.vcpus), v.meta.cpu_need_cores * 1.5) for v in inv.vms if v.managed}
        return adapt_inventory(cluster.name, inv, 1 << 40, cluster=cluster, needs=needs).plan
    except MigrationBlocked:
        return None


# ------------------------------------------------------------------------------------------ a schedule


@dataclass
class Outcome:
    seed: int
    index: int
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    calls: int = 0
    result: str = ""
    workload: str = ""
    #: Approve schedules: how each approval ended (applied, failed, stale, refused, locked, killed).
    approvals: collections.Counter[str] = field(default_factory=collections.Counter)


class Schedule:
    """One seeded run: a scenario, its command under faults, then a fault-free repair and re-run."""

    def __init__(self, rt: Runtime, seed: int, index: int, *, rate: float = DEFAULT_RATE,
                 keep_trace: bool = False, extras: Extras = Extras()) -> None:
        self.rt = rt
        self.extras = extras
        #: The stop event of the running process that handles SIGTERM as an orderly stop (cli/signals.py): the
        #: controller's (`vcsched run`), or the probe's (`observe --probe`); None for the one-shot commands, for
        #: which SIGTERM is Python's default, an end at once — the ``kill`` fault.
        self.stoppable: threading.Event | None = None
        self.rng = random.Random(f"{seed}/{index}")
        #: The thread the schedule runs in: every simulated libvirt call must be made from it (:meth:`hook`).
        self.thread = threading.current_thread()
        self.sc = scenario(self.rng.randrange(SCENARIOS))
        #: The plan the command works on.  ``place`` saves the plan it computed and later processes apply it
        #: (``vcsched apply``); ``drain`` and ``adapt`` either do the same (``-o plan.json``, then ``vcsched
        #: apply``) or plan again in every process on what they read (``--apply``); the final process of a
        #: drain or an adapt plans again.
        self.plan: Any = None
        self.saved = self.sc.command == "place" or self.rng.random() < 0.5
        #: Whether a saved plan is re-applied with ``--force`` (the operator read "changed since this plan was
        #: computed ... or apply anyway with --force" and did).
        self.force = self.rng.random() < 0.3
        #: ``--floors``: this schedule's virtual clusters (all but vc0) have floors (a recover, restart or controller
        #: schedule: the workloads that restart VMs, where floors decide who restarts below them).
        self.floored = extras.floors and workload_of(index) in FAILURE_WORKLOADS
        self.world = build_world(self.sc, self.floored)
        if index % TWIN_EVERY == TWIN_AT:
            self.twin(random.Random(f"twin/{seed}/{index}"))
        self.cluster = cluster_for(self.sc)
        #: ``--floors``: half of those schedules keep the cluster file's ``on_failure = "strand"`` (a VM whose floor
        #: the survivors cannot meet is stranded, listed lost) rather than the default "restart" (below its floor);
        #: drawn apart from the schedule's own draws, so the schedule is otherwise the same.
        if self.floored and random.Random(f"strand/{seed}/{index}").random() < STRAND_SHARE:
            self.cluster = dataclasses.replace(self.cluster, on_failure="strand")
        self.lock = SimLockService(self.world)
        self.out = Outcome(seed, index)
        self.rate = rate
        self.keep_trace = keep_trace
        self.injecting = True
        self.depth = 0
        self.next_pid = 1
        self.live_lock: SimLock | None = None
        #: (process, VM) of migrations whose switch-over (Perform) was made under a valid lease, until Confirm.
        self.switched: set[tuple[int, str | None]] = set()
        self.tracked = {d.uuid: d.name for h in self.world.hosts.values() for d in h.domains.values()
                        if d.meta is not None}
        stranger = next(d for d in self.world.hosts["h0"].domains.values() if d.name == "stranger")
        self.stranger = ("h0", stranger.uuid, self._look(stranger))
        #: ``probe``: this schedule runs ``vcsched observe --probe`` (every guest busy at its cap, so each one
        #: capped below its vCPUs on a host with room is probed); else the scenario's command.
        kind = workload_of(index)
        self.workload = kind if kind in ("probe", "approve") else self.sc.command
        #: The caps vcsched set (the starting ones: a probe schedule changes no cap for good).
        self.caps = {d.uuid: d.cap_cores() for h in self.world.hosts.values() for d in h.domains.values()
                     if d.meta is not None}
        self.journals: Path | None = None  # the probe journals' directory (the state dir's journal/)
        #: The definitions store (in memory, outliving processes): every command records its steps there.
        self.store = store_for(self.sc, self.floored)
        #: ``recover``: the host that fails (the one, h0 aside, with most managed VMs; h0 holds the unmanaged
        #: domain, which a fence would take along) and the UUIDs a fence took away (no copy left: awaiting their
        #: restart), and the VMs the last recovery stranded, with why (legitimately not running at the end).
        self.target = ""
        self.fenced_away: set[str] = set()
        self.powered: set[str] = set()  # hosts a fence switched off (each comes back, if ever, with no guest)
        self.stranded: dict[str, str] = {}
        self.leader: SimLockService | None = None  # the controller's leader lock
        #: ``sleep`` / ``wake``: a power schedule (faultsim/power.py: the host, the record, the agent, the checks).
        self.powerwork: Any = None
        #: ``approve``: `vcsched run --mode recommend` and `vcsched approve` (faultsim/approve.py).
        self.approval: Any = None
        if kind == "approve":
            from faultsim.approve import ApproveWork

            self.approval = ApproveWork(self)
        if kind in FAILURE_WORKLOADS:
            self.workload = "recover"
            per_host = collections.Counter(v[1] for v in self.sc.vms if v[1] != "h0")
            self.target = max((f"h{i}" for i in range(1, self.sc.hosts)), key=lambda h: (per_host[h], h))
            self.world.set_up(self.target, False)
            if kind == "controller":
                self.workload = "controller"
                self.leader = SimLockService(self.world)
                self.cluster = dataclasses.replace(self.cluster, failure_timeout=CONTROLLER_FAILURE_S)
                self.journals = Path(tempfile.mkdtemp(prefix="vcsched-faultsim-journal-"))
            if kind == "restart":  # fenced, nothing restarted: its VMs are lost
                self.workload = "restart"
                self._power_off(self.target)
                self.store.mark_fenced(self.target)
        from faultsim.power import kind_of

        if (kind := kind_of(index)) is not None and self.workload != "probe":
            from faultsim.power import PowerWork, power_cluster

            self.workload = kind
            self.cluster = power_cluster(self.cluster)
            self.powerwork = PowerWork(self, kind)
        self.out.workload = self.workload
        self.burnt = 0.0  # the simulated time up to which the guests' CPU time is counted

    def twin(self, rng: random.Random) -> None:
        """Start where issue 31's first reproduction started: a migration of a VM from A to B failed at its end
        (B stopped answering after Finish; libvirt resumed the source), leaving B a paused arrival beside the
        copy running on A; and a third host does not answer, so repair (which settles only on a full inventory)
        must leave the twin alone and it stays in doubt while commands plan and act."""
        w = self.world
        managed = sorted(((h.name, d) for h in w.hosts.values() for d in h.domains.values() if d.meta is not None),
                         key=lambda hd: (hd[0], hd[1].name))
        if not managed:
            return
        a, d = rng.choice(managed)
        others = sorted(n for n in w.hosts if n != a)
        room = [n for n in others
                if sum(x.memory_bytes for x in w.hosts[n].domains.values() if x.active) + d.memory_bytes
                <= w.hosts[n].memory_bytes]
        if not room:
            return
        b = rng.choice(room)
        w.add_domain(b, SimDomain(d.name, d.uuid, d.vcpus, d.memory_bytes, PAUSED, False, d.quota, d.period,
                                  dict(d.meta or {}, arriving_from=a), reason=libvirt.VIR_DOMAIN_PAUSED_USER))
        w.set_up(rng.choice([n for n in others if n != b]), False)
        # Half the twins are what this vcsched's migration leaves (the attempt recorded on the source: generation
        # 1 on both copies, ``migrating_to`` B on A); the others what an older vcsched left (neither mark).
        if rng.random() < 0.5 and d.meta is not None:
            d.meta = dict(d.meta, generation="1", migrating_to=b)
            d.changed()
            twin = w.hosts[b].domains[d.uuid]
            twin.meta = dict(twin.meta or {}, generation="1")
            twin.changed()

    # -------------------------------------------------------------- tracing

    def note(self, line: str) -> None:
        if self.keep_trace:
            self.out.trace.append(f"t={self.world.now:8.3f} {line}")

    @staticmethod
    def _look(d: SimDomain) -> tuple[Any, ...]:
        return (d.name, d.state, d.quota, d.period, d.vcpus, d.memory_bytes, d.meta, d.persistent)

    # -------------------------------------------------------------- invariants

    def check(self, where: str, *, quiescent: bool = False) -> None:
        w = self.world
        for h in w.hosts.values():
            for d in h.domains.values():
                if d.meta is not None and d.uuid not in self.tracked:
                    self.tracked[d.uuid] = d.name
        for uuid, name in self.tracked.items():
            copies = w.copies(uuid)
            running = [h for h, d in copies if d.state == RUNNING]
            if len(running) > 1:
                self.violate(f"{name} runs on {' and '.join(running)} ({where})")
            if not copies and uuid not in self.fenced_away:
                self.violate(f"{name} is lost: no copy on any host ({where})")
            if quiescent:
                self.runs_once(name, copies, where)
        if self.fenced_away:  # a restart defines the VM again (a new UUID): a VM is its name across UUIDs
            by_name = collections.Counter(d.name for h in w.hosts.values() for d in h.domains.values()
                                          if d.meta is not None and d.state == RUNNING)
            twice = sorted(n for n, k in by_name.items() if k > 1)
            if twice:
                self.violate(f"{twice[0]} runs twice, as two domains ({where})")
        if w.stale:
            self.violate(f"{w.stale[0]} ({where})")
        if self.powerwork is not None:
            self.powerwork.check(where)
        for h in w.hosts.values():
            # Unmanaged domains count for memory, not for CPU (vcsched never caps them: vcsched/plans/check.py).
            cap = sum(d.cap_cores() for d in h.domains.values() if d.state == RUNNING and d.meta is not None)
            if cap > h.cores + CAP_TOL:
                self.violate(f"host {h.name}: caps of running managed domains {cap:.3f} > {h.cores} cores ({where})")
            mem = sum(d.memory_bytes for d in h.domains.values() if d.active)
            if mem > h.memory_bytes:
                self.violate(f"host {h.name}: memory {mem >> 20} MiB > {h.memory_bytes >> 20} MiB ({where})")
        host, uuid, look = self.stranger
        if host in self.powered:  # a fence took it along, as it takes every guest of its host
            return
        now = w.hosts[host].domains.get(uuid)
        if now is None or self._look(now) != look or any(uuid in h.domains for h in w.hosts.values() if h.name != host):
            self.violate(f"the unmanaged domain 'stranger' was changed ({where})")

    def runs_once(self, name: str, copies: list[tuple[str, SimDomain]], where: str) -> None:
        """At quiescence (after the final process's repair, and at the very end): every VM recorded as managed
        (every UUID that ever carried vcsched's metadata) runs exactly once — none lost, none paused on every
        host it is on, no stale copy left beside it."""
        running = [h for h, d in copies if d.state == RUNNING]
        if len(copies) == 1 and running:
            return
        if not copies and self.fenced_away:
            # A fenced copy: the VM must run again as another domain (itself checked), or be stranded with a reason.
            if name in self.stranded or any(d.name == name and d.meta is not None for h in self.world.hosts.values()
                                            for d in h.domains.values()):
                return
            self.violate(f"{name} does not run after its host was fenced, and no recovery stranded it: lost "
                         f"({where})")
        seen = [(h, _STATE.get(d.state, d.state)) for h, d in copies]
        if not copies:
            why = "lost: no copy on any host"
        elif not running:
            why = f"paused everywhere, running nowhere: {seen}"
        else:
            why = f"not settled: {seen}"
        self.violate(f"{name} does not run exactly once after repair: {why} ({where})")

    def after(self, c: Call) -> None:
        """After every call that changed a host: only the holder of a valid lease changes hosts, and the
        invariants hold."""
        where = f"p{c.process} {c.host}.{c.method}({c.vm or ''})"
        valid = self.lock.valid(c.process)
        if c.method == "migrate.perform" and valid:
            self.switched.add((c.process, c.vm))
        # Exempt: libvirt's client library completing a migration, not a decision of vcsched — Confirm(cancelled)
        # of a failed one, and Finish and Confirm of one whose switch-over was made under a valid lease (after the
        # switch-over the job cannot be aborted; until Confirm the source's job keeps every other process's repair
        # and steps off the VM).  Found at seed 7, schedule 3185: the process stalled 5 s between Finish and
        # Confirm (another process's read ran in between) and its lease expired meanwhile.
        completing = c.method in ("migrate.finish", "migrate.confirm") and (c.process, c.vm) in self.switched
        if not valid and c.method != "migrate.confirm-cancelled" and not completing:
            who = "without the lock" if self.lock.holder != c.process else "after its lease ran out"
            self.violate(f"a host was changed {who}: {where}")
        if c.method == "migrate.confirm":
            self.switched.discard((c.process, c.vm))
        if self.approval is not None:
            self.approval.changed(c)
        self.check(f"after {where}")

    def violate(self, what: str) -> None:
        if what not in self.out.violations:
            self.out.violations.append(what)
            self.note(f"VIOLATION {what}")
            raise Violation(what)

    # -------------------------------------------------------------- the fault hook

    def hook(self, c: Call) -> None:
        if threading.current_thread() is not self.thread and not any("from thread" in v for v in self.out.violations):
            # A schedule replays exactly only if every call is made in the schedule's own thread, in program order:
            # calls from a thread (a migration wave's, issue 37) interleave as the OS schedules them.
            self.out.violations.append(f"crash: p{c.process} {c.host}.{c.method}({c.vm or ''}) called from thread "
                                       f"{threading.current_thread().name}: the schedule cannot replay exactly")
        if self.keep_trace:
            self.note(f"p{c.process} {c.host}.{c.method}({c.vm or ''})")
        if self.workload in ("probe", "controller", "approve"):
            self._burn()
        if not self.injecting or self.depth:
            return
        if self.powerwork is not None:
            self.powerwork.hook(c)
        if self.lock.expires is not None and self.lock.free() and self.rng.random() < 0.2:
            self.fault("actor", "after the lease ran out")  # someone takes the lock the old holder lost
            self.second(act=True)
            return
        roll = self.rng.random()
        if c.method.startswith("migrate."):
            roll /= MIGRATION_BOOST  # the migration's phases are where copies multiply: look there harder
        if roll >= self.rate:
            # A host that stopped answering comes back after a while (about 50 calls).
            if roll < self.rate + 0.02 and any(not h.up for h in self.world.hosts.values()):
                self._host_up()
            return
        kind = self.rng.choices(KINDS, WEIGHTS)[0]
        host = self.world.hosts[c.host]
        if kind == "host_up":
            self._host_up()
            return
        if kind == "host_down":
            name = c.host if self.rng.random() < 0.5 else self.rng.choice(sorted(self.world.hosts))
            if not self.world.hosts[name].up:
                return
            self.fault(kind, f"{name} stops answering")
            self.world.set_up(name, False)
            return
        if kind == "error":
            code = self.rng.choice((libvirt.VIR_ERR_OPERATION_FAILED, libvirt.VIR_ERR_INTERNAL_ERROR,
                                    libvirt.VIR_ERR_RPC, libvirt.VIR_ERR_OPERATION_INVALID))
            self.fault(kind, f"{c.host}.{c.method} fails with code {code}")
            raise sim_error(code, f"injected failure of {c.method} on {c.host}")
        if kind == "hang":
            self.fault(kind, f"{c.host}.{c.method} hangs past host_timeout")
            self.world.now += self.world.host_timeout
            for conn in self.world.open_conns.get(c.process, []):
                if conn.host is host:
                    conn.closed = True
            raise sim_error(libvirt.VIR_ERR_INTERNAL_ERROR, "internal error: connection closed due to keepalive "
                            "timeout")
        if kind == "kill" and self.stoppable is not None and self.extras.sigterm and self.rng.random() < SIGTERM_SHARE:
            if not self.stoppable.is_set():
                self.fault("sigterm", f"process {c.process} receives SIGTERM at {c.host}.{c.method}")
                self.stoppable.set()  # the running step finishes; no further step starts (a probe: caps put back)
            return
        if kind == "kill":
            self.fault(kind, f"process {c.process} killed at {c.host}.{c.method}")
            self.world.process_died(c.process)  # from here on, nothing of it reaches a host
            raise ProcessKilled(c.process)
        if kind == "lease_lost":
            if self.lock.holder != c.process or self.lock.expires is not None:
                return
            self.fault(kind, f"process {c.process} can no longer renew its lease")
            self.lock.lose()
            return
        self.fault(kind, "")
        self.second(act=kind == "actor")

    def _burn(self) -> None:
        """Every running guest has used its whole cap since the last call (busy guests: the ones a probe is for)."""
        w = self.world
        dt = w.now - self.burnt
        if dt <= 0:
            return
        for h in w.hosts.values():
            for d in h.domains.values():
                if d.state == RUNNING:
                    d.cpu_ns += int(d.cap_cores() * dt * 1e9)
        self.burnt = w.now

    def check_caps(self, where: str) -> None:
        """No managed VM's cap differs from the one vcsched last set for good (a probe's raise is not for good)."""
        for uuid, cap in self.caps.items():
            for host, d in self.world.copies(uuid):
                if d.state == RUNNING and abs(d.cap_cores() - cap) > CAP_TOL:
                    self.violate(f"{d.name} left at cap {d.cap_cores():.3f} on {host}, not its {cap:.3f} "
                                 f"(a probe's raise not put back) ({where})")

    def _host_up(self) -> None:
        down = sorted(n for n, h in self.world.hosts.items() if not h.up)
        if self.target in down and self.target not in self.powered and self.rng.random() < 0.8:
            down.remove(self.target)  # the failed host mostly stays failed until recovered (else nothing to recover)
        if self.powerwork is not None and self.powerwork.off & set(down) and self.rng.random() < 0.8:
            down = [n for n in down if n not in self.powerwork.off]  # a host asleep mostly stays asleep
        if not down:
            return
        name = self.rng.choice(down)
        self.fault("host_up", f"{name} answers again")
        if name in self.powered:
            self.fault("fenced_back", f"{name}, fenced, is powered on again: it answers with no guest")
        self.world.set_up(name, True)
        self.check(f"after {name} came back")

    def fault(self, kind: str, what: str) -> None:
        self.out.faults[kind] += 1
        self.note(f"FAULT {kind} {what}")

    def second(self, *, act: bool) -> None:
        """Another vcsched process at this point: it reads every host, or takes the lock and repairs."""
        outer = self.rt.pid
        pid = self.new_pid()
        self.depth += 1
        self.note(f"p{pid} starts ({'acting' if act else 'reading'}) inside p{outer}")
        try:
            if act:
                self.command(pid, repair_only=True)
            else:
                self.read(pid)
        except ProcessKilled:  # pragma: no cover - no faults are injected into a second process
            raise
        finally:
            self.world.process_died(pid)
            self.rt.alive.discard(pid)
            self.depth -= 1
            self.rt.pid = outer

    def new_pid(self) -> int:
        pid = self.next_pid
        self.next_pid += 1
        self.rt.pid = pid
        self.rt.alive.add(pid)
        return pid

    # -------------------------------------------------------------- processes

    def hypervisor(self) -> Any:
        from hypervisor.libvirt_backend import LibvirtHypervisor

        w = self.world

        def sleep(s: float) -> None:
            w.now += s

        return LibvirtHypervisor(self.cluster, connect=self.rt.connect, workers=1,
                                 clock=lambda: 1_800_000_000.0 + w.now, sleep=sleep)

    def read(self, pid: int) -> None:
        """``status`` / a dry run / ``observe``: an inventory, no lock (as the CLI constructs it)."""
        hv = self.hypervisor()
        with contextlib.suppress(VcschedError):
            hv.inventory()
        hv.close()

    def unit_of_work(self, hv: Any, pid: int) -> Any:
        """The real unit of work (acting/unit_of_work.py) of process ``pid``, on the simulated libvirt and lock:
        the lock, the lease, in-doubt VMs settled first (each settlement noted, and the invariants checked right
        after it), the whole-plan check, the executor."""
        from acting.unit_of_work import Reporting, UnitOfWork

        def settled(report: Any) -> None:
            self.note(f"p{self.rt.pid} repair: {'; '.join(report.lines()) or 'nothing in doubt'}")
            self.check("after repair")

        return UnitOfWork(hv, SimLock(self.lock, pid), store=self.store, reporting=Reporting(settled=settled),
                          power=None if self.powerwork is None else self.powerwork.store.read, threads=False)

    def command(self, pid: int, *, repair_only: bool = False, final: bool = False) -> str:
        """A command that changes hosts (cli/common.py's ``acting_on``): its unit of work — the lock, a repair —
        then the plan through it and the real executor."""
        from acting.lock import LockBusy

        hv = self.hypervisor()
        try:
            with self.unit_of_work(hv, pid) as uow:
                if self.workload == "probe":
                    # `vcsched repair --apply` restores the journals of gone processes
                    self.restore_probes(hv, uow.lock_guard)
                if final:
                    self.check("after the final repair", quiescent=True)
                if repair_only:
                    return "repaired"
                if self.plan is None or not self.saved or (final and self.sc.command != "place"):
                    self.plan = plan_on(self.sc, self.cluster, uow.inventory())
                    if self.plan is None:
                        return "no plan"
                report = uow.apply(self.plan, force=self.saved and self.force, threads=False)
                assert report is not None  # no irreversible action: always a report
                if report.ok:
                    return "ok"
                failed = report.failed()
                return f"stopped: {report.stopped or (failed.detail if failed else '?')}"
        except LockBusy as exc:
            self.note(f"p{pid} refused: {exc}")
            return "locked"
        except VcschedError as exc:
            if getattr(exc, "exit_code", 1) == 70:  # vcsched says it is its own bug (HostReadBug): a violation
                raise
            return f"refused: {type(exc).__name__}: {exc}"
        finally:
            hv.close()

    def recover(self, pid: int, *, final: bool = False) -> str:
        """``vcsched recover HOST --apply`` (cli/recover.py): its unit of work (the lock, a repair), then the product's
        own recovery, :func:`acting.recovery.recover_host`: planned from the definitions store's records, validated
        whole, then fenced (:meth:`fence_agent`), then the creates.  A fence followed by a refused plan loses the
        host's VMs: that is a violation here (the order the unit of work enforces; the switch
        ``fence-before-validate``)."""
        from acting.recovery import NotFailed, RecoveryRun, recover_host

        def body(hv: Any) -> str:
            fenced: list[bool] = []

            def planned(run: RecoveryRun) -> None:
                recovery = run.recovery
                self.stranded = dict((*recovery.stranded, *recovery.waiting))  # waiting: another host not fenced
                self.note(f"p{pid} recovery of {self.target}: restarts {list(recovery.restarts)}, "
                          f"stranded {recovery.stranded}, waiting {recovery.waiting}, running {list(recovery.running)}")

            with self.unit_of_work(hv, pid) as uow:
                try:
                    run = recover_host(uow, self.cluster, self.store, uow.inventory(), self.target,
                                       fence=self.fence_of(fenced, final=final), planned=planned, threads=False)
                except NotFailed as exc:  # cli/recover.py: answers, or powered off by vcsched, empty
                    return (f"refused: host {self.target} is asleep: it has not failed" if exc.asleep
                            else f"refused: host {self.target} answers: it has not failed")
                recovery, refused = run.recovery, run.refused
                if refused is not None:
                    if fenced and fenced[-1]:
                        self.violate(f"{self.target} fenced, then its recovery plan refused: its VMs "
                                     f"{[r.vm for r in run.records]} run nowhere ({type(refused).__name__}: {refused})")
                    return f"refused: {type(refused).__name__}: {refused}"
                if recovery.plan is None:
                    return f"stranded: {recovery.stranded}" if recovery.stranded else "ok"
                return "not fenced: nothing restarted" if run.report is None else _ended(run.report, recovery.stranded)

        return self.process(pid, body)

    def fence_of(self, fenced: list[bool], *, final: bool = False) -> Callable[[Any], Any]:
        """The fence a recovery is given (:func:`acting.fence.fence_host`'s place): :meth:`fence_agent`, its answer as
        a :class:`acting.fence.FenceResult`; ``fenced`` gets, at each fence, whether the host is then off."""
        from acting.fence import FenceResult

        def fence(host: Any) -> FenceResult:
            ok = self.fence_agent(host.name, final=final)
            fenced.append(host.name in self.powered)
            return FenceResult(host.name, "fence_sim", ok, "off, then status off" if ok else "the agent failed", 0.0)

        return fence

    def controller(self, pid: int, *, final: bool = False) -> str:
        """``vcsched run`` (acting/controller.py's :class:`Controller`, act mode) for :data:`CONTROLLER_CYCLES`
        intervals (the final process: enough for the failed host to be declared failed, fenced and its VMs
        restarted): each interval samples, restarts lost VMs, detects the failed host and recovers it (fencing
        with :meth:`fence_agent`), probes and rebalances, through its unit of work.  The VMs it strands (its
        ``vm_stranded`` events) may legitimately not run at the end."""
        import json

        from acting.controller import RunOptions
        from acting.failure import Failover
        from vcsched.control.rebalance import RebalanceOptions
        from vcsched.formats.windows import ALWAYS

        options = RunOptions(CONTROLLER_INTERVAL_S, RebalanceOptions(1 << 40, 0.05, 1, 0.0, schedule=ALWAYS),
                             sample=CONTROLLER_SAMPLE_S, probe_seconds=CONTROLLER_PROBE_S)

        def said(e: dict[str, Any]) -> None:
            if e["event"] in ("vm_stranded", "vm_waiting"):
                self.stranded[e["vm"]] = e["reason"]
            elif e["event"] in ("vm_restarted", "host_fenced", "applied", "host_failed", "error"):
                self.note(f"p{pid} event {e['event']}: " + json.dumps({k: v for k, v in e.items()
                                                                      if k not in ("time", "member", "event")}))

        stopped = self.run_controller(pid, options, CONTROLLER_CYCLES * (3 if final else 1), said,
                                      journals=self.journals,
                                      failover=Failover(self.cluster, self.store, fence=self.fence_of([], final=final)),
                                      power=None if self.powerwork is None else self.powerwork.store.read)
        return "stopped (SIGTERM)" if stopped else "ok"

    def run_controller(self, pid: int, options: Any, cycles: int, said: Callable[[dict[str, Any]], None],
                       **components: Any) -> bool:
        """A simulated `vcsched run` process (acting/controller.py's :class:`Controller`, any mode): ``cycles``
        intervals on the simulated hosts, clock, leader lock and cluster lock, its waves in plan order; a SIGTERM
        (:attr:`stoppable`) ends it as ``run()`` does (``finish``), after which the invariants are checked.  Each
        event it emitted is handed to ``said`` once it ends (killed or not), and the locks it held are free.
        ``components``: the controller's own (a failover, the recommendations book, ...).  Whether it stopped on
        SIGTERM."""
        import io
        import json

        from acting.controller import Controller
        from acting.events import EventLog
        from acting.metrics import ControllerMetrics

        assert self.leader is not None
        leader = self.leader
        hv = self.hypervisor()
        clock = SimClock(self.world)
        stream = io.StringIO()
        ctl = Controller("sim", hv, options, leader_lock=lambda: SimLock(leader, pid),
                         cluster_lock=lambda: SimLock(self.lock, pid), events=EventLog(stream, f"p{pid}", clock.time),
                         metrics=ControllerMetrics("sim"), clock=clock, threads=False, **components)
        self.stoppable = ctl.stop
        try:
            for _ in range(cycles):
                if ctl.stop.is_set():
                    break
                ctl.cycle()
            if ctl.stop.is_set():  # SIGTERM: run()'s way out, then the process ends
                ctl.finish()
                self.note(f"p{pid} stopped (SIGTERM)")
                self.check(f"after p{pid} stopped")
        finally:
            self.stoppable = None
            hv.close()
            for line in stream.getvalue().splitlines():
                said(json.loads(line))
            if leader.holder == pid:
                leader.holder = None
            if self.lock.holder == pid:
                self.lock.holder = None
        return ctl.stop.is_set()

    def restart(self, pid: int, *, final: bool = False) -> str:
        """``vcsched restart VM... --apply`` (cli/restart.py) for every VM the store says is lost: its unit of work,
        then the product's own restart, :func:`acting.recovery.restart_lost` (below floors allowed: naming a VM is
        choosing that it runs).  The VMs it refuses (no room) are stranded, with the reason."""
        from acting.recovery import RestartRun, restart_lost

        def planned(run: RestartRun) -> None:
            restart = run.restart
            self.stranded = dict(restart.refused)
            self.note(f"p{pid} restart of {sorted(r.vm for r in run.records)}: {list(restart.restarts)}, "
                      f"refused {restart.refused}")

        def body(hv: Any) -> str:
            with self.unit_of_work(hv, pid) as uow:
                run = restart_lost(uow, self.cluster, self.store, uow.inventory(), below_floor_ok=True,
                                   planned=planned, threads=False)
                if run.report is None:
                    return f"stranded: {run.restart.refused}" if run.restart.refused else "ok"
                return _ended(run.report, run.restart.refused)

        return self.process(pid, body)

    def process(self, pid: int, body: Callable[[Any], str]) -> str:
        """A vcsched process that acts: ``body`` on a fresh adapter; what the CLI turns into exit 1 (the lock busy,
        a refusal) is its result, a bug of vcsched's own (exit 70) a violation."""
        from acting.lock import LockBusy

        hv = self.hypervisor()
        try:
            return body(hv)
        except LockBusy as exc:
            self.note(f"p{pid} refused: {exc}")
            return "locked"
        except VcschedError as exc:
            if getattr(exc, "exit_code", 1) == 70:
                raise
            return f"refused: {type(exc).__name__}: {exc}"
        finally:
            hv.close()

    def fence_agent(self, host: str, *, final: bool = False) -> bool:
        """The fence agent of ``host`` (cli/recover.py runs :func:`acting.fence.fence_host`: ``off``, then
        ``status``), simulated: it switches the host off (:meth:`SimWorld.power_off`: its guests gone) and says
        so.  Under faults it may fail (the host stays on, its guests run), hang (killed at its timeout, the clock
        jumps; the host may be off all the same, but vcsched cannot know), or the process may die right after
        the power went off.  Returns whether the fence is confirmed (``FenceResult.fenced``)."""
        from acting.fence import DEFAULT_AGENT_TIMEOUT_S

        roll = self.rng.random() if self.injecting and not final else 1.0
        if roll < FENCE_FAIL:
            self.fault("fence_fail", f"the fence agent of {host}: off exits 1")
            return False
        if roll < FENCE_FAIL + FENCE_HANG:
            self.world.now += DEFAULT_AGENT_TIMEOUT_S
            off = self.rng.random() < 0.5
            self.fault("fence_hang", f"the fence agent of {host} killed at its timeout"
                       + (" (it had switched the host off)" if off else ""))
            if off:
                self._power_off(host)
            return False
        self._power_off(host)
        self.note(f"p{self.rt.pid} fenced {host}: off, then status off")
        if roll < FENCE_FAIL + FENCE_HANG + FENCE_KILL:
            self.fault("kill", f"process {self.rt.pid} killed right after {host} was fenced")
            self.world.process_died(self.rt.pid)
            raise ProcessKilled(self.rt.pid)
        return True

    def _power_off(self, host: str) -> None:
        self.fenced_away |= {d.uuid for d in self.world.hosts[host].domains.values() if d.meta is not None}
        # A paused arrival from this host that libvirt was not recorded to have completed: repair destroys it
        # (vcsched/plans/repair.py SOURCE_FENCED: the source may have run past its state) and the VM is restarted
        # from its record, as the fenced host's own VMs are — its state went with the fence as theirs did (seed 1,
        # schedule 7157: the source's copy was confirmed away before the fence, the mark not written, lease lost).
        self.fenced_away |= {d.uuid for h in self.world.hosts.values() if h.name != host
                             for d in h.domains.values()
                             if d.meta is not None and d.meta.get("arriving_from") == host
                             and d.meta.get("completed") != "true"}
        self.world.power_off(host)
        self.powered.add(host)
        self.check(f"after {host} was fenced")

    def restore_probes(self, hv: Any, guard: Callable[[], None]) -> None:
        """What `vcsched run`, `observe --probe` and `repair --apply` do under the lock: put back the caps of
        probes whose process is gone (:func:`acting.restore.restore_journal`)."""
        from acting.restore import restore_journal
        from hypervisor.journal import PROBE

        report = restore_journal(hv, kinds=(PROBE,), directory=self.journals, guard=guard)
        if report.restored or report.problems:
            self.note(f"p{self.rt.pid} journal: {'; '.join(report.restored + report.problems)}")
        self.check("after the journal's restore")

    def observe_probe(self, pid: int, *, final: bool = False) -> str:
        """``vcsched observe --probe`` (cli/observe.py): sample without the lock, take it, repair, put back the
        caps of killed probes, then probe (:func:`acting.sampling.probe_and_restore`) and put the caps back.
        The final process checks, after its restore, that no cap is left raised, then probes once more."""
        from acting.sampling import CpuSampler, probe_and_restore
        from hypervisor.journal import PROBE, Journal

        def body(hv: Any) -> str:
            stop = threading.Event()  # set by SIGTERM or Ctrl-C in cli/observe.py (cli/signals.py)
            self.stoppable = stop
            try:
                return probe(hv, stop)
            finally:
                self.stoppable = None

        def probe(hv: Any, stop: threading.Event) -> str:
            sampler = CpuSampler(PROBE_WINDOW_S + PROBE_SAMPLE_S, SimClock(self.world))
            sampler.sample_for(hv, PROBE_WINDOW_S, PROBE_SAMPLE_S, stop)
            with self.unit_of_work(hv, pid) as uow:  # in-doubt VMs settled first
                self.restore_probes(hv, uow.lock_guard)
                if final:
                    self.check("after the final restore", quiescent=True)
                    self.check_caps("after the final restore")
                done, _inv, _est = probe_and_restore(hv, sampler, PROBE_SECONDS_S, PROBE_SAMPLE_S, stop,
                                                     uow.lock_guard,
                                                     journal=Journal(PROBE, self.journals or Path("."), pid=pid))
                self.note(f"p{pid} probed {dict(done.caps)}")
                if final:
                    self.check_caps("after the final probe")
                failed = [what for what, r in done.reports().items() if not r.ok]
                if stop.is_set():  # cli/observe.py: Interrupted (exit 128 + the signal); what it could not put
                    # back stays journaled, and the final process checks that no cap is left raised
                    return "stopped (SIGTERM)" + (f": {', '.join(failed)} not ok" if failed else "")
                return f"stopped: {', '.join(failed)} not ok" if failed else "ok"

        return self.process(pid, body)

    def goal(self) -> None:
        """The plan's goal: each VM it predicts on its host, running once, with its cap."""
        if self.plan is None:
            return
        from vcsched.caps import realisable_cap

        for name, p in self.plan.per_vm.items():
            found = [(h.name, d) for h in self.world.hosts.values() for d in h.domains.values() if d.name == name]
            if len(found) != 1 or found[0][0] != p.host or found[0][1].state != RUNNING:
                self.violate(f"did not converge: {name} is {[(h, _STATE.get(d.state)) for h, d in found]}, "
                             f"the plan puts it on {p.host}")
            d = found[0][1]
            want = realisable_cap(p.cap_cores, d.vcpus)
            if abs(d.cap_cores() - want) > CAP_TOL:
                self.violate(f"did not converge: {name} capped at {d.cap_cores():.4f}, the plan says {want:.4f}")

    def run(self) -> Outcome:
        w = self.world
        self.rt.world = w
        w.hook = self.hook
        w.abort_wanted = lambda pid: not self.rt.lease_holds(pid)
        w.after = self.after
        self.note(f"scenario {self.sc.index}: {self.sc.command}"
                  f"{' ' + self.sc.drain if self.sc.command == 'drain' else ''}, vms {[v[:2] for v in self.sc.vms]}")
        probing = self.workload == "probe"
        if probing:
            self.journals = Path(tempfile.mkdtemp(prefix="vcsched-faultsim-journal-"))
            self.note("workload: observe --probe")
        run = {"probe": self.observe_probe, "recover": self.recover, "restart": self.restart,
               "controller": self.controller}.get(self.workload, self.command)
        if self.approval is not None:
            run = self.approval.run
            self.note(f"workload: approve ({'a VM placed before the approvals' if self.approval.stale else 'fresh'})")
        if self.powerwork is not None:
            run = self.powerwork.run
            self.note(f"workload: {self.workload} {self.powerwork.host} (with {self.powerwork.companion})")
        if self.workload in ("recover", "restart", "controller"):
            self.note(f"workload: {self.workload} ({self.target} does not answer"
                      f"{', fenced, nothing restarted' if self.workload == 'restart' else ''})")
        try:
            if self.powerwork is not None:
                self.powerwork.start()
            result = ""
            for _ in range(MAX_PROCESSES):
                pid = self.new_pid()
                try:
                    result = run(pid)
                    self.note(f"p{pid} ends: {result}")
                except ProcessKilled:
                    self.note(f"p{pid} killed")
                    w.process_died(pid)
                    self.lock.holder = None if self.lock.holder == pid else self.lock.holder
                    if self.leader is not None and self.leader.holder == pid:
                        self.leader.holder = None
                    self.check(f"after p{pid} was killed")
                finally:
                    self.rt.alive.discard(pid)
                if result == "ok":
                    break
                # The operator (or systemd) runs the command again, perhaps once a host answers again.
                if self.rng.random() < 0.7:
                    self._host_up()
            # The end: faults stop, every host answers, a fresh process repairs and re-runs the command.
            self.injecting = False
            for name in sorted(w.hosts):
                if self.powerwork is None or name not in self.powerwork.off:  # a host asleep stays off
                    w.set_up(name, True)
            self.check("after every host answers again")
            if self.workload in ("recover", "controller"):  # the host fails again (or still): a last recovery
                w.set_up(self.target, False)
            self.lock.holder = None
            pid = self.new_pid()
            result = run(pid, final=True)
            self.rt.alive.discard(pid)
            self.note(f"p{pid} (final) ends: {result}")
            if self.workload == "recover" and (result == "ok" or result.startswith("stranded")):
                # What the operator runs next (`status` lists them): a restart of the VMs that are lost (a recovery's
                # create cut short leaves its VM recorded on the host it was created on, which may not hold it).
                result = self.restart(self.new_pid(), final=True)
                self.rt.alive.discard(self.rt.pid)
                self.note(f"p{self.rt.pid} (final restart) ends: {result}")
            self.out.result = result
            self.check("at the end", quiescent=True)
            if self.workload in ("recover", "restart", "controller"):
                w.set_up(self.target, True)  # powered on again: a fenced host comes back with no guest
                self.check(f"after {self.target} answers again", quiescent=True)
                if not (result == "ok" or result.startswith("stranded")):
                    self.violate(f"did not converge: the final {self.workload} {result}")
            elif self.powerwork is not None:
                self.powerwork.final(result)
            elif result in ("ok", "no plan"):
                if not probing:
                    self.goal()
            elif not result.startswith("refused"):
                self.violate(f"did not converge: the final re-run {result}")
        except Violation:
            pass
        except Exception as exc:  # a bug of the code under test or of the simulation: reported as a violation
            import traceback

            self.out.violations.append(f"crash: {type(exc).__name__}: {exc}")
            self.note("CRASH " + "".join(traceback.format_exception(exc))[-2000:])
        finally:
            w.hook = w.after = None
            self.out.calls = w.calls
            if self.approval is not None:
                self.out.approvals = self.approval.outcomes
            self.rt.alive.clear()
            if self.journals is not None:
                shutil.rmtree(self.journals, ignore_errors=True)
        return self.out


def _ended(report: Any, stranded: tuple[tuple[str, str], ...]) -> str:
    """A recovery's or a restart's result from its apply report and the VMs it stranded."""
    if report.ok:
        return f"stranded: {stranded}" if stranded else "ok"
    failed = report.failed()
    return f"stopped: {report.stopped or (failed.detail if failed else '?')}"


_STATE = {RUNNING: "running", PAUSED: "paused", libvirt.VIR_DOMAIN_SHUTOFF: "shut off"}


@dataclass
class Summary:
    schedules: int
    faults: collections.Counter[str]
    violations: list[dict[str, Any]]
    calls: int
    #: Schedules per workload (place, drain, adapt, probe, recover, restart, controller, sleep, wake).
    workloads: collections.Counter[str] = field(default_factory=collections.Counter)
    #: How the approvals of the approve schedules ended (faultsim/approve.py).
    approvals: collections.Counter[str] = field(default_factory=collections.Counter)

    def to_dict(self) -> dict[str, Any]:
        return {"schedules": self.schedules, "faults": dict(sorted(self.faults.items())),
                "violations": self.violations, "calls": self.calls, "workloads": dict(sorted(self.workloads.items())),
                "approvals": dict(sorted(self.approvals.items()))}


@contextlib.contextmanager
def hazards_on(names: Iterator[str] | tuple[str, ...] | frozenset[str] = ()) -> Iterator[None]:
    """The mutation switches ``names`` on (:mod:`hypervisor.hazards`) for the block; unknown names are refused."""
    wanted = set(names)
    unknown = wanted - hazards.KNOWN
    if unknown:
        raise ValueError(f"unknown hazard(s) {sorted(unknown)} (known: {sorted(hazards.KNOWN)})")
    before = set(hazards.HAZARDS)
    hazards.HAZARDS |= wanted
    try:
        yield
    finally:
        hazards.HAZARDS.clear()
        hazards.HAZARDS |= before


def run_schedules(n: int, seed: int, *, rate: float = DEFAULT_RATE, first: int = 0, extras: Extras = Extras(),
                  on_violation: Callable[[Outcome], None] | None = None, stop_at_first: bool = False,
                  on_outcome: Callable[[Outcome], None] | None = None) -> Summary:
    """Schedules ``first`` .. ``first + n - 1`` of ``seed`` (those ``extras.only`` keeps: the count says how many
    ran); each violation with its seed and index.  ``on_outcome``: given each schedule's outcome, with its trace
    (kept only then: ``--digests``)."""
    rt = Runtime()
    faults: collections.Counter[str] = collections.Counter()
    violations: list[dict[str, Any]] = []
    calls = ran = 0
    workloads: collections.Counter[str] = collections.Counter()
    approvals: collections.Counter[str] = collections.Counter()
    with rt.installed():
        for i in range(first, first + n):
            if not extras.runs(i):
                continue
            ran += 1
            out = Schedule(rt, seed, i, rate=rate, extras=extras, keep_trace=on_outcome is not None).run()
            if on_outcome is not None:
                on_outcome(out)
            faults.update(out.faults)
            calls += out.calls
            workloads[out.workload] += 1
            approvals.update(out.approvals)
            if out.violations:
                violations.append({"seed": seed, "schedule": i, "workload": out.workload,
                                   "violations": out.violations})
                if on_violation is not None:
                    on_violation(out)
                if stop_at_first:
                    return Summary(ran, faults, violations, calls, workloads, approvals)
    return Summary(ran, faults, violations, calls, workloads, approvals)


def replay(seed: int, index: int, *, rate: float = DEFAULT_RATE, extras: Extras = Extras()) -> Outcome:
    """Schedule ``index`` of ``seed`` again, with its trace."""
    rt = Runtime()
    with rt.installed():
        return Schedule(rt, seed, index, rate=rate, keep_trace=True, extras=extras).run()




def digest(out: Outcome) -> str:
    """A schedule's outcome in 12 hex digits: its trace (every call and fault, on the simulated clock), faults,
    violations and result.  Two runs of a seed must give each schedule the same digest (``--digests``).  The one
    random the product draws, the token of the throw-away domain a create's XML is validated as
    (:data:`hypervisor.bootcheck.CHECK_PREFIX`), is a name only (nothing is ordered or decided by it): left out."""
    import hashlib
    import re

    from hypervisor.bootcheck import CHECK_PREFIX

    text = "\n".join([*out.trace, repr(sorted(out.faults.items())), repr(out.violations), out.result])
    text = re.sub(re.escape(CHECK_PREFIX) + r"[0-9a-z]+", CHECK_PREFIX + "TOKEN", text)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    """``scripts/faultsim``: run schedules and print what was injected and what broke (exit 1 on a violation)."""
    import argparse
    import json
    import sys
    import time

    ap = argparse.ArgumentParser(prog="scripts/faultsim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=1000, help="how many schedules (default 1000)")
    ap.add_argument("--seed", type=int, default=1, help="the seed; schedule i of seed s always replays the same")
    ap.add_argument("--first", type=int, default=0, help="index of the first schedule (default 0)")
    ap.add_argument("--rate", type=float, default=DEFAULT_RATE,
                    help=f"chance of a fault at each libvirt call (default {DEFAULT_RATE})")
    ap.add_argument("--hazard", action="append", default=[], choices=sorted(hazards.KNOWN),
                    help="switch a known hazard back on (a mutation, to see it caught); repeatable")
    ap.add_argument("--replay", type=int, metavar="INDEX", help="replay schedule INDEX of --seed and print its trace")
    ap.add_argument("--stop", action="store_true", help="stop at the first violation")
    ap.add_argument("--sigterm", action=argparse.BooleanOptionalAction, default=True,
                    help=f"controller and probe schedules (and approve schedules' recommending controller): "
                         f"{SIGTERM_SHARE:.0%} of the kills are a SIGTERM instead (default: on; --no-sigterm gives "
                         "the plain schedules that the tests pin)")
    ap.add_argument("--only", default="", metavar="WORKLOADS",
                    help="run only these workloads' schedules, comma-separated (probe, approve, recover, restart, "
                         "controller, sleep, wake, command); the others are skipped")
    ap.add_argument("--floors", action=argparse.BooleanOptionalAction, default=True,
                    help=f"recover, restart and controller schedules: every virtual cluster but vc0 has min_yield "
                         f"{FLOOR}, and {STRAND_SHARE:.0%} of them say on_failure = \"strand\" (default: on; "
                         "--no-floors gives the plain schedules that the tests pin)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--digests", action="store_true",
                    help="also each schedule's digest (its trace, faults, violations and result): two runs of a seed "
                         "must agree on every one (a schedule replays exactly); slower, every trace is kept")
    args = ap.parse_args(argv)
    if args.schedules < 1 or not 0 <= args.rate <= 1:
        ap.error("--schedules must be at least 1 and --rate within [0, 1]")
    only = frozenset(w for w in args.only.split(",") if w)
    if only - {"probe", "approve", "command", "sleep", "wake", *FAILURE_WORKLOADS}:
        ap.error(f"--only: {args.only!r}: the workloads are probe, approve, recover, restart, controller, sleep, "
                 "wake and command")
    extras = Extras(sigterm=args.sigterm, floors=args.floors, only=only)
    with hazards_on(tuple(args.hazard)):
        if args.replay is not None:
            out = replay(args.seed, args.replay, rate=args.rate, extras=extras)
            if args.json:
                print(json.dumps({"seed": out.seed, "schedule": out.index, "faults": dict(out.faults),
                                  "violations": out.violations, "result": out.result, "trace": out.trace}))
            else:
                print("\n".join(out.trace))
                print(f"faults: {dict(sorted(out.faults.items()))}; result: {out.result}")
                print("violations: " + ("; ".join(out.violations) if out.violations else "none"))
            return 1 if out.violations else 0
        wall, cpu = time.monotonic(), time.process_time()

        def shown(o: Outcome) -> None:
            if not args.json:
                print(f"VIOLATION seed {o.seed} schedule {o.index} ({o.workload}): {'; '.join(o.violations)}\n"
                      f"  replay: scripts/faultsim --seed {o.seed} --replay {o.index}"
                      + ("" if args.sigterm else " --no-sigterm") + ("" if args.floors else " --no-floors")
                      + (f" --rate {args.rate:g}" if args.rate != DEFAULT_RATE else "")
                      + "".join(f" --hazard {h}" for h in args.hazard), file=sys.stderr)

        digests: dict[int, str] = {}
        s = run_schedules(args.schedules, args.seed, rate=args.rate, first=args.first, on_violation=shown,
                          stop_at_first=args.stop, extras=extras,
                          on_outcome=(lambda o: digests.__setitem__(o.index, digest(o))) if args.digests else None)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    doc = s.to_dict() | {"seed": args.seed, "first": args.first, "rate": args.rate, "hazards": sorted(args.hazard),
                         "sigterm": args.sigterm, "floors": args.floors, "only": sorted(only),
                         "seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
                         "schedules_per_s": round(s.schedules / wall, 1) if wall > 0 else None}
    if args.digests:
        doc["digests"] = {str(i): d for i, d in sorted(digests.items())}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"{s.schedules} schedules (seed {args.seed}, from {args.first}) in {wall:.1f} s ({cpu:.1f} s CPU, "
              f"{doc['schedules_per_s']} schedules/s), {s.calls} simulated libvirt calls")
        print("workloads: " + ", ".join(f"{k} {v}" for k, v in sorted(s.workloads.items())))
        print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(s.faults.items())))
        if s.approvals:
            print("approvals: " + ", ".join(f"{k} {v}" for k, v in sorted(s.approvals.items())))
        print(f"violations: {len(s.violations)}" + (f" (hazards on: {', '.join(args.hazard)})" if args.hazard else ""))
        for i, d in sorted(digests.items()):
            print(f"schedule {i}: {d}")
    return 1 if s.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
