"""The only layer that talks to hypervisors (through libvirt).

Kept separate so the decision core in :mod:`vcsched` stays pure data and can be
tested without any daemon; everything that acts on a host lives here:

* :mod:`hypervisor.base` — the small ``Hypervisor`` protocol the executor and CLI use;
* :mod:`hypervisor.libvirt_backend` — its libvirt implementation (one connection per host URI, made by a
  connection factory), put together from :mod:`hypervisor.domain_xml`, :mod:`hypervisor.live_state`,
  :mod:`hypervisor.throttle`, :mod:`hypervisor.drivers` (what each driver can do), :mod:`hypervisor.pool`,
  :mod:`hypervisor.migration` and :mod:`hypervisor.settlement` (in-doubt VMs: ``vcsched repair``);
* :mod:`hypervisor.memory` — an in-memory implementation for tests and dry runs;
* :mod:`hypervisor.executor` — applies a :class:`vcsched.plans.plan.Plan` step by step, idempotently;
* :mod:`hypervisor.lab` — the local multi-host lab; :mod:`hypervisor.caps_probe` — calibration subjects.

Submodules are not imported here, so ``import hypervisor.memory`` never needs libvirt.
"""
