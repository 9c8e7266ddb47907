"""A plan checked whole against the live inventory, before its first step runs.

A plan file may have been edited by hand, computed against another cluster
state, or be half-applied already.  Before anything changes, the executor
replays the plan on the inventory as data (:func:`plan_problems`): every step
must make sense where the cluster is *now*, and no prefix of the plan may
leave a host with more caps than cores or more memory than it has.  The
same replay, on a few steps and a freshly read inventory, is each step's
pre-condition right before it acts (so a change made meanwhile by anyone
else stops the plan instead of over-committing a host).

The replay follows the executor's idempotency rules: a step whose effect is
already in place (the VM exists with that cap, has already migrated, is
already gone) is a no-op, so re-running a half-applied plan checks clean.

What is checked, per step: its host exists and is up; VM names obey the
request rules; the VM is managed (vcsched touches nothing else); caps are on
the quota grid's usable range (at least the minimum quota, at most the VM's
vCPUs and the host's cores); needs are within the VM's vCPUs; memory fits
where a VM arrives; a VM migrates only while the host its last, cut-short
migration may have left a copy on (``migrating_to``) answers; no VM gets two
steps in one wave; and after every step
(every wave, for migrations that run at once) no host's caps exceed its cores
because of the plan.  Unmanaged domains count for memory here, not for CPU:
their CPU reservation is a planning input (measured by the controller, else
their cap or vCPUs: :meth:`vcsched.inventory.Inventory.usable_cores`), which
a one-shot read would over-state for a plan the controller made; the hard
bound checked here is the managed VMs' caps within the host's cores.  An
``adopt`` step makes an unmanaged domain managed where it runs (its cap then
counts), a ``release`` step the reverse.

Disk and network caps (:mod:`vcsched.iocaps`) are checked the same way: the
host's driver can cap that resource, the host declares its capacity for it
(``disk_bps``/``net_bps`` in the cluster file), the VM has a disk / an
interface libvirt can shape, the cap is at least libvirt's minimum and at
most the host's capacity, and after every step no host's disk or network
caps sum above its capacity because of the plan.  A VM carries its disk and
network caps when it migrates, so its destination must be able to hold them
too.  Each problem names the step, the VM, the host and the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from vcsched.caps import CAP_TOLERANCE, grid_problem, min_cap
from vcsched.errors import InputError
from vcsched.formats.fields import check_name
from vcsched.inventory import HostState, Inventory
from vcsched.iocaps import IO_RESOURCES, STEP_FIELDS, IoCaps, VmDevices, io_problem, realisable
from vcsched.plans.ordering import IO_TOLERANCE
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

MAX_SHOWN = 5


@dataclass(frozen=True)
class _Vm:
    host: str
    vcpus: int
    memory: int
    managed: bool
    active: bool
    cluster: str | None
    cap: float | None  # None: uncapped (counts as all its vCPUs)
    devices: VmDevices
    io: IoCaps  # uncapped on a resource: does not count there
    #: The host its last, cut-short migration attempt may have left a copy on (:attr:`VmMeta.migrating_to`).
    copy_maybe_on: str | None = None
    #: A copy of a VM in doubt: never acted on, but its cap stays reserved on its host (repair may resume it).
    doubt: bool = False

    @property
    def cores(self) -> float:
        return float(self.vcpus) if self.cap is None else self.cap


class _Replay:
    """The cluster as data, changed step by step as the executor would change it."""

    def __init__(self, inventory: Inventory, created: Mapping[str, VmDevices], copy_holders: bool = True) -> None:
        self.hosts: dict[str, HostState] = {h.name: h for h in inventory.hosts}
        self.vms: dict[str, _Vm] = {
            v.name: _Vm(v.host, v.vcpus, v.memory_bytes, v.managed, v.active, v.cluster, v.cap_cores, v.devices,
                        v.io_caps, v.meta.migrating_to if v.meta is not None else None, v.in_doubt)
            for v in inventory.vms}
        self.created = created
        self.copy_holders = copy_holders
        self.problems: list[str] = []

    def caps(self, host: str) -> float:
        """The caps held on ``host``: its running managed VMs', and those of copies of VMs in doubt there (repair
        may resume a paused arrival where it stands: found by the fault simulation, seed 7, schedule 9024, where
        an adapt filled the host of a paused arrival and the repair after it over-committed that host)."""
        return sum(v.cores for v in self.vms.values() if v.host == host and (v.managed or v.doubt) and v.active)

    def io_total(self, host: str, resource: str) -> float:
        return float(sum(v.io.amount(resource) or 0 for v in self.vms.values()
                         if v.host == host and v.managed and v.active))

    def io_ok(self, where: str, vm: str, caps: IoCaps, devices: VmDevices, host: HostState) -> bool:
        """Disk and network caps ``caps`` (the fields given) for ``vm`` on ``host``: see the module docstring."""
        if not caps:
            return True
        asked = {"disk": caps.disk_bytes_sec or caps.disk_iops_sec, "net": caps.net_bytes_sec}
        for r in IO_RESOURCES:  # the driver first: nothing else matters on a host that cannot cap at all
            why = host.cap_problem(r)
            if asked[r] is not None and why is not None:
                field = STEP_FIELDS[r] if r == "net" or caps.disk_bytes_sec is not None else "disk_iops_sec"
                unit = "IOPS" if field == "disk_iops_sec" else "B/s"
                self.problems.append(f"{where}.{field}: host {host.name} cannot cap {r} of VM {vm!r} "
                                     f"({asked[r]} {unit}): {why}")
                return False
        problem = io_problem(caps, devices)
        if problem is not None:
            self.problems.append(f"{where}: VM {vm!r} on host {host.name}: {problem}")
            return False
        for r in IO_RESOURCES:
            amount = caps.amount(r)
            if amount is None:
                continue
            field = STEP_FIELDS[r]
            capacity = host.capacity(r)
            if capacity is None:
                self.problems.append(f"{where}.{field}: host {host.name} declares no {r}_bps in the cluster file, "
                                     f"so VM {vm!r} cannot be capped at {amount} B/s of {r} there (measure it: "
                                     f"vcsched calibrate --resource {r})")
                return False
            if amount > capacity + IO_TOLERANCE:
                self.problems.append(f"{where}.{field}: {amount} B/s for VM {vm!r} is more than host "
                                     f"{host.name}'s {r}_bps of {capacity}")
                return False
        return True

    def carried_ok(self, where: str, vm: str, v: _Vm, host: HostState) -> bool:
        """A VM arriving on ``host`` with the disk and network caps it has: the host must hold them too."""
        return self.io_ok(where, vm, v.io, v.devices, host)

    def holder_answers(self, where: str, vm: str, v: _Vm) -> bool:
        """A VM may migrate only while the host its last attempt may have left a copy on answers.

        Found by the fault simulation (issue 37): a migration cut short leaves a paused copy on its destination
        when that host stops answering before the copy can be removed; migrating the VM again meanwhile makes a
        third copy, and a second cut leaves the VM paused everywhere.  Once the host answers, the stale copy
        makes the VM in doubt (no plan acts on it) until repair removes it; a host outside this inventory's
        cluster cannot be read and does not hold the VM back."""
        held = self.hosts.get(v.copy_maybe_on) if v.copy_maybe_on is not None else None
        if held is None or held.down is None:
            return True
        self.problems.append(f"{where}: VM {vm!r} may still have a copy on host {held.name}, where its last "
                             f"migration was cut short, and {held.name} does not answer ({held.down}): it is not "
                             f"migrated until {held.name} answers and `vcsched repair` has settled any copy there")
        return False

    def memory(self, host: str) -> int:
        return sum(v.memory for v in self.vms.values() if v.host == host and v.active)

    def host_ok(self, where: str, host: str) -> HostState | None:
        h = self.hosts.get(host)
        if h is None:
            self.problems.append(f"{where}: host {host!r} is not in the cluster (hosts: {', '.join(self.hosts)})")
            return None
        if h.down is not None:
            self.problems.append(f"{where}: host {host} is down ({h.down})")
            return None
        return h

    def managed_vm(self, where: str, name: str, host: str | None = None) -> _Vm | None:
        v = self.vms.get(name)
        if v is None:
            self.problems.append(f"{where}: VM {name!r} is on no host of the cluster")
            return None
        if not v.managed:
            self.problems.append(f"{where}: VM {name!r} on host {v.host} is not managed by vcsched")
            return None
        if not v.active:
            self.problems.append(f"{where}: VM {name!r} on host {v.host} is not running")
            return None
        if host is not None and v.host != host:
            self.problems.append(f"{where}: VM {name!r} is on host {v.host}, not {host}")
            return None
        return v

    def cap_ok(self, where: str, cap: float, vcpus: int, host: HostState) -> bool:
        why = host.cap_problem("cpu")
        if why is not None:
            self.problems.append(f"{where}.cap_cores: host {host.name} cannot cap CPU: {why}")
            return False
        if cap > vcpus + CAP_TOLERANCE:
            self.problems.append(f"{where}.cap_cores: {cap:.10g} cores is more than the VM's {vcpus} vCPUs can use")
            return False
        off = grid_problem(f"{where}.cap_cores", cap, vcpus)
        if off is not None:
            self.problems.append(off)
            return False
        if cap > host.cores + CAP_TOLERANCE:
            self.problems.append(f"{where}.cap_cores: {cap:.10g} cores is more than host {host.name}'s {host.cores}")
            return False
        if cap < min_cap(vcpus) - CAP_TOLERANCE:
            self.problems.append(f"{where}.cap_cores: {cap:.10g} cores is below the smallest cap of a {vcpus}-vCPU "
                                 f"VM ({min_cap(vcpus):g}: the minimum CPU quota)")
            return False
        return True

    # ------------------------------------------------------------------ one step

    def step(self, where: str, s: Step) -> None:
        if isinstance(s, CreateStep):
            self._create(where, s)
        elif isinstance(s, SetCapStep):
            h = self.host_ok(where, s.host)
            v = self.managed_vm(where, s.vm, s.host)
            if h is None or v is None:
                return
            if s.cap_cores is not None and not self.cap_ok(where, s.cap_cores, v.vcpus, h):
                return
            if not self.io_ok(where, s.vm, s.io_caps, v.devices, h):
                return
            self.vms[s.vm] = replace(v, cap=v.cap if s.cap_cores is None else s.cap_cores,
                                     io=realisable(s.io_caps, v.devices).over(v.io))
        elif isinstance(s, MigrateStep):
            self._migrate(where, s)
        elif isinstance(s, RemoveStep):
            v = self.vms.get(s.vm)
            if v is None:
                return  # already gone
            if not v.managed or v.cluster != s.cluster:
                owner = f"virtual cluster {v.cluster!r}" if v.cluster else "no virtual cluster (unmanaged)"
                self.problems.append(f"{where}: VM {s.vm!r} on host {v.host} belongs to {owner}, "
                                     f"not the departing {s.cluster!r}")
            elif v.host != s.host:
                self.problems.append(f"{where}: VM {s.vm!r} is on host {v.host}, the plan removes it from {s.host}")
            else:
                del self.vms[s.vm]
        elif isinstance(s, AdoptStep):
            self._adopt(where, s)
        elif isinstance(s, ReleaseStep):
            self._release(where, s)
        elif isinstance(s, SetNeedStep):
            v = self.managed_vm(where, s.vm, s.host)
            if v is not None and not 0 < s.cpu_need_cores <= v.vcpus + CAP_TOLERANCE:
                self.problems.append(f"{where}.cpu_need_cores: {s.cpu_need_cores:g} must be above 0 and at most "
                                     f"the VM's {v.vcpus} vCPUs")

    def _create(self, where: str, s: CreateStep) -> None:
        try:
            check_name(f"{where}.vm", s.vm)
            check_name(f"{where}.cluster", s.cluster)
        except InputError as exc:
            self.problems.append(str(exc))
            return
        h = self.host_ok(where, s.host)
        if h is None or not self.cap_ok(where, s.cap_cores, s.vcpus, h):
            return
        clash = self.vms.get(s.cluster)
        if clash is not None:  # virtual cluster and VM names share one namespace (`--depart NAME`, `status`)
            self.problems.append(f"{where}.cluster: {s.cluster!r} is already the name of a VM on host {clash.host}")
            return
        if any(v.cluster == s.vm for v in self.vms.values()):
            self.problems.append(f"{where}.vm: {s.vm!r} is already the name of a virtual cluster")
            return
        v = self.vms.get(s.vm)
        if v is not None:  # an interrupted earlier run created it: only its caps are left to set
            if not v.managed or v.cluster != s.cluster or v.host != s.host or not v.active:
                self.problems.append(f"{where}: a domain named {s.vm!r} already exists on host {v.host}")
            elif self.io_ok(where, s.vm, s.io_caps, v.devices, h):
                self.vms[s.vm] = replace(v, cap=s.cap_cores, io=realisable(s.io_caps, v.devices).over(v.io))
            return
        devices = self.created.get(s.vm, VmDevices())
        if not self.io_ok(where, s.vm, s.io_caps, devices, h):
            return
        if s.memory_bytes > h.usable_memory - self.memory(s.host):
            self.problems.append(f"{where}: VM {s.vm!r} needs {s.memory_bytes} bytes, host {s.host} has "
                                 f"{h.usable_memory - self.memory(s.host)} free")
        self.vms[s.vm] = _Vm(s.host, s.vcpus, s.memory_bytes, True, True, s.cluster, s.cap_cores, devices,
                             realisable(s.io_caps, devices))

    def _adopt(self, where: str, s: AdoptStep) -> None:
        """A running unmanaged domain becomes managed where it is, with the cap and size its definition says."""
        d = s.definition
        h = self.host_ok(where, s.host)
        v = self.vms.get(s.vm)
        if h is None:
            return
        if v is None:
            self.problems.append(f"{where}: VM {s.vm!r} is on no host of the cluster")
        elif v.host != s.host:
            self.problems.append(f"{where}: VM {s.vm!r} is on host {v.host}, not {s.host}")
        elif not v.active:
            self.problems.append(f"{where}: VM {s.vm!r} on host {v.host} is not running")
        elif v.managed and v.cluster != d.cluster:
            self.problems.append(f"{where}: VM {s.vm!r} on host {v.host} is already managed by vcsched "
                                 f"(virtual cluster {v.cluster!r})")
        elif (v.vcpus, v.memory) != (d.vcpus, d.memory_bytes):
            self.problems.append(f"{where}.definition: VM {s.vm!r} has {v.vcpus} vCPUs and {v.memory} bytes, the "
                                 f"definition {d.vcpus} and {d.memory_bytes}")
        elif self.cap_ok(where, d.cap_cores, v.vcpus, h):
            try:
                check_name(f"{where}.definition.cluster", d.cluster)
            except InputError as exc:
                self.problems.append(str(exc))
                return
            if d.cluster in self.vms:
                self.problems.append(f"{where}.definition.cluster: {d.cluster!r} is already the name of a VM")
                return
            self.vms[s.vm] = replace(v, managed=True, cluster=d.cluster, cap=d.cap_cores)

    def _release(self, where: str, s: ReleaseStep) -> None:
        """A managed VM of the step's virtual cluster becomes unmanaged and uncapped; it keeps running."""
        v = self.vms.get(s.vm)
        if v is None:
            self.problems.append(f"{where}: VM {s.vm!r} is on no host of the cluster")
        elif v.host != s.host:
            self.problems.append(f"{where}: VM {s.vm!r} is on host {v.host}, not {s.host}")
        elif v.managed and v.cluster != s.cluster:
            self.problems.append(f"{where}: VM {s.vm!r} on host {v.host} belongs to virtual cluster {v.cluster!r}, "
                                 f"not {s.cluster!r}")
        elif v.managed:
            self.vms[s.vm] = replace(v, managed=False, cluster=None, cap=None)

    def _migrate(self, where: str, s: MigrateStep) -> None:
        v = self.vms.get(s.vm)
        if v is not None and (v.host == s.target or (s.final is not None and v.host == s.final)):
            if v.managed and v.active and v.host == s.target:
                self.vms[s.vm] = replace(v, cap=s.cap_cores)  # arrived in an earlier run; the cap is re-set
            return
        v = self.managed_vm(where, s.vm, s.source)
        h = self.host_ok(where, s.target)
        if v is None or h is None or not self.cap_ok(where, s.cap_cores, v.vcpus, h):
            return
        if not self.carried_ok(where, s.vm, v, h):
            return
        if self.copy_holders and not self.holder_answers(where, s.vm, v):
            return
        if s.bytes < 1:
            self.problems.append(f"{where}.bytes: {s.bytes} (a migration moves at least the VM's memory)")
        self.vms[s.vm] = replace(v, host=s.target, cap=s.cap_cores)


def batches(steps: Sequence[Step]) -> list[list[tuple[int, Step]]]:
    """Steps that run at once, with their index: consecutive migrations of one wave; any other step alone.

    A wave was planned so that all its migrations fit in memory together
    (:mod:`vcsched.plans.migration`), so they may run concurrently.
    """
    out: list[list[tuple[int, Step]]] = []
    for i, s in enumerate(steps):
        last = out[-1][0][1] if out else None
        if (isinstance(s, MigrateStep) and s.wave is not None and isinstance(last, MigrateStep)
                and last.wave == s.wave):
            out[-1].append((i, s))
        else:
            out.append([(i, s)])
    return out


def replay_problems(steps: Sequence[Step], inventory: Inventory, *, first_index: int = 0,
                    created: Mapping[str, VmDevices] | None = None, copy_holders: bool = True) -> list[str]:
    """The problems of running ``steps`` in order on the cluster ``inventory`` describes (see the module docstring).

    The replay stops after the first step (or wave) with a problem: what
    follows a broken step would only repeat its consequences.

    ``first_index`` numbers the steps in messages (``plan.steps[N]``) when
    ``steps`` is the tail of a plan.  ``created``: the disks and interfaces
    each VM the plan creates will have (the hypervisor knows from its boot);
    a created VM not in it has none.  ``copy_holders`` False: a migration
    is not held back by a host that may hold a copy of its VM (a mutation
    switch of the fault simulation; always True otherwise).
    """
    r = _Replay(inventory, created or {}, copy_holders)
    for batch in batches(steps):
        if r.problems:
            break  # the steps after a broken one would only report its consequences
        seen: set[str] = set()
        for i, s in batch:
            if s.vm in seen:
                r.problems.append(f"plan.steps[{first_index + i}]: VM {s.vm!r} has two steps in one wave")
            seen.add(s.vm)
        # Only the hosts a step of this batch can change are summed, before and after it: a step changes its own
        # VM only, which stays where it is, or lands on the step's host (a create; a migration's target).
        # (Summing every host for every batch cost hosts x VMs per batch: 45 s for 8 creates on 1,000 hosts.)
        touched = {h for _, s in batch for h in (s.host, r.vms[s.vm].host if s.vm in r.vms else None)
                   if h in r.hosts}
        caps_before = {h: r.caps(h) for h in touched}
        io_before = {(h, res): r.io_total(h, res) for h in touched for res in IO_RESOURCES}
        mem_before = {h: r.memory(h) for h in touched}
        # While a wave runs, a migrating VM holds memory on both hosts: count arrivals before any departure.
        arriving: dict[str, int] = {}
        for i, s in batch:
            if isinstance(s, MigrateStep):
                v = r.vms.get(s.vm)
                if v is not None and v.host == s.source and v.active:
                    arriving[s.target] = arriving.get(s.target, 0) + v.memory
            r.step(f"plan.steps[{first_index + i}]", s)
        for h, state in r.hosts.items():
            if state.down is not None or h not in touched:
                continue
            caps = r.caps(h)
            if caps > caps_before[h] + CAP_TOLERANCE and caps > state.cores + CAP_TOLERANCE:
                first = batch[0][0] + first_index
                r.problems.append(f"plan.steps[{first}] ({batch[0][1].op} {batch[0][1].vm}): host {h} would have "
                                  f"caps of {caps:.10g} cores on {state.cores} cores")
            for res in IO_RESOURCES:
                total, capacity = r.io_total(h, res), state.capacity(res)
                if capacity is not None and total > io_before[(h, res)] + IO_TOLERANCE \
                        and total > capacity + IO_TOLERANCE:
                    first = batch[0][0] + first_index
                    r.problems.append(f"plan.steps[{first}] ({batch[0][1].op} {batch[0][1].vm}): host {h} would "
                                      f"have {res} caps of {total:.0f} B/s on its {res}_bps of {capacity}")
            peak = max(r.memory(h), mem_before[h] + arriving.get(h, 0))
            if peak > mem_before[h] and peak > state.usable_memory:
                first = batch[0][0] + first_index
                r.problems.append(f"plan.steps[{first}] ({batch[0][1].op} {batch[0][1].vm}): host {h} would need "
                                  f"{peak} bytes of memory, it has {state.usable_memory} usable")
    return r.problems


def check_plan(steps: Sequence[Step], inventory: Inventory, *, first_index: int = 0,
               created: Mapping[str, VmDevices] | None = None, copy_holders: bool = True) -> None:
    """Raise :class:`InputError` naming the first problems of :func:`replay_problems`, if any."""
    problems = replay_problems(steps, inventory, first_index=first_index, created=created,
                               copy_holders=copy_holders)
    if problems:
        more = f" (+{len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
        raise InputError("; ".join(problems[:MAX_SHOWN]) + more)

