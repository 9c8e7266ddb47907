"""A host that never answered does not block the others' commands (issue 40), and the lock stays one lock.

A host in the cluster file that does not answer, has no declared ``uuid`` and was never read here used to make
every changing command refuse ("cannot name the lock").  Now it is down for the command, and the lock is named
through host claims (acting/lock_names.py): a command that saw the host and one that did not hold the same lock.

The hosts are the simulated libvirt's (``sim:///DIR/hN.xml``, which can apply every step); a host "that never
answered" is a socket path where nothing listens, or a node file that is not there (yet).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from acting.lock import LockBusy, LockSet, cluster_lock_name
from acting.lock_names import HostClaims, admission, cluster_locks, lock_keys
from cli.common import load_cluster
from cli.main import cli
from hypervisor.identity import Identities, LockUnnamed, claim, lock_key
from hypervisor.libvirt_backend import LibvirtHypervisor
from hypervisor.testhosts import ScaleCluster, write_scale_cluster
from tests.etcd_support import Etcd, etcd  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def sim(tmp_path: Path) -> ScaleCluster:
    """Two simulated hosts h0, h1 with two VMs each, and a third entry ``far`` (no ``uuid``) where nothing
    listens."""
    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2, scheme="sim")
    with hosts.cluster_file.open("a") as f:
        f.write(f'\n[[hosts]]\nname = "far"\nuri = "qemu+unix:///system?socket={tmp_path}/nothing-here"\n')
    return hosts


@pytest.fixture
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state directory of this test's own: no command "here" has read any host yet."""
    state = tmp_path / "state"
    monkeypatch.setenv("VCSCHED_STATE_DIR", str(state))
    yield state


# ---------------------------------------------------------------------------------------------- the commands


def test_a_never_seen_host_without_uuid_is_down_and_the_others_commands_work(sim: ScaleCluster, tmp_path: Path,
                                                                            own_state: Path) -> None:
    c, lock = sim.cluster_file, f"file://{tmp_path}/coordination"
    status = run("status", "--sample", "0", "--cluster", c, "--json")
    assert status.exit_code == 0, status.output
    down = {h["name"]: h["down"] for h in json.loads(status.stdout)["hosts"] if h.get("down")}
    assert list(down) == ["far"] and "cannot connect" in down["far"]
    for args in (("place", sim.request_file), ("adapt", "--budget", "0", "--set-need", "vm0=0.3"),
                 ("drain", "h0", "--budget", "unlimited")):
        result = run(*args, "--apply", "--cluster", c, "--coordination", lock, "--json")
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
        doc = json.loads(result.stdout)
        assert doc["ok"] is True, args
        assert [d["host"] for d in doc["hosts_down"]] == ["far"], args
    after = run("status", "--sample", "0", "--cluster", c, "--json")
    vms = {v["name"]: v["host"] for v in json.loads(after.stdout)["vms"]}
    assert sum(name.startswith("arrival-") for name in vms) == 8  # placed
    assert vms["vm0"] == vms["vm1"] == "h1"  # h0 drained
    claims = HostClaims(lock).read()
    assert len(claims) == 2 and len(set(claims.values())) == 1  # h0 and h1, one lock; far has no identity


def test_a_controller_runs_beside_a_never_seen_host_and_status_reads_its_window(sim: ScaleCluster, tmp_path: Path,
                                                                               own_state: Path) -> None:
    # `vcsched run` refused to start ("cannot name the lock"); `status` without --sample shows its last window.
    log = tmp_path / "run.jsonl"
    r = run("run", "--cluster", sim.cluster_file, "--budget-per-interval", "0", "--interval", "3s", "--duration",
            "4s", "--log", log, "--coordination", f"file://{tmp_path}/coordination")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["host"] for e in events if e["event"] == "host-down"] == ["far"]
    assert sum(e["event"] == "interval" for e in events) >= 2
    doc = json.loads(run("status", "--cluster", sim.cluster_file, "--json").stdout)
    assert doc["measured_from"] == "controller window" and doc["sample_seconds"] == 0
    assert all(v["measured_cores"] is not None for v in doc["vms"])


def test_without_host_claims_a_host_with_no_identity_still_refuses(sim: ScaleCluster, own_state: Path) -> None:
    # A tooz backend other than file and etcd keeps no documents, so no claims: the old rule stands there.
    result = run("cordon", "h1", "--cluster", sim.cluster_file, "--coordination", "zookeeper://127.0.0.1:1")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("vcsched: error: cannot name the lock of cluster 'scale': host far does not "
                                    "answer (host far: cannot connect")
    assert "keeps no host claims; nothing changed (declare its libvirt host UUID" in result.stderr
    assert "maintenance" not in sim.cluster_file.read_text()


def test_no_host_with_an_identity_cannot_name_a_lock(tmp_path: Path, own_state: Path) -> None:
    with pytest.raises(LockUnnamed, match=r"cannot name the lock of cluster 'c': no host has an identity \(host "
                                          r"far does not answer"):
        lock_keys(f"file://{tmp_path}", "c", Identities({}, {"far": "host far does not answer (...)"}))


# ---------------------------------------------------------------------------------------------- one lock


HOLD = textwrap.dedent("""
    import sys
    from acting.unit_of_work import for_cluster
    from hypervisor.libvirt_backend import LibvirtHypervisor
    from cli.common import load_cluster

    cluster = load_cluster(sys.argv[1])
    with LibvirtHypervisor(cluster) as hv, for_cluster(cluster, hv, apply=True, coordination=sys.argv[2]):
        print("held", flush=True)
        sys.stdin.read()
""")


def hold(cluster_file: Path, url: str, state: Path) -> subprocess.Popen[str]:
    """Another process (its own state directory: another machine) holding the lock of ``cluster_file``, as a
    changing command does, until its stdin closes."""
    import os

    env = {**os.environ, "VCSCHED_STATE_DIR": str(state)}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(cluster_file), url], cwd=ROOT, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    if line != "held":
        p.kill()
        raise AssertionError(p.communicate()[1])
    return p


def release(p: subprocess.Popen[str]) -> None:
    p.communicate(timeout=60)


@pytest.fixture
def third(tmp_path: Path) -> Iterator[tuple[ScaleCluster, Path]]:
    """h0, h1 and a third simulated host h2 (no ``uuid`` declared) whose node file can be taken away: while it is
    away, h2 does not answer."""
    hosts = write_scale_cluster(tmp_path / "hosts", hosts=3, vms_per_host=1, scheme="sim")
    yield hosts, tmp_path / "hosts" / "h2.xml"


@pytest.mark.parametrize("first", ["saw it", "never saw it"])
def test_a_command_that_saw_a_host_and_one_that_never_did_contend_for_one_lock(
        first: str, third: tuple[ScaleCluster, Path], tmp_path: Path, own_state: Path) -> None:
    hosts, h2 = third
    url = f"file://{tmp_path}/coordination"
    away = h2.with_suffix(".away")
    if first == "never saw it":  # the holder runs while h2 does not answer; this command sees it
        h2.rename(away)
        holder = hold(hosts.cluster_file, url, tmp_path / "other-machine")
        away.rename(h2)
    else:  # the holder sees h2; then h2 stops answering, and this command never saw it
        holder = hold(hosts.cluster_file, url, tmp_path / "other-machine")
        h2.rename(away)
    try:
        result = run("cordon", "h0", "--cluster", hosts.cluster_file, "--coordination", url)
        assert result.exit_code == 1, (result.stdout, result.stderr)
        assert "cluster 'scale' is locked by" in result.stderr and "nothing changed" in result.stderr
    finally:
        release(holder)
    assert "maintenance" not in hosts.cluster_file.read_text()
    assert run("cordon", "h0", "--cluster", hosts.cluster_file, "--coordination", url).exit_code == 0


@contextlib.contextmanager
def named_while_h2_away(third: tuple[ScaleCluster, Path], url: str) \
        -> Iterator[tuple[LibvirtHypervisor, Identities, tuple[str, ...]]]:
    """A command's connections, identities and lock keys, named while h2 did not answer; h2 answers again."""
    hosts, h2 = third
    away = h2.with_suffix(".away")
    h2.rename(away)
    with LibvirtHypervisor(load_cluster(str(hosts.cluster_file))) as hv:
        ids = hv.identities()
        keys = lock_keys(url, hv.cluster.name, ids)
        away.rename(h2)
        yield hv, ids, keys


def test_a_host_that_answers_only_after_the_lock_was_named_is_left_out_unless_the_lock_covers_it(
        third: tuple[ScaleCluster, Path], tmp_path: Path, own_state: Path) -> None:
    url = f"file://{tmp_path}/coordination"
    with named_while_h2_away(third, url) as (hv, ids, keys):
        assert set(ids.known) == {"h0", "h1"} and list(ids.unknown) == ["h2"]
        hv.act_only_as(ids.known)  # no admission: a newcomer stays out
        inv = hv.inventory()
        assert "had no identity when this command named the cluster lock" in (inv.host("h2").down or "")
        assert all(v.host != "h2" for v in inv.vms)
        hv.act_only_as(ids.known, admission(url, keys))  # admitted: claimed under the lock this command holds
        inv = hv.inventory()
        assert inv.host("h2").down is None and any(v.host == "h2" for v in inv.vms)
        claims = HostClaims(url).read()
        assert set(claims.values()) == set(keys) and len(claims) == 3


def test_a_newcomer_claimed_under_another_lock_is_left_out(third: tuple[ScaleCluster, Path], tmp_path: Path,
                                                           own_state: Path) -> None:
    url = f"file://{tmp_path}/coordination"
    with named_while_h2_away(third, url) as (hv, ids, keys):
        h2_id = LibvirtHypervisor(hv.cluster).identities().known["h2"]
        HostClaims(url).update(lambda c: ({**c, h2_id: "elsewhere"}, None))  # another cluster's command got it first
        hv.act_only_as(ids.known, admission(url, keys))
        assert "not acted on" in (hv.inventory().host("h2").down or "")


def test_a_host_is_acted_on_as_the_identity_its_lock_was_named_with(tmp_path: Path, own_state: Path) -> None:
    # A declared uuid names the host, also where its driver reports none (the test driver): the same identity
    # when the lock is named and when the host is read, so it is not left out.
    cf = tmp_path / "cluster.toml"
    cf.write_text('name = "t"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n'
                  'uuid = "0a6f5ad8-1111-2222-3333-444455556666"\n')
    with LibvirtHypervisor(load_cluster(str(cf))) as hv:
        ids = hv.identities()
        hv.act_only_as(ids.known)  # no admission: only the identity it was named with
        assert hv.inventory().host("h0").down is None


# ---------------------------------------------------------------------------------------------- the rule


def test_claims_name_the_lock_of_a_cluster_first_seen_whole_as_it_always_was() -> None:
    claims, keys = claim({}, ["uuid:b", "uuid:a"])
    assert keys == (lock_key(["uuid:a", "uuid:b"]),)
    assert claims == {"uuid:a": keys[0], "uuid:b": keys[0]}
    assert claim(claims, ["uuid:a"]) == (claims, keys)  # knowing less: the same lock
    grown, more = claim(claims, ["uuid:a", "uuid:b", "uuid:c"])  # knowing more: the same lock, c now claimed
    assert more == keys and grown["uuid:c"] == keys[0]
    _, both = claim({"uuid:a": "k1", "uuid:c": "k2"}, ["uuid:a", "uuid:c", "uuid:d"])
    assert both == ("k1", "k2")  # spans two claims: both locks


def test_any_two_commands_that_know_a_common_host_hold_a_common_lock() -> None:
    """The safety property, over random orders of commands knowing random subsets of random clusters' hosts."""
    rng = random.Random(40)
    for _ in range(300):
        hosts = [f"uuid:{i}" for i in range(rng.randint(1, 7))]
        claims: dict[str, str] = {}
        held: list[tuple[set[str], set[str]]] = []
        for _ in range(rng.randint(2, 6)):
            known = {h for h in hosts if rng.random() < 0.6} or {rng.choice(hosts)}
            claims, keys = claim(claims, known)
            held.append((known, set(keys)))
        for known_a, keys_a in held:
            for known_b, keys_b in held:
                if known_a & known_b:
                    assert keys_a & keys_b, (known_a, keys_a, known_b, keys_b, claims)


def test_a_lock_set_is_taken_whole_or_not_at_all(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    other = LockSet(url, "c", [cluster_lock_name("k2")], member="other@test:1")
    other.acquire()
    try:
        both = cluster_locks(url, "c", ["k1", "k2"])
        with pytest.raises(LockBusy, match="locked by other@test:1"):
            both.acquire()
        alone = LockSet(url, "c", [cluster_lock_name("k1")])
        alone.acquire()  # k1 was given back when k2 was refused
        alone.release()
    finally:
        other.release()
    both.acquire()
    assert both.held() and both.names == (cluster_lock_name("k1"), cluster_lock_name("k2"))
    both.release()


def test_claims_on_etcd(etcd: Etcd) -> None:  # noqa: F811
    ids = Identities({"h0": "uuid:a", "h1": "uuid:b"}, {"far": "host far does not answer"})
    keys = lock_keys(etcd.url, "c", ids)
    assert keys == (lock_key(["uuid:a", "uuid:b"]),)
    assert lock_keys(etcd.url, "c", Identities({"h1": "uuid:b", "far": "uuid:c"})) == keys
    assert HostClaims(etcd.url).read() == dict.fromkeys(("uuid:a", "uuid:b", "uuid:c"), keys[0])
