"""Running guests as calibration subjects: capped with libvirt, observed through their vCPU time.

This is the libvirt side of ``vcsched calibrate --backend libvirt`` (the
calibration package itself never imports libvirt).  It implements
``calibration.experiment.Subjects`` for already-running guests that loop on
their CPU (the minimal guest, ``hypervisor.guest``).

What is measured, and why: the host cannot see a guest's own progress without
an agent inside it, so the observable is the guests' **vCPU time**: the sum of
``cpuTime`` over ``dom.vcpus()`` — the CPU time of the vCPU threads, exactly
what ``vcpu_quota`` rations (the emulator thread is capped separately, by
``emulator_quota``, and not counted).  Under TCG a second of vCPU time is a
roughly constant amount of emulated work, so vCPU seconds per second is the
guest's compute rate in units of one host CPU.  The "bare" rate is therefore
the nominal 1 vCPU-second per second of a guest that owns its CPU; the
overhead is how far short of it an uncapped guest falls.

Caps follow the project contract: ``vcpu_period`` = 100000 µs,
``vcpu_quota`` = round(cap / vcpus * period) per vCPU thread, set LIVE only —
calibration is temporary, and ``close()`` restores each guest's original
scheduler parameters, vCPU pinning and running state.  Xen hosts would use
``cap`` (percent of one CPU) instead; the test driver cannot cap at all and is
refused naming the host.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import libvirt

from hypervisor.guest import GUEST_CMDLINE, GuestError, GuestImage, start_guest, wait_for_boot
from hypervisor.journal import GUESTS, CalibrationEntry, Journal, signals_held
from vcsched.caps import MIN_QUOTA_US, PERIOD_US, quota_for
from vcsched.errors import InputError, VcschedError
from vcsched.iocaps import IoCaps


class CapsProbeError(VcschedError):
    """A libvirt call failed while calibrating (after the inputs were accepted)."""


def _quiet_libvirt() -> None:
    """libvirt prints every error on stderr by default; ours are reported once, by the CLI."""
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def vcpu_quota_for(cap: float | None, vcpus: int) -> int:
    """Per-vCPU-thread quota for a cap in host CPUs (``None``: unlimited, which libvirt spells -1)."""
    if cap is None:
        return -1
    if not 0 < cap <= vcpus:
        raise InputError(f"cap: {cap:g} is outside (0, {vcpus}] for a {vcpus}-vCPU guest")
    quota = quota_for(cap, vcpus)
    if quota < MIN_QUOTA_US:
        raise InputError(f"cap: {cap:g} is below libvirt's minimum vcpu_quota ({MIN_QUOTA_US} µs per {PERIOD_US} µs)")
    return quota


class ManagedDomain(VcschedError):
    """A ``--domain`` that vcsched manages, asked for without its cluster's lock (exit 1: nothing was changed)."""

    exit_code = 1


def check_managed(dom: Any, uri: str, force: bool, managed: bool = False) -> None:
    """Whether a calibration may take ``dom``, which it pins, pauses and re-caps.

    A domain vcsched does not manage (no vcsched metadata) is refused unless ``force``: vcsched touches only what
    it manages.  One it manages is refused unless ``managed``: the caller holds the lock of the domain's cluster
    and the operator asked for it (``--cluster FILE --allow-managed``).  Its cluster's commands and controller
    set its cap too, and each holds that lock while it does: a calibration without it would race them (a plan's
    cap written over the calibration's, or the calibration's left on a VM the plan had just capped)."""
    from hypervisor.domain_xml import METADATA_NS, parse_metadata

    try:
        meta = parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0))
    except libvirt.libvirtError:  # no such metadata element: not ours
        meta = None
    if meta is None:
        if force:
            return
        raise InputError(f"--domain {dom.name()}: not managed by vcsched on {uri} (no vcsched metadata); a "
                         "calibration pins, pauses and re-caps it: pass --force to calibrate it anyway")
    if not managed:
        raise ManagedDomain(f"--domain {dom.name()}: managed by vcsched (virtual cluster {meta.cluster!r}) on {uri}; "
                            "a calibration pins, pauses and re-caps it, so only under its cluster's lock: pass "
                            "--cluster FILE --allow-managed")


def put_back(dom: Any, entry: CalibrationEntry) -> tuple[list[str], list[str]]:
    """Put ``entry``'s settings back on ``dom``, each on its own (one that fails does not skip the others):
    scheduler parameters, each vCPU's pinning, the emulator's, I/O limits, then a resume if it is paused by a
    suspend (one paused by a migration is not ours to resume).  Returns (what was put back, what was not)."""
    live = libvirt.VIR_DOMAIN_AFFECT_LIVE
    name = f"{entry.domain} on {entry.uri}"
    done: list[str] = []
    problems: list[str] = []

    def attempt(what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except (libvirt.libvirtError, VcschedError) as exc:
            msg = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else str(exc)
            problems.append(f"{name}: {what} not put back ({msg})")
        else:
            done.append(f"{name}: {what} put back")

    if entry.scheduler:
        attempt("vcpu_quota/vcpu_period " + "/".join(str(entry.scheduler[k]) for k in sorted(entry.scheduler)),
                lambda: dom.setSchedulerParametersFlags(dict(entry.scheduler or {}), live))
    for v, cpumap in enumerate(entry.vcpu_pins or ()):
        attempt(f"vCPU {v} pinning", functools.partial(dom.pinVcpuFlags, v, tuple(cpumap), live))
    if entry.emulator_pin is not None:
        attempt("emulator pinning", lambda: dom.pinEmulator(tuple(entry.emulator_pin or ()), live))
    if entry.io is not None:
        resource, amount = str(entry.io["resource"]), entry.io.get("amount")
        attempt(f"{resource} limit", lambda: _put_io_back(dom, entry.uri, resource, amount))
    try:
        state, reason = dom.state()[:2]
    except libvirt.libvirtError as exc:
        problems.append(f"{name}: state unreadable, may be left paused ({exc.get_error_message()})")
    else:
        if state == libvirt.VIR_DOMAIN_PAUSED and reason == libvirt.VIR_DOMAIN_PAUSED_USER:
            attempt("running state", dom.resume)
    return done, problems


def _put_io_back(dom: Any, uri: str, resource: str, amount: int | None) -> None:
    from hypervisor.throttle import apply_io_caps, live_devices

    v = 0 if amount is None else int(amount)
    caps = IoCaps(disk_bytes_sec=v) if resource == "disk" else IoCaps(net_bytes_sec=v)
    apply_io_caps(uri, dom, live_devices(dom), caps, libvirt.VIR_DOMAIN_AFFECT_LIVE)


def _put_all_back(subjects: Any) -> list[str]:
    """A subjects object's :meth:`close`: every adopted domain put back (:func:`put_back`), the connection closed,
    the journal cleared when everything went back.  Returns what could not be put back."""
    problems: list[str] = []
    for dom, entry in zip(subjects.doms, subjects.entries, strict=False):
        problems += put_back(dom, entry)[1]
    subjects.doms = []
    with contextlib.suppress(libvirt.libvirtError, AttributeError):
        subjects.conn.close()
    if subjects.journal is not None and not problems:
        subjects.journal.clear()
    return problems


def restore_domain(entry: CalibrationEntry) -> tuple[list[str], list[str]]:
    """:func:`put_back` on the domain of ``entry`` (by UUID, on its URI) after its calibration was killed; a
    domain that is gone has nothing to put back."""
    _quiet_libvirt()
    try:
        conn = libvirt.open(entry.uri)
    except libvirt.libvirtError as exc:
        return [], [f"{entry.domain} on {entry.uri}: cannot connect ({exc.get_error_message()}); nothing put back"]
    try:
        try:
            dom = conn.lookupByUUIDString(entry.uuid)
        except libvirt.libvirtError:
            return [f"{entry.domain} on {entry.uri}: gone; nothing to put back"], []
        if not dom.isActive():
            return [f"{entry.domain} on {entry.uri}: no longer running; nothing to put back"], []
        return put_back(dom, entry)
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()


def running_domain(conn: Any, uri: str, name: str, why: str = "") -> Any:
    """The running domain ``name`` given with --domain: calibration measures a guest's work as it runs, so a
    missing or stopped one is bad input, refused before anything is changed."""
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        raise InputError(f"--domain {name}: no such domain on {uri}") from None
    if dom.state()[0] != libvirt.VIR_DOMAIN_RUNNING:
        raise InputError(f"--domain {name}: not running on {uri}{why}")
    return dom


class LibvirtSubjects:
    """Running CPU-loop guests on one libvirt host, optionally pinned to one host CPU.

    Domains vcsched does not manage only with ``force``, and those it manages only with ``managed`` (the caller
    holds their cluster's lock): a calibration pins, pauses and re-caps what it measures (:func:`check_managed`).
    What it is about to change is written to ``journal`` first (:mod:`hypervisor.journal`), so a
    calibration killed by SIGKILL is put back by the next one or by ``vcsched repair``; :meth:`close` puts
    everything back itself and clears it.
    """

    unit = "vCPU s/s"
    nominal_bare: float | None = 1.0
    default_window = 1.0

    def __init__(self, uri: str, domains: Sequence[str], cpu: int | None = None, *, force: bool = False,
                 managed: bool = False, journal: Journal | None = None):
        _quiet_libvirt()
        self.uri = uri
        self.count = len(domains)
        self.doms: list[Any] = []
        self.entries: list[CalibrationEntry] = []
        self.journal = journal
        self.problems: list[str] = []
        try:
            self.conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            raise InputError(f"--connect {uri}: cannot connect ({exc.get_error_message()})") from None
        try:
            self._adopt(domains, force, managed)
            if cpu is not None:
                self._check_cpu(cpu)
            self._record(cpu is not None)
            if cpu is not None:
                self._pin(cpu)
            for i in range(self.count):
                self.pause(i)  # like the cgroup workers: only the subjects being measured may run
        except BaseException:
            self.close()
            raise

    def _adopt(self, names: Sequence[str], force: bool, managed: bool) -> None:
        for name in names:
            dom = running_domain(self.conn, self.uri, name, " (calibration needs a CPU-loop guest)")
            check_managed(dom, self.uri, force, managed)
            try:
                params = dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)
            except libvirt.libvirtError as exc:
                msg = exc.get_error_message()
                raise InputError(f"host {self.uri}: cannot set caps: scheduler parameters unreadable ({msg})") from None
            if "vcpu_quota" not in params:
                raise InputError(
                    f"host {self.uri}: cannot set caps: its driver has no vcpu_quota/vcpu_period "
                    "(the libvirt test driver never has)"
                )
            self.doms.append(dom)
            self.entries.append(CalibrationEntry(self.uri, name, dom.UUIDString(),
                                                 {k: params[k] for k in ("vcpu_period", "vcpu_quota")}))

    def _check_cpu(self, cpu: int) -> None:
        n_cpus = self.conn.getInfo()[2]
        if not 0 <= cpu < n_cpus:
            raise InputError(f"--cpu: {cpu} is not a CPU of host {self.uri} (it has {n_cpus})")

    def _record(self, pins: bool) -> None:
        """Read what is about to change (the pinning too, when it will be pinned) and journal it, before any change."""
        if pins:
            flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
            self.entries = [replace(e, vcpu_pins=[list(m) for m in dom.vcpuPinInfo(flags)],
                                    emulator_pin=list(dom.emulatorPinInfo(flags)))
                            for e, dom in zip(self.entries, self.doms, strict=True)]
        if self.journal is not None and self.entries:
            self.journal.write(domains=self.entries)

    def _pin(self, cpu: int) -> None:
        """All vCPU and emulator threads on host CPU ``cpu``, as the paper ran every VM on one CPU."""
        n_cpus = self.conn.getInfo()[2]
        cpumap = tuple(i == cpu for i in range(n_cpus))
        for dom, entry in zip(self.doms, self.entries, strict=True):
            flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
            try:
                for v in range(len(entry.vcpu_pins or ())):
                    dom.pinVcpuFlags(v, cpumap, flags)
                dom.pinEmulator(cpumap, flags)
            except libvirt.libvirtError as exc:
                msg = exc.get_error_message()
                raise InputError(f"--cpu {cpu}: cannot pin {dom.name()} on {self.uri} ({msg})") from None

    # --- the Subjects protocol -------------------------------------------------
    def resume(self, index: int) -> None:
        dom = self.doms[index]
        if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
            dom.resume()

    def pause(self, index: int) -> None:
        dom = self.doms[index]
        if dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING:
            dom.suspend()

    def set_cap(self, index: int, cap: float | None) -> None:
        dom = self.doms[index]
        vcpus = len(dom.vcpus()[0])
        quota = vcpu_quota_for(cap, vcpus)
        try:
            dom.setSchedulerParametersFlags(
                {"vcpu_period": PERIOD_US, "vcpu_quota": quota}, libvirt.VIR_DOMAIN_AFFECT_LIVE
            )
        except libvirt.libvirtError as exc:
            raise CapsProbeError(f"host {self.uri}: cannot cap {dom.name()} ({exc.get_error_message()})") from None
        got = dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_LIVE)
        if got.get("vcpu_quota") != quota and not (quota < 0 and got.get("vcpu_quota", 0) <= 0):
            raise CapsProbeError(f"host {self.uri}: {dom.name()} kept vcpu_quota {got.get('vcpu_quota')} after {quota}")

    def make_bare(self, index: int) -> None:
        raise CapsProbeError("a guest cannot run outside its VM: the libvirt backend uses a nominal bare rate")

    def poll(self, index: int) -> list[tuple[float, float, float]]:
        """One point: (time of the reading, vCPU seconds, vCPU seconds) — work and CPU are the same here."""
        before = time.monotonic()
        info = self.doms[index].vcpus()[0]
        after = time.monotonic()
        used = sum(v[2] for v in info) / 1e9
        return [((before + after) / 2, used, used)]

    def close(self) -> list[str]:
        """Put every guest back as found — scheduler parameters, pinning, running — each setting on its own, with
        SIGTERM and SIGINT held meanwhile; clears the journal when all went back.  Returns (and keeps in
        :attr:`problems`) what could not be put back."""
        with signals_held():
            self.problems = _put_all_back(self)
        return self.problems

    def __enter__(self) -> LibvirtSubjects:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def loop_guest_boot(cluster_file: Path, uri: str) -> tuple[GuestImage, str | None]:
    """The guest boot (``[guest]``) of a cluster file and the partition of its host ``uri`` (None if unlisted)."""
    try:
        doc = tomllib.loads(cluster_file.read_text())
    except OSError as exc:
        raise InputError(f"--cluster {cluster_file}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--cluster {cluster_file}: malformed TOML ({exc})") from None
    guest = doc.get("guest")
    if not isinstance(guest, dict) or "kernel" not in guest or "initrd" not in guest:
        raise InputError(f"--cluster {cluster_file}: no [guest] kernel/initrd to boot CPU-loop guests from")
    image = GuestImage(
        kernel=Path(guest["kernel"]),
        initrd=Path(guest["initrd"]),
        cmdline=str(guest.get("cmdline", GUEST_CMDLINE)),
        domain_type=str(guest.get("domain_type", "qemu")),
    )
    partition = next((h.get("partition") for h in doc.get("hosts", []) if h.get("uri") == uri), None)
    return image, partition


@contextlib.contextmanager
def loop_guests(uri: str, count: int, image: GuestImage, partition: str | None) -> Iterator[list[str]]:
    """``count`` transient CPU-loop guests booted on ``uri`` for a calibration, destroyed afterwards.

    Named ``vcsched-calib-<pid>-<i>``; their serial consoles (how the boot is
    detected) go to a temporary directory removed with them.
    """
    with _calibration_guests(uri, count, image, partition, "CPU-loop", lambda _name, _work: {}) as names:
        yield names


@contextlib.contextmanager
def _calibration_guests(uri: str, count: int, image: GuestImage, partition: str | None, kind: str,
                        extra: Callable[[str, Path], dict[str, Any]]) -> Iterator[list[str]]:
    """Boot ``count`` transient guests, wait for each one's boot marker, and destroy them all afterwards.

    One place for the start/wait/clean-up sequence, so that a failed start or
    boot never leaves a calibration guest running (``extra(name, workdir)``:
    the workload's own arguments to :func:`start_guest`).
    """
    _quiet_libvirt()
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise InputError(f"--connect {uri}: cannot connect ({exc.get_error_message()})") from None
    work = Path(tempfile.mkdtemp(prefix="vcsched-calib-", dir="/var/tmp"))  # where lab daemons see it too
    os.chmod(work, 0o755)  # the daemon's qemu writes the console files here
    names = [f"vcsched-calib-{os.getpid()}-{i}" for i in range(count)]
    started: list[Any] = []
    # Journaled as each starts (by UUID), so that a calibration killed by SIGKILL leaves nothing running for long:
    # the next calibration or `vcsched repair --apply` destroys them (hypervisor.journal).
    journal = Journal(GUESTS)
    try:
        for name in names:
            try:
                started.append(start_guest(conn, name, image, partition=partition, console_log=work / f"{name}.log",
                                           **extra(name, work)))
            except libvirt.libvirtError as exc:
                msg = exc.get_error_message()
                raise CapsProbeError(f"host {uri}: cannot start {kind} guest {name} ({msg})") from None
            journal.write(guests=[{"uri": uri, "domain": d.name(), "uuid": d.UUIDString()} for d in started],
                          workdir=str(work))
        for name in names:
            try:
                wait_for_boot(work / f"{name}.log")
            except GuestError as exc:
                raise CapsProbeError(f"host {uri}: {exc}") from None
        yield names
    finally:
        gone = True
        for dom in started:
            try:
                dom.destroy()
            except libvirt.libvirtError:
                gone = gone and not _still_there(conn, dom)
        if gone:
            journal.clear()
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()
        shutil.rmtree(work, ignore_errors=True)


def _still_there(conn: Any, dom: Any) -> bool:
    try:
        conn.lookupByUUIDString(dom.UUIDString())
    except libvirt.libvirtError:
        return False
    return True


def destroy_guest(uri: str, name: str, uuid: str) -> tuple[list[str], list[str]]:
    """Destroy the transient calibration guest ``uuid`` a killed calibration booted on ``uri`` (hypervisor.journal);
    one that is gone, or is not a calibration guest by its name, is left.  Returns (done, problems)."""
    _quiet_libvirt()
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        return [], [f"calibration guest {name} on {uri}: cannot connect ({exc.get_error_message()})"]
    try:
        try:
            dom = conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError:
            return [f"calibration guest {name} on {uri}: gone already"], []
        if dom.name() != name or not name.startswith("vcsched-calib-") or dom.isPersistent():
            return [], [f"calibration guest {name} on {uri}: its UUID is now {dom.name()!r}, not a transient "
                        "calibration guest; left alone"]
        try:
            dom.destroy()
        except libvirt.libvirtError as exc:
            return [], [f"calibration guest {name} on {uri}: not destroyed ({exc.get_error_message()})"]
        return [f"calibration guest {name} on {uri}: destroyed"], []
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()


# --------------------------------------------------------------------------------------------- disk and network


class LibvirtIoSubjects:
    """Running guests that write to their disk (or receive on their NIC), capped through libvirt.

    The ``calibration.experiment.Subjects`` of ``vcsched calibrate --resource
    disk|net``.  Caps are fractions of a reference rate (:attr:`scale`, bytes
    per second: what one guest reaches uncapped, measured by the caller), so
    the CPU protocol — fractions, n concurrent subjects with n x cap <= 1,
    cap steps — applies unchanged, and errors are in points of that
    reference.  Caps are set the way the product sets them
    (``hypervisor.libvirt_backend.apply_io_caps``: one throttle group for a
    VM's disks; the same average in and out on each interface), LIVE only,
    and the guests' original limits are put back by :meth:`close`.

    Observed: disk = bytes read + written (``blockStats``); net = bytes the
    guest received (``interfaceStats`` rx), with this machine writing frames
    into each guest's tap while it runs (:mod:`hypervisor.frames`: inbound,
    the direction libvirt's counters can show a cap on).
    """

    nominal_bare: float | None = 1.0
    default_window = 1.0
    resource: str

    def __init__(self, uri: str, domains: Sequence[str], resource: str, *, force: bool = False,
                 managed: bool = False, journal: Journal | None = None):
        from hypervisor.drivers import io_support

        _quiet_libvirt()
        if resource not in ("disk", "net"):
            raise InputError(f"--resource: {resource!r} is not disk or net")
        self.uri = uri
        self.resource = resource
        self.count = len(domains)
        self.scale = 1.0  # bytes/s of one unit; the caller sets the measured reference
        self.unit = "x reference"
        self.doms: list[Any] = []
        self.devices: list[Any] = []
        self._saved: list[Any] = []
        self.entries: list[CalibrationEntry] = []
        self._floods: list[Any] = []
        self.journal = journal
        self.problems: list[str] = []
        try:
            self.conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            raise InputError(f"--connect {uri}: cannot connect ({exc.get_error_message()})") from None
        try:
            refused = dict(io_support(str(self.conn.getType()).lower(), uri))
            if resource in refused:
                raise InputError(f"host {uri}: cannot cap {resource}: {refused[resource]}")
            self._adopt(domains, force, managed)
            if self.journal is not None and self.entries:
                self.journal.write(domains=self.entries)
            self._probe()
            if resource == "net":
                self._make_floods()
            for i in range(self.count):
                self.pause(i)
        except BaseException:
            self.close()
            raise

    def _adopt(self, names: Sequence[str], force: bool, managed: bool) -> None:
        from hypervisor.throttle import live_devices

        for name in names:
            dom = running_domain(self.conn, self.uri, name)
            check_managed(dom, self.uri, force, managed)
            devices = live_devices(dom)
            if not devices.count(self.resource):
                what = "disk" if self.resource == "disk" else "network interface libvirt can shape"
                raise InputError(f"--domain {name}: has no {what} on {self.uri}")
            self.doms.append(dom)
            self.devices.append(devices)
            self._saved.append(self._read(dom, devices))
            self.entries.append(CalibrationEntry(self.uri, name, dom.UUIDString(), io={
                "resource": self.resource, "amount": self._saved[-1].amount(self.resource)}))

    def _read(self, dom: Any, devices: Any) -> Any:
        from hypervisor.throttle import io_caps_of

        live = libvirt.VIR_DOMAIN_AFFECT_LIVE
        if self.resource == "disk":
            return io_caps_of([dom.blockIoTune(d, live) for d in devices.disks], [])
        return io_caps_of([], [dom.interfaceParameters(n, live) for n in devices.nics])

    def _caps(self, value: int | None) -> IoCaps:
        """``value`` bytes/s on this resource (None: no limit, which libvirt spells 0)."""
        v = 0 if value is None else int(value)
        return IoCaps(disk_bytes_sec=v) if self.resource == "disk" else IoCaps(net_bytes_sec=v)

    def _apply(self, index: int, value: int | None) -> None:
        from hypervisor.base import HypervisorError
        from hypervisor.throttle import apply_io_caps

        try:
            apply_io_caps(self.uri, self.doms[index], self.devices[index], self._caps(value),
                          libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except HypervisorError as exc:
            raise CapsProbeError(str(exc)) from None

    def _probe(self) -> None:
        """Cap the first guest once (at a rate nothing reaches) and put it back: a host that cannot is refused
        before anything is measured, naming host, guest and value."""
        if not self.doms:
            return
        probe = 10**12
        try:
            self._apply(0, probe)
        except CapsProbeError as exc:
            raise InputError(f"--resource {self.resource}: {exc}") from None
        self._apply(0, self._saved[0].amount(self.resource))

    def _make_floods(self) -> None:
        import xml.etree.ElementTree as ET

        from hypervisor.frames import Flood

        for dom, devices in zip(self.doms, self.devices, strict=True):
            mac = ET.fromstring(dom.XMLDesc(0)).find("devices/interface/mac")
            if mac is None or not mac.get("address"):
                raise InputError(f"--domain {dom.name()}: its interface has no MAC address")
            self._floods.append(Flood(devices.nics[0], str(mac.get("address"))))

    # --- the Subjects protocol -------------------------------------------------
    def resume(self, index: int) -> None:
        dom = self.doms[index]
        if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
            dom.resume()
        if self._floods:
            self._floods[index].start()

    def pause(self, index: int) -> None:
        if self._floods:
            self._floods[index].stop()
        dom = self.doms[index]
        if dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING:
            dom.suspend()

    def set_cap(self, index: int, cap: float | None) -> None:
        value = None if cap is None else max(1, round(cap * self.scale))
        self._apply(index, value)
        got = self._read(self.doms[index], self.devices[index]).amount(self.resource)
        from vcsched.iocaps import realisable

        want = None if value is None else realisable(self._caps(value), self.devices[index]).amount(self.resource)
        if got != want:
            raise CapsProbeError(f"host {self.uri}: {self.doms[index].name()} reads back {self.resource} cap "
                                 f"{got} after {want}")

    def make_bare(self, index: int) -> None:
        raise CapsProbeError("a guest's I/O cannot run outside its VM: the reference is measured uncapped")

    def bytes_done(self, index: int) -> int:
        dom, devices = self.doms[index], self.devices[index]
        if self.resource == "disk":
            return sum(max(s[1], 0) + max(s[3], 0) for s in (dom.blockStats(d) for d in devices.disks))
        return sum(max(dom.interfaceStats(n)[0], 0) for n in devices.nics)

    def poll(self, index: int) -> list[tuple[float, float, float]]:
        """One point: (time of the reading, bytes / reference, same): work and share are the same here."""
        before = time.monotonic()
        done = self.bytes_done(index) / self.scale
        after = time.monotonic()
        return [((before + after) / 2, done, done)]

    def close(self) -> list[str]:
        """Stop the floods, put every guest's limits back, resume it (:func:`put_back`, signals held meanwhile).
        Returns (and keeps in :attr:`problems`) what could not be put back."""
        with signals_held():
            for f in self._floods:
                f.close()
            self._floods = []
            self.problems = _put_all_back(self)
        return self.problems

    def __enter__(self) -> LibvirtIoSubjects:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@contextlib.contextmanager
def io_guests(uri: str, count: int, image: GuestImage, partition: str | None, resource: str) -> Iterator[list[str]]:
    """``count`` transient guests that write to their own disk (``disk``) or receive on a NIC (``net``).

    Named ``vcsched-calib-<pid>-<i>``; their consoles and disk files go to a
    temporary directory removed with them.
    """
    from hypervisor.guest import make_disk

    def extra(name: str, work: Path) -> dict[str, Any]:
        if resource == "disk":
            return {"workload": "disk", "disk": make_disk(work / f"{name}.img"), "nic": False}
        return {"workload": "sink", "disk": None, "nic": True}

    with _calibration_guests(uri, count, image, partition, resource, extra) as names:
        yield names
