"""Shared fixtures and builders for the test suite."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings as _hypothesis_settings

# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment (xdist 3.8), which a serial run
# does not have; the CLI sizes its tables by COLUMNS (cli/app.py), so under a worker every CLI test would render
# for an 80-column terminal instead of as piped output.  Drop them before anything imports the CLI.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("COLUMNS") == "80":
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# vcsched's state (the file lock under it) is the test run's own, one per xdist worker: the machine's
# /var/lib/vcsched is left alone, and two workers' labs never wait on each other's lock (every lab is named "lab").
# (The xdist controller's choice reaches its workers through the environment: a worker replaces it with its own,
# but keeps a directory the person running the tests chose.)
if "VCSCHED_STATE_DIR" not in os.environ or os.environ.get("VCSCHED_TEST_STATE_DIR_CHOSEN") == "conftest":
    import tempfile

    os.environ["VCSCHED_STATE_DIR"] = tempfile.mkdtemp(
        prefix=f"vcsched-test-state-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    os.environ["VCSCHED_TEST_STATE_DIR_CHOSEN"] = "conftest"

from tests.etcd_support import etcd  # noqa: F401  (a real etcd on loopback, see tests/etcd_support.py)
from tests.lab_support import lab2  # noqa: F401  (the real-libvirt lab fixture, see tests/lab_support.py)
from vcsched.model import Host, Instance, Job

# Hypothesis fails an example slower than 200 ms by default; on a loaded 2-core machine (CI beside the lab's TCG
# guests) a 40 ms example took 290 ms and failed a property that has nothing to do with time.  Speed lives in the
# benchmarks, not in the tests: no deadline, for every property test.
_hypothesis_settings.register_profile("vcsched", deadline=None)
_hypothesis_settings.load_profile("vcsched")



def make_instance(jobs: list[tuple[float, float] | tuple[float, float, int]], n_hosts: int = 2) -> Instance:
    """Identical unit hosts and jobs given as (cpu_need, memory[, tasks])."""
    hosts = tuple(Host(f"h{i}") for i in range(n_hosts))
    js = tuple(Job(f"j{i}", j[0], j[1], j[2] if len(j) > 2 else 1) for i, j in enumerate(jobs))  # type: ignore[misc]
    return Instance(hosts=hosts, jobs=js)


@pytest.fixture
def two_host_instance() -> Instance:
    return make_instance([(0.8, 0.3), (0.9, 0.5, 2)], n_hosts=2)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Lab tests of one module run on one xdist worker (``--dist loadgroup``), so the module's lab comes up once.

    With ``VCSCHED_EXCLUSIVE_MODULES=FILE`` (scripts/test's first pass), the modules holding tests marked
    ``exclusive`` are written to FILE, one path a line, before ``-m`` deselects anything: the second pass then
    collects only those (collecting the whole suite again cost ~19 s of a serial pass), and no exclusive test
    can be missed by a list kept by hand.

    Tests marked ``network`` (they download from Debian's mirrors: they test the machine's network, not vcsched)
    run only when asked for by name in ``-m`` (``pytest -m network``); otherwise they are deselected, not
    skipped, so they neither cost CI time nor count as skips."""
    for item in items:
        if item.get_closest_marker("lab") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else "lab"))
    listing = os.environ.get("VCSCHED_EXCLUSIVE_MODULES")
    if listing:
        from hypervisor.files import write_atomic

        modules = sorted({item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("exclusive")})
        write_atomic(listing, "".join(f"{m}\n" for m in modules))
    if "network" in (config.getoption("markexpr") or ""):
        return
    keep = [item for item in items if item.get_closest_marker("network") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("network")])
        items[:] = keep


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the state directory this run made for itself (see the top of this file)."""
    if os.environ.get("VCSCHED_TEST_STATE_DIR_CHOSEN") == "conftest":
        import shutil

        shutil.rmtree(os.environ["VCSCHED_STATE_DIR"], ignore_errors=True)


# ---- VCSCHED_REQUIRE_LAB=1 (.ci/run): a skip is a failure unless tests/skip_policy.py allows it ----------------


def _skip_reason(longrepr: object) -> str:
    """The reason pytest recorded for a skip (a ``(path, line, "Skipped: reason")`` tuple)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _refuse_skip(report: pytest.TestReport | pytest.CollectReport, nodeid: str) -> None:
    """Turn a skip report into a failure naming the reason, unless the allow-list accepts it now."""
    from tests.skip_policy import REQUIRE_LAB_ENV, allowed

    reason = _skip_reason(report.longrepr)
    condition = allowed(nodeid, reason)
    if condition is not None:
        report.longrepr = (*report.longrepr[:2], f"Skipped: {reason} [allowed: {condition}]") \
            if isinstance(report.longrepr, tuple) else report.longrepr
        return
    report.outcome = "failed"
    report.longrepr = (f"{nodeid} was skipped, and {REQUIRE_LAB_ENV}=1 allows no skip that is not in "
                       f"tests/skip_policy.py ALLOWED_SKIPS: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    from tests.skip_policy import require_lab

    if report.skipped and require_lab() and not hasattr(report, "wasxfail"):
        _refuse_skip(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    from tests.skip_policy import require_lab

    if report.skipped and require_lab():
        _refuse_skip(report, collector.nodeid)


# Where a run's time goes, by module (setup, call and teardown summed; on the xdist controller too): CI's budget
# (docs/testing.md) is kept module by module, and --durations alone names tests, not the labs they share.
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or not _MODULE_SECONDS or config.option.collectonly:
        return
    slowest = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:15]
    terminalreporter.write_sep("=", f"slowest modules (of {len(_MODULE_SECONDS)}, "
                                    f"{sum(_MODULE_SECONDS.values()):.0f} s summed over workers)")
    for module, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s  {module}")
