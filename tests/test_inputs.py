"""Inputs cannot lie (issue 32), without a lab: sizes and their units, names, what a created VM boots from, which
host a cluster file entry is, which lock a cluster takes, how a lab's shape changes, down hosts in the deciding
commands' output, and a failed step on stderr with the caps it lowered put back.

The same findings against real libvirt daemons are tests/test_inputs_lab.py.
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from acting.executor import DONE, FAILED, ApplyReport, StepResult, apply_plan
from acting.lock import ClusterLock, LockBusy, holding
from cli.main import cli
from hypervisor.bootcheck import boot_problems, initrd_footprint, kernel_footprint, validation_xml
from hypervisor.identity import check_distinct, lock_key, uuid_from_capabilities
from hypervisor.memory import MemoryHypervisor
from tests.builders import MiB, cluster_of, inventory_of, managed, memory_hypervisor, request
from vcsched.control.admission import admit
from vcsched.errors import InputError
from vcsched.formats.cluster import Cluster, ClusterHost, GuestDefaults, cluster_from_dict
from vcsched.formats.request import request_from_dict
from vcsched.formats.units import MIN_VM_MEMORY, parse_memory, parse_size
from vcsched.plans.plan import plan_from_dict
from vcsched.plans.steps import Boot, CreateStep, SetCapStep

U0, U1 = "6d1b8a52-3f0e-4c59-9a52-8c0f1e0b7a11", "0f0f0f0f-1111-4222-8333-444455556666"


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---------------------------------------------------------------------------------------------- units, sizes


def test_decimal_and_binary_suffixes_follow_libvirts_rule() -> None:
    assert parse_size("x", "64 MB") == 64_000_000 and parse_size("x", "64MiB") == 64 << 20
    assert parse_size("x", "64M") == 64 << 20 and parse_size("x", "1GB") == 10**9


def test_a_vm_memory_in_decimal_megabytes_is_refused_naming_both_readings() -> None:
    # Finding 2 of issue 32: "64 MB" was accepted; libvirt would have run 64,000,000 bytes (61.04 MiB) as 62 MiB.
    with pytest.raises(InputError, match=r"memory: '64 MB' is 64000000 bytes, not a whole number of MiB \(KB, MB, "
                                         r"GB are powers of 1000, KiB, MiB, GiB of 1024\); libvirt would round it "
                                         r"up to 62 MiB"):
        request_from_dict({"name": "web", "vms": 1, "vcpus": 1, "memory": "64 MB", "cpu_need": 0.5})


@pytest.mark.parametrize("memory", [1, "1", "1MiB", "15MiB", 16 * MiB - 1])
def test_a_vm_memory_below_16_mib_is_refused(memory: Any) -> None:
    # Finding 2 of issue 32: memory = 1 (one byte) was accepted and failed only when the VM was created.
    with pytest.raises(InputError, match=r"memory: .* below the smallest VM memory of 16 MiB"):
        request_from_dict({"name": "web", "vms": 1, "vcpus": 1, "memory": memory, "cpu_need": 0.5})


def test_whole_mebibytes_from_16_up_are_vm_memory() -> None:
    assert parse_memory("memory", "16MiB") == MIN_VM_MEMORY
    assert parse_memory("memory", "1.5GiB") == 1536 << 20
    assert parse_memory("memory", 64 * MiB) == 64 * MiB


def test_a_plans_create_step_holds_to_the_same_memory_rule() -> None:
    plan = admit(cluster_of(), inventory_of(), request()).plan
    assert plan is not None
    doc = plan.to_dict()
    doc["steps"][0]["memory_bytes"] = 64_000_000
    with pytest.raises(InputError, match=r"plan\.steps\[0\]\.memory_bytes: 64000000 is 64000000 bytes, not a whole"):
        plan_from_dict(doc)


# ---------------------------------------------------------------------------------------------- names


def test_a_virtual_cluster_named_like_a_running_vm_is_refused() -> None:
    # Finding 2 of issue 32: a virtual cluster named web-0, a name VMs of cluster web carry, was accepted.
    inv = inventory_of([managed("web-0", "h0", "web", 0.2), managed("web-1", "h1", "web", 0.2)])
    with pytest.raises(InputError, match=r"name: 'web-0' is already a VM's name in cluster 'lab' \(on host h0, of "
                                         r"virtual cluster 'web'\); virtual cluster and VM names must differ"):
        admit(cluster_of(), inv, request("web-0", vms=1))


def test_a_request_whose_vms_would_carry_a_virtual_clusters_name_is_refused() -> None:
    inv = inventory_of([managed("x", "h0", "web-0", 0.2)])
    with pytest.raises(InputError, match=r"name: the request's VM 'web-0' would carry the name of virtual cluster"):
        admit(cluster_of(), inv, request("web", vms=1))


def test_a_plan_creating_a_cluster_named_like_a_vm_is_refused_before_any_step() -> None:
    hv = memory_hypervisor(inventory_of([managed("web-0", "h0", "web", 0.2)]))
    plan = admit(cluster_of(), hv.inventory(), request("db", vms=1, need=0.2)).plan
    assert plan is not None
    doc = plan.to_dict()
    i = next(i for i, s in enumerate(doc["steps"]) if s["op"] == "create")
    doc["steps"][i]["cluster"] = "web-0"
    with pytest.raises(InputError, match=rf"plan\.steps\[{i}\]\.cluster: 'web-0' is already the name of a VM"):
        apply_plan(hv, plan_from_dict(doc), force=True)
    assert hv.calls == []


# ---------------------------------------------------------------------------------------------- boot files


def elf_kernel(path: Path, segments: list[tuple[int, int]]) -> Path:
    """A 64-bit ELF with PT_LOAD segments ``(physical address, size in memory)``."""
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<QHH", header, 32, 64, 0, 0)  # e_phoff
    struct.pack_into("<HH", header, 54, 56, len(segments))
    phdrs = b"".join(struct.pack("<IIQQQQQQ", 1, 5, 0, 0, paddr, memsz, memsz, 0) for paddr, memsz in segments)
    path.write_bytes(bytes(header) + phdrs)
    return path


def bzimage(path: Path, pref: int, init_size: int) -> Path:
    head = bytearray(0x300)
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, 0x20F)
    struct.pack_into("<Q", head, 0x258, pref)
    struct.pack_into("<I", head, 0x260, init_size)
    path.write_bytes(bytes(head))
    return path


def test_an_elf_kernel_needs_memory_up_to_its_highest_loaded_segment(tmp_path: Path) -> None:
    k = elf_kernel(tmp_path / "vmlinux", [(16 * MiB, 24 * MiB), (48 * MiB, 26 * MiB)])
    assert kernel_footprint(str(k)) == 74 * MiB


def test_a_bzimage_needs_its_load_address_and_init_size(tmp_path: Path) -> None:
    assert kernel_footprint(str(bzimage(tmp_path / "vmlinuz", 16 * MiB, 48 * MiB))) == 64 * MiB


def test_a_gzip_initrd_counts_packed_and_unpacked(tmp_path: Path) -> None:
    i = tmp_path / "initrd.gz"
    i.write_bytes(gzip.compress(b"\0" * (3 * MiB)))
    assert initrd_footprint(str(i)) == i.stat().st_size + 3 * MiB


def test_a_kernel_and_initrd_larger_than_the_vm_are_refused_naming_sizes(tmp_path: Path) -> None:
    k = elf_kernel(tmp_path / "vmlinux", [(16 * MiB, 58 * MiB)])
    i = tmp_path / "initrd"
    i.write_bytes(b"x" * MiB)
    boot = Boot("kernel", kernel=str(k), initrd=str(i))
    assert boot_problems("plan.steps[1]", boot, 128 * MiB) == []
    assert boot_problems("plan.steps[1]", boot, 79 * MiB) == []
    assert boot_problems("plan.steps[1]", boot, 78 * MiB) == [
        "plan.steps[1].boot.kernel: the kernel 74 MiB + the initrd 1 MiB (packed and unpacked) + 4 MiB to run need "
        "79 MiB of guest memory, the VM has 78 MiB (memory_bytes 81788928)"]


def test_missing_unreadable_and_non_file_boot_files_are_named(tmp_path: Path) -> None:
    boot = Boot("kernel", kernel=str(tmp_path / "none"), initrd=str(tmp_path))
    assert boot_problems("s", boot, 128 * MiB) == [f"s.boot.kernel: '{tmp_path / 'none'}' does not exist",
                                                   f"s.boot.initrd: '{tmp_path}' is not a regular file"]
    assert boot_problems("s", Boot("image", path=str(tmp_path / "d.qcow2")), 128 * MiB) == [
        f"s.boot.path: '{tmp_path / 'd.qcow2'}' does not exist"]


def test_a_template_that_is_not_domain_xml_is_refused() -> None:
    # Finding 2 of issue 32: template = "/etc/passwd" was accepted; the create failed after other VMs were re-capped.
    assert boot_problems("plan.steps[2]", Boot("template", path="/etc/passwd"), 128 * MiB)[0].startswith(
        "plan.steps[2].boot.path: template /etc/passwd: malformed XML")


def test_a_templates_own_kernel_and_disks_are_checked(tmp_path: Path) -> None:
    t = tmp_path / "vm.xml"
    t.write_text(f"<domain type='kvm'><os><kernel>{tmp_path}/k</kernel></os><devices><disk type='file' "
                 f"device='disk'><source file='{tmp_path}/d.raw'/><target dev='vda'/></disk></devices></domain>")
    got = boot_problems("s", Boot("template", path=str(t)), 128 * MiB)
    assert got == [f"s.boot.path (template {t}) <os><kernel>: '{tmp_path}/k' does not exist",
                   f"s.boot.path (template {t}) <disk><source>: '{tmp_path}/d.raw' does not exist"]
    assert boot_problems("s", Boot("template", path=str(t)), 128 * MiB, local=False) == []  # on another machine


def test_the_xml_libvirt_validates_is_nameless_metadata_free_and_uuid_free() -> None:
    xml = validation_xml("<domain type='qemu'><name>web-0</name><uuid>x</uuid><metadata><a/></metadata>"
                         "<memory>1</memory></domain>", "abc")
    assert xml == "<domain type=\"qemu\"><name>vcsched-check-abc</name><memory>1</memory></domain>"


def test_a_plan_whose_vm_cannot_boot_is_refused_before_any_cap_is_lowered(tmp_path: Path) -> None:
    # Finding 2 of issue 32: the plan re-capped every running VM, then the create failed, exit 1, stderr empty.
    hv = memory_hypervisor(inventory_of([managed("old-0", "h0", "old", 1.0, cap=1.0),
                                         managed("old-1", "h1", "old", 1.0, cap=1.0)]))
    hv.boot_files = True
    cluster = Cluster("lab", cluster_of().hosts, 0.0, GuestDefaults(str(tmp_path / "k"), str(tmp_path / "i")))
    plan = admit(cluster, hv.inventory(), request("web", vms=2, need=1.0)).plan
    assert plan is not None and plan.steps[0].op == "set-cap"
    with pytest.raises(InputError, match=r"plan\.steps\[\d\]\.boot\.kernel: '.*/k' does not exist"):
        apply_plan(hv, plan)
    assert hv.calls == [] and hv.vms["old-0"].cap_cores == 1.0


def test_place_refuses_a_request_that_cannot_boot_before_reading_any_host(tmp_path: Path) -> None:
    cf = tmp_path / "cluster.toml"
    cf.write_text(f'name = "t"\n[guest]\nkernel = "{tmp_path}/vmlinux"\ninitrd = "{tmp_path}/initrd"\n'
                  f'[[hosts]]\nname = "h0"\nuri = "qemu+unix:///system?socket={tmp_path}/nowhere"\n')
    elf_kernel(tmp_path / "vmlinux", [(16 * MiB, 58 * MiB)])
    (tmp_path / "initrd").write_bytes(b"x" * MiB)
    req = tmp_path / "web.toml"
    for extra, message in [('template = "/etc/passwd"', "template: template /etc/passwd: malformed XML"),
                           ('memory = "64MiB"', "guest.kernel (cluster file): the kernel 74 MiB + the initrd 1 MiB "
                                                "(packed and unpacked) + 4 MiB to run need 79 MiB of guest memory, "
                                                "the VM has 64 MiB")]:
        memory = "" if "memory" in extra else 'memory = "128MiB"\n'
        req.write_text(f'name = "web"\nvms = 1\nvcpus = 1\n{memory}cpu_cores = 0.5\n{extra}\n')
        result = run("place", req, "--cluster", cf)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"vcsched: error: request {req}: {message}")  # before the host is read


# ---------------------------------------------------------------------------------------------- a failed step


def crowded() -> MemoryHypervisor:
    return memory_hypervisor(inventory_of([managed("old-0", "h0", "old", 1.0, cap=1.0),
                                           managed("old-1", "h1", "old", 1.0, cap=1.0)]))


def test_caps_lowered_for_a_vm_that_was_not_created_are_put_back() -> None:
    hv = crowded()
    plan = admit(cluster_of(), hv.inventory(), request("web", vms=2, need=1.0)).plan
    assert plan is not None
    creates = [s for s in plan.steps if isinstance(s, CreateStep)]
    hv.fail[("create", creates[0].vm)] = f"host {creates[0].host}: it died"
    report = apply_plan(hv, plan)
    assert [r.outcome for r in report.results if r.step.op == "create"] == [FAILED, "not run"]
    # Neither new VM came: both caps lowered for them are back.
    assert [(r.step.vm, r.outcome) for r in report.restored] == [("old-0", DONE), ("old-1", DONE)]
    assert hv.vms["old-0"].cap_cores == hv.vms["old-1"].cap_cores == 1.0
    assert [r["vm"] for r in report.to_dict()["restored"]] == ["old-0", "old-1"]


def test_a_lowered_cap_whose_room_a_created_vm_uses_stays_lowered() -> None:
    hv = crowded()
    plan = admit(cluster_of(), hv.inventory(), request("web", vms=2, need=1.0)).plan
    assert plan is not None
    creates = [s for s in plan.steps if isinstance(s, CreateStep)]
    hv.fail[("create", creates[-1].vm)] = "boom"  # the first create happened: its host keeps its lowered caps
    report = apply_plan(hv, plan)
    assert creates[0].vm in hv.vms
    assert all(r.step.host != creates[0].host for r in report.restored)


def test_a_failed_plan_says_so_on_stderr_naming_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.common import apply_exit_code

    step = SetCapStep("web-0", "h1", 0.5)
    report = ApplyReport((StepResult(SetCapStep("a", "h0", 0.5), DONE), StepResult(step, FAILED, "host h1: down")),
                         True, restored=(StepResult(SetCapStep("a", "h0", 1.0), DONE),))
    assert apply_exit_code(report) == 1
    assert capsys.readouterr().err == ("vcsched: error: the plan stopped at step 2 (set-cap web-0 on h1), failed: "
                                       "host h1: down; 1 lowered cap(s) put back; every VM is left running (re-run "
                                       "the plan to continue)\n")


# ---------------------------------------------------------------------------------------------- host identity


def caps_xml(uuid: str | None) -> str:
    inner = f"<uuid>{uuid}</uuid>" if uuid else ""
    return f"<capabilities><host>{inner}<cpu><arch>x86_64</arch></cpu></host></capabilities>"


def test_a_hosts_uuid_is_read_from_its_capabilities() -> None:
    assert uuid_from_capabilities(caps_xml(U0.upper())) == U0
    assert uuid_from_capabilities(caps_xml(None)) is None


def two_entries(uuid1: str | None = None) -> Cluster:
    return Cluster("lab", (ClusterHost("h0", "qemu+unix:///system?socket=/s/h0"),
                           ClusterHost("again", "qemu+unix:///system?socket=/s/./h0", uuid=uuid1)))


def test_two_entries_reaching_one_host_are_refused_naming_both_and_the_uuid() -> None:
    # Finding 3 of issue 32: eight spellings of one host's socket were accepted as a second host.
    with pytest.raises(InputError, match=rf"hosts\[1\]: again \(qemu\+unix:///system\?socket=/s/\./h0\) and "
                                         rf"hosts\[0\]: h0 \(qemu\+unix:///system\?socket=/s/h0\) reach the same host, "
                                         rf"libvirt host UUID {U0}"):
        check_distinct(two_entries(), {"h0": U0, "again": U0})
    check_distinct(two_entries(), {"h0": U0, "again": U1})


def test_a_host_answering_with_another_uuid_than_declared_is_refused() -> None:
    with pytest.raises(InputError, match=rf"hosts\[1\]\.uuid: host again .* answers as host {U0}, the cluster file "
                                         rf"declares {U1}"):
        check_distinct(two_entries(U1), {"h0": U1, "again": U0})


def test_a_cluster_file_declares_host_uuids_once_each() -> None:
    def doc(*uuids: str) -> dict[str, Any]:
        return {"name": "lab", "hosts": [{"name": f"h{i}", "uri": f"test:///h{i}.xml", "uuid": u}
                                         for i, u in enumerate(uuids)]}

    assert cluster_from_dict(doc(U0.upper(), U1)).hosts[0].uuid == U0
    with pytest.raises(InputError, match=rf"hosts\[1\]\.uuid: {U0} is also hosts\[0\]'s"):
        cluster_from_dict(doc(U0, U0))
    with pytest.raises(InputError, match=r"hosts\[0\]\.uuid: 'nope' is not a UUID"):
        cluster_from_dict(doc("nope"))


# ---------------------------------------------------------------------------------------------- the lock


def test_the_lock_key_is_the_set_of_host_identities() -> None:
    assert lock_key(["uuid:a", "uuid:b"]) == lock_key(["uuid:b", "uuid:a", "uuid:a"])
    assert lock_key(["uuid:a", "uuid:b"]) != lock_key(["uuid:a", "uuid:c"])


def test_two_clusters_named_alike_do_not_share_a_lock_and_two_names_for_one_cluster_do(tmp_path: Path) -> None:
    # Finding 4 of issue 32: every lab is named "lab", and one lab's drain locked out another lab's adapt.
    url = f"file://{tmp_path}"
    mine, other = lock_key([f"uuid:{U0}"]), lock_key([f"uuid:{U1}"])
    with holding(url, "lab", key=mine):
        _held_briefly(url, "lab", other)  # an unrelated cluster of the same name: its own lock
        with pytest.raises(LockBusy, match=r"cluster 'prod' is locked by"):
            ClusterLock(url, "prod", key=mine).acquire()  # the same hosts under another name: the same lock


def _held_briefly(url: str, name: str, key: str) -> None:
    lock = ClusterLock(url, name, key=key)
    lock.acquire()
    lock.release()


def test_a_down_host_whose_uuid_is_not_declared_no_longer_stops_a_changing_command(tmp_path: Path) -> None:
    # Issue 40: it refused ("cannot name the lock"); now the host is down for it and the lock is named through the
    # other hosts' claims (tests/test_lock_names.py).
    cf = tmp_path / "cluster.toml"
    cf.write_text(f'name = "t"\n[[hosts]]\nname = "far"\nuri = "qemu+unix:///system?socket={tmp_path}/nope"\n'
                  '[[hosts]]\nname = "near"\nuri = "test:///default"\n')
    result = run("cordon", "near", "--cluster", cf, "--coordination", f"file://{tmp_path}/coordination")
    assert result.exit_code == 0, result.output
    assert "maintenance = true" in cf.read_text()


def test_a_down_host_whose_uuid_a_command_here_has_read_still_names_the_lock(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from hypervisor.identity import remember, remembered

    monkeypatch.setenv("VCSCHED_STATE_DIR", str(tmp_path / "state"))
    far = f"qemu+unix:///system?socket={tmp_path}/nope"
    cf = tmp_path / "cluster.toml"
    cf.write_text(f'name = "t"\n[[hosts]]\nname = "far"\nuri = "{far}"\n'
                  '[[hosts]]\nname = "near"\nuri = "test:///default"\n')
    remember(tmp_path / "state", {far: U0})  # as a command did while far answered
    assert remembered(tmp_path / "state") == {far: U0}
    result = run("uncordon", "near", "--cluster", cf)
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------------------------------- down hosts


def test_place_and_adapt_name_a_down_host_and_what_it_means(tmp_path: Path) -> None:
    cf = tmp_path / "cluster.toml"
    # Boot files that pass the request's checks: "far" is on this machine, so they are checked before planning.
    bzimage(tmp_path / "k", 16 * MiB, 16 * MiB)
    (tmp_path / "i").write_bytes(b"x")
    cf.write_text(f'name = "t"\n[guest]\nkernel = "{tmp_path}/k"\ninitrd = "{tmp_path}/i"\n'
                  f'[[hosts]]\nname = "far"\nuri = "qemu+unix:///system?socket={tmp_path}/nope"\n'
                  '[[hosts]]\nname = "near"\nuri = "test:///default"\n')
    req = tmp_path / "web.toml"
    req.write_text('name = "web"\nvms = 1\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.5\n')
    consequence = "its VMs were not counted and nothing was planned onto it or off it"
    for args in (("place", req), ("adapt", "--budget", "0"), ("drain", "near", "--budget", "0")):
        result = run(*args, "--cluster", cf, "--json")
        down = json.loads(result.stdout)["hosts_down"]
        assert [(d["host"], d["consequence"]) for d in down] == [("far", consequence)], result.output
        assert down[0]["reason"].startswith("host far: cannot connect")
        text = run(*args, "--cluster", cf)
        assert "host far is down (host far: cannot connect" in text.output and consequence in text.output


# ---------------------------------------------------------------------------------------------- lab shape


def test_lab_up_with_other_memory_on_a_running_lab_is_refused_naming_both_shapes_and_the_ways(tmp_path: Path) -> None:
    # Finding 5 of issue 32: `lab up --memory 256MiB` on a running lab rewrote every host's memory_reserved.
    import lab as labmod
    from hypervisor.guest import GuestImage
    from lab.state import LabHost, LabLayout, render_cluster_toml

    if labmod.prerequisites_problem():
        pytest.skip(f"lab prerequisites: {labmod.prerequisites_problem()}")
    layout = LabLayout(tmp_path)
    hosts = [LabHost("h0", layout.uri(0), layout.partition(0), memory_reserved="3900MiB")]
    guest = GuestImage(tmp_path / "k", tmp_path / "i")
    layout.state_file.write_text(json.dumps({"id": layout.id, "n_hosts": 1, "machine_memory_mib": 4900,
                                             "hosts": [h.__dict__ for h in hosts],
                                             "guest": {"kernel": "k", "initrd": "i", "cmdline": "", "domain_type":
                                                       "qemu"}}))
    layout.cluster_file.write_text(render_cluster_toml("lab", hosts, guest))
    before = layout.cluster_file.read_text()
    assert labmod.recorded_shape(tmp_path) == labmod.LabShape(1, 1, 1000, "unix", False)
    with pytest.raises(labmod.LabError, match=r"a lab of 1 host\(s\) of 1 core\(s\), 1000 MiB each \(transport unix\) "
                                              r"already runs in .*, this asks for 1 host\(s\) of 1 core\(s\), 256 MiB "
                                              r"each .*: nothing changed; 'vcsched lab up --recreate' replaces it "
                                              r".*'vcsched lab up --memory 256MiB --resize' changes only the memory"):
        labmod.up(1, tmp_path, memory_mib=256)
    with pytest.raises(labmod.LabError, match=r"this asks for 1 host\(s\) of 2 core\(s\)"):
        labmod.up(1, tmp_path, cores=2)
    assert layout.cluster_file.read_text() == before


def test_the_lab_cluster_file_declares_each_hosts_uuid() -> None:
    from hypervisor.guest import GuestImage
    from lab.state import LabHost, render_cluster_toml

    text = render_cluster_toml("lab", [LabHost("h0", "qemu:///system", "/p", uuid=U0)], GuestImage(Path("k"),
                                                                                                  Path("i")))
    assert cluster_from_dict(__import__("tomllib").loads(text)).hosts[0].uuid == U0


def test_reading_hosts_and_applying_plans_import_no_numpy() -> None:
    """The VM-size rule lives in light modules: the libvirt backend and `apply` start without numpy (a command on a
    hung host must end within host_timeout + 1 s, start-up included; numpy through the plan steps cost 0.2-0.3 s
    of it, measured)."""
    import subprocess
    import sys

    code = "import sys, cli.apply, acting.executor, hypervisor.libvirt_backend; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
