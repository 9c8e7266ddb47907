"""An in-memory hypervisor: the executor's and the CLI's tests run against it, and dry runs could too.

It keeps the same invariants a real host enforces (one VM per name, a VM on
one host, caps only on running VMs, no cap above the VM's vCPUs) and lets a
test inject a failure into any operation on any VM (``fail``), which is how
the executor's stop-and-report and re-run-converges behaviour is specified
without a daemon.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from hypervisor.base import HypervisorError
from vcsched.control.inventory import HostState, Inventory, VmMeta, VmState
from vcsched.plans.steps import CreateStep


class MemoryHypervisor:
    def __init__(self, cluster: str, hosts: Iterable[HostState], vms: Iterable[VmState] = ()) -> None:
        self.cluster = cluster
        self.hosts = {h.name: h for h in hosts}
        self.vms: dict[str, VmState] = {}
        for v in vms:
            self._add(v)
        #: (operation, vm) -> message; the next such call raises HypervisorError(message) once.
        self.fail: dict[tuple[str, str], str] = {}
        self.calls: list[tuple[str, str]] = []  # (operation, vm) of every state-changing call

    def _add(self, v: VmState) -> None:
        if v.host not in self.hosts:
            raise HypervisorError(f"host {v.host}: not in cluster {self.cluster!r}")
        if v.name in self.vms:
            raise HypervisorError(f"host {v.host}: domain {v.name!r} already exists")
        self.vms[v.name] = v

    def _maybe_fail(self, op: str, vm: str) -> None:
        self.calls.append((op, vm))
        msg = self.fail.pop((op, vm), None)
        if msg is not None:
            raise HypervisorError(msg)

    def _vm_on(self, host: str, vm: str) -> VmState:
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

    def inventory(self) -> Inventory:
        return Inventory(self.cluster, tuple(self.hosts.values()),
                         tuple(sorted(self.vms.values(), key=lambda v: (v.host, v.name))))

    def find_vm(self, name: str) -> VmState | None:
        return self.vms.get(name)

    def create_vm(self, step: CreateStep) -> None:
        self._maybe_fail("create", step.vm)
        meta = VmMeta(step.cluster, step.cpu_need_cores, step.memory_bytes, step.vcpus, step.min_yield)
        self._add(VmState(step.vm, step.host, step.vcpus, step.memory_bytes, True, meta, step.cap_cores))

    def set_cap(self, host: str, vm: str, cap_cores: float) -> None:
        self._maybe_fail("set-cap", vm)
        v, _meta = self._managed_on(host, vm, "cap")
        if not v.active:
            raise HypervisorError(f"host {host}: domain {vm!r} is not running")
        if cap_cores > v.vcpus + 1e-9:
            raise HypervisorError(f"host {host}: cap {cap_cores:g} cores exceeds {vm!r}'s {v.vcpus} vCPUs")
        self.vms[vm] = replace(v, cap_cores=cap_cores)

    def set_need(self, host: str, vm: str, cpu_need_cores: float) -> None:
        self._maybe_fail("set-need", vm)
        v, meta = self._managed_on(host, vm, "write metadata of")
        self.vms[vm] = replace(v, meta=replace(meta, cpu_need_cores=cpu_need_cores))

    def remove_vm(self, host: str, vm: str) -> None:
        self._maybe_fail("remove", vm)
        self._managed_on(host, vm, "remove")
        del self.vms[vm]

    def migrate_vm(self, vm: str, source: str, target: str) -> None:
        """The VM changes host, keeping its cap (as a live migration does)."""
        self._maybe_fail("migrate", vm)
        v = self._vm_on(source, vm)
        if target not in self.hosts:
            raise HypervisorError(f"host {target}: not in cluster {self.cluster!r}")
        self.vms[vm] = replace(v, host=target)

    def lists(self, host: str, vm: str) -> bool:
        v = self.vms.get(vm)
        return v is not None and v.host == host

    def read_cap(self, host: str, vm: str) -> float | None:
        return self._vm_on(host, vm).cap_cores

    def cpu_time_ns(self, host: str, vm: str) -> int | None:
        self._vm_on(host, vm)
        return None  # nothing runs here, so there is nothing to measure

    def close(self) -> None:
        pass
