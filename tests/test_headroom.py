"""``vcsched headroom`` (vcsched/control/headroom.py): how many more VMs of a shape fit, asked of admission.

The answer must agree with ``vcsched place`` exactly: a request of N VMs of the shape is admitted and one of
N+1 refused, for every shape below, with and without room for a host failure.  On libvirt's test driver
(hypervisor/testhosts.py): 3 hosts of 8 cores and 32 GiB, each running 2 VMs of 0.5 cores and 512 MiB.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from hypervisor.testhosts import ScaleCluster, write_scale_cluster
from vcsched.control.admission import Decision
from vcsched.control.headroom import largest_admitted


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def hosts(tmp_path: Path) -> ScaleCluster:
    """3 hosts of 8 cores, 32 GiB and 100 MiB/s of disk, each running 2 VMs of 0.5 cores and 512 MiB."""
    sc = write_scale_cluster(tmp_path / "hosts", hosts=3, vms_per_host=2)
    text = sc.cluster_file.read_text()
    sc.cluster_file.write_text(re.sub(r'(uri = "[^"]*"\n)', r'\1disk_bps = "100MiB"\n', text))
    return sc


def with_failures(sc: ScaleCluster, tolerated: int) -> Path:
    """The cluster file with ``failures_tolerated`` set (what `place` reads; `headroom --failures` overrides it)."""
    path = sc.cluster_file.with_name(f"cluster-f{tolerated}.toml")
    path.write_text(sc.cluster_file.read_text().replace('name = "scale"',
                                                        f'name = "scale"\nfailures_tolerated = {tolerated}'))
    return path


def headroom(cluster: Path, shape: str, *extra: Any) -> dict[str, Any]:
    r = run("headroom", "--vm", shape, "--cluster", cluster, "--json", *extra)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["ok"] is True
    return dict(doc)


def placed(cluster: Path, tmp_path: Path, fields: dict[str, Any], vms: int) -> bool:
    """Whether `vcsched place` (dry run) admits a request of ``vms`` VMs with ``fields``."""
    req = tmp_path / f"req{vms}.toml"
    req.write_text(f'name = "probe"\nvms = {vms}\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items()))
    r = run("place", req, "--cluster", cluster, "--json")
    assert r.exit_code in (0, 1), (r.stdout, r.stderr)
    return bool(json.loads(r.stdout)["admitted"])


#: (shape for --vm, the same as request fields, --min-yield or None): memory-bound, CPU-bound, disk-bound (the
#: sharing policy's allocation over CPU and disk), several vCPUs.
SHAPES = {
    "memory-bound": ("cpu_cores=0.25,memory=4GiB", {"vcpus": 1, "memory": "4GiB", "cpu_cores": 0.25}, None),
    "cpu-bound": ("cpu_cores=1,memory=256MiB", {"vcpus": 1, "memory": "256MiB", "cpu_cores": 1.0}, 0.6),
    "disk-bound": ("cpu_cores=0.25,memory=512MiB,disk_bps=20MiB",
                   {"vcpus": 1, "memory": "512MiB", "cpu_cores": 0.25, "disk_bps": "20MiB"}, 0.8),
    "vcpus=2": ("vcpus=2,cpu_need=0.25,memory=1GiB", {"vcpus": 2, "memory": "1GiB", "cpu_need": 0.25}, 0.8),
}


@pytest.mark.parametrize("failures", [0, 1])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_headroom_agrees_with_place_n_admitted_and_n_plus_1_refused(name: str, failures: int, hosts: ScaleCluster,
                                                                   tmp_path: Path) -> None:
    shape, fields, floor = SHAPES[name]
    extra = ["--min-yield", floor] if floor is not None else []
    doc = headroom(hosts.cluster_file, shape, "--failures", failures, *extra)
    n = doc["count"]
    assert n > 0 and doc["failures"] == failures
    assert sum(doc["per_host"].values()) == n and set(doc["per_host"]) <= {"h0", "h1", "h2"}
    if floor is not None:
        assert doc["min_yield"] >= floor - 1e-6
        fields = {**fields, "min_yield": floor}
    place_cluster = with_failures(hosts, failures)
    assert placed(place_cluster, tmp_path, fields, n), f"{name}: place refuses the {n} VMs headroom said fit"
    assert not placed(place_cluster, tmp_path, fields, n + 1), f"{name}: place admits {n + 1}, one above headroom"


def test_the_limits_are_the_ones_each_shape_is_built_to_hit(hosts: ScaleCluster) -> None:
    c = hosts.cluster_file
    memory = headroom(c, SHAPES["memory-bound"][0])
    assert memory["count"] == 3 * 7 and memory["limit"].startswith("memory: ")  # (32 GiB - 1 GiB) // 4 GiB per host
    cpu = headroom(c, SHAPES["cpu-bound"][0], "--min-yield", 0.6)
    assert cpu["count"] < 3 * 120 and "0.6" in cpu["limit"]  # far below what memory holds: CPU at the floor
    assert cpu["floor_from"] == "--min-yield" and cpu["min_yield_floor"] == 0.6


def test_without_a_floor_a_cpu_bound_shape_is_counted_at_the_lowest_current_yield(hosts: ScaleCluster) -> None:
    """The running VMs are capped at their need (yield 1): 7 more cores per host at yield 1, not what memory
    holds (120 per host) at whatever yield is left."""
    doc = headroom(hosts.cluster_file, SHAPES["cpu-bound"][0])
    assert doc["count"] == 3 * 7 and doc["min_yield_floor"] == 1.0
    assert doc["floor_from"].startswith("the lowest current yield (VM 'vm")
    r = run("headroom", "--vm", SHAPES["cpu-bound"][0], "--cluster", hosts.cluster_file)
    assert r.exit_code == 0 and "every yield at least 1: the lowest current yield (VM" in " ".join(r.stdout.split())


def test_without_a_floor_the_clusters_min_yield_counts(hosts: ScaleCluster) -> None:
    path = hosts.cluster_file.with_name("cluster-y.toml")
    path.write_text(hosts.cluster_file.read_text().replace('name = "scale"', 'name = "scale"\nmin_yield = 0.6'))
    doc = headroom(path, SHAPES["cpu-bound"][0])
    assert doc["min_yield_floor"] == 0.6 and doc["floor_from"] == "cluster 'scale' min_yield"
    assert doc["count"] == headroom(hosts.cluster_file, SHAPES["cpu-bound"][0], "--min-yield", 0.6)["count"]


def test_room_for_a_host_failure_leaves_fewer(hosts: ScaleCluster) -> None:
    shape = SHAPES["memory-bound"][0]
    alone, kept = headroom(hosts.cluster_file, shape), headroom(hosts.cluster_file, shape, "--failures", 1)
    assert kept["count"] < alone["count"] and kept["limit"].startswith("failover: ")
    assert headroom(with_failures(hosts, 1), shape)["failures"] == 1  # the cluster file's, when not overridden


def test_the_text_answer_says_the_count_the_hosts_and_the_limit(hosts: ScaleCluster) -> None:
    r = run("headroom", "--vm", SHAPES["memory-bound"][0], "--cluster", hosts.cluster_file)
    assert r.exit_code == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert out.startswith("21 more VMs of 1 vCPU, 0.25 cores, 4 GiB fit")
    assert "per host: h0 7, h1 7, h2 7" in out and "one more is refused: memory: " in out


def test_a_host_in_maintenance_takes_none(hosts: ScaleCluster) -> None:
    text = hosts.cluster_file.read_text().replace('name = "h2"\n', 'name = "h2"\nmaintenance = true\n')
    hosts.cluster_file.write_text(text)
    doc = headroom(hosts.cluster_file, SHAPES["memory-bound"][0])
    assert doc["count"] == 2 * 7 and doc["per_host"] == {"h0": 7, "h1": 7}


def test_the_text_answer_names_the_shapes_disk_rate(hosts: ScaleCluster) -> None:
    r = run("headroom", "--vm", SHAPES["disk-bound"][0], "--min-yield", "0.8", "--cluster", hosts.cluster_file)
    assert r.exit_code == 0 and "512 MiB, disk 20 MiB/s fit, every yield at least 0.8" in " ".join(r.stdout.split())


@pytest.mark.parametrize(("shape", "named"), [
    ("cpu_cores=1", "memory is missing"),
    ("cpu_cores=1,memory=2GiB,colour=red", "unknown key 'colour'"),
    ("cpu_cores=1,memory=2GiB,memory=1GiB", "memory is given twice"),
    ("cpu_cores=1,memory", "'memory' is not KEY=VALUE"),
    ("cpu_cores=1,memory=lots", "memory: 'lots'"),
    ("cpu_cores=1,memory=64MB", "memory: '64MB'"),
    ("cpu_cores=nan,memory=1GiB", "cpu_cores: nan"),
    ("cpu_cores=3,vcpus=2,memory=1GiB", "cpu_cores: 3 cores"),
    ("cpu_cores=1,vcpus=0,memory=1GiB", "vcpus: 0"),
    ("cpu_cores=1,cpu_need=0.5,memory=1GiB", "cpu_need/cpu_cores"),
    ("cpu_cores=1,memory=1GiB,disk_bps=fast", "disk_bps: 'fast'"),
])
def test_a_bad_shape_is_bad_input_naming_the_field_and_value(shape: str, named: str, hosts: ScaleCluster) -> None:
    r = run("headroom", "--vm", shape, "--cluster", hosts.cluster_file)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--vm" in lines[0] and named in lines[0], lines


@pytest.mark.parametrize(("args", "named"), [
    (["--failures", "3"], "--failures: 3"),  # 3 hosts: at most 2 may fail
    (["--failures", "-1"], "--failures"),
    (["--min-yield", "1.5"], "--min-yield"),
    (["--vm", "cpu_cores=1,memory=64GiB"], "memory: 64 GiB per VM is larger than the largest host"),
    (["--vm", "cpu_cores=9,vcpus=9,memory=1GiB"], "cpu_cores: 9 cores per VM is more than the largest host"),
])
def test_bad_options_are_bad_input_naming_them(args: list[str], named: str, hosts: ScaleCluster) -> None:
    shape = [] if "--vm" in args else ["--vm", "cpu_cores=1,memory=1GiB"]
    r = run("headroom", *shape, *args, "--cluster", hosts.cluster_file)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines


def test_every_host_down_exits_1(tmp_path: Path) -> None:
    cluster = tmp_path / "down.toml"
    cluster.write_text(f'name = "down"\n[[hosts]]\nname = "h0"\nuri = "test://{tmp_path}/missing.xml"\n')
    r = run("headroom", "--vm", "cpu_cores=1,memory=1GiB", "--cluster", cluster)
    assert r.exit_code == 1, (r.stdout, r.stderr)
    assert "every host of cluster 'down' is down" in r.stderr


# --- the search, on an admission that admits up to k ------------------------------------------------


@pytest.mark.parametrize("cap", [0, 5, 36, 37, 100])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 36, 37, 64, 99])
def test_the_search_finds_the_largest_count_admitted_and_asks_the_one_above(k: int, cap: int) -> None:
    """``cap`` (the per-host arithmetic's count) above or below ``k`` is an estimate: admission decides, in
    about 2 log2 of the miss."""
    asked: list[int] = []

    def ask(n: int) -> Decision:
        asked.append(n)
        return Decision(n <= k, None if n <= k else f"{n} > {k}", None)

    best, refused = largest_admitted(ask, cap)
    assert (best[0] if best else 0) == k and refused[0] == k + 1 and refused[1].reason == f"{k + 1} > {k}"
    assert k + 1 in asked and (k == 0 or k in asked)
    assert len(asked) <= 2 * max(abs(k - cap), 1).bit_length() + 2
    if cap == k:  # the arithmetic was right: admission is asked the count and the one above, nothing else
        assert sorted(asked) == [k, k + 1] if k else asked == [1]


# --- one placement, not a search ----------------------------------------------------------------


def _read(sc: ScaleCluster, path: Path | None = None) -> tuple[Any, Any]:
    from cli.common import load_cluster
    from hypervisor.libvirt_backend import LibvirtHypervisor

    cluster = load_cluster(str(path or sc.cluster_file))
    with LibvirtHypervisor(cluster) as hv:
        return cluster, hv.inventory()


@pytest.mark.parametrize("failures", [0, 1])
@pytest.mark.parametrize("name", ["memory-bound", "cpu-bound", "vcpus=2"])
def test_where_memory_and_cpu_bind_admission_is_asked_the_count_and_the_one_above(name: str, failures: int,
                                                                                 hosts: ScaleCluster) -> None:
    """The per-host arithmetic gives admission's count: two admissions answer (N admitted, N+1 refused)."""
    from cli.params import VmShape
    from vcsched.control.headroom import headroom_for

    shape, _fields, floor = SHAPES[name]
    cluster, inventory = _read(hosts)
    answer = headroom_for(cluster, inventory, VmShape().convert(shape, None, None), failures=failures,
                          min_yield=floor)
    assert answer.count > 0 and answer.asked == 2, (answer.count, answer.asked)


def test_the_failover_check_says_the_same_yes_or_no_with_or_without_its_explanation(hosts: ScaleCluster) -> None:
    """headroom's search asks without the VM-by-VM explanation; place's refusal explains: same verdicts."""
    import dataclasses

    from vcsched.control.failover import failover_refusal

    cluster, inventory = _read(hosts)
    for k in (1, 2):
        c = dataclasses.replace(cluster, failures_tolerated=k)
        verdicts = set()
        for mib in (32768, 1536, 1100):  # hosts h1, h2 shrunk (each runs 1 GiB of VMs) until failover room lacks
            inv = dataclasses.replace(inventory, hosts=tuple(
                dataclasses.replace(h, memory_bytes=mib << 20, memory_reserved=0) if i else h
                for i, h in enumerate(inventory.hosts)))
            short, long = failover_refusal(c, inv, explain=False), failover_refusal(c, inv)
            assert (short is None) == (long is None), (k, mib, short, long)
            assert short is None or short.startswith("failover: ")
            verdicts.add(short is None)
        assert verdicts == {True, False}, k  # both verdicts were asked
