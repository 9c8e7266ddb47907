"""Local processes under Linux CFS bandwidth control: the ``cgroup`` calibration backend.

The KVM/QEMU analogue of Xen's credit-scheduler ``cap`` (paper section 7) is
CFS bandwidth control, which is exactly what libvirt's ``vcpu_quota`` /
``vcpu_period`` write into the vCPU threads' cgroups.  Measuring it on plain
processes isolates the kernel mechanism from the emulator.

Both hierarchies are supported, whichever has a writable ``cpu`` controller:

* cgroup v1: ``<mount>/cpu/<group>/cpu.cfs_period_us`` and ``cpu.cfs_quota_us``
  (``-1`` = no limit);
* cgroup v2: ``<mount>/<group>/cpu.max`` = ``"<quota> <period>"`` or ``"max <period>"``.

Every run creates one group named ``vcsched-calib-<pid>`` with one child per
worker (``w0``, ``w1``, ...) and removes it afterwards, also on Ctrl-C and
SIGTERM (see ``CgroupSubjects.close``).  Groups left by a run that was killed
outright (SIGKILL) are removed by the next run once their pid is gone.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from calibration.workload import PARENT_ENV, SINGLE_THREAD_ENV, Point, is_ready, read_points, slot_bytes
from vcsched.caps import MIN_QUOTA_US, PERIOD_US
from vcsched.caps import quota_for as vcpu_quota_for
from vcsched.errors import InputError, VcschedError

# High priority, the same for bare and capped workers: nice -20 is CFS weight 88761; a v1 group with
# cpu.shares 88761 weighs the same against other processes, v2's cpu.weight tops out at 10000 (= 102400).
HIGH_NICE = -20
HIGH_SHARES_V1 = 88761
HIGH_WEIGHT_V2 = 10000
GROUP_PREFIX = "vcsched-calib-"
DEFAULT_SYSFS = Path("/sys/fs/cgroup")
SHM_DIR = Path("/dev/shm")  # the workers' progress file: tmpfs, named vcsched-calib-<pid>-XXXX


class CgroupError(VcschedError):
    """The cgroup hierarchy could not be used (the CLI reports it as bad input: exit 2)."""


@dataclass(frozen=True)
class CpuHierarchy:
    """Where the ``cpu`` controller lives: its mount point, version, and the cgroup we started in."""

    version: int
    mount: Path
    home: Path  # our own cgroup inside ``mount``: where "bare" workers stay

    def group_dir(self, name: str) -> Path:
        return self.mount / name


def _own_cgroup(version: int, proc_cgroup: str) -> str:
    """The path of the current process's cgroup for the cpu controller, from /proc/self/cgroup."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if version == 1 and "cpu" in controllers.split(","):
            return path
        if version == 2 and parts[0] == "0" and controllers == "":
            return path
    return "/"


def detect_hierarchy(sysfs: Path = DEFAULT_SYSFS, proc_cgroup: str | None = None) -> CpuHierarchy:
    """Find a ``cpu`` controller we can use: v1 ``<sysfs>/cpu``, else v2 with ``cpu`` in its controllers."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    v1 = sysfs / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return CpuHierarchy(1, v1, v1 / _own_cgroup(1, proc_cgroup).lstrip("/"))
    for mount in (sysfs, sysfs / "unified"):
        controllers = mount / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return CpuHierarchy(2, mount, mount / _own_cgroup(2, proc_cgroup).lstrip("/"))
    raise CgroupError(
        f"--backend cgroup: no cpu controller under {sysfs} (neither v1 {v1}/cpu.cfs_quota_us "
        "nor a cgroup v2 mount listing 'cpu' in cgroup.controllers)"
    )


def quota_for(cap: float | None) -> int | None:
    """CFS quota (µs per ``PERIOD_US``) for a cap in (0, 1]; ``None`` means no limit."""
    if cap is None:
        return None
    if not 0 < cap <= 1:
        raise InputError(f"cap: {cap:g} is outside (0, 1]")
    quota = vcpu_quota_for(cap, 1)  # a worker is one thread, capped like a 1-vCPU guest
    if quota < MIN_QUOTA_US:
        raise InputError(f"cap: {cap:g} is below the kernel's minimum quota ({MIN_QUOTA_US / PERIOD_US:g})")
    return quota


class CpuGroup:
    """One ``vcsched-calib-<pid>`` group with one child per worker; removes itself on ``remove()``."""

    def __init__(self, hierarchy: CpuHierarchy, children: int, name: str | None = None):
        self.hierarchy = hierarchy
        self.dir = hierarchy.group_dir(name or f"{GROUP_PREFIX}{os.getpid()}")
        self.children = [self.dir / f"w{i}" for i in range(children)]
        try:
            self.dir.mkdir()
        except FileExistsError:
            raise CgroupError(f"--backend cgroup: {self.dir} already exists (another calibration run?)") from None
        except OSError as exc:
            raise CgroupError(f"--backend cgroup: cannot create {self.dir} ({exc.strerror}); run as root") from None
        try:
            if hierarchy.version == 2:
                self._enable_cpu_controller()
            for child in self.children:
                child.mkdir()
        except OSError as exc:
            self.remove()
            raise CgroupError(f"--backend cgroup: cannot set up {self.dir} ({exc.strerror})") from None

    def _enable_cpu_controller(self) -> None:
        parent_control = self.dir.parent / "cgroup.subtree_control"
        if "cpu" not in parent_control.read_text().split():
            parent_control.write_text("+cpu")
        (self.dir / "cgroup.subtree_control").write_text("+cpu")

    def set_high_weight(self) -> None:
        """Weigh the group and its children like nice -20 tasks against the machine's other processes.

        Weight only decides who runs when several want the CPU; the quota
        still caps each child exactly, so this changes what the run measures
        only by keeping other tenants' processes from eating into it.
        """
        for d in [self.dir, *self.children]:
            if self.hierarchy.version == 1:
                (d / "cpu.shares").write_text(str(HIGH_SHARES_V1))
            else:
                (d / "cpu.weight").write_text(str(HIGH_WEIGHT_V2))

    def set_cap(self, index: int, cap: float | None) -> None:
        quota = quota_for(cap)
        child = self.children[index]
        if self.hierarchy.version == 1:
            (child / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (child / "cpu.cfs_quota_us").write_text(str(-1 if quota is None else quota))
        else:
            (child / "cpu.max").write_text(f"{'max' if quota is None else quota} {PERIOD_US}")

    def read_cap(self, index: int) -> float | None:
        """The cap the kernel holds for a child (read back, not remembered)."""
        child = self.children[index]
        if self.hierarchy.version == 1:
            quota = int((child / "cpu.cfs_quota_us").read_text())
            period = int((child / "cpu.cfs_period_us").read_text())
            return None if quota < 0 else quota / period
        q, p = (child / "cpu.max").read_text().split()
        return None if q == "max" else int(q) / int(p)

    def attach(self, index: int, pid: int) -> None:
        (self.children[index] / "cgroup.procs").write_text(str(pid))

    def detach(self, pid: int) -> None:
        """Back to the cgroup we started in: outside any limit we set."""
        (self.hierarchy.home / "cgroup.procs").write_text(str(pid))

    def remove(self) -> list[str]:
        """Remove the children and the group; moves any remaining process home first.  Returns problems."""
        problems: list[str] = []
        for d in [*self.children, self.dir]:
            if not d.exists():
                continue
            procs = d / "cgroup.procs"
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(OSError):
                        self.detach(int(pid))
            for attempt in range(50):
                try:
                    d.rmdir()
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 49:
                        problems.append(f"cannot remove {d} ({exc.strerror})")
                        break
                    time.sleep(0.02)  # an exiting worker leaves the group a moment after it is reaped
        return problems


def remove_stale_groups(hierarchy: CpuHierarchy, shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove what runs killed outright (SIGKILL) left: their groups and progress files.

    Both carry the run's pid (``vcsched-calib-<pid>``, ``vcsched-calib-<pid>-XXXX``);
    anything whose pid no longer exists is stale.  Returns what was removed.
    """
    removed: list[Path] = []
    pattern = re.compile(re.escape(GROUP_PREFIX) + r"(\d+)(-\w+)?$")

    def stale(p: Path) -> bool:
        m = pattern.match(p.name)
        return m is not None and not Path(f"/proc/{m.group(1)}").exists()

    for d in hierarchy.mount.iterdir():
        if not d.is_dir() or not stale(d):
            continue
        children = sorted(p for p in d.iterdir() if p.is_dir())
        group = CpuGroup.__new__(CpuGroup)
        group.hierarchy, group.dir, group.children = hierarchy, d, children
        if not group.remove():
            removed.append(d)
    if shm_dir.is_dir():
        for f in shm_dir.iterdir():
            if f.is_file() and stale(f):
                with contextlib.suppress(OSError):
                    f.unlink()
                    removed.append(f)
    return removed


class CgroupSubjects:
    """``count`` DGEMM worker processes pinned to one CPU, each in its own capped child cgroup.

    Implements the ``calibration.experiment.Subjects`` protocol.  Workers are
    frozen with SIGSTOP between phases so an idle worker costs the measured
    CPU nothing; the group and the workers disappear in ``close()``.
    """

    unit = "DGEMM/s"
    nominal_bare: float | None = None  # the bare rate is measured: a worker outside any cgroup limit
    default_window = 0.1  # one CFS period: exact for the self-timestamped workload

    def __init__(
        self,
        count: int,
        cpu: int,
        hierarchy: CpuHierarchy | None = None,
        ready_timeout: float = 60.0,
        high_priority: bool = False,
    ):
        self.count = count
        self.cpu = cpu
        self.high_priority = high_priority
        self.hierarchy = hierarchy or detect_hierarchy()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._since = [0] * count
        self.group: CpuGroup | None = None
        self._shm_path: str | None = None
        self._mm: mmap.mmap | None = None
        self._view: memoryview[float] | None = None
        try:
            remove_stale_groups(self.hierarchy)
            self.group = CpuGroup(self.hierarchy, count)
            if high_priority:
                self.group.set_high_weight()
            self._start_workers(ready_timeout)
        except BaseException:
            self.close()
            raise

    def _start_workers(self, ready_timeout: float) -> None:
        shm_dir = str(SHM_DIR) if os.access(SHM_DIR, os.W_OK) else None
        fd, self._shm_path = tempfile.mkstemp(prefix=f"{GROUP_PREFIX}{os.getpid()}-", dir=shm_dir)
        os.ftruncate(fd, slot_bytes(self.count))
        self._mm = mmap.mmap(fd, 0)
        os.close(fd)
        self._view = memoryview(self._mm).cast("d")
        env = {**os.environ, **SINGLE_THREAD_ENV, PARENT_ENV: str(os.getpid())}
        for i in range(self.count):
            proc = subprocess.Popen(
                [sys.executable, "-m", "calibration.workload", self._shm_path, str(i), str(self.cpu)],
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us, and we kill the workers in order
            )
            self.procs.append(proc)
            if self.high_priority:
                os.setpriority(os.PRIO_PROCESS, proc.pid, HIGH_NICE)  # bare runs weigh what the groups weigh
        deadline = time.monotonic() + ready_timeout
        for i, proc in enumerate(self.procs):
            while not is_ready(self._view, i):
                if proc.poll() is not None:
                    raise VcschedError(f"calibration worker {i} exited with code {proc.returncode} before starting")
                if time.monotonic() > deadline:
                    raise VcschedError(f"calibration worker {i} not ready after {ready_timeout:g} s")
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGSTOP)

    # --- the Subjects protocol -------------------------------------------------
    def resume(self, index: int) -> None:
        os.kill(self.procs[index].pid, signal.SIGCONT)

    def pause(self, index: int) -> None:
        os.kill(self.procs[index].pid, signal.SIGSTOP)

    def set_cap(self, index: int, cap: float | None) -> None:
        assert self.group is not None
        self.group.attach(index, self.procs[index].pid)
        self.group.set_cap(index, cap)

    def make_bare(self, index: int) -> None:
        assert self.group is not None
        self.group.detach(self.procs[index].pid)

    def poll(self, index: int) -> list[Point]:
        """Points the worker published since the last poll: ``(time, work, cpu seconds)``."""
        assert self._view is not None
        points, self._since[index] = read_points(self._view, index, self._since[index])
        return points

    def close(self) -> list[str]:
        """Kill and reap the workers, remove the cgroups and the shared file.  Safe to call twice."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process dies only once continued on some kernels
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        problems = self.group.remove() if self.group is not None else []
        self.group = None
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._shm_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._shm_path)
            self._shm_path = None
        return problems

    def __enter__(self) -> CgroupSubjects:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

