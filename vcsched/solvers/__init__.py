"""Placement algorithms behind one registry (:mod:`vcsched.solvers.registry`): MCB1–8, greedy, rounding, MILP.

Every placer maps an instance to a task -> host placement; the registry adds
the average-yield phase and validation, so all algorithms are compared alike.
"""
