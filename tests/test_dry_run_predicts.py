"""A dry run predicts ``--apply`` (issue 40): it exits with the code ``--apply`` would, its warnings on stderr
(docs/cli.md), and what only a later step would have found — a kernel that is no kernel, a request that
cannot boot on this machine — is found before anything is planned.  Hosts are libvirt's test driver
(hypervisor/testhosts.py), the simulated libvirt (``sim://``, hypervisor/simlibvirt.py: hosts that cap CPU) or
unreachable local URIs (the request is refused before any host is read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from tests.builders import test_driver_node as node
from tests.test_adopt import test_hosts  # noqa: F401  (fixture: test-driver hosts with "stranger" and "old-0")
from vcsched.inventory import VmMeta

MiB = 1 << 20


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def floors(tmp_path: Path) -> Path:
    """Two one-core simulated hosts (``sim://``: they cap CPU), each full with two VMs of 0.5 cores; gold's are
    admitted with a floor of 1: emptying h0 onto h1 would halve every yield."""
    gold = VmMeta("gold", 0.5, 512 * MiB, 1, min_yield=1.0)
    web = VmMeta("web", 0.5, 512 * MiB, 1)
    (tmp_path / "h0.xml").write_text(node([("gold-0", gold), ("gold-1", gold)], 1, 0))
    (tmp_path / "h1.xml").write_text(node([("web-0", web), ("web-1", web)], 1, 2))
    c = tmp_path / "cluster.toml"
    c.write_text('name = "floors"\n' + "".join(f'[[hosts]]\nname = "h{i}"\nuri = "sim://{tmp_path}/h{i}.xml"\n'
                                               for i in range(2)))
    return c


def test_a_drain_that_apply_would_refuse_below_a_floor_exits_1_as_a_dry_run_too(floors: Path,
                                                                                  tmp_path: Path) -> None:
    """Issue: the dry run printed its floor warning on stdout and exited 0; --apply refused with 1."""
    lock = f"file://{tmp_path}/lock"
    dry = run("drain", "h0", "--budget", "unlimited", "--cluster", floors)
    applied = run("drain", "h0", "--budget", "unlimited", "--cluster", floors, "--apply", "--coordination", lock)
    assert (dry.exit_code, applied.exit_code) == (1, 1), (dry.stdout, dry.stderr, applied.stdout, applied.stderr)
    assert "warning: virtual cluster 'gold'" in dry.stderr and "warning" not in dry.stdout
    assert "--allow-below-floor" in dry.stderr.strip().splitlines()[-1]
    allowed = run("drain", "h0", "--budget", "unlimited", "--cluster", floors, "--allow-below-floor")
    assert allowed.exit_code == 0, (allowed.stdout, allowed.stderr)  # as --apply --allow-below-floor would go on


def test_a_saved_drain_plan_below_a_floor_names_the_virtual_cluster_and_its_dry_run_says_apply_would_refuse(
        floors: Path, tmp_path: Path) -> None:
    """Issue (QA on the lab): `apply PLAN --dry-run` of such a plan said only "a virtual cluster would end below its
    min_yield" — not which one, nor (as its --help and docs/cli.md promise) "--apply would refuse"."""
    plan = tmp_path / "plan.json"
    assert run("drain", "h0", "--budget", "unlimited", "--cluster", floors, "-o", plan).exit_code == 1
    why = "virtual cluster 'gold' would end at yield 0.500, below the min_yield 1 it was admitted with"
    dry = run("apply", plan, "--dry-run", "--cluster", floors)
    assert dry.exit_code == 1 and "plan for cluster floors (drain h0, " in dry.stdout, dry.stdout  # not "adapt"
    assert dry.stderr.strip().splitlines()[-1] == (f"vcsched: refused: --apply would refuse this plan: {why} "
                                                    "(--allow-below-floor to apply anyway)"), dry.stderr
    applied = run("apply", plan, "--cluster", floors, "--coordination", f"file://{tmp_path}/lock")
    assert applied.exit_code == 1 and f"vcsched: refused: {why}" in applied.stderr, applied.stderr


def test_a_drain_dry_run_json_says_ok_false_when_apply_would_refuse(floors: Path) -> None:
    import json

    r = run("drain", "h0", "--budget", "unlimited", "--cluster", floors, "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["ok"] is False


def mixed_cluster(tmp_path: Path, kernel: Path) -> Path:
    """h0 on this machine (a socket nobody listens on: never read), h1 on another machine."""
    initrd = tmp_path / "initrd"
    initrd.write_bytes(b"x" * MiB)
    c = tmp_path / "cluster.toml"
    c.write_text(f'name = "mixed"\n[guest]\nkernel = "{kernel}"\ninitrd = "{initrd}"\n'
                 f'[[hosts]]\nname = "h0"\nuri = "qemu+unix:///system?socket={tmp_path}/nowhere"\n'
                 '[[hosts]]\nname = "h1"\nuri = "qemu+ssh://h1.example.invalid/system"\n')
    return c


def bzimage(path: Path, init_size: int) -> Path:
    """A kernel file with the x86 boot protocol's header: "HdrS" at 0x202, version 2.15, loaded at 16 MiB."""
    import struct

    head = bytearray(0x300)
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, 0x20F)
    struct.pack_into("<Q", head, 0x258, 16 * MiB)
    struct.pack_into("<I", head, 0x260, init_size)
    path.write_bytes(bytes(head))
    return path


def request_file(tmp_path: Path, memory: str) -> Path:
    req = tmp_path / "web.toml"
    req.write_text(f'name = "web"\nvms = 6\nvcpus = 1\nmemory = "{memory}"\ncpu_cores = 0.5\n')
    return req


@pytest.mark.parametrize("apply", [False, True])
def test_a_request_that_cannot_boot_here_is_bad_input_before_planning_even_with_a_remote_host(
        apply: bool, tmp_path: Path) -> None:
    """Issue: with one non-local host the request's files were not checked; `place` printed "admitted" and the
    plan, then exited 2 on plan.steps[5].boot.kernel."""
    c = mixed_cluster(tmp_path, bzimage(tmp_path / "vmlinuz", 70 * MiB))
    args = ["place", request_file(tmp_path, "64MiB"), "--cluster", c]
    r = run(*args, *(["--apply", "--coordination", f"file://{tmp_path}/lock"] if apply else []))
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert r.stdout == ""  # nothing planned, nothing said to be admitted
    assert "guest.kernel (cluster file): the kernel 86 MiB" in r.stderr


@pytest.mark.parametrize("apply", [False, True])
def test_a_kernel_that_is_not_a_kernel_is_bad_input_before_anything_happens(apply: bool, tmp_path: Path) -> None:
    """Issue: kernel=/etc/passwd passed every check and failed only when the VM started, after other caps were
    lowered for it."""
    c = mixed_cluster(tmp_path, Path("/etc/passwd"))
    args = ["place", request_file(tmp_path, "128MiB"), "--cluster", c]
    r = run(*args, *(["--apply", "--coordination", f"file://{tmp_path}/lock"] if apply else []))
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "'/etc/passwd' is not a Linux kernel" in r.stderr and "HdrS" in r.stderr


def test_a_bzimage_and_an_elf_vmlinux_are_kernels_and_nothing_else_is(tmp_path: Path) -> None:
    from hypervisor.bootcheck import kernel_problem

    elf = tmp_path / "vmlinux"
    elf.write_bytes(b"\x7fELF\x02" + bytes(100))
    text = tmp_path / "notes"
    text.write_text("x" * 4096)
    assert kernel_problem("k", str(bzimage(tmp_path / "vmlinuz", MiB))) is None
    arm64 = tmp_path / "Image"
    arm64.write_bytes(bytes(0x38) + b"ARM\x64" + bytes(100))
    assert kernel_problem("k", str(elf)) is None and kernel_problem("k", str(arm64)) is None
    assert kernel_problem("k", str(text)) == (f"k: '{text}' is not a Linux kernel (neither a bzImage, with its "
                                              "boot header \"HdrS\" at offset 0x202, nor an ELF vmlinux, nor an "
                                              "arm64 Image)")


def test_a_cap_off_the_quota_grid_is_named_as_such_not_as_a_sum_a_hair_above_the_host() -> None:
    """Issue: set-cap 0.3000004 on a full host was refused as "caps of 1.00000 cores on 1 cores"."""
    from acting.executor import PlanRefused, apply_plan
    from tests.builders import inventory_of, memory_hypervisor
    from vcsched.inventory import snapshot_hash
    from vcsched.plans.plan import Plan
    from vcsched.plans.steps import SetCapStep

    hv = memory_hypervisor(inventory_of([managed_vm("a-0", 0.7), managed_vm("b-0", 0.3)], n_hosts=1))
    plan = Plan("adapt", "lab", snapshot_hash(hv.inventory()), 1.0, 1.0, {}, (SetCapStep("b-0", "h0", 0.3000004),))
    with pytest.raises(PlanRefused) as caught:
        apply_plan(hv, plan)
    assert str(caught.value).startswith("plan.steps[0].cap_cores: 0.3000004 cores is off the quota grid: a 1-vCPU "
                                        "VM's caps are multiples of 1e-05 cores")
    assert "it would hold 0.3" in str(caught.value) and "caps of" not in str(caught.value)
    assert hv.calls == []


def managed_vm(name: str, cap: float) -> Any:
    from tests.builders import managed

    return managed(name, "h0", name.split("-")[0], cap, cap)


def test_a_malformed_vm_name_in_a_plan_is_bad_input(tmp_path: Path) -> None:
    """Issue: a plan naming VM "bad name!" exited 1 ("on no host of the cluster"), not 2."""
    import json

    from hypervisor.testhosts import write_scale_cluster

    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2, scheme="sim")
    plan = tmp_path / "plan.json"
    made = run("adapt", "--budget", "0", "--set-need", "vm0=0.3", "--cluster", hosts.cluster_file, "-o", plan)
    assert made.exit_code == 0, (made.stdout, made.stderr)
    doc = json.loads(plan.read_text())
    doc["steps"][0]["vm"] = "bad name!"
    plan.write_text(json.dumps(doc))
    r = run("apply", plan, "--cluster", hosts.cluster_file, "--coordination", f"file://{tmp_path}/lock")
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "plan.steps[0].vm: 'bad name!' is not a name" in r.stderr


def test_a_refused_plans_table_says_what_a_migration_would_move_not_its_claim(tmp_path: Path) -> None:
    """Issue: a plan refused for a migration's "bytes": 1 still showed "1 B moved" in its table."""
    import json

    from hypervisor.testhosts import write_scale_cluster

    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2, scheme="sim")
    plan = tmp_path / "plan.json"
    made = run("drain", "h0", "--budget", "unlimited", "--cluster", hosts.cluster_file, "-o", plan)
    assert made.exit_code == 0, (made.stdout, made.stderr)
    assert "512 MiB to move" in made.stdout
    doc = json.loads(plan.read_text())
    doc["steps"][0]["bytes"] = 1
    doc["migrated_bytes"] = sum(s["bytes"] for s in doc["steps"] if s["op"] == "migrate")
    plan.write_text(json.dumps(doc))
    r = run("apply", plan, "--cluster", hosts.cluster_file, "--coordination", f"file://{tmp_path}/lock")
    assert r.exit_code == 1, (r.stdout, r.stderr)
    assert "claims 1 B; moves 512 MiB" in r.stdout and "1 B moved" not in r.stdout


# ---------------------------------------------------------------------------------------------- the whole-plan check


def test_a_restart_dry_run_exits_1_where_apply_refuses_the_plan_whole(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue: `restart VM` planned and exited 0 as a dry run, where --apply's whole-plan check refused (exit 1).
    h1 is down and fenced, web-0 lost; h0 and h2 are libvirt's test driver, which cannot cap CPU."""
    from acting.definitions import DefinitionStore
    from tests.test_recover_cli import agent, cluster, recorded

    state = tmp_path / "state"
    monkeypatch.setenv("VCSCHED_STATE_DIR", str(state))
    monkeypatch.delenv("VCSCHED_COORDINATION", raising=False)
    recorded(state, "web-0")
    DefinitionStore.for_url(f"file://{state}/coordination", "t").mark_fenced("h1", at=2e9)
    args = ["restart", "web-0", "--cluster", cluster(tmp_path, agent(tmp_path, 2))]
    dry, applied = run(*args), run(*args, "--apply")
    assert (dry.exit_code, applied.exit_code) == (1, 1), (dry.output, applied.output)
    assert "cannot cap CPU" in applied.stderr
    assert dry.stderr.startswith("vcsched: refused: --apply would refuse: ") and "cannot cap CPU" in dry.stderr
    assert "use --apply" not in dry.stdout
    doc = json.loads(run(*args, "--json").stdout)
    assert doc["ok"] is False and doc["plan"]["restart"] == ["web-0"]  # the plan is still shown


@pytest.mark.parametrize("argv", [["adopt", "stranger", "--vc", "old", "--need", "0.5"], ["release", "old-0"]])
def test_adopt_and_release_dry_runs_exit_as_apply_when_the_whole_plan_check_refuses(
        argv: list[str], test_hosts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The dry run runs --apply's whole-plan check (acting.executor.check_whole) on its plan.  Made to refuse
    here, as it would for a cluster whose live state the plan does not fit: both exit 1, nothing changed."""
    import acting.executor
    from vcsched.errors import InputError

    before = (tmp_path / "h0.xml").read_text()
    # The test driver cannot cap CPU, and adopt refuses such a host itself: the same host files, served by the
    # simulated libvirt, whose hosts cap CPU.
    test_hosts.write_text(test_hosts.read_text().replace('"test://', '"sim://'))
    args = [*argv, "--cluster", test_hosts, "--coordination", f"file://{tmp_path}/coord"]
    ok = run(*args)
    assert ok.exit_code == 0, (ok.stdout, ok.stderr)  # the check holds: the dry run goes through

    def refused(*_a: Any, **_k: Any) -> None:
        raise InputError("plan.steps[0]: a refusal of the whole-plan check")

    monkeypatch.setattr(acting.executor, "check_plan", refused)
    dry, applied = run(*args), run(*args, "--apply")
    assert (dry.exit_code, applied.exit_code) == (1, 1), (dry.output, applied.output)
    assert dry.stderr.strip() == ("vcsched: refused: --apply would refuse: plan.steps[0]: a refusal of the "
                                  "whole-plan check"), dry.stderr
    doc = json.loads(run(*args, "--json").stdout)
    assert doc["ok"] is False and "--apply would refuse" in doc["refused"]
    assert (tmp_path / "h0.xml").read_text() == before


# ---------------------------------------------------------------------------------------------- dry run = --apply


def _deciding(command: str, hosts: Any) -> list[Any]:
    """The command line of a deciding command on ``hosts`` (hypervisor/testhosts.py), without --apply."""
    c = ["--cluster", hosts.cluster_file]
    return {"place": ["place", hosts.request_file, *c],
            "adapt": ["adapt", "--budget", "0", "--set-need", "vm0=0.3", *c],
            "drain": ["drain", "h0", "--budget", "unlimited", *c]}[command]


@pytest.mark.parametrize("command", ["place", "adapt", "drain"])
def test_the_dry_run_of_place_adapt_and_drain_exits_as_apply_does(command: str, tmp_path: Path) -> None:
    """Issue: the dry run did not run --apply's whole-plan check, so it exited 0 where --apply refused.  On
    libvirt's test driver, which cannot cap CPU, --apply refuses every plan here (exit 1, nothing changed), and so
    does the dry run, saying why; on the simulated libvirt (``sim://``), whose hosts cap CPU, both go on (0)."""
    from hypervisor.testhosts import write_scale_cluster

    for scheme, refuses in (("test", True), ("sim", False)):
        hosts = write_scale_cluster(tmp_path / scheme, hosts=2, vms_per_host=2, scheme=scheme)
        args = _deciding(command, hosts)
        dry, doc = run(*args), json.loads(run(*args, "--json").stdout)
        applied = run(*args, "--apply", "--coordination", f"file://{tmp_path}/lock")
        assert (dry.exit_code, applied.exit_code) == ((1, 1) if refuses else (0, 0)), (scheme, dry.output,
                                                                                         applied.output)
        assert doc["ok"] is not refuses and doc["plan"]["steps"]  # --json carries the verdict beside the plan
        if refuses:
            assert "cannot set CPU caps" in applied.stderr
            assert "maintenance" not in hosts.cluster_file.read_text()  # refused: nothing changed, h0 not cordoned
            assert dry.stderr.strip().splitlines()[-1].startswith("vcsched: refused: --apply would refuse: "
                                                                  "plan.steps[")
            assert "cannot set CPU caps" in dry.stderr and doc["refused"].startswith("--apply would refuse: ")
            assert "--apply to carry it out" not in dry.stdout and "use --apply" not in dry.stdout
        else:
            assert "refused" not in doc and "would refuse" not in dry.stderr
            assert ("maintenance = true" in hosts.cluster_file.read_text()) is (command == "drain")


def test_apply_dry_run_exits_as_apply_does(tmp_path: Path) -> None:
    """`vcsched apply PLAN --dry-run` runs the check applying runs (the snapshot, then the whole plan against the
    live cluster) and changes nothing: 1 where applying refuses (the test driver cannot cap CPU), 0 where it
    would act (the simulated libvirt's hosts cap CPU)."""
    from hypervisor.testhosts import write_scale_cluster

    for scheme, refuses in (("test", True), ("sim", False)):
        hosts = write_scale_cluster(tmp_path / scheme, hosts=2, vms_per_host=2, scheme=scheme)
        plan = tmp_path / f"{scheme}.json"
        run("adapt", "--budget", "0", "--set-need", "vm0=0.3", "--cluster", hosts.cluster_file, "-o", plan)
        args = ["apply", plan, "--cluster", hosts.cluster_file, "--coordination", f"file://{tmp_path}/lock"]
        dry, doc = run(*args, "--dry-run"), json.loads(run(*args, "--dry-run", "--json").stdout)
        again = run(*args, "--dry-run")  # nothing changed: the same verdict
        applied = run(*args)
        assert (dry.exit_code, again.exit_code, applied.exit_code) == ((1, 1, 1) if refuses else (0, 0, 0)), \
            (scheme, dry.output, applied.output)
        assert doc["ok"] is not refuses and doc["dry_run"] is True and doc["applied"] is None
        if refuses:
            assert "cannot set CPU caps" in applied.stderr and "cannot set CPU caps" in doc["refused"]
            assert dry.stderr.strip().startswith("vcsched: refused: --apply would refuse: plan.steps[0]")
        else:
            assert "dry run: nothing changed" in dry.stdout and "applied" in applied.stdout


def test_apply_dry_run_of_a_stale_plan_exits_1_as_apply_does_and_with_force_0(tmp_path: Path) -> None:
    from hypervisor.testhosts import write_scale_cluster

    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2, scheme="sim")
    plan = tmp_path / "plan.json"
    run("adapt", "--budget", "0", "--set-need", "vm0=0.3", "--cluster", hosts.cluster_file, "-o", plan)
    doc = json.loads(plan.read_text())
    doc["snapshot"] = "0" * 64  # computed on another cluster state
    plan.write_text(json.dumps(doc))
    args = ["apply", plan, "--cluster", hosts.cluster_file, "--dry-run"]
    stale = run(*args)
    assert stale.exit_code == 1 and "changed since this plan was computed" in stale.stderr, stale.output
    assert run(*args, "--force").exit_code == 0


@pytest.mark.parametrize("command", ["place", "adapt", "drain", "apply"])
def test_the_dry_run_refuses_with_the_very_check_apply_runs(command: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """One validator: made to refuse (acting.executor.check_plan, inside UnitOfWork.validate), the dry run and
    --apply refuse alike, with the same reason, on hosts where both would otherwise act."""
    import acting.executor
    from hypervisor.testhosts import write_scale_cluster
    from vcsched.errors import InputError

    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2, scheme="sim")
    lock = ["--coordination", f"file://{tmp_path}/lock"]
    if command == "apply":
        plan = tmp_path / "plan.json"
        run("adapt", "--budget", "0", "--set-need", "vm0=0.3", "--cluster", hosts.cluster_file, "-o", plan)
        dry_args, apply_args = ["apply", plan, "--cluster", hosts.cluster_file, "--dry-run"], \
            ["apply", plan, "--cluster", hosts.cluster_file, *lock]
    else:
        dry_args = _deciding(command, hosts)
        apply_args = [*dry_args, "--apply", *lock]

    def refused(*_a: Any, **_k: Any) -> None:
        raise InputError("plan.steps[0]: a refusal of the whole-plan check")

    monkeypatch.setattr(acting.executor, "check_plan", refused)
    dry, applied = run(*dry_args), run(*apply_args)
    assert (dry.exit_code, applied.exit_code) == (1, 1), (dry.output, applied.output)
    assert dry.stderr.strip().splitlines()[-1] == ("vcsched: refused: --apply would refuse: plan.steps[0]: a refusal "
                                                   "of the whole-plan check")
    assert "plan.steps[0]: a refusal of the whole-plan check" in applied.stderr


@pytest.mark.parametrize("command", ["recover", "restart"])
def test_recover_and_restart_dry_runs_exit_as_apply_does(command: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """h1 is down with web-0 recorded on it; h0 and h2 answer.  On libvirt's test driver, which cannot cap CPU,
    --apply refuses the plan (before fencing), and so does the dry run (1); on the simulated libvirt, whose hosts
    cap CPU, both go on (0), and --apply runs web-0 again."""
    from acting.definitions import DefinitionStore
    from tests.test_recover_cli import agent, cluster, recorded

    for scheme, refuses in (("test", True), ("sim", False)):
        where = tmp_path / scheme
        where.mkdir()
        state = where / "state"
        monkeypatch.setenv("VCSCHED_STATE_DIR", str(state))
        monkeypatch.delenv("VCSCHED_COORDINATION", raising=False)
        recorded(state, "web-0")
        if command == "restart":
            DefinitionStore.for_url(f"file://{state}/coordination", "t").mark_fenced("h1", at=2e9)
        args = [command, "h1" if command == "recover" else "web-0",
                "--cluster", cluster(where, agent(where, 2), scheme=scheme)]
        dry, doc = run(*args), json.loads(run(*args, "--json").stdout)
        applied = run(*args, "--apply")
        assert (dry.exit_code, applied.exit_code) == ((1, 1) if refuses else (0, 0)), (scheme, dry.output,
                                                                                         applied.output)
        assert doc["ok"] is not refuses and doc["plan"]["steps"]
        assert ("--apply would refuse" in dry.stderr) is refuses
        if not refuses:
            assert "web-0" in applied.stdout and "applied" in applied.stdout


@pytest.mark.parametrize("command", ["place", "adapt", "drain"])
def test_the_help_of_each_planning_command_says_its_dry_run_exits_as_apply_would(command: str) -> None:
    """Issue (QA): their "Exit codes" listed 1 for --apply's refusals only; a script reading the help could not
    know the dry run exits 1 too where --apply would refuse (docs/cli.md, "Dry runs")."""
    r = CliRunner().invoke(cli, [command, "--help"], env={"COLUMNS": "200"})
    assert "A dry run exits as --apply would: 1 where --apply would refuse its plan" in " ".join(r.stdout.split())


def test_a_drain_that_moves_nothing_does_not_say_nothing_to_do(floors: Path) -> None:
    """Issue (QA on the lab): `drain h0 --budget 100MiB` said "0 of 2 VMs leave" and then "nothing to do: every VM
    already has its cap", above the table of the VMs that stay."""
    r = run("drain", "h0", "--budget", "0", "--cluster", floors)
    assert r.exit_code == 1 and "0 of 2 VMs leave" in r.stdout, (r.stdout, r.stderr)
    assert "nothing to do" not in r.stdout and "the plan has no step" in r.stdout, r.stdout
