"""Sharing policies on a live cluster: admission, adaptation, status, metadata, and the CLI on libvirt's test driver."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hypervisor.domain_xml import metadata_xml, parse_metadata
from tests.builders import MiB, cluster_of, inventory_of, request
from tests.test_libvirt_backend import domain_of, node_xml, one_line_error, run, write_request
from vcsched.control.admission import admit
from vcsched.control.live import adapt_inventory
from vcsched.control.sharing import Sharing, sharing_for
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster
from vcsched.inventory import VmMeta, VmState
from vcsched.model import Tenant
from vcsched.plans.plan import plan_from_dict
from vcsched.plans.steps import Boot, CreateStep, step_from_dict
from vcsched.policies.allocation import PolicyOptions

DISK = 100 * MiB  # bytes/s a host with disk declares


def with_disk(cluster: Cluster, *hosts: str, rate: int = DISK, tenants: tuple[Tenant, ...] = (),
              policy: str | None = None) -> Cluster:
    """``cluster`` with ``disk_bps`` declared on ``hosts`` (all when none named)."""
    named = set(hosts) or {h.name for h in cluster.hosts}
    return dataclasses.replace(cluster, hosts=tuple(dataclasses.replace(h, disk_bps=rate) if h.name in named else h
                                                    for h in cluster.hosts), tenants=tenants, policy=policy)


def disk_vm(name: str, host: str, vc: str, need: float, cap: float | None, disk: int | None,
            weight: float = 1.0, tenant: str | None = None, floor: float | None = None) -> VmState:
    meta = VmMeta(vc, need, 128 * MiB, 1, floor, disk, None, weight, tenant)
    return VmState(name, host, 1, 128 * MiB, True, meta, cap)


def drf() -> Sharing:
    return Sharing("drf", PolicyOptions())


def host_disk_load(plan_doc: dict, host: str) -> int:
    return sum(p.get("disk_bytes_sec", 0) for p in plan_doc["predicted"]["per_vm"].values() if p["host"] == host)


# --- admission ---------------------------------------------------------------------------------------


def test_a_request_needing_disk_goes_only_where_disk_is_declared_and_every_host_holds() -> None:
    cluster = with_disk(cluster_of(3), "h1")
    decision = admit(cluster, inventory_of(n_hosts=3), request("io", vms=2, need=0.2, disk_bps=60 * MiB), "mcb8",
                     sharing=drf())
    assert decision.admitted and decision.plan is not None
    doc = decision.plan.to_dict()
    assert doc["policy"] == "drf"
    assert {s["host"] for s in doc["steps"]} == {"h1"}
    assert [s["disk_bps"] for s in doc["steps"]] == [60 * MiB, 60 * MiB]
    assert host_disk_load(doc, "h1") <= DISK
    assert decision.min_yield == pytest.approx(DISK / (120 * MiB), abs=1e-6)  # disk binds: 100 / 120 MiB/s


def test_the_plan_predicts_each_vms_disk_rate_and_reads_back() -> None:
    cluster = with_disk(cluster_of(2))
    vms = [disk_vm("db-0", "h0", "db", 0.3, 0.3, 80 * MiB)]
    decision = admit(cluster, inventory_of(vms), request("io", vms=1, need=0.2, disk_bps=80 * MiB), "mcb8",
                     sharing=drf())
    assert decision.plan is not None
    doc = decision.plan.to_dict()
    assert all("disk_bytes_sec" in p for p in doc["predicted"]["per_vm"].values())
    assert plan_from_dict(json.loads(json.dumps(doc))).to_dict() == doc


def test_without_a_policy_or_extra_needs_declared_capacities_change_nothing() -> None:
    inv = inventory_of([disk_vm("a-0", "h0", "a", 0.5, 0.5, None)])
    plain = admit(cluster_of(2), inv, request("web"), "mcb8")
    declared = admit(with_disk(cluster_of(2)), inv, request("web"), "mcb8")
    assert plain.plan is not None and declared.plan is not None
    assert plain.plan.to_dict() == declared.plan.to_dict()
    assert "policy" not in plain.plan.to_dict()


def test_the_cluster_files_policy_is_used_when_no_flag_is_given() -> None:
    cluster = with_disk(cluster_of(2), policy="drf")
    decision = admit(cluster, inventory_of(), request("web"), "mcb8")
    assert decision.plan is not None and decision.plan.extra["policy"] == "drf"
    assert sharing_for(cluster, "pf").policy == "pf"  # a flag overrides it


def test_floors_stay_promises_in_yield_under_a_policy() -> None:
    # "big" (4 VMs, floor 0.9) fills both hosts' CPU; under DRF a newcomer would push it below its floor.
    vms = [disk_vm(f"big-{i}", f"h{i % 2}", "big", 0.45, 0.45, None, floor=0.9) for i in range(4)]
    decision = admit(cluster_of(2), inventory_of(vms), request("new", vms=1, need=0.5), "mcb8", sharing=drf())
    assert not decision.admitted
    assert decision.reason is not None and "'big'" in decision.reason and "0.9" in decision.reason


def test_weights_shift_the_drf_allocation() -> None:
    vms = [disk_vm("a-0", "h0", "a", 1.0, 0.5, None, weight=3.0)]
    decision = admit(cluster_of(1), inventory_of(vms, n_hosts=1), request("b", vms=1, need=1.0), "mcb8",
                     sharing=drf())
    assert decision.plan is not None
    per_vm = decision.plan.to_dict()["predicted"]["per_vm"]
    assert per_vm["a-0"]["yield"] == pytest.approx(0.75) and per_vm["b-0"]["yield"] == pytest.approx(0.25)


def test_hdrf_uses_the_cluster_files_tenant_tree() -> None:
    tree = (Tenant("ads", 1.0), Tenant("web", 1.0))
    cluster = dataclasses.replace(cluster_of(1), tenants=tree, policy="hdrf")
    vms = [disk_vm("a-0", "h0", "a", 1.0, 1.0, None, tenant="ads"), disk_vm("b-0", "h0", "b", 1.0, None, None,
                                                                              tenant="ads")]
    decision = admit(cluster, inventory_of(vms, n_hosts=1, memory=2048 * MiB),
                     request("c", vms=1, need=1.0, tenant="web"), "mcb8")
    assert decision.plan is not None
    per_vm = decision.plan.to_dict()["predicted"]["per_vm"]
    # web gets half the host, ads's two clusters a quarter each (H-DRF: the tree, not the leaves, is fair)
    assert per_vm["c-0"]["yield"] == pytest.approx(0.5, abs=1e-3)
    assert per_vm["a-0"]["yield"] == pytest.approx(0.25, abs=1e-3)


@pytest.mark.parametrize(("change", "message"), [
    ({"tenant": "nowhere"}, "tenant: request 'web' names 'nowhere'"),
    ({"disk_bps": 10 * MiB}, "disk_bps: VMs need disk but no host of cluster 'lab' declares disk_bps"),
    ({"disk_bps": 2 * DISK}, "more than the largest host declares"),
    ({"weight": 0.0}, "weight"),
])
def test_bad_requests_under_a_policy_are_input_errors(change: dict, message: str) -> None:
    cluster = with_disk(cluster_of(2), "h0") if change.get("disk_bps") == 2 * DISK else cluster_of(2)
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        admit(cluster, inventory_of(), request("web", **change), "mcb8", sharing=drf())


def test_a_running_vm_naming_a_tenant_gone_from_the_tree_is_an_input_error() -> None:
    vms = [disk_vm("a-0", "h0", "a", 0.5, 0.5, None, tenant="gone")]
    with pytest.raises(InputError, match="virtual cluster 'a' names 'gone'"):
        admit(cluster_of(2), inventory_of(vms), request("web"), "mcb8", sharing=drf())


def test_an_unknown_policy_or_a_stray_alpha_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown policy 'fairest'"):
        sharing_for(cluster_of(1), "fairest")
    with pytest.raises(InputError, match="alpha"):
        sharing_for(cluster_of(1), "drf", 2.0)


# --- adaptation --------------------------------------------------------------------------------------


def test_adapt_under_a_policy_allocates_every_resource_on_the_placement_found() -> None:
    cluster = with_disk(cluster_of(2))
    vms = [disk_vm("a-0", "h0", "a", 0.3, 0.3, 80 * MiB), disk_vm("a-1", "h0", "a", 0.3, 0.3, 80 * MiB),
           disk_vm("b-0", "h1", "b", 0.3, 0.3, None)]
    live = adapt_inventory("lab", inventory_of(vms), 0, cluster=cluster, sharing=drf())
    assert live.plan is not None
    doc = live.plan.to_dict()
    assert doc["policy"] == "drf"
    assert host_disk_load(doc, "h0") <= DISK
    assert doc["predicted"]["per_vm"]["a-0"]["yield"] == pytest.approx(DISK / (160 * MiB), abs=1e-6)


def test_adapt_places_on_the_resource_vector_moving_a_vm_off_a_disk_bound_host() -> None:
    """CPU alone sees no reason to move (0.6 of h0's core), but h0's disk is asked 160 MiB/s of 100: with a
    budget the search moves one disk VM to h1, and both then run at full yield on every resource."""
    cluster = with_disk(cluster_of(2))
    vms = [disk_vm("a-0", "h0", "a", 0.3, 0.3, 80 * MiB), disk_vm("a-1", "h0", "a", 0.3, 0.3, 80 * MiB),
           disk_vm("b-0", "h1", "b", 0.3, 0.3, None)]
    live = adapt_inventory("lab", inventory_of(vms), 1 << 30, cluster=cluster, sharing=drf())
    assert live.plan is not None
    doc = live.plan.to_dict()
    moves = [s for s in doc["steps"] if s["op"] == "migrate"]
    assert len(moves) == 1 and moves[0]["vm"] in ("a-0", "a-1")
    assert host_disk_load(doc, "h0") <= DISK and host_disk_load(doc, "h1") <= DISK
    assert doc["predicted"]["per_vm"]["a-0"]["yield"] == pytest.approx(1.0)


def test_adapt_without_the_cluster_file_refuses_vms_needing_disk() -> None:
    vms = [disk_vm("a-0", "h0", "a", 0.3, 0.3, 80 * MiB)]
    with pytest.raises(InputError, match="need disk or network"):
        adapt_inventory("lab", inventory_of(vms), 0)


def test_adapt_with_the_default_policy_and_no_extra_needs_is_unchanged() -> None:
    vms = [disk_vm("a-0", "h0", "a", 0.6, 0.3, None), disk_vm("b-0", "h0", "b", 0.6, 0.3, None)]
    inv = inventory_of(vms)
    before = adapt_inventory("lab", inv, 1 << 30)
    after = adapt_inventory("lab", inv, 1 << 30, cluster=with_disk(cluster_of(2)))
    assert before.plan is not None and after.plan is not None
    assert before.plan.to_dict() == after.plan.to_dict()


# --- metadata and steps -------------------------------------------------------------------------------


def test_metadata_carries_the_multi_resource_fields_and_old_metadata_still_parses() -> None:
    meta = VmMeta("db", 0.5, 64 * MiB, 1, 0.3, 20 * MiB, 5 * MiB, 2.5, "ads")
    assert parse_metadata(metadata_xml(meta)) == meta
    old = '<vm cluster="x" cpu_need_cores="0.5" memory_bytes="1024" vcpus="1"/>'
    assert parse_metadata(old) == VmMeta("x", 0.5, 1024, 1)
    assert "weight" not in metadata_xml(VmMeta("x", 0.5, 1024, 1))
    assert parse_metadata('<vm cluster="x" cpu_need_cores="0.5" memory_bytes="1" vcpus="1" weight="nan"/>') is None


def test_a_create_step_records_the_requests_fields_and_an_old_step_still_loads() -> None:
    step = CreateStep("db-0", "h0", "db", 1, 64 * MiB, 0.5, 0.5, Boot("image", path="/d"), None, 20 * MiB, None,
                      2.0, "ads")
    d = step.to_dict()
    assert (d["disk_bps"], d["weight"], d["tenant"]) == (20 * MiB, 2.0, "ads") and "net_bps" not in d
    assert step_from_dict("s", d) == step
    assert step.meta().tenant == "ads"
    plain = {k: v for k, v in d.items() if k not in ("disk_bps", "weight", "tenant")}
    assert step_from_dict("s", plain).meta() == VmMeta("db", 0.5, 64 * MiB, 1)


# --- the CLI on simulated hosts ---------------------------------------------------------------------------


def disk_cluster(tmp_path: Path, extra: str = "", h0_disk: str = '"100MiB"', tenants: str = "") -> Path:
    """Two simulated hosts (``sim://``, hypervisor/simlibvirt.py: they cap CPU; their VMs have no disk device);
    h0 declares disk_bps and runs a managed VM needing disk; h1 declares none."""
    meta = VmMeta("db", 0.5, 128 * MiB, 1, None, 50 * MiB, None, 2.0, None)
    (tmp_path / "h0.xml").write_text(node_xml(1, 1 << 20, domain_of("db-0", meta)))
    (tmp_path / "h1.xml").write_text(node_xml(1, 1 << 20))
    text = (f'name = "t"\n{extra}\n[guest]\nkernel = "/k"\ninitrd = "/i"\n'
            f'[[hosts]]\nname = "h0"\nuri = "sim://{tmp_path}/h0.xml"\ndisk_bps = {h0_disk}\n'
            f'[[hosts]]\nname = "h1"\nuri = "sim://{tmp_path}/h1.xml"\n{tenants}')
    p = tmp_path / "cluster.toml"
    p.write_text(text)
    return p


IO = 'name = "io"\nvms = 1\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.2\ndisk_bps = "75MiB"\n'


#: What --apply (and so the dry run) says of a plan capping db-0's disk on a simulated host, whose VMs have no disk.
NO_DISK = "--apply would refuse: plan.steps[0]: VM 'db-0' on host h0: disk_bytes_sec 52428800: it has no disk"


def test_cli_place_under_drf_plans_the_disk_and_names_the_policy(tmp_path: Path) -> None:
    r = run("place", write_request(tmp_path, IO), "--cluster", disk_cluster(tmp_path), "--policy", "drf", "--json")
    assert r.exit_code == 1, r.output  # admitted; the dry run exits as --apply would
    doc = json.loads(r.stdout)
    assert doc["admitted"] and doc["refused"] == NO_DISK
    assert doc["policy"] == "drf" and doc["plan"]["policy"] == "drf"
    per_vm = doc["plan"]["predicted"]["per_vm"]
    assert per_vm["io-0"]["host"] == "h0"  # h1 declares no disk
    assert per_vm["io-0"]["disk_bytes_sec"] + per_vm["db-0"]["disk_bytes_sec"] <= 100 * MiB


def test_cli_place_reads_the_policy_from_the_cluster_file_and_prints_it(tmp_path: Path) -> None:
    r = run("place", write_request(tmp_path, IO), "--cluster", disk_cluster(tmp_path, 'policy = "asset"'))
    assert r.exit_code == 1 and NO_DISK in r.stderr, r.output
    assert "policy asset" in r.stdout and "disk" in r.stdout


def test_cli_status_shows_each_virtual_clusters_yield_and_dominant_share(tmp_path: Path) -> None:
    r = run("status", "--cluster", disk_cluster(tmp_path, 'policy = "drf"'), "--sample", "0", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["policy"] == "drf"
    (vc,) = doc["virtual_clusters"]
    assert (vc["name"], vc["weight"], vc["dominant_pool"], vc["yield"]) == ("db", 2.0, "disk", 1.0)
    assert vc["dominant_share"] == pytest.approx(0.5)  # 50 of the cluster's 100 MiB/s
    text = run("status", "--cluster", disk_cluster(tmp_path), "--sample", "0", "--policy", "drf-pools")
    assert text.exit_code == 0 and "h0:disk" in text.stdout and "policy drf-pools" in text.stdout


def test_cli_adapt_under_a_policy(tmp_path: Path) -> None:
    r = run("adapt", "--cluster", disk_cluster(tmp_path), "--budget", "0", "--policy", "pf", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["policy"] == "pf" and doc["plan"]["policy"] == "pf"
    assert doc["plan"]["predicted"]["per_vm"]["db-0"]["disk_bytes_sec"] == 50 * MiB


@pytest.mark.parametrize("command", ["place", "adapt", "status"])
@pytest.mark.parametrize(("flags", "cluster_extra", "message"), [
    (["--policy", "fairest"], "", "policy: unknown policy 'fairest'"),
    ([], 'policy = "fairest"', "policy: unknown policy 'fairest'"),
    (["--policy", "drf", "--alpha", "2"], "", "alpha: only the alpha-fair policy takes an alpha"),
    ([], 'policy = "hdrf"\n[[tenants]]\nname = "a"\nparent = "b"\n[[tenants]]\nname = "b"\nparent = "a"',
     "tenants[0].parent: cycle a -> b -> a"),
    ([], '[[tenants]]\nname = "a"\n[[tenants]]\nname = "a"', "tenants[1].name: duplicate name 'a'"),
    ([], '[[tenants]]\nname = "a"\nweight = nan', "tenants[0].weight: nan is not a finite number"),
    ([], '[[tenants]]\nname = "a"\nweight = -1', "tenants[0].weight: -1 must be above 0"),
])
def test_bad_policy_input_is_one_line_exit_2_for_every_command(tmp_path: Path, command: str, flags: list[str],
                                                               cluster_extra: str, message: str) -> None:
    tenants = ""
    if "[[tenants]]" in cluster_extra:
        cluster_extra, _, rest = cluster_extra.partition("[[tenants]]")
        tenants = "[[tenants]]" + rest
    cluster = disk_cluster(tmp_path, cluster_extra, tenants=tenants)
    args = {"place": ["place", write_request(tmp_path, IO)], "adapt": ["adapt", "--budget", "0"],
            "status": ["status", "--sample", "0"]}[command]
    line = one_line_error(run(*args, "--cluster", cluster, *flags))
    assert message in line


@pytest.mark.parametrize("command", ["place", "adapt", "status"])
def test_a_negative_capacity_is_one_line_exit_2(tmp_path: Path, command: str) -> None:
    cluster = disk_cluster(tmp_path, h0_disk="-5")
    args = {"place": ["place", write_request(tmp_path, IO)], "adapt": ["adapt", "--budget", "0"],
            "status": ["status"]}[command]
    line = one_line_error(run(*args, "--cluster", cluster))
    assert "hosts[0].disk_bps: -5 must be above 0" in line


@pytest.mark.parametrize("command", ["place", "adapt", "status"])
def test_needs_for_a_resource_no_host_declares_are_one_line_exit_2(tmp_path: Path, command: str) -> None:
    cluster = disk_cluster(tmp_path)
    cluster.write_text(cluster.read_text().replace('disk_bps = "100MiB"\n', ""))  # db-0 still needs disk
    args = {"place": ["place", write_request(tmp_path, IO)], "adapt": ["adapt", "--budget", "0"],
            "status": ["status", "--sample", "0"]}[command]
    line = one_line_error(run(*args, "--cluster", cluster))
    assert "disk_bps: VMs need disk but no host of cluster 't' declares disk_bps" in line


@pytest.mark.parametrize("command", ["place", "adapt", "status"])
def test_a_virtual_cluster_naming_a_tenant_not_in_the_tree_is_one_line_exit_2(tmp_path: Path, command: str) -> None:
    meta = VmMeta("db", 0.5, 128 * MiB, 1, None, None, None, 1.0, "gone")
    cluster = disk_cluster(tmp_path, 'policy = "hdrf"', tenants='[[tenants]]\nname = "ads"\n')
    (tmp_path / "h0.xml").write_text(node_xml(1, 1 << 20, domain_of("db-0", meta)))
    args = {"place": ["place", write_request(tmp_path, IO.replace('disk_bps = "75MiB"', 'tenant = "ads"'))],
            "adapt": ["adapt", "--budget", "0"], "status": ["status", "--sample", "0"]}[command]
    line = one_line_error(run(*args, "--cluster", cluster))
    assert "virtual cluster 'db' names 'gone'" in line


@pytest.mark.parametrize(("field", "message"), [
    ("weight = 0", "weight: 0 must be above 0"),
    ("weight = nan", "weight: nan is not a finite number"),
    ('tenant = "nowhere"', "tenant: request 'io' names 'nowhere'"),
    ('disk_bps = "-1"', "disk_bps: '-1' is not a byte size"),
])
def test_bad_request_fields_are_one_line_exit_2(tmp_path: Path, field: str, message: str) -> None:
    text = IO.replace('disk_bps = "75MiB"\n', "") + field + "\n"
    line = one_line_error(run("place", write_request(tmp_path, text), "--cluster", disk_cluster(tmp_path),
                              "--policy", "drf"))
    assert message in line
