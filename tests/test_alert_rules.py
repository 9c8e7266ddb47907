"""The Prometheus alert rules shipped in deploy/: valid for promtool, proven by its unit tests, and only on metrics
that a running `vcsched run` exports; each with a summary and a runbook section that exists in the docs."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_run_cli import running_controller

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "vcsched.rules.yml"
RULE_TESTS = ROOT / "tests" / "data" / "vcsched.rules.test.yml"
UNIT = ROOT / "deploy" / "vcsched@.service"
RUNBOOKS = "docs/metrics.md"  # the page of the runbook sections, one per alert (its section "Alerts")
SERVICE_DOC = ROOT / "docs" / "controller.md"  # "Installing it as a service" shows the unit

#: PromQL's keywords and modifiers: words in an expression that are not metric names.
PROMQL_WORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and",
                          "or", "unless", "inf", "nan", "atan2"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (strings, label matchers, ranges, label lists and function
    names left out).  Enough for the rules here; tested below on the shapes they use."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group(0).lower() in PROMQL_WORDS:
            continue  # a function (or an aggregation before its argument) or a keyword
        names.add(m.group(0))
    return names


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/install-system-deps installs it)")
    return path


@pytest.mark.parametrize(("expr", "names"), [
    ('increase(vcsched_steps_total{op="migrate", outcome="failed"}[30m]) > 0', {"vcsched_steps_total"}),
    ("max by (cluster) (vcsched_leader) == 0", {"vcsched_leader"}),
    ("vcsched_vm_yield < vcsched_vm_min_yield - 0.001", {"vcsched_vm_yield", "vcsched_vm_min_yield"}),
    ("absent(vcsched_leader)", {"vcsched_leader"}),
    ('sum without (host) (rate(x_total{a="by(y)"}[5m] offset 1h)) / on (cluster) group_left (vc) y > bool 1e3',
     {"x_total", "y"}),
])
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_rules_file_passes_promtool_check_rules() -> None:
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout


def test_each_alert_fires_when_it_should_and_not_otherwise() -> None:
    """promtool's unit tests (tests/data/vcsched.rules.test.yml): input series -> the alerts expected."""
    r = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"] if any(t["exp_alerts"] or [])}
    assert tested == {r["alert"] for r in rules()}, "every alert has a case where it fires"


def test_every_alert_has_a_summary_a_description_and_a_runbook_section_that_exists() -> None:
    headings, fenced = set(), False
    for line in (ROOT / RUNBOOKS).read_text().splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:  # GitHub's anchor of a heading
            headings.add(re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    for r in rules():
        a = r["annotations"]
        assert a["summary"] and a["description"], r["alert"]
        page, _, anchor = a["runbook_url"].partition("#")
        assert page == RUNBOOKS and anchor in headings, (r["alert"], a["runbook_url"])


def test_the_unit_in_the_docs_is_the_shipped_one() -> None:
    text = SERVICE_DOC.read_text()
    block = text.split("```ini\n", 1)[1].split("```", 1)[0]
    assert block == UNIT.read_text()


def scrape_running_controller(tmp_path: Path) -> str:
    """/metrics of a real `vcsched run --dry-run` leading a one-host cluster (libvirt's test driver), after two
    intervals of work."""
    with running_controller(tmp_path) as (p, log):
        start = json.loads(log.read_text().splitlines()[0])
        assert start["event"] == "start"
        url = f"http://127.0.0.1:{start['metrics']['port']}/metrics"
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, p.communicate()
    return str(body)


def test_every_metric_a_rule_uses_is_one_vcsched_run_exports(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    body = scrape_running_controller(tmp_path)
    exported = set()
    for family in text_string_to_metric_families(body):
        exported.add(family.name + ("_total" if family.type == "counter" else ""))
        exported |= {s.name for s in family.samples}
    used: dict[str, set[str]] = {r["alert"]: metric_names(r["expr"]) for r in rules()}
    assert all(used.values()), used
    missing = {alert: names - exported for alert, names in used.items() if names - exported}
    assert not missing, f"rules use metrics vcsched run does not export: {missing} (exported: {sorted(exported)})"
