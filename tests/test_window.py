"""``status`` without ``--sample`` samples nothing: it shows the controller's last window when one runs here
(acting/window.py), and nothing measured otherwise."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from acting.window import STALE_INTERVALS, last_window, path_for, publish
from cli.main import cli
from hypervisor.files import state_dir
from hypervisor.testhosts import write_scale_cluster
from vcsched.formats.cluster import cluster_from_dict


def status(cluster_file: Path, *extra: str) -> tuple[dict, float]:
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["status", "--cluster", str(cluster_file), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), time.monotonic() - t0


def test_a_window_is_read_while_fresh_and_only_for_its_own_hosts(tmp_path: Path) -> None:
    a = cluster_from_dict({"name": "lab", "hosts": [{"name": "h0", "uri": "test:///a.xml"}]})
    b = cluster_from_dict({"name": "lab", "hosts": [{"name": "h0", "uri": "test:///b.xml"}]})
    publish(tmp_path, a, 10.0, {"vm0": 0.5, "vm1": None}, now=1000.0)
    w = last_window(tmp_path, a, now=1005.0)
    assert w is not None and w.used == {"vm0": 0.5, "vm1": None} and w.age(1005.0) == 5.0
    assert last_window(tmp_path, b, now=1005.0) is None  # another lab of the same name: not its window
    assert last_window(tmp_path, a, now=1000.0 + STALE_INTERVALS * 10.0 + 1) is None  # the controller stopped
    path_for(tmp_path, a).write_text("{broken")
    assert last_window(tmp_path, a, now=1005.0) is None


def test_status_without_sample_measures_nothing_and_shows_a_fresh_window(tmp_path: Path) -> None:
    sc = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2)
    doc, took = status(sc.cluster_file)
    assert doc["sample_seconds"] == 0 and doc["measured_from"] is None and took < 1.9  # no 2 s sample
    assert all(v["measured_cores"] is None for v in doc["vms"])
    from cli.common import load_cluster

    publish(state_dir(), load_cluster(str(sc.cluster_file)), 10.0, {"vm0": 0.25, "vm3": 0.5})
    doc, _ = status(sc.cluster_file)
    assert doc["measured_from"] == "controller window" and doc["window_age_s"] < 10
    assert {v["name"]: v["measured_cores"] for v in doc["vms"]} == {"vm0": 0.25, "vm1": None, "vm2": None,
                                                                     "vm3": 0.5}
    doc, _ = status(sc.cluster_file, "--sample", "0.2")  # asked: sampled, whatever the window says
    assert doc["measured_from"] == "sample" and doc["sample_seconds"] == 0.2
    r = CliRunner().invoke(cli, ["status", "--cluster", str(sc.cluster_file)])
    assert r.exit_code == 0 and "measured: the controller's last window" in r.stdout
