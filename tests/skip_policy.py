"""Which skips a CI run may contain: none, except the allow-list below, each justified by a machine condition.

A test that needs real libvirtd, a bootable guest, a writable cgroup or etcd
skips with its reason on a developer's machine that cannot provide them.  On
CI that would make a green run that tested nothing real (a machine without
root, without network for the guest kernel, or with a broken libvirt), so
``.ci/run`` sets ``VCSCHED_REQUIRE_LAB=1`` and then *every* skip fails the
run — at collection, in a fixture or in the test — unless it matches an entry
of :data:`ALLOWED_SKIPS` whose machine condition is checked to hold right now.
A CI log's skip list is therefore exactly this list.

Tests gated on the machine's load ("machine too busy", "guest not quiet")
call :func:`skip_or_fail`: under ``VCSCHED_REQUIRE_LAB=1`` they have waited
longer (:data:`LOAD_PATIENCE`) and then fail with the measured load instead of
skipping.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import pytest

REQUIRE_LAB_ENV = "VCSCHED_REQUIRE_LAB"

#: How much longer a load-gated wait lasts when a skip is not allowed (CI): the machine gets more time to
#: quieten before the test fails with the load it measured.
LOAD_PATIENCE = 3.0


def require_lab() -> bool:
    """Whether skips are failures here (``VCSCHED_REQUIRE_LAB=1``, set by ``.ci/run``)."""
    return os.environ.get(REQUIRE_LAB_ENV) == "1"


@functools.cache
def kernel_lacks_sfq() -> str | None:
    """The machine condition behind the network-shaping skips: this kernel has no ``sch_sfq`` qdisc.

    libvirt's ``<bandwidth>`` shapes inbound traffic with an HTB class and an
    SFQ leaf, so without SFQ no network cap can be applied on this machine.
    Checked for real, in a throw-away network namespace: adding an sfq qdisc
    to its loopback device fails with "Specified qdisc kind is unknown".
    """
    try:
        r = subprocess.run(["unshare", "-n", "tc", "qdisc", "add", "dev", "lo", "root", "sfq"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 and "Specified qdisc kind is unknown" in r.stderr:
        return "this kernel has no sch_sfq qdisc (`tc qdisc add ... sfq`: Specified qdisc kind is unknown)"
    return None


def kernel_has_sfq() -> str | None:
    """The converse condition: network shaping works here, so the path taken when it cannot is unreachable."""
    return None if kernel_lacks_sfq() is not None else "this kernel has the sch_sfq qdisc: network caps apply"


@dataclass(frozen=True)
class AllowedSkip:
    """A skip CI accepts: tests matching ``tests`` (a node-id pattern), a reason containing ``reason``, and only
    while ``machine()`` says the justifying condition holds (it returns that condition in words, else None)."""

    tests: str
    reason: str
    machine: Callable[[], str | None]


#: The one allow-list.  Add an entry only for a condition of the machine that vcsched cannot change, checked
#: by its ``machine`` function, never for "it did not work today".
ALLOWED_SKIPS: tuple[AllowedSkip, ...] = (
    # Network caps: libvirt's <bandwidth> needs sch_sfq, which this machine kind's kernel does not have (no
    # loadable modules either).  The failure path (a cap that cannot be applied leaves the interface as it was)
    # runs here instead: tests/test_io_lab.py.
    AllowedSkip("tests/test_io_lab.py::*net*", "Specified qdisc kind is unknown", kernel_lacks_sfq),
    # ... and on a machine that has sch_sfq, that failure path cannot be reached.
    AllowedSkip("tests/test_io_lab.py::test_a_net_cap_this_host_cannot_apply_*", "this host can shape interfaces",
                kernel_has_sfq),
)


def allowed(nodeid: str, reason: str) -> str | None:
    """The machine condition that allows skipping ``nodeid`` for ``reason``, or None if the skip is not allowed."""
    for entry in ALLOWED_SKIPS:
        if fnmatch.fnmatchcase(nodeid, entry.tests) and entry.reason in reason:
            condition = entry.machine()
            if condition is not None:
                return condition
    return None


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason`` on a developer's machine; fail with it where skips are not allowed (CI)."""
    if require_lab():
        pytest.fail(f"{reason} ({REQUIRE_LAB_ENV}=1: not skipped)", pytrace=False)
    pytest.skip(reason)


def patience() -> float:
    """The factor load-gated waits are stretched by: :data:`LOAD_PATIENCE` where skips fail, else 1."""
    return LOAD_PATIENCE if require_lab() else 1.0
