"""`vcsched approve` of a sleep or a wake that `vcsched run` proposed (power_saving = "recommend"), on libvirt's
test driver with a fake power agent: it is re-validated against the live inventory under the lock, then carried
out by the same sleep_host / wake_host as the controller's; a proposal that no longer holds is refused as stale
(exit 1) and changes nothing.  How the controller makes the proposals: tests/test_controller_power.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from acting.power import store_for
from acting.power_saving import proposal
from acting.unit_of_work import UnitOfWork
from cli.common import load_cluster, notice
from cli.main import cli
from cli.recommend import _store
from hypervisor.libvirt_backend import LibvirtHypervisor
from tests.test_power_cli import agent, cluster, run, state  # noqa: F401  (the state-directory fixture)
from vcsched.control import recommend as rc
from vcsched.control.power import SLEEP, WAKE, PowerDecision, sleep_check
from vcsched.formats.units import UNLIMITED


def propose(c: Path, action: str, host: str = "h1") -> str:
    """Record a proposal to sleep or wake ``host`` as `vcsched run` does (acting/power_saving.py); its id."""
    cluster_ = load_cluster(str(c))
    with LibvirtHypervisor(cluster_, on_notice=notice) as hv:
        power = store_for(cluster_, hv.identities())
        with UnitOfWork(hv, None, power=power.read) as uow:
            inventory = uow.inventory()
        state = power.read()
        plan = None
        if action == SLEEP:
            why, plan = sleep_check(cluster_, inventory, state, host, time.time(), UNLIMITED)
            assert why is None, why
        decision = PowerDecision(action, host, f"test: {action} {host}", state, plan)
        kind, doc, reasons, effect = proposal(cluster_, decision, inventory, {}, state)
        rec = rc.new_recommendation(kind, cluster_.name, decision.reason, doc, reasons, effect, time.time(), 600.0,
                                    "test")
        return _store(cluster_, None, hv).update(lambda book: rc.record(book, rec)).id


def approve(c: Path, rec_id: str, code: int) -> tuple[dict[str, object], str]:
    r = CliRunner().invoke(cli, ["approve", rec_id, "--cluster", str(c), "--json"])
    assert r.exit_code == code, (r.stdout, r.stderr)
    return (json.loads(r.stdout) if r.stdout.strip() else {}), r.stderr


def states(c: Path) -> dict[str, str]:
    return {h["host"]: h["state"] for h in run("status", "--cluster", c, code=0)["hosts"]}  # type: ignore[attr-defined]


def test_an_approved_sleep_then_an_approved_wake_go_through_sleep_host_and_wake_host(tmp_path: Path) -> None:
    c = cluster(tmp_path, agent(tmp_path))
    sleep_id = propose(c, SLEEP)
    assert states(c) == {"h0": "on", "h1": "on"} and not (tmp_path / "called").exists(), "a proposal changes nothing"
    doc, _ = approve(c, sleep_id, 0)
    assert doc["ok"] and doc["power"]["slept"] and doc["recommendation"]["state"] == "applied"  # type: ignore[index]
    assert (tmp_path / "called").read_text().split() == ["action=off", "action=status"]
    assert states(c) == {"h0": "on", "h1": "sleeping"}
    approve(c, sleep_id, 1)  # already applied: refused, nothing run
    assert (tmp_path / "called").read_text().split() == ["action=off", "action=status"]
    wake_id = propose(c, WAKE)
    doc, _ = approve(c, wake_id, 0)
    assert doc["power"]["woke"] and states(c) == {"h0": "on", "h1": "on"}  # type: ignore[index]


def test_a_sleep_that_no_longer_holds_is_refused_as_stale_and_changes_nothing(tmp_path: Path) -> None:
    c = cluster(tmp_path, agent(tmp_path))
    sleep_id = propose(c, SLEEP)
    run("sleep", "h1", "--cluster", c, "--apply", code=0)  # an operator put it to sleep meanwhile
    called = (tmp_path / "called").read_text()
    _, err = approve(c, sleep_id, 1)
    assert "stale" in err and "h1 may no longer sleep: sleeping, not on" in err, err
    assert (tmp_path / "called").read_text() == called, "no agent run"
    book = rc.Book.from_dict(json.loads(next((tmp_path / "state").rglob("recommendations-*.json")).read_text()))
    assert book.get(sleep_id).state == rc.STALE


def test_a_wake_of_a_host_that_is_on_is_refused_as_stale(tmp_path: Path) -> None:
    c = cluster(tmp_path, agent(tmp_path))
    run("sleep", "h1", "--cluster", c, "--apply", code=0)
    wake_id = propose(c, WAKE)
    run("wake", "h1", "--cluster", c, "--apply", code=0)  # woken by hand meanwhile
    _, err = approve(c, wake_id, 1)
    assert "stale" in err and "h1 is on, no longer asleep" in err, err
    assert states(c)["h1"] == "on"
