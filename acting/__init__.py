"""The acting runtime: everything that changes hosts, and the one way it does.

Data flows one way (docs/architecture.md): a command or the controller decides with the pure core
(:mod:`vcsched`), which returns a plan (a value); this package acts on it under the cluster lock, through the
libvirt adapter (:mod:`hypervisor`).  What lives here:

* :mod:`acting.unit_of_work` — the one sequence every change of hosts goes through: lock, lease, settle
  in-doubt VMs, read, validate the whole plan, an irreversible action only after that, apply, record;
* :mod:`acting.executor` — applies a plan step by step (already done / act / verify), idempotently;
* :mod:`acting.lock` — the cluster lock (tooz: a file or etcd), its lease and guard;
* :mod:`acting.definitions`, :mod:`acting.recommendations` — the stores kept beside the lock;
* :mod:`acting.fence`, :mod:`acting.failure` — fencing failed hosts through ClusterLabs agents;
* :mod:`acting.restore` — putting back what a killed process's journal says it changed;
* :mod:`acting.controller`, :mod:`acting.sampling`, :mod:`acting.events`, :mod:`acting.metrics` — `vcsched run`.

Nothing here imports libvirt; :mod:`hypervisor` never imports this package.
"""
