"""Live migration of managed VMs, and the executor's runner for ``migrate`` plan steps.

The libvirt recipe is the one measured in docs/lab.md: ``migrate3`` from the
source connection with ``VIR_MIGRATE_LIVE``, a destination XML
(``VIR_MIGRATE_PARAM_DEST_XML``) in which the per-host cgroup partition is
rewritten to the destination's (the cluster file's ``partition``), optional
bandwidth (``VIR_MIGRATE_PARAM_BANDWIDTH``, MiB/s).  vcsched creates its VMs
transient (:mod:`hypervisor.libvirt_backend`); a persistent one additionally
gets ``PERSIST_DEST | UNDEFINE_SOURCE`` with the same rewritten XML as its
persistent definition.  libvirt only undefines the source once the VM runs
on the destination, and a failed migration leaves it running on its source:
the step fails, the plan stops, re-running continues from there.

The runner is idempotent like the others (:mod:`hypervisor.executor`):
already running on the destination = skipped (its arrival cap is transient:
later set-cap steps of the plan own the final cap); on the source =
migrated, then capped to the arrival cap; anywhere else = failure naming
where it is.
"""

from __future__ import annotations

from typing import Any

from hypervisor.base import Hypervisor, HypervisorError
from hypervisor.executor import StepFailed, _verify_cap, register_runner
from hypervisor.memory import MemoryHypervisor
from vcsched.migration import MigrateStep

MIGRATION_URI = "tcp://127.0.0.1"  # the lab's migration stream; real clusters set the cluster file's host address


def rewrite_partition(xml: str, source_partition: str | None, target_partition: str | None) -> str:
    """The domain XML with the source host's cgroup partition replaced by the destination's."""
    if source_partition == target_partition:
        return xml
    if source_partition is not None and f"<partition>{source_partition}</partition>" in xml:
        if target_partition is None:
            return xml.replace(f"<resource>\n    <partition>{source_partition}</partition>\n  </resource>", "") \
                      .replace(f"<partition>{source_partition}</partition>", "")
        return xml.replace(f"<partition>{source_partition}</partition>", f"<partition>{target_partition}</partition>")
    if target_partition is not None and "<resource>" not in xml:
        return xml.replace("</domain>", f"  <resource>\n    <partition>{target_partition}</partition>\n"
                                        "  </resource>\n</domain>", 1)
    return xml


def libvirt_migrate(hv: Any, vm: str, source: str, target: str, bandwidth_mib: int | None = None) -> None:
    """Live-migrate ``vm`` with libvirt (``hv`` is a :class:`hypervisor.libvirt_backend.LibvirtHypervisor`)."""
    import libvirt

    src_host, dst_host = hv.cluster.host(source), hv.cluster.host(target)
    dom = hv._domain(source, vm)
    dst = hv._conn(target)
    try:
        xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE)
        xml = rewrite_partition(xml, src_host.partition, dst_host.partition)
        params: dict[str, Any] = {libvirt.VIR_MIGRATE_PARAM_URI: MIGRATION_URI,
                                  libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml}
        flags = libvirt.VIR_MIGRATE_LIVE
        if dom.isPersistent():
            params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = xml
            flags |= libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
        if bandwidth_mib is not None:
            params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = bandwidth_mib
        dom.migrate3(dst, params, flags)
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"host {source}: cannot migrate {vm!r} to {target}: {exc.get_error_message()} "
                              f"(it keeps running on {source})") from None


def memory_migrate(hv: MemoryHypervisor, vm: str, source: str, target: str) -> None:
    """The in-memory hypervisor's migration (tests, dry runs): the VM changes host, keeping its cap."""
    from dataclasses import replace

    hv._maybe_fail("migrate", vm)
    v = hv._vm_on(source, vm)
    if target not in hv.hosts:
        raise HypervisorError(f"host {target}: not in cluster {hv.cluster!r}")
    hv.vms[vm] = replace(v, host=target)


def migrate_vm(hv: Hypervisor, vm: str, source: str, target: str, bandwidth_mib: int | None = None) -> None:
    if isinstance(hv, MemoryHypervisor):
        memory_migrate(hv, vm, source, target)
        return
    from hypervisor.libvirt_backend import LibvirtHypervisor

    if isinstance(hv, LibvirtHypervisor):
        libvirt_migrate(hv, vm, source, target, bandwidth_mib)
        return
    raise HypervisorError(f"host {source}: this backend ({type(hv).__name__}) cannot migrate")


class MigrateRunner:
    """Pre-condition / act / post-condition for ``migrate`` steps (see the module docstring)."""

    bandwidth_mib: int | None = None

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
        if v is not None and v.host == step.source:
            migrate_vm(hv, step.vm, step.source, step.target, self.bandwidth_mib)
        hv.set_cap(step.target, step.vm, step.cap_cores)

    def verify(self, hv: Hypervisor, step: MigrateStep) -> None:
        _verify_cap(hv, step.target, step.vm, step.cap_cores)
        if isinstance(hv, MemoryHypervisor):
            return
        try:  # libvirt: make sure the source no longer lists it (not even paused or defined)
            hv._domain(step.source, step.vm)  # type: ignore[attr-defined]
        except HypervisorError:
            return
        raise StepFailed(f"{step.vm} still exists on host {step.source} after migrating to {step.target}")


RUNNER = MigrateRunner()
register_runner(MigrateStep.op, RUNNER)
