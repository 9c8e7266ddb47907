"""An in-memory hypervisor: the executor's and the CLI's tests run against it, and dry runs could too.

It keeps the same invariants a real host enforces (one VM per name, a VM on
one host, caps only on running VMs, no cap above the VM's vCPUs, caps held on
the CFS quota grid like libvirt's; disk and network caps only on a VM that
has such a device, at least libvirt's minimum, held on the same grids as
libvirt's and refused on a host whose driver cannot cap them — tests set
``HostState.cannot_cap`` — and carried along by a migration) and lets a test inject a failure into any
operation on any VM (``fail``), mark a host down (``down``), or run code just
before an operation (``before``: another operator acting meanwhile), which is
how the executor's stop-and-report and re-run-converges behaviour is
specified without a daemon.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from hypervisor.base import CpuCounters, HypervisorError, IoCounters
from hypervisor.bootcheck import boot_problems
from hypervisor.devices import boot_devices
from vcsched.caps import CAP_TOLERANCE, min_cap, realisable_cap
from vcsched.formats.throttles import NO_THROTTLES
from vcsched.inventory import HostState, Inventory, VmMeta, VmState
from vcsched.iocaps import IO_RESOURCES, IoCaps, VmDevices, io_problem, realisable
from vcsched.plans.steps import CreateStep

if TYPE_CHECKING:
    from vcsched.plans.repair import RepairReport


class MemoryHypervisor:
    def __init__(self, cluster: str, hosts: Iterable[HostState], vms: Iterable[VmState] = ()) -> None:
        self.cluster = cluster
        self.hosts = {h.name: h for h in hosts}
        self.vms: dict[str, VmState] = {}
        for v in vms:
            self._add(v)
        #: (operation, vm) -> message; the next such call raises HypervisorError(message) once.
        self.fail: dict[tuple[str, str], str] = {}
        #: (operation, vm) -> callable run once just before that call (e.g. a second operator's change).
        self.before: dict[tuple[str, str], Callable[[], None]] = {}
        #: host -> reason: the host does not answer (its VMs are unknown, every call on it fails).
        self.down: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []  # (operation, vm) of every state-changing call
        #: Wall clock of the hosts: a migrated VM records when it moved (``VmMeta.migrated_at``), as libvirt's do.
        self.clock: Callable[[], float] = time.time
        #: Whether the hosts' files are this machine's: boot files are then checked before a plan's first step.
        self.boot_files = False
        self.lease: Callable[[], bool] | None = None
        self.repairs = 0  # how many times repair ran (in-memory hosts hold one copy per VM: nothing to settle)
        self.throttles = NO_THROTTLES
        self.timeouts: dict[str, float | None] = {}  # vm -> the timeout its last migration was given
        #: vm -> its domain XML (:meth:`domain_definition`); a VM not in it has a plain one (no devices).
        self.definitions: dict[str, str] = {}

    def _add(self, v: VmState) -> None:
        if v.host not in self.hosts:
            raise HypervisorError(f"host {v.host}: not in cluster {self.cluster!r}")
        if v.name in self.vms:
            raise HypervisorError(f"host {v.host}: domain {v.name!r} already exists")
        self.vms[v.name] = v

    def _maybe_fail(self, op: str, vm: str) -> None:
        hook = self.before.pop((op, vm), None)
        if hook is not None:
            hook()
        self.calls.append((op, vm))
        msg = self.fail.pop((op, vm), None)
        if msg is not None:
            raise HypervisorError(msg)

    def _vm_on(self, host: str, vm: str) -> VmState:
        if host in self.down:
            raise HypervisorError(f"host {host}: does not answer ({self.down[host]})")
        v = self.vms.get(vm)
        if v is None or v.host != host:
            raise HypervisorError(f"host {host}: no domain {vm!r}")
        return v

    def _managed_on(self, host: str, vm: str, action: str) -> tuple[VmState, VmMeta]:
        """The VM on ``host`` and its metadata; an unmanaged domain is refused, naming ``action``."""
        v = self._vm_on(host, vm)
        if v.meta is None:
            raise HypervisorError(f"host {host}: refusing to {action} unmanaged domain {vm!r}")
        return v, v.meta

    def inventory(self, hosts: Iterable[str] | None = None) -> Inventory:
        names = list(self.hosts) if hosts is None else list(hosts)
        for h in names:
            if h not in self.hosts:
                raise HypervisorError(f"host {h}: not in cluster {self.cluster!r}")
        states = tuple(replace(self.hosts[h], down=self.down.get(h)) for h in names)
        up = {h for h in names if h not in self.down}
        return Inventory(self.cluster, states,
                         tuple(sorted((v for v in self.vms.values() if v.host in up), key=lambda v: (v.host, v.name))))

    def repair(self, guard: Callable[[], None], *, apply: bool = True,
               inventory: Inventory | None = None, fenced: frozenset[str] = frozenset()) -> RepairReport:
        """Nothing is ever in doubt here (one copy per VM by construction): an empty report, counted."""
        from vcsched.plans.repair import RepairReport, plan_repair

        self.repairs += 1
        return RepairReport(plan_repair(inventory if inventory is not None else self.inventory(), fenced=fenced),
                            applied=apply)

    def find_vm(self, name: str) -> VmState | None:
        v = self.vms.get(name)
        return None if v is None or v.host in self.down else v

    def create_problems(self, step: CreateStep, where: str, *, define: bool = True) -> list[str]:
        """The boot's template is read (vcsched reads it, wherever the host is); its other files only with
        :attr:`boot_files` (the in-memory hosts have no files of their own unless a test says they are this
        machine's)."""
        return boot_problems(where, step.boot, step.memory_bytes, local=self.boot_files)

    def create_vm(self, step: CreateStep) -> None:
        self._maybe_fail("create", step.vm)
        if step.host in self.down:
            raise HypervisorError(f"host {step.host}: does not answer ({self.down[step.host]})")
        self._check_cap(step.host, step.vm, step.vcpus, step.cap_cores)
        devices = self.planned_devices(step)
        self._check_io(step.host, step.vm, devices, step.io_caps)
        meta = step.meta()
        self._add(VmState(step.vm, step.host, step.vcpus, step.memory_bytes, True, meta,
                          self.realised_cap(step.host, step.vcpus, step.cap_cores), devices,
                          realisable(step.io_caps, devices)))

    def _check_io(self, host: str, vm: str, devices: VmDevices, caps: IoCaps) -> None:
        for r in IO_RESOURCES:
            why = self.hosts[host].cap_problem(r)
            wanted = caps.amount(r) if r == "net" else (caps.disk_bytes_sec or caps.disk_iops_sec)
            if why is not None and wanted is not None:
                raise HypervisorError(f"host {host}: cannot cap {r} of {vm!r} ({wanted}): {why}")
        problem = io_problem(caps, devices)
        if problem is not None:
            raise HypervisorError(f"host {host}: {vm!r}: {problem}")

    @staticmethod
    def _check_cap(host: str, vm: str, vcpus: int, cap_cores: float) -> None:
        if cap_cores > vcpus + CAP_TOLERANCE:
            raise HypervisorError(f"host {host}: cap {cap_cores:g} cores exceeds {vm!r}'s {vcpus} vCPUs")
        if cap_cores < min_cap(vcpus) - CAP_TOLERANCE:
            raise HypervisorError(f"host {host}: cap {cap_cores:g} cores for {vm!r} is below the minimum quota")

    def realised_cap(self, host: str, vcpus: int, cap_cores: float) -> float:
        return realisable_cap(cap_cores, vcpus)  # like libvirt's vcpu_quota: whole µs, rounded down

    def set_cap(self, host: str, vm: str, cap_cores: float) -> None:
        self._maybe_fail("set-cap", vm)
        v, _meta = self._managed_on(host, vm, "cap")
        if not v.active:
            raise HypervisorError(f"host {host}: domain {vm!r} is not running")
        self._check_cap(host, vm, v.vcpus, cap_cores)
        self.vms[vm] = replace(v, cap_cores=self.realised_cap(host, v.vcpus, cap_cores))

    def set_need(self, host: str, vm: str, cpu_need_cores: float) -> None:
        self._maybe_fail("set-need", vm)
        v, meta = self._managed_on(host, vm, "write metadata of")
        self.vms[vm] = replace(v, meta=replace(meta, cpu_need_cores=cpu_need_cores))

    def remove_vm(self, host: str, vm: str) -> None:
        self._maybe_fail("remove", vm)
        self._managed_on(host, vm, "remove")
        del self.vms[vm]

    def migrate_vm(self, vm: str, source: str, target: str, cap_cores: float, *,
                   timeout_s: float | None = None) -> None:
        """The VM changes host and arrives with ``cap_cores`` (the destination XML's cap, in libvirt); nothing
        here takes time, so ``timeout_s`` is only recorded (:attr:`timeouts`)."""
        self.timeouts[vm] = timeout_s
        self._maybe_fail("migrate", vm)
        v = self._vm_on(source, vm)
        if target not in self.hosts:
            raise HypervisorError(f"host {target}: not in cluster {self.cluster!r}")
        if target in self.down:
            raise HypervisorError(f"host {target}: does not answer ({self.down[target]})")
        self._check_cap(target, vm, v.vcpus, cap_cores)
        self._check_io(target, vm, v.devices, v.io_caps)  # its <iotune>/<bandwidth> travel in the domain XML
        meta = None if v.meta is None else replace(v.meta, migrated_at=self.clock(), generation=v.meta.generation + 1)
        self.vms[vm] = replace(v, host=target, cap_cores=self.realised_cap(target, v.vcpus, cap_cores), meta=meta)

    def adopt_vm(self, host: str, vm: str, meta: VmMeta, cap_cores: float) -> None:
        self._maybe_fail("adopt", vm)
        v = self._vm_on(host, vm)
        if v.meta is not None:
            raise HypervisorError(f"host {host}: domain {vm!r} is already managed (virtual cluster "
                                  f"{v.meta.cluster!r})")
        if not v.active:
            raise HypervisorError(f"host {host}: domain {vm!r} is not running")
        self._check_cap(host, vm, v.vcpus, cap_cores)
        self.vms[vm] = replace(v, meta=meta, cap_cores=self.realised_cap(host, v.vcpus, cap_cores))

    def release_vm(self, host: str, vm: str) -> None:
        self._maybe_fail("release", vm)
        v, _meta = self._managed_on(host, vm, "release")
        self.vms[vm] = replace(v, meta=None, cap_cores=None)  # disk and network caps stay, as libvirt's do

    def domain_definition(self, host: str, vm: str) -> str:
        v = self._vm_on(host, vm)
        return self.definitions.get(vm) or (
            f"<domain type='test'><name>{v.name}</name><memory unit='b'>{v.memory_bytes}</memory>"
            f"<vcpu>{v.vcpus}</vcpu><os><type>hvm</type></os><devices/></domain>")

    def lists(self, host: str, vm: str) -> bool:
        v = self.vms.get(vm)
        return v is not None and v.host == host

    def read_cap(self, host: str, vm: str) -> float | None:
        return self._vm_on(host, vm).cap_cores

    def cpu_time_ns(self, host: str, vm: str) -> int | None:
        self._vm_on(host, vm)
        return None  # nothing runs here, so there is nothing to measure

    def cpu_counters(self, host: str, vm: str) -> CpuCounters | None:
        """Used CPU only (from :meth:`cpu_time_ns`, which fakes with a load override): throttling and delay are
        not measured here unless a subclass says so."""
        ns = self.cpu_time_ns(host, vm)
        return None if ns is None else CpuCounters(ns)

    def set_io_caps(self, host: str, vm: str, caps: IoCaps) -> None:
        self._maybe_fail("set-io-caps", vm)
        v, _meta = self._managed_on(host, vm, "cap")
        if not v.active:
            raise HypervisorError(f"host {host}: domain {vm!r} is not running")
        self._check_io(host, vm, v.devices, caps)
        self.vms[vm] = replace(v, io_caps=realisable(caps, v.devices).over(v.io_caps))

    def read_io_caps(self, host: str, vm: str) -> IoCaps:
        return self._vm_on(host, vm).io_caps

    def realised_io_caps(self, host: str, devices: VmDevices, caps: IoCaps) -> IoCaps:
        return realisable(caps, devices)  # like libvirt's: whole bytes, net on the 1000 B/s grid per interface

    def planned_devices(self, step: CreateStep) -> VmDevices:
        return boot_devices(step.boot)

    def io_counters(self, host: str, vm: str) -> IoCounters | None:
        self._vm_on(host, vm)
        return None

    def close(self) -> None:
        pass
