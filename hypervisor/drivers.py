"""What each libvirt driver vcsched meets can do: ONE table, read by every job of the backend.

Before this table, each job asked ``driver in ("xen", "libxl")`` or ``driver == "test"`` on its own, and a
driver's abilities were spread over a dozen places.  A driver libvirt reports that is not in the table is
treated as QEMU/KVM (the common case, and what vcsched is tested on).

* **qemu** (QEMU/KVM): CFS caps ``vcpu_quota``/``vcpu_period`` per vCPU, visible in the live XML's
  ``<cputune>``; disks throttled with ``blockIoTune``, interfaces shaped with ``interfaceParameters``; CPU time
  and I/O counters measured.
* **xen / libxl**: the credit scheduler's ``cap`` (percent of one physical CPU), read with
  ``schedulerParametersFlags`` (not in the XML); no disk or network caps (:data:`LIBXL_CANNOT`).
* **test** (libvirt's built-in test driver, docs/lab.md): no caps at all (its ``<cputune>`` is what its domain
  file says, which the scale benchmark uses as a cap); constant counters, so nothing is measured; no jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from vcsched.iocaps import DISK, NET

#: What libvirt's libxl driver (Xen) can do with disk and network caps, as of libvirt 9.0: why vcsched
#: refuses them on a Xen host instead of writing XML that would be ignored.
LIBXL_CANNOT = {
    DISK: ("libvirt's libxl driver implements neither virDomainSetBlockIoTune nor virDomainGetBlockIoTune and "
           "does not translate <iotune> for libxl, so a Xen VM would run with unlimited disk I/O"),
    NET: ("libvirt's libxl driver has no virDomainSetInterfaceParameters: it applies only <bandwidth><outbound "
          "average> when a domain starts (as the netback rate, average x 1024 bytes per 50 ms), cannot change or "
          "read it on a running domain, and never limits inbound traffic"),
}


@dataclass(frozen=True)
class Driver:
    """One libvirt driver's abilities, as vcsched uses them."""

    name: str
    #: How a CPU cap is set: ``"quota"`` (CFS ``vcpu_quota`` per vCPU), ``"credit"`` (Xen's ``cap``), or None.
    cpu_cap: str | None
    #: Whether the live domain XML's ``<cputune>`` carries the cap (else it is read with its own call).
    cap_in_xml: bool
    #: Whether ``blockIoTune`` / ``interfaceParameters`` exist (disk and network caps).
    io_caps: bool
    #: Whether CPU time and I/O counters are real (the test driver returns constants).
    measures: bool
    #: Whether the driver has scheduler parameters beyond ``weight`` (the test driver only knows ``weight``).
    scheduler_flags: bool = True

    def cannot_cap(self, uri: str) -> tuple[tuple[str, str], ...]:
        """``(resource, why not)`` for each of CPU, disk and network this driver cannot cap
        (``HostState.cannot_cap``): a plan capping it there is refused before its first step."""
        if self.cpu_cap is None:
            return (("cpu", f"the libvirt test driver ({uri}) cannot set CPU caps"),
                    (DISK, f"the libvirt test driver ({uri}) cannot throttle disks"),
                    (NET, f"the libvirt test driver ({uri}) cannot shape network interfaces"))
        if not self.io_caps:
            return tuple(LIBXL_CANNOT.items())
        return ()


QEMU = Driver("qemu", cpu_cap="quota", cap_in_xml=True, io_caps=True, measures=True)
XEN = Driver("xen", cpu_cap="credit", cap_in_xml=False, io_caps=False, measures=True)
TEST = Driver("test", cpu_cap=None, cap_in_xml=True, io_caps=False, measures=False, scheduler_flags=False)

#: libvirt's driver name (``getType()``, lower case) -> its abilities.
DRIVERS: dict[str, Driver] = {"qemu": QEMU, "kvm": QEMU, "xen": XEN, "libxl": XEN, "test": TEST}


def driver_of(name: str) -> Driver:
    """The abilities of the driver libvirt calls ``name`` (unknown names: as QEMU/KVM)."""
    return DRIVERS.get(name.lower(), QEMU)


def io_support(driver: str, uri: str) -> tuple[tuple[str, str], ...]:
    """``(resource, why not)`` for each resource driver ``driver`` cannot cap (see :meth:`Driver.cannot_cap`)."""
    return driver_of(driver).cannot_cap(uri)
