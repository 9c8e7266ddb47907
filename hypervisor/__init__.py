"""The only layer that talks to hypervisors (through libvirt).

Kept separate so the decision core in :mod:`vcsched` stays pure data and can be
tested without any daemon.  This is the adapter and its fakes; the runtime that decides *when* to act (the
executor, the lock, the controller) is :mod:`acting`, which calls this package and is never called by it:

* :mod:`hypervisor.base` — the small ``Hypervisor`` protocol the executor and CLI use;
* :mod:`hypervisor.libvirt_backend` — its libvirt implementation (one connection per host URI, made by a
  connection factory), put together from :mod:`hypervisor.domain_xml`, :mod:`hypervisor.live_state`,
  :mod:`hypervisor.throttle`, :mod:`hypervisor.drivers` (what each driver can do), :mod:`hypervisor.pool`,
  :mod:`hypervisor.migration` and :mod:`hypervisor.settlement` (in-doubt VMs: ``vcsched repair``);
* :mod:`hypervisor.memory`, :mod:`hypervisor.simlibvirt`, :mod:`hypervisor.testhosts` — fakes: in memory,
  a simulated libvirt (the fault simulation, the scale benchmark), libvirt's test driver;
* :mod:`hypervisor.caps_probe` — calibration subjects, and what they boot and feed: :mod:`hypervisor.guest`
  (the minimal guest, also the lab's) and :mod:`hypervisor.frames` (frames into a guest's tap).

It imports none of :mod:`acting`, :mod:`lab`, :mod:`faultsim`, :mod:`calibration` or :mod:`cli`
(tests/test_layers.py).

Submodules are not imported here, so ``import hypervisor.memory`` never needs libvirt.
"""
