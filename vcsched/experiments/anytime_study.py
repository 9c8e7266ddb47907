"""The ``best`` study of docs/results.md: the paper's sets with ``best`` at several budgets next to MCB8 and the MILP.

``vcsched experiment`` runs every algorithm with one time limit (the MILP's);
this study needs ``best`` at 10 ms, 100 ms and 1 s in the same run as a MILP
with 60 s, so it runs the budgeted labels of :func:`vcsched.experiments.paper.parse_label`
(``best@0.01``, ...) through the same library functions (:func:`~vcsched.experiments.paper.work_items`,
:func:`~vcsched.experiments.paper.run_items`, :func:`~vcsched.experiments.paper.report_markdown`)
and writes the same ``records.json`` and ``report.md``::

    nice python -m vcsched.experiments.anytime_study small -o results/best-small -j 2
    nice python -m vcsched.experiments.anytime_study large -n 5 -o results/best-large -j 2

Records are saved every minute; ``--resume`` keeps the instances a saved run
already has (same set, seed, algorithms, time limit).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vcsched.errors import InputError
from vcsched.experiments.paper import (
    BOUND,
    EXACT,
    PAPER_INSTANCES,
    REFERENCE,
    SET_TASKS,
    SETS,
    Record,
    budget_label,
    in_run_order,
    missing_items,
    report_markdown,
    resumable_records,
    run_items,
    specs,
    work_items,
)

BUDGETS = (0.01, 0.1, 1.0)
CHECKPOINT_S = 60.0


def study_algorithms(set_name: str, budgets: Sequence[float]) -> list[str]:
    """MCB8, ``best`` at each budget, the MILP on the small set only (it does not scale), the LP bound."""
    exact = [EXACT] if set_name == "small" else []
    return [*exact, REFERENCE, *(budget_label("best", b) for b in budgets), BOUND]


def _machine() -> str:
    import numpy
    import scipy

    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, numpy {numpy.__version__}, scipy {scipy.__version__}, load average "
            f"{', '.join(f'{x:.2f}' for x in load)} at the start")


def _code() -> str:
    """The git commit of this checkout, and whether vcsched/ differs from it (results depend on it)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here.parent, capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head} (vcsched/ with uncommitted changes)" if dirty else head


def _save(path: Path, meta: dict[str, Any], records: list[Record]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "records": [r.to_dict() for r in records]}, indent=0))
    tmp.replace(path)


def run_study(set_name: str, out_dir: Path, *, instances: int, budgets: Sequence[float], jobs: int,
              time_limit: float, seed: int, tasks: Sequence[int] | None, resume: bool) -> dict[str, Any]:
    """Run (or finish) the study and write ``records.json`` and ``report.md`` to ``out_dir``; returns the meta."""
    names = study_algorithms(set_name, budgets)
    items = work_items(set_name, instances, names, seed=seed, time_limit=time_limit, tasks=tasks)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "set": set_name, "instances_per_spec": instances, "families": len(specs(set_name, tasks)),
        "tasks": list(tasks or SET_TASKS[set_name]), "seed": seed, "algorithms": names,
        "time_limit": time_limit, "jobs": jobs, "wall_s": 0.0, "machine": _machine(),
        "code": _code(), "complete": False,
    }
    path = out_dir / "records.json"
    records: list[Record] = []
    if resume and path.exists():
        previous = resumable_records(json.loads(path.read_text()), meta, str(path))
        records, meta["wall_s"] = previous.records, previous.wall_s
    todo = missing_items(items, records)
    start = last = time.perf_counter()
    before = float(meta["wall_s"])

    def progress(done: int, total: int, what: str) -> None:
        if done == total or done % 20 == 0:
            print(f"{done}/{total} {what} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)

    for batch in run_items(todo, jobs, progress):
        records.extend(batch)
        if time.perf_counter() - last > CHECKPOINT_S:
            meta["wall_s"] = before + time.perf_counter() - start
            _save(path, meta, records)
            last = time.perf_counter()
    records = in_run_order(records, names)
    meta["wall_s"] = before + time.perf_counter() - start
    meta["complete"] = True
    _save(path, meta, records)
    (out_dir / "report.md").write_text(report_markdown(records, meta))
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcsched.experiments.anytime_study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set_name", choices=[s for s in SETS if s != "parallel"])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("-n", "--instances", type=int, default=None, help="per family (default: the paper's)")
    parser.add_argument("--budgets", default=",".join(f"{b:g}" for b in BUDGETS), help="seconds, comma-separated")
    parser.add_argument("--tasks", default=None, help="only these task counts, comma-separated")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=60.0, help="the MILP's limit in seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    try:
        budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
        tasks = [int(t) for t in args.tasks.split(",")] if args.tasks else None
    except ValueError:
        print("error: --budgets and --tasks take comma-separated numbers", file=sys.stderr)
        return 2
    try:
        meta = run_study(args.set_name, Path(args.output), instances=args.instances or PAPER_INSTANCES[args.set_name],
                         budgets=budgets, jobs=args.jobs, time_limit=args.time_limit, seed=args.seed, tasks=tasks,
                         resume=args.resume)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.output}/report.md: {meta['wall_s']:.0f} s wall", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
