"""Measure the need estimate's error against a known duty cycle, with and without contention (docs/contention.md).

Run as root on a machine that can run the lab (docs/lab.md), from the repository::

    .venv/bin/python scripts/contention_measure.py [--json OUT]

A one-host lab; two managed guests spin at 40 % of their vCPU (``vcsched.load=40:3600``: true need 0.4 core),
declared at 0.5 core and capped at 0.8 (the cap never binds).  Then 0, 1, 2 and 3 uncapped 1-vCPU busy guests
vcsched does not manage are added: nominal demand over this machine's cores (0.8 + n) / cores.  A first, quiet
level gives the lab host's cgroup partition the largest CPU weight (the machine may be busy with other work) and
measures the guests' true need: their mean use when nothing holds them back.  For each level,
:data:`WINDOWS` windows of five one-second samples are estimated twice, the caps unchanged meanwhile: by
today's estimator, and by the one of before (the same samples without the delay and throttling signals: used
CPU and the cap only), both without the planning headroom (the need alone).  Prints one row per level.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.common import load_cluster
from hypervisor.cpu_signals import host_pressure
from hypervisor.guest import wait_for_boot
from hypervisor.libvirt_backend import LibvirtHypervisor
from lab.state import LabLayout
from tests.lab_support import destroy_everywhere, running_lab, start_lab_guest
from tests.test_contention_lab import BOOT_SETTLE_S, cpu_priority, create_managed, sample_windows

DUTY, DECLARED, CAP = 40, 0.5, 0.8
WINDOWS = 3
LEVELS = ("quiet", 0, 1, 2, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    nominal = DUTY / 100
    true = nominal  # until the quiet level has measured it
    with running_lab(1, cores=cores) as lab:
        cluster = load_cluster(str(lab.cluster_file))
        names = ["cm-0", "cm-1"]
        hogs: list[str] = []
        try:
            with LibvirtHypervisor(cluster) as hv:
                for name in names:
                    create_managed(hv, cluster, name, "h0", DECLARED, CAP, DUTY)
                time.sleep(BOOT_SETTLE_S)
                for level in LEVELS:
                    while isinstance(level, int) and len(hogs) < level:
                        hog = f"hog{len(hogs)}"
                        start_lab_guest(lab, 0, hog, wait=False)
                        hogs.append(hog)
                        wait_for_boot(LabLayout(lab.dir).host_dir(0) / "console" / f"{hog}.log")
                    time.sleep(5)
                    p0, t0 = host_pressure(), time.monotonic()
                    if level == "quiet":
                        with cpu_priority(lab, 0):
                            windows = sample_windows(hv, names, WINDOWS, dict.fromkeys(names, DECLARED))
                        true = statistics.mean(w.used_mean for w in windows if not w.censored)
                    else:
                        windows = sample_windows(hv, names, WINDOWS, dict.fromkeys(names, DECLARED))
                    p1, seconds = host_pressure(), time.monotonic() - t0
                    psi = (None if p0.some_us is None or p1.some_us is None
                           else (p1.some_us - p0.some_us) / 1e6 / seconds)
                    new = [w.new for w in windows]
                    old = [w.old for w in windows]
                    n = 0 if level == "quiet" else int(level)
                    row = {"busy_guests": level, "nominal_overcommit": round((2 * nominal + n) / cores, 2),
                           "true_need": round(true, 3),
                           "used_mean": round(statistics.mean(w.used_mean for w in windows), 3),
                           "machine_cpu_pressure_some": None if psi is None else round(psi, 3),
                           "waited_cores_mean": round(statistics.mean(w.waited or 0.0 for w in windows), 3),
                           "old_estimate_mean": round(statistics.mean(old), 3),
                           "old_error_mean": round(statistics.mean(x / true - 1 for x in old), 3),
                           "new_estimate_mean": round(statistics.mean(new), 3),
                           "new_error_mean": round(statistics.mean(x / true - 1 for x in new), 3),
                           "censored_share": round(sum(w.censored for w in windows) / len(windows), 2),
                           "windows": len(windows),
                           "bases": dict(Counter(f"{w.basis} ({w.samples} samples)" for w in windows))}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for name in names + hogs:
                destroy_everywhere(lab, name)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
