"""Plans: what vcsched will do to a cluster, as a value that can be printed, saved, reviewed and applied later.

:mod:`~vcsched.plans.steps` (the step kinds), :mod:`~vcsched.plans.plan` (a
whole plan and its file format), :mod:`~vcsched.plans.ordering` (cap-safe
order) and :mod:`~vcsched.plans.migration` (memory-safe migration waves).
"""
