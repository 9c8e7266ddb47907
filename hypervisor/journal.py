"""What vcsched is about to change for a while, written down before it changes it, so any later process can undo it.

Two commands change hosts *temporarily*: a probe (``vcsched observe --probe``
and ``vcsched run``) raises VMs' caps for a few seconds, and ``vcsched
calibrate --backend libvirt`` pins a domain's threads to one CPU, pauses it
between measurements and re-caps it.  Each puts things back on its way out —
on return, on an error, on SIGTERM and SIGINT — but nothing runs after a
SIGKILL, a machine crash or an OOM kill.  So before its first change such a
command writes a *journal*: one small JSON file per process under
``<state dir>/journal/`` (``$VCSCHED_STATE_DIR``, see
:func:`hypervisor.files.state_dir`), replaced atomically (write, fsync,
rename), removed once everything is back.  :func:`acting.restore.restore_journal` reads the
journals of processes that are gone and puts back what they recorded; ``vcsched
observe --probe`` and ``vcsched run`` call it (probe journals of their
cluster) before they probe, ``vcsched calibrate --backend libvirt``
(calibration journals) before it calibrates.

The format (``version`` 1)::

    {"version": 1, "kind": "probe", "pid": 4242, "started": 123456, "written": 1764190000.1,
     "cluster": "lab",
     "vms": [{"host": "h0", "vm": "web-0", "uuid": "…", "before": 0.5, "raised": 1.0}]}

    {"version": 1, "kind": "calibration", "pid": 4243, "started": 123499, "written": 1764190001.2,
     "domains": [{"uri": "qemu:///system", "domain": "u1", "uuid": "…",
                  "scheduler": {"vcpu_period": 100000, "vcpu_quota": -1},
                  "vcpu_pins": [[true, true]], "emulator_pin": [true, true], "io": null}]}

    {"version": 1, "kind": "calibration-guests", "pid": 4244, "started": 123510, "written": 1764190002.3,
     "guests": [{"uri": "qemu:///system", "domain": "vcsched-calib-4244-0", "uuid": "…"}],
     "workdir": "/var/tmp/vcsched-calib-x1y2z3"}

``pid`` and ``started`` (the process's start time in clock ticks since boot,
``/proc/<pid>/stat`` field 22) say whose journal it is: a journal whose
process still runs is that process's business and is left alone (a reused
pid has another start time).  A probe entry is put back only if the VM still
runs on that host with that UUID, is not in doubt, and still has the raised
cap (anything else means a later command set its cap: the newer setting
wins); through the executor, as a set-cap plan, under the caller's cluster
lock.  A calibration entry is put back on the domain with that UUID whatever
its caps are now (a calibration is an operator's exclusive measurement), each
setting on its own: scheduler parameters, each vCPU's pinning, the emulator's
pinning, I/O limits, and a resume if vCPUs are paused *by a suspend*
(``VIR_DOMAIN_PAUSED_USER``: a copy paused by a migration is never resumed
here); one that fails does not skip the others, and every failure is
reported.  The transient guests a calibration boots for itself
(``calibration-guests``, journaled as each starts) are destroyed, by UUID,
if they still carry their ``vcsched-calib-`` name.  A journal is removed
once every entry is back or moot; one with failures stays for the next try.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vcsched.errors import VcschedError
from vcsched.inventory import Inventory

VERSION = 1
PROBE, CALIBRATION = "probe", "calibration"
#: The transient guests `calibrate` boots for itself (``vcsched-calib-<pid>-<i>``): destroyed after a SIGKILL.
GUESTS = "calibration-guests"
KINDS = (PROBE, CALIBRATION, GUESTS)


def journal_dir(state: Path | None = None) -> Path:
    """``<state dir>/journal`` (:func:`hypervisor.files.state_dir` unless ``state`` is given)."""
    if state is None:
        from hypervisor.files import state_dir

        state = state_dir()
    return state / "journal"


def own_pid() -> int:
    """This process's pid: whose journal :meth:`Journal.write` writes and which journal is one's own.  A function,
    so that the fault simulation (:mod:`faultsim.simulation`) can run its simulated processes through this module."""
    return os.getpid()


def process_started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (None: no such process, or not on Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count the fields after its last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ProbeEntry:
    """A VM whose cap a probe is about to raise from ``before`` to ``raised`` (cores)."""

    host: str
    vm: str
    uuid: str | None
    before: float
    raised: float


@dataclass(frozen=True)
class CalibrationEntry:
    """A domain a calibration is about to pin, pause and re-cap, with the settings to put back.

    ``vcpu_pins``/``emulator_pin``: None when the calibration does not pin; ``io``: ``{"resource": "disk",
    "amount": bytes/s or None}`` when it caps disk or network instead of CPU (None otherwise).
    """

    uri: str
    domain: str
    uuid: str
    scheduler: Mapping[str, int] | None = None
    vcpu_pins: Sequence[Sequence[bool]] | None = None
    emulator_pin: Sequence[bool] | None = None
    io: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class JournalReport:
    """What :func:`acting.restore.restore_journal` did: ``restored`` (one line per setting put back),
    ``problems`` (what it could not put back: their journals stay), ``left`` (journals it did not touch, and why)."""

    restored: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    left: tuple[str, ...] = ()

    def __add__(self, other: JournalReport) -> JournalReport:
        return JournalReport(self.restored + other.restored, self.problems + other.problems, self.left + other.left)

    def to_dict(self) -> dict[str, list[str]]:
        return {"restored": list(self.restored), "problems": list(self.problems), "left": list(self.left)}


@dataclass
class Journal:
    """This process's journal of one kind (module docstring): :meth:`write` before changing, :meth:`clear` after."""

    kind: str
    directory: Path = field(default_factory=journal_dir)
    pid: int = field(default_factory=lambda: own_pid())

    @property
    def path(self) -> Path:
        return self.directory / f"{self.kind}-{self.pid}.json"

    def write(self, **content: Any) -> None:
        """Replace this process's journal with ``content`` (``cluster``/``vms`` or ``domains``), durably: after a
        crash the file is either the old one or this one.  A journal that cannot be written is an error: what
        it would record must not be changed."""
        doc = {"version": VERSION, "kind": self.kind, "pid": self.pid, "started": process_started(self.pid),
               "written": round(time.time(), 3), **_plain(content)}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            with tmp.open("w", encoding="utf-8") as f:
                f.write(json.dumps(doc, indent=1) + "\n")
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.path)
            dirfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)
        except OSError as exc:
            raise JournalError(f"journal {self.path}: cannot write ({exc.strerror}); nothing changed") from None

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def exists(self) -> bool:
        return self.path.exists()


class JournalError(VcschedError):
    """The journal cannot be written, so the change it would record is not made (exit 1)."""

    exit_code = 1


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return _plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Found:
    """A journal of a gone process (or this one's, asked for) and what it says."""

    path: Path
    doc: dict[str, Any]


def pending(kind: str | None = None, directory: Path | None = None, *, own: bool = False) -> list[Path]:
    """Journals (of ``kind``, or every kind) whose process is gone — or this process's own, with ``own``."""
    return [f.path for f in gone_journals(directory or journal_dir(), kind, own)[0]]


def gone_journals(directory: Path, kind: str | None, own: bool) -> tuple[list[Found], list[str]]:
    """(journals to restore, lines for those left alone)."""
    found: list[Found] = []
    left: list[str] = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return [], []
    for path in paths:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            left.append(f"journal {path}: unreadable ({exc}); left as it is")
            continue
        if not isinstance(doc, dict) or doc.get("version") != VERSION or doc.get("kind") not in KINDS:
            left.append(f"journal {path}: not a version-{VERSION} vcsched journal; left as it is")
            continue
        if kind is not None and doc["kind"] != kind:
            continue
        pid, started = doc.get("pid"), doc.get("started")
        me = own_pid()
        mine = pid == me and started == process_started(me)
        alive = isinstance(pid, int) and not mine and process_started(pid) is not None \
            and process_started(pid) == started
        if alive:
            left.append(f"journal {path}: its process {pid} still runs; left to it")
            continue
        if mine and not own:
            continue
        found.append(Found(path, doc))
    return found, left


def describe_journal(directory: Path | None = None) -> list[str]:
    """What :func:`acting.restore.restore_journal` would put back (one line per journal of a gone process),
    changing nothing."""
    found, _left = gone_journals(directory or journal_dir(), None, own=False)
    out = []
    for f in found:
        if f.doc["kind"] == PROBE:
            vms = ", ".join(f"{e.get('vm')} on {e.get('host')} to {e.get('before')} if still at {e.get('raised')}"
                            for e in f.doc.get("vms", []))
            out.append(f"journal {f.path}: a killed probe (pid {f.doc.get('pid')}, cluster "
                       f"{f.doc.get('cluster')!r}) left caps raised: {vms or 'none'}")
        elif f.doc["kind"] == GUESTS:
            guests = ", ".join(f"{e.get('domain')} on {e.get('uri')}" for e in f.doc.get("guests", []))
            out.append(f"journal {f.path}: a killed calibration (pid {f.doc.get('pid')}) booted {guests or 'none'}: "
                       "destroyed")
        else:
            doms = ", ".join(f"{e.get('domain')} on {e.get('uri')}" for e in f.doc.get("domains", []))
            out.append(f"journal {f.path}: a killed calibration (pid {f.doc.get('pid')}) changed {doms or 'none'} "
                       "(pinning, running state, caps): each is put back")
    return out


def probe_entries(inventory: Inventory, caps: Mapping[str, float]) -> list[ProbeEntry]:
    """What a probe's journal records before it raises ``caps`` (VM -> raised cap) on ``inventory``."""
    out = []
    for name, cap in sorted(caps.items()):
        v = inventory.vm(name)
        if v is not None and v.cap_cores is not None:
            out.append(ProbeEntry(v.host, name, v.uuid, v.cap_cores, cap))
    return out


def probe_caps_back(inventory: Inventory, entries: Sequence[ProbeEntry]) -> tuple[dict[str, float], list[str]]:
    """Which probe caps to put back now (VM -> its cap before the probe), and why others must wait.

    An entry is put back only if its VM still runs on the same host with the same UUID, is not in doubt, and
    still has the raised cap; any other cap was set by a later command and stands.  An entry whose host is down
    waits (a line each): its VM cannot be read.
    """
    from vcsched.caps import same_cap

    down = {h.name for h in inventory.down_hosts()}
    back: dict[str, float] = {}
    waiting: list[str] = []
    for e in entries:
        v = inventory.vm(e.vm)
        if e.host in down:
            waiting.append(f"{e.vm}: host {e.host} is down; its probe cap {e.raised:g} stays recorded")
        elif v is None or v.host != e.host or not v.active or v.in_doubt or v.meta is None \
                or (e.uuid is not None and v.uuid != e.uuid):
            continue
        elif v.cap_cores is not None and same_cap(v.cap_cores, e.raised, v.vcpus):
            back[e.vm] = e.before
    return back, waiting


def destroy_guests(f: Found) -> JournalReport:
    from hypervisor.caps_probe import destroy_guest

    done: list[str] = []
    problems: list[str] = []
    for g in f.doc.get("guests", []):
        try:
            d, p = destroy_guest(str(g["uri"]), str(g["domain"]), str(g["uuid"]))
        except (KeyError, TypeError) as exc:
            problems.append(f"journal {f.path}: malformed guest entry ({exc})")
            continue
        done += d
        problems += p
    if not problems:
        work = f.doc.get("workdir")
        if isinstance(work, str) and Path(work).name.startswith("vcsched-calib-"):  # its consoles and disks
            shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            f.path.unlink()
    return JournalReport(tuple(done), tuple(problems))


def restore_calibration(f: Found) -> JournalReport:
    from hypervisor.caps_probe import restore_domain

    restored: list[str] = []
    problems: list[str] = []
    for raw in f.doc.get("domains", []):
        try:
            entry = CalibrationEntry(str(raw["uri"]), str(raw["domain"]), str(raw["uuid"]), raw.get("scheduler"),
                                     raw.get("vcpu_pins"), raw.get("emulator_pin"), raw.get("io"))
        except (KeyError, TypeError) as exc:
            problems.append(f"journal {f.path}: malformed calibration entry ({exc})")
            continue
        done, failed = restore_domain(entry)
        restored += done
        problems += failed
    if not problems:
        with contextlib.suppress(FileNotFoundError):
            f.path.unlink()
    return JournalReport(tuple(restored), tuple(problems))


# ---------------------------------------------------------------------------------------------- signals


@contextlib.contextmanager
def signals_held() -> Iterator[list[int]]:
    """SIGTERM and SIGINT wait until the block ends (putting things back must not be cut short by a second
    signal); the list holds the signals that came meanwhile, and they are delivered again, to the handlers
    that were in force, when the block ends.  Outside the main thread (where handlers cannot be set): no-op."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def hold(signum: int, _frame: Any) -> None:
        came.append(signum)

    previous = {s: signal.signal(s, hold) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield came
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        for signum in dict.fromkeys(came):
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                if signum == signal.SIGINT:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signum)
