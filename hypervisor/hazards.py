"""Mutation switches: known hazards of the acting layer, re-introduced on purpose to show the fault simulation
can catch them (tests/test_faultsim.py).  Off unless a test or ``scripts/faultsim --hazard`` turns one on.

A simulation that has never failed has not been shown to look: each name below is consulted at the exact
point in the real code where the hazard used to be (grep the name), and the simulation must report a
violation within its test's schedules when it is on.
"""

from __future__ import annotations

#: An arrival is resumed when the hosts that were read answered, without re-reading its source host.
RESUME_UNREAD_SOURCE = "resume-unread-source"
#: In-doubt VMs are settled (paused twins destroyed, arrivals resumed) by a read, without the cluster lock.
SETTLE_WITHOUT_LOCK = "settle-without-lock"
#: The executor acts on the first copy of an in-doubt VM by host order.
FIRST_COPY_LOOKUP = "first-copy-lookup"

#: A probe raises caps without journaling first what to put back: after a kill nothing puts them back.
PROBE_NO_RESTORE = "probe-no-restore"

#: The inventory does not mark the copies of an in-doubt VM (they read as managed), so plans, the plan check and
#: each step's pre-condition may name it: the defense in front of :data:`FIRST_COPY_LOOKUP`.
IN_DOUBT_PLANNABLE = "in-doubt-plannable"

#: Migrations record no generation and no ``migrating_to`` mark, and repair orders paused copies without them:
#: when no copy runs it resumes the first paused arrival by host order (issue 37's repair before generations).
RESUME_WITHOUT_GENERATION = "resume-without-generation"

#: The plan check and each step's pre-condition let a VM migrate while the host its last, cut-short migration
#: attempt may have left a copy on does not answer (issue 37's second schedule): the defense in front of
#: :data:`RESUME_WITHOUT_GENERATION`.
MIGRATE_WHILE_HOLDER_DOWN = "migrate-while-holder-down"

#: The unit of work performs an irreversible action (fencing a failed host) before it validates the plan that must
#: follow it, the order of issue 37's first report: a plan refused after the fence leaves the host's VMs dead.
FENCE_BEFORE_VALIDATE = "fence-before-validate"

#: Power saving's sleep (acting/power.py, ``sleep_host``) powers the host off without reading it again after its
#: evacuation: whatever is still there, or arrived meanwhile, goes down with it.
POWER_OFF_UNCHECKED = "power-off-unchecked"

#: Power saving's wake (``wake_host``) takes whichever machine answers behind the host's URI as the host that
#: slept, without comparing its libvirt host UUID.
WAKE_ANY_UUID = "wake-any-uuid"

#: A VM whose recorded host answers without it counts as lost although a host that does not answer, and was not
#: fenced, may run it (a migration cut after its switch-over, before its step was recorded): the rule before
#: docs/faultsim.md's "runs twice" fix.
LOST_WHILE_HOLDER_DOWN = "lost-while-holder-down"

#: A fence mark is never cleared when its host answers again: once that host stops answering again, a VM moved
#: there since counts as lost (the mark's lifetime before docs/faultsim.md's "runs twice" fix).
STALE_FENCE_MARK = "stale-fence-mark"

#: `vcsched approve` applies a recommendation's plan step by step without validating it whole against the live
#: inventory first (its snapshot, the plan replayed, its claims): a recommendation the cluster changed under since
#: it was made — stale — is applied as if it still held (acting/approval.py).
APPROVE_UNVALIDATED = "approve-unvalidated"

KNOWN = frozenset({RESUME_UNREAD_SOURCE, SETTLE_WITHOUT_LOCK, FIRST_COPY_LOOKUP, PROBE_NO_RESTORE,
                   IN_DOUBT_PLANNABLE, RESUME_WITHOUT_GENERATION, MIGRATE_WHILE_HOLDER_DOWN,
                   FENCE_BEFORE_VALIDATE, POWER_OFF_UNCHECKED, WAKE_ANY_UUID, LOST_WHILE_HOLDER_DOWN,
                   STALE_FENCE_MARK, APPROVE_UNVALIDATED})

#: The hazards switched on (empty in production).
HAZARDS: set[str] = set()


def on(name: str) -> bool:
    """Whether hazard ``name`` is switched on."""
    return name in HAZARDS
