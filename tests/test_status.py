"""``vcsched status`` output built from an inventory (no libvirt): yields, floors, unmanaged domains."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.app import console
from cli.status import render_status, status_dict
from vcsched.control.status import predicted_yield
from vcsched.inventory import HostState, Inventory, VmMeta, VmState

MiB = 1 << 20


def inventory() -> Inventory:
    return Inventory("lab", (HostState("h0", 1, 1024 * MiB),), (
        VmState("gold-0", "h0", 1, 128 * MiB, True, VmMeta("gold", 1.0, 128 * MiB, 1, 0.6), 0.5),
        VmState("web-0", "h0", 1, 128 * MiB, True, VmMeta("web", 0.5, 128 * MiB, 1), 0.25),
        VmState("other", "h0", 1, 256 * MiB, True, None, None),
    ))


def test_yields_floors_and_host_totals() -> None:
    doc = status_dict(inventory(), {"gold-0": 0.51, "web-0": 0.26, "other": 0.1}, 2.0)
    vms = {v["name"]: v for v in doc["vms"]}
    assert vms["gold-0"]["predicted_yield"] == pytest.approx(0.5) and vms["gold-0"]["min_yield"] == 0.6
    assert vms["web-0"]["min_yield"] is None and vms["other"]["predicted_yield"] is None
    (h,) = doc["hosts"]
    assert h["caps_cores"] == pytest.approx(0.75) and h["memory_used_bytes"] == 512 * MiB
    assert h["measured_cores"] == pytest.approx(0.87)


def test_the_table_shows_the_recorded_floor_and_unmanaged_domains() -> None:
    with console.capture() as cap:
        render_status(status_dict(inventory(), {}, 0.0))
    text = cap.get()
    assert "floor" in text and "0.6" in text and "unmanaged" in text


def test_an_uncapped_managed_vm_has_full_yield() -> None:
    v = VmState("x", "h0", 1, MiB, True, VmMeta("x", 0.5, MiB, 1), None)
    assert predicted_yield(v) == 1.0


def test_piped_status_tables_are_not_cut_at_80_columns(tmp_path: Path) -> None:
    """Issue: `vcsched status | cat` showed "vCP…" for vCPUs: without a terminal rich used 80 columns."""
    from click.testing import CliRunner

    from cli.main import cli

    c = tmp_path / "c.toml"
    c.write_text('name = "t"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    r = CliRunner().invoke(cli, ["status", "--cluster", str(c), "--sample", "0"])
    assert r.exit_code == 0, r.output
    assert "vCPUs" in r.stdout and "…" not in r.stdout


def test_a_host_whose_wake_failed_is_named_so_with_how_to_clear_it_not_shown_merely_sleeping() -> None:
    """Issue (QA on the lab): after a failed wake, `status` said "h2 (sleeping)" and "`vcsched power wake` wakes
    one" — the one state in which no command will wake it (docs/power.md §6) was invisible."""
    from vcsched.control.power import PowerState, mark_asleep, slept, wake_failed

    h2 = HostState("h2", 1, 1024 * MiB, uuid="u2")
    state = wake_failed(slept(PowerState(), h2, 1.0), "h2", 2.0, "power agent action=on exited 1")
    inv = mark_asleep(Inventory("lab", (*inventory().hosts, HostState("h2", 1, 0, down="did not answer")),
                                inventory().vms), state)
    doc = status_dict(inv, {}, 0.0)
    assert [h["power"] for h in doc["hosts"]] == [None, "wake-failed"]
    with console.capture() as cap:
        render_status(doc)
    text = cap.get()
    assert "h2 (wake-failed)" in text and "h2 (sleeping)" not in text
    assert "1 host failed to wake (h2)" in text and "vcsched power clear HOST" in text
    asleep = mark_asleep(inv, slept(PowerState(), h2, 1.0))  # asleep, nothing failed: as before
    with console.capture() as cap:
        render_status(status_dict(asleep, {}, 0.0))
    assert "h2 (sleeping)" in cap.get() and "failed to wake" not in cap.get()


def test_one_host_down_is_said_in_the_singular() -> None:
    """Issue (QA on the lab): "1 host down (h1): their VMs are unknown, and nothing is planned onto or off them"."""
    inv = Inventory("lab", (*inventory().hosts, HostState("h1", 1, 0, down="did not answer")), inventory().vms)
    with console.capture() as cap:
        render_status(status_dict(inv, {}, 0.0))
    assert "1 host down (h1): its VMs are unknown, and nothing is planned onto or off it until it answers" in \
        " ".join(cap.get().split())


def test_place_says_one_vm_in_the_singular(tmp_path: Path) -> None:
    """Issue (QA on the lab): "admitted big: 1 VMs of 1 vCPU, 128 MiB"."""
    from click.testing import CliRunner

    from cli.main import cli
    from hypervisor.testhosts import write_scale_cluster

    hosts = write_scale_cluster(tmp_path, 2, 0, scheme="sim")
    one = tmp_path / "one.toml"
    one.write_text('name = "big"\nvms = 1\nvcpus = 2\nmemory = "128MiB"\ncpu_cores = 1\n')
    r = CliRunner().invoke(cli, ["place", str(one), "--cluster", str(hosts.cluster_file)])
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert "admitted big: 1 VM of 2 vCPUs, 128 MiB" in r.stdout, r.stdout
