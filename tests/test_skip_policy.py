"""VCSCHED_REQUIRE_LAB=1 turns every skip into a failure, except the allow-list's, while its condition holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import skip_policy
from tests.skip_policy import AllowedSkip

pytest_plugins = ["pytester"]

CONFTEST = """
from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
"""

TESTS = """
import pytest

def test_skips_in_its_body():
    pytest.skip("no guest boots here")

@pytest.mark.skipif(True, reason="cgroup not writable")
def test_skips_by_mark():
    pass

@pytest.fixture
def lab():
    pytest.skip("lab unavailable: not root")

def test_skips_in_a_fixture(lab):
    pass

def test_shaping():
    pytest.skip("tc: Specified qdisc kind is unknown")

def test_runs():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    return {k: v for k, v in result.parseoutcomes().items() if k in ("passed", "failed", "skipped", "errors")}


def test_without_the_variable_skips_stay_skips(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(skip_policy.REQUIRE_LAB_ENV, raising=False)
    assert outcomes(suite.runpytest("-p", "no:cacheprovider")) == {"passed": 1, "skipped": 4}


def test_with_the_variable_every_skip_fails_naming_its_reason(suite: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(skip_policy.REQUIRE_LAB_ENV, "1")
    monkeypatch.setattr(skip_policy, "ALLOWED_SKIPS", ())
    result = suite.runpytest("-p", "no:cacheprovider")
    # A skip in the test body fails it; one in a fixture or a skipif mark (setup) errors it: neither is green.
    assert outcomes(result) == {"passed": 1, "failed": 2, "errors": 2}
    out = result.stdout.str()
    for reason in ("no guest boots here", "cgroup not writable", "lab unavailable: not root"):
        assert reason in out
    assert result.ret != 0


def test_an_allowed_skip_stays_a_skip_only_while_its_machine_condition_holds(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(skip_policy.REQUIRE_LAB_ENV, "1")
    holds: list[str | None] = ["the kernel has no sfq"]
    monkeypatch.setattr(skip_policy, "ALLOWED_SKIPS",
                        (AllowedSkip("*::test_shaping", "qdisc kind is unknown", lambda: holds[0]),))
    result = suite.runpytest("-p", "no:cacheprovider", "-rs", "-k", "shaping")
    assert outcomes(result) == {"skipped": 1}
    assert "allowed: the kernel has no sfq" in result.stdout.str()
    holds[0] = None  # a machine that has sfq: the same skip is now a failure
    assert outcomes(suite.runpytest("-p", "no:cacheprovider", "-k", "shaping")) == {"failed": 1}


def test_a_module_skipped_at_collection_fails_too(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_mod="import pytest\nlibvirt = pytest.importorskip('no_such_module_here')\n"
                                 "def test_x():\n    pass\n")
    monkeypatch.setenv(skip_policy.REQUIRE_LAB_ENV, "1")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0 and "no_such_module_here" in result.stdout.str()


def test_every_allow_list_entry_names_an_existing_test_file_and_a_machine_check() -> None:
    """A stale entry (its file gone) would silently allow nothing; a constant condition would allow forever."""
    root = Path(__file__).resolve().parents[1]
    for entry in skip_policy.ALLOWED_SKIPS:
        assert (root / entry.tests.split("::")[0]).is_file(), entry
        assert callable(entry.machine) and entry.machine.__module__ == skip_policy.__name__, entry
