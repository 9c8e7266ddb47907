"""Simulation of virtual clusters arriving and leaving over time, under every sharing policy (docs/simulate.md).

* :mod:`~vcsched.simulate.workload` — hosts, classes of VCs (Poisson rates, work, phases), loads and the
  capacity region; :mod:`~vcsched.simulate.trace` — arrivals from a CSV trace;
  :mod:`~vcsched.simulate.scenarios` — the papers' configurations and vcsched's own;
* :mod:`~vcsched.simulate.fluid` — the event-driven fluid simulation (Bonald & Roberts' dynamic model on
  vcsched's hosts); :mod:`~vcsched.simulate.tasks` — task-based "serve the most deprived job" (their §4);
* :mod:`~vcsched.simulate.engines` — how each registry policy is evaluated at every event, with fast exact
  paths :mod:`~vcsched.simulate.maxmin` (water-filling) and :mod:`~vcsched.simulate.dualpf` (PF, α-fair);
* :mod:`~vcsched.simulate.altruism` — CARBYNE's three-level altruism; :mod:`~vcsched.simulate.placement` —
  where arrivals go, adaptation under a migration budget;
* :mod:`~vcsched.simulate.metrics` and :mod:`~vcsched.simulate.study` — what is measured, replications,
  confidence intervals; :mod:`~vcsched.simulate.markov` — the exact Markov chain the simulator is tested
  against.

Sources, cited by title: T. Bonald and J. Roberts, "Enhanced Cluster Computing Performance through
Proportional Fairness"; R. Grandl et al., "Altruistic Scheduling in Multi-Resource Clusters" (CARBYNE);
W. Stillwell et al., "Resource Allocation using Virtual Clusters".  Everything here is pure: no
hypervisor, no printing; long runs report through an ``on_progress`` callback.
"""
