"""Exceptions the core raises.  Messages are written for the operator who must act on them."""


class VcschedError(Exception):
    """Base class: anything vcsched reports to a user as a one-line error."""


class InputError(VcschedError, ValueError):
    """User input is malformed or out of range (the CLI exits 2 on it).

    The message names the offending field and value, e.g.
    ``jobs[3].cpu_need: 1.5 is above 1``.
    """


class AllocationError(VcschedError):
    """An allocation breaks the model's constraints (a solver bug, or a tampered plan)."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        shown = "; ".join(problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"invalid allocation: {shown}{more}")
