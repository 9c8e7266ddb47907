"""Inputs cannot lie (issue 32), against real libvirt daemons: each of the five findings, replayed as they were
found, and random edits of a real plan's numbers.

Each finding was an input vcsched believed instead of checking the thing it
describes.  Here each is refused (or applied exactly as it claims), and what
the hosts hold is read back through libvirt, not through vcsched:

1. a plan's migration bytes edited to 1 under a budget of 1;
2. a request whose VM cannot boot (a template that is not XML, a memory of
   one byte, "64 MB"), a virtual cluster named like a VM, and a create that
   fails at run time: the caps lowered for it are put back, and stderr says so;
3. one host listed twice under two spellings of its socket;
4. two labs both named "lab": one's lock does not block the other, and a
   second file for the same hosts under another name shares the lock;
5. ``lab up --memory`` on a running lab.

Uses the session's ``lab2`` and one small lab of its own (one host).
"""

from __future__ import annotations

import contextlib
import json
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cli.main import cli
from hypervisor.libvirt_backend import LibvirtHypervisor
from lab import Lab
from tests.lab_support import (
    destroy_everywhere,
    running_lab,
    skip_unless_lab_possible,
    start_lab_guest,
    unbootable_kernel,
)
from tests.plan_edits import claims_hold, edited, get, new_values, number_paths, same_bytes
from vcsched.formats.cluster import Cluster, cluster_from_dict
from vcsched.plans.steps import Boot, CreateStep

pytestmark = pytest.mark.lab

MIB = 1 << 20


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result: Any) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("vcsched: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def cluster_of(lab: Lab) -> Cluster:
    return cluster_from_dict(tomllib.loads(lab.cluster_file.read_text()))


def held(lab: Lab) -> dict[str, tuple[str, float | None, int]]:
    """Every domain on every host of ``lab``, read through libvirt: name -> (host, cap in cores, memory KiB)."""
    import libvirt

    out: dict[str, tuple[str, float | None, int]] = {}
    for h in lab.hosts:
        conn = libvirt.open(h.connect_uri)
        try:
            for d in conn.listAllDomains(0):
                cap = None
                if d.isActive():
                    p = d.schedulerParameters()
                    cap = p["vcpu_quota"] / p["vcpu_period"] * d.maxVcpus() if p.get("vcpu_quota", -1) > 0 else None
                out[d.name()] = (h.name, cap, int(d.maxMemory()))
        finally:
            conn.close()
    return out


@contextlib.contextmanager
def managed_on(lab: Lab, host: str, *names_and_needs: tuple[str, float], cap: float = 0.5) -> Iterator[None]:
    """Managed VMs created on ``host`` through vcsched's own create (booting in the background)."""
    cluster = cluster_of(lab)
    g = cluster.guest
    assert g is not None
    boot = Boot("kernel", kernel=g.kernel, initrd=g.initrd, cmdline=g.cmdline, domain_type=g.domain_type)
    try:
        with LibvirtHypervisor(cluster) as hv:
            for name, need in names_and_needs:
                hv.create_vm(CreateStep(name, host, name.rsplit("-", 1)[0], 1, 128 * MIB, need, cap, boot))
        yield
    finally:
        for name, _ in names_and_needs:
            destroy_everywhere(lab, name)


def tag() -> str:
    return uuid.uuid4().hex[:5]


# ---------------------------------------------------------------------------------------------- 1. bytes


def test_migration_bytes_edited_under_a_tiny_budget_are_refused_and_nothing_moves(lab2: Lab, tmp_path: Path) -> None:
    t = tag()
    with managed_on(lab2, "h0", (f"b{t}-0", 0.6), (f"c{t}-0", 0.6)):
        plan_file = tmp_path / "plan.json"
        made = run("adapt", "--cluster", lab2.cluster_file, "--budget", "1GiB", "-o", plan_file)
        assert made.exit_code == 0, made.output
        doc = json.loads(plan_file.read_text())
        moves = [i for i, s in enumerate(doc["steps"]) if s["op"] == "migrate"]
        assert moves, doc
        for i in moves:
            doc["steps"][i]["bytes"] = 1
        doc["budget"] = doc["migrated_bytes"] = len(moves)
        plan_file.write_text(json.dumps(doc))
        before = held(lab2)

        result = run("apply", plan_file, "--cluster", lab2.cluster_file)
        assert result.exit_code == 1, result.output
        line = one_line_error(result)
        assert f"plan.steps[{moves[0]}].bytes: migrate {doc['steps'][moves[0]]['vm']} h0->h1 claims 1 bytes, it " \
               f"moves {128 * MIB} (its memory, 128 MiB)" in line and "nothing changed" in line
        assert held(lab2) == before


# ---------------------------------------------------------------------------------------------- 2. boot, names


def request_file(tmp_path: Path, name: str, extra: str = "", memory: str = '"128MiB"') -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(f'name = "{name}"\nvms = 1\nvcpus = 1\nmemory = {memory}\ncpu_cores = 0.6\n{extra}\n')
    return p


def test_a_request_that_cannot_boot_is_refused_before_any_cap_is_lowered(lab2: Lab, tmp_path: Path) -> None:
    t = tag()
    with managed_on(lab2, "h0", (f"r{t}-0", 0.6), cap=0.6):
        before = held(lab2)
        cases = [
            (request_file(tmp_path, f"m{t}", memory="1"), "memory: 1 is 1 B, below the smallest VM memory of 16 MiB"),
            (request_file(tmp_path, f"d{t}", memory='"64 MB"'), "memory: '64 MB' is 64000000 bytes, not a whole "
                                                                "number of MiB"),
            (request_file(tmp_path, f"p{t}", 'template = "/etc/passwd"'), "template /etc/passwd: malformed XML"),
            (request_file(tmp_path, f"r{t}-0"), f"name: 'r{t}-0' is already a VM's name"),
        ]
        for req, message in cases:
            result = run("place", req, "--cluster", lab2.cluster_file, "--apply")
            assert result.exit_code == 2, result.output
            assert message in one_line_error(result)
        assert held(lab2) == before  # not one cap lowered


def test_a_vm_that_fails_at_run_time_gets_the_caps_lowered_for_it_back_and_stderr_says_so(
        lab2: Lab, tmp_path: Path) -> None:
    """A template whose kernel is no kernel but by its header passes every check vcsched can make (it exists, is
    readable, has a bzImage's header, fits, and libvirt validates the XML); QEMU refuses it when the VM starts."""
    t = tag()
    kernel = unbootable_kernel(tmp_path / "not-a-kernel")
    template = tmp_path / "vm.xml"
    template.write_text(f"<domain type='qemu'><os><type arch='x86_64'>hvm</type><kernel>{kernel}</kernel></os>"
                        "<devices><serial type='pty'/></devices></domain>")
    with managed_on(lab2, "h0", (f"s{t}-0", 1.0), cap=1.0), managed_on(lab2, "h1", (f"u{t}-0", 1.0), cap=1.0):
        before = held(lab2)
        req = request_file(tmp_path, f"n{t}", f'template = "{template}"')
        result = run("place", req, "--cluster", lab2.cluster_file, "--apply", "--json")
        try:
            assert result.exit_code == 1, result.output
            doc = json.loads(result.stdout)
            steps = doc["applied"]["steps"]
            lowered = [s for s in steps if s["op"] == "set-cap" and s["outcome"] == "done"]
            assert lowered and steps[-1]["op"] == "create" and steps[-1]["outcome"] == "failed"
            line = one_line_error(result)
            assert f"the plan stopped at step {len(steps)} (create n{t}-0 on" in line
            assert "lowered cap(s) put back" in line
            assert [r["outcome"] for r in doc["applied"]["restored"]] == ["done"] * len(lowered)
            assert held(lab2) == before  # every cap where it was, and no VM n...-0
        finally:
            destroy_everywhere(lab2, f"n{t}-0")


# ---------------------------------------------------------------------------------------------- 3. identity


def spellings(lab: Lab) -> list[str]:
    """Other URIs that reach lab host h0's daemon."""
    uri = lab.hosts[0].uri
    sock = uri.split("socket=", 1)[1]
    d, f = sock.rsplit("/", 1)
    link = Path(d).parent / "h0-sock-link"
    if not link.exists():
        link.symlink_to(sock)
    return [uri.replace(sock, f"{d}/./{f}"), uri.replace(sock, f"{d}//{f}"), uri.replace(sock, str(link)),
            uri + "&extra=1" if "?" in uri else uri]


def test_one_host_listed_twice_under_other_spellings_is_refused_naming_both_and_its_uuid(lab2: Lab,
                                                                                          tmp_path: Path) -> None:
    if lab2.transport != "unix":
        pytest.skip("the spellings are of a unix socket")
    text = lab2.cluster_file.read_text()
    uuid0 = host_uuid(lab2.hosts[0].connect_uri)
    shown = json.loads(run("status", "--cluster", lab2.cluster_file, "--sample", "0", "--json").stdout)
    assert shown["hosts"][0]["uuid"] == uuid0  # what an operator writes into a hand-made cluster file
    before = held(lab2)
    for other in spellings(lab2):
        doc = tomllib.loads(text)
        doc["hosts"].append({"name": "again", "uri": other})
        cf = tmp_path / "twice.toml"
        cf.write_text(_toml(doc))
        for args in (("status", "--sample", "0"), ("place", request_file(tmp_path, f"i{tag()}"), "--apply")):
            result = run(*args, "--cluster", cf)
            assert result.exit_code == 2, (other, result.output)
            assert f"hosts[2]: again ({other}) and hosts[0]: h0 ({lab2.hosts[0].uri}) reach the same host, libvirt " \
                   f"host UUID {uuid0}" in one_line_error(result)
    assert held(lab2) == before


def host_uuid(uri: str) -> str:
    """The host's libvirt UUID, asked of libvirt directly."""
    import xml.etree.ElementTree as ET

    import libvirt

    conn = libvirt.open(uri)
    try:
        return str(ET.fromstring(conn.getCapabilities()).findtext("host/uuid"))
    finally:
        conn.close()


def _toml(doc: dict[str, Any]) -> str:
    import tomlkit

    return tomlkit.dumps(doc)


# ---------------------------------------------------------------------------------------------- 4. the lock


@pytest.fixture(scope="module")
def solo() -> Iterator[Lab]:
    """A lab of one host of its own, named "lab" like every lab."""
    skip_unless_lab_possible()
    with running_lab(1) as lab:
        yield lab


def test_two_labs_named_lab_have_two_locks_and_two_files_for_one_lab_share_one(lab2: Lab, solo: Lab,
                                                                                 tmp_path: Path) -> None:
    from acting.unit_of_work import for_cluster
    from cli.common import load_cluster

    assert cluster_of(lab2).name == cluster_of(solo).name == "lab"
    renamed = tomllib.loads(lab2.cluster_file.read_text())
    renamed["name"] = "prod"
    for h in renamed["hosts"]:
        h.pop("uuid", None)  # a hand-written file: identities read from the hosts themselves
        if lab2.transport == "unix":
            h["uri"] = h["uri"].replace("/run/libvirt-sock", "/run/./libvirt-sock")
    other = tmp_path / "prod.toml"
    other.write_text(_toml(renamed))
    held = load_cluster(str(lab2.cluster_file))
    with LibvirtHypervisor(held) as hv, for_cluster(held, hv, apply=True, settle=False):
        free = run("adapt", "--cluster", solo.cluster_file, "--budget", "0", "--apply")
        assert free.exit_code == 0, free.output  # another lab, also named "lab": not locked
        busy = run("adapt", "--cluster", other, "--budget", "0", "--apply")
        assert busy.exit_code == 1, busy.output  # the same hosts under another name and spelling: locked
        assert "cluster 'prod' is locked by" in one_line_error(busy)


# ---------------------------------------------------------------------------------------------- 5. lab up


def test_lab_up_never_changes_a_running_labs_memory_silently(solo: Lab) -> None:
    before = solo.cluster_file.read_text()
    refused = run("lab", "up", "--dir", solo.dir, "--hosts", 1, "--memory", "256MiB")  # only the memory differs
    assert refused.exit_code == 2, refused.output
    assert "--recreate" in one_line_error(refused) and "--resize" in one_line_error(refused)
    assert solo.cluster_file.read_text() == before
    assert run("lab", "up", "--dir", solo.dir).exit_code == 0  # a plain `up` repairs: the same shape
    assert solo.cluster_file.read_text() == before

    guest = start_lab_guest(solo, 0, memory_mib=128, wait=False)
    try:
        small = run("lab", "up", "--dir", solo.dir, "--memory", "100MiB", "--resize")
        assert small.exit_code == 2 and "guests" in one_line_error(small) and "use 128 MiB" in one_line_error(small)
        assert solo.cluster_file.read_text() == before
        grown = run("lab", "up", "--dir", solo.dir, "--memory", "1GiB", "--resize")
        assert grown.exit_code == 0, grown.output
        after = cluster_from_dict(tomllib.loads(solo.cluster_file.read_text()))
        assert after.hosts[0].memory_reserved != cluster_from_dict(tomllib.loads(before)).hosts[0].memory_reserved
        assert guest.isActive()  # kept
    finally:
        destroy_everywhere(solo, guest.name())


# ---------------------------------------------------------------------------------------------- any edit


@pytest.fixture(scope="module")
def plan_on_lab2(lab2: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], Path]]:
    """A running managed VM on h0 and a saved `place` plan that lowers its cap and creates one more VM."""
    t = tag()
    d = tmp_path_factory.mktemp("edits")
    with managed_on(lab2, "h0", (f"e{t}-0", 1.0), cap=1.0):
        out = d / "plan.json"
        req = request_file(d, f"f{t}")
        made = run("place", req, "--cluster", lab2.cluster_file, "-o", out)
        assert made.exit_code == 0, made.output
        yield json.loads(out.read_text()), d


LAB_PLAN_PATHS: list[tuple[str | int, ...]] = []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_edit_of_a_real_plans_numbers_is_refused_whole_or_applied_exactly(
        lab2: Lab, plan_on_lab2: tuple[dict[str, Any], Path], data: st.DataObject) -> None:
    doc, d = plan_on_lab2
    path = data.draw(st.sampled_from(sorted(number_paths(doc), key=str)))
    changed = edited(doc, path, data.draw(new_values(get(doc, path))))
    if same_bytes(changed, doc):
        return
    cluster = cluster_of(lab2)
    with LibvirtHypervisor(cluster) as hv:
        before = hv.inventory()
    was = held(lab2)
    plan_file = d / "edited.json"
    plan_file.write_text(json.dumps(changed))
    created = [s["vm"] for s in changed["steps"] if s["op"] == "create"]
    try:
        result = run("apply", plan_file, "--cluster", lab2.cluster_file, "--json")
        if result.exit_code != 0:
            one_line_error(result)
            assert held(lab2) == was, f"{path}: refused (exit {result.exit_code}) after changing a host"
            event(f"refused, exit {result.exit_code}")
            return
        event("applied as claimed")
        with LibvirtHypervisor(cluster) as hv:
            wrong = claims_hold(changed, before, hv.inventory())
        assert wrong == [], f"{path}: applied, not as claimed: {wrong}"
    finally:
        for vm in created:
            destroy_everywhere(lab2, vm)
        _restore_caps(lab2, cluster, was)


def _restore_caps(lab: Lab, cluster: Cluster, was: dict[str, tuple[str, float | None, int]]) -> None:
    """Put every managed VM's cap back as it was before an accepted edit changed it."""
    now = held(lab)
    with LibvirtHypervisor(cluster) as hv:
        for name, (host, cap, _mem) in was.items():
            if cap is not None and name in now and now[name][1] is not None and abs(now[name][1] - cap) > 1e-9:
                hv.set_cap(host, name, cap)
