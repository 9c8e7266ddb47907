"""vcsched core: the VCSched model and its solvers, as pure functions over plain data.

Nothing in this package performs I/O or talks to a hypervisor: it takes an
inventory and requests and returns values (allocations, plans) that other
layers print, save or apply.  See DEVELOPERS.md for the data flow.
"""

from vcsched.errors import InputError, VcschedError
from vcsched.model import Allocation, Host, Instance, Job, SolveOptions, SolveResult

__all__ = [
    "Allocation",
    "Host",
    "InputError",
    "Instance",
    "Job",
    "SolveOptions",
    "SolveResult",
    "VcschedError",
]
