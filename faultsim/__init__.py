"""The deterministic fault simulation of the acting layer (docs/faultsim.md): a test harness, never a way to
run VMs.  :mod:`faultsim.simulation` drives vcsched's own acting code against :mod:`hypervisor.simlibvirt`,
one seeded schedule at a time, and checks the invariants after every event."""
