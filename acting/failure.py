"""What `vcsched run` needs to handle failed hosts: the cluster file, the definitions store, the fence runner.

Failure handling (docs/failures.md, "When a host dies") runs on the
controller's leader, once per interval (:meth:`acting.controller.Controller.tick`):

1. a host found down is timed from the first interval this leader saw it
   down; once it has been down for ``failure_timeout`` (cluster file) it is
   *failed* (event ``host_failed``, once per failure).  One missed reading is
   never a failure: ``failure_timeout`` is at least ``host_timeout`` and by
   default three intervals of 30 s;
2. its VMs' definitions are read from the definitions store
   (:mod:`acting.definitions`) and the recovery is planned by the core
   (:func:`vcsched.control.failover.plan_recovery`): creates on the survivors,
   most important first, re-capping the survivors; VMs that cannot be restarted
   are reported (``vm_stranded``, once each, with the reason: no fence agent,
   local disk, no room);
3. under the cluster lock, on a fresh inventory (the host must still be
   down), through :func:`acting.recovery.recover_host` (the sequence `vcsched
   recover` runs too), once the recovery plan is validated whole against it
   (acting/unit_of_work.py: a plan refused fences nothing): the host is
   fenced with its agent, once per failure (``host_fenced``
   with ``fenced`` true or false); when fencing fails or the agent does not say
   off, nothing is created and it is tried again next interval;
4. the plan is applied through the executor like any other (every step under
   the leader's and the cluster's locks); each VM created is ``vm_restarted``
   with the seconds since the host was declared failed.

A host that answers again ends its failure (its state is forgotten).  A new
leader starts timing afresh: a failure is never declared on another
controller's word.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from acting.definitions import DefinitionStore
from acting.fence import FenceResult, fence_host
from vcsched.formats.cluster import Cluster, ClusterHost


@dataclass(frozen=True)
class Failover:
    """Failure handling for a controller: off when the controller has none (tests, a cluster without fencing
    still gets ``host_failed`` and ``vm_stranded`` events)."""

    cluster: Cluster
    store: DefinitionStore
    fence: Callable[[ClusterHost], FenceResult] = fence_host


@dataclass
class FailureState:
    """What the leader knows about hosts that are down (monotonic seconds)."""

    down_since: dict[str, float] = field(default_factory=dict)
    failed_at: dict[str, float] = field(default_factory=dict)  # declared failed (host_failed emitted)
    fenced: set[str] = field(default_factory=set)
    said_stranded: set[tuple[str, str]] = field(default_factory=set)
    said_waiting: set[tuple[str, str]] = field(default_factory=set)  # (host, vm): vm_waiting said for this failure
    said_lost: set[str] = field(default_factory=set)  # lost VMs (vcsched/control/lost.py) already said

    def up(self, host: str) -> bool:
        """Forget ``host``'s failure (it answers again); True if it had been declared failed."""
        self.down_since.pop(host, None)
        self.fenced.discard(host)
        self.said_stranded = {(h, vm) for h, vm in self.said_stranded if h != host}
        self.said_waiting = {(h, vm) for h, vm in self.said_waiting if h != host}
        return self.failed_at.pop(host, None) is not None
