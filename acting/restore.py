"""Putting back what a killed vcsched process left changed, from its journal (hypervisor/journal.py).

The journal (writing it, finding the journals of gone processes, putting back a calibration's domain settings
through libvirt) is the adapter's; putting back a probe's caps is acting — a set-cap plan through the executor,
under the caller's cluster lock — so it lives here, and the adapter imports nothing of the acting runtime.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from acting.executor import DONE, SKIPPED, apply_plan
from hypervisor.journal import (
    GUESTS,
    KINDS,
    PROBE,
    Found,
    JournalReport,
    ProbeEntry,
    destroy_guests,
    gone_journals,
    journal_dir,
    probe_caps_back,
    restore_calibration,
)
from vcsched.control.observe import cap_plan
from vcsched.errors import VcschedError


def restore_journal(hv: Any = None, *, kinds: Sequence[str] = KINDS, directory: Path | None = None,
                    guard: Callable[[], None] | None = None, own: bool = False) -> JournalReport:
    """Put back what the journals of gone processes recorded (module docstring); returns what it did.

    ``hv`` (a :class:`hypervisor.base.Hypervisor` of one cluster) restores probe journals of that cluster,
    through the executor: the caller holds the cluster lock and passes its ``guard``; without ``hv`` probe
    journals are left.  Calibration journals are restored through libvirt directly, by URI.  ``own``: this
    process's journals too (a controller whose earlier restore failed).  Raises nothing for what it cannot put
    back: that is in the report's ``problems`` (and the journal stays).
    """
    directory = directory or journal_dir()
    found, left = gone_journals(directory, None, own)
    report = JournalReport(left=tuple(left))
    for f in found:
        kind = f.doc["kind"]
        if kind not in kinds:
            continue
        if kind == PROBE:
            report += _restore_probe(hv, f, guard)
        elif kind == GUESTS:
            report += destroy_guests(f)
        else:
            report += restore_calibration(f)
    return report


def _restore_probe(hv: Any, f: Found, guard: Callable[[], None] | None) -> JournalReport:
    if hv is None:
        return JournalReport(left=(f"journal {f.path}: probe caps of cluster {f.doc.get('cluster')!r} (restored "
                                   "by `vcsched run`, `vcsched observe --probe` or `vcsched repair` there)",))
    try:
        entries = [ProbeEntry(str(e["host"]), str(e["vm"]), None if e.get("uuid") is None else str(e["uuid"]),
                              float(e["before"]), float(e["raised"])) for e in f.doc.get("vms", [])]
    except (KeyError, TypeError, ValueError) as exc:
        return JournalReport(left=(f"journal {f.path}: malformed probe entry ({exc}); left as it is",))
    inventory = hv.inventory()
    if f.doc.get("cluster") != inventory.cluster:
        return JournalReport(left=(f"journal {f.path}: probe caps of cluster {f.doc.get('cluster')!r}, not "
                                   f"{inventory.cluster!r}",))
    back, waiting = probe_caps_back(inventory, entries)
    restored: list[str] = []
    problems: list[str] = list(waiting)
    if back:
        try:
            result = apply_plan(hv, cap_plan(inventory, back), guard=guard)
        except VcschedError as exc:
            problems.append(f"probe caps {', '.join(sorted(back))}: not put back ({exc})")
        else:
            for r in result.results:
                if r.outcome in (DONE, SKIPPED):
                    restored.append(f"{r.step.vm}: cap put back to {back[r.step.vm]:g} (a probe had raised it)")
                else:
                    problems.append(f"{r.step.vm}: probe cap not put back to {back[r.step.vm]:g} ({r.outcome}"
                                    + (f": {r.detail}" if r.detail else "") + ")")
    if not problems:
        with contextlib.suppress(FileNotFoundError):
            f.path.unlink()
    return JournalReport(tuple(restored), tuple(problems))
