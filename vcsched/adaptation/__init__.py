"""Re-placing a running cluster under a migration byte budget (paper section 6.1): the problem, our heuristic,
the paper's MILP, and :func:`vcsched.adaptation.solve.solve_adapt` that runs either."""
