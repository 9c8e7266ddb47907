"""The CPU-bound workload: a DGEMM loop that publishes its own progress.

Paper section 7 measures "the effective compute rate of each VM instance (in
number of matrix multiplications per second)" with LAPACK DGEMM loops.  This is
the same loop for local processes: ``numpy`` matmul of small square matrices
(single-threaded BLAS, so one worker is one CPU's worth of demand).

Why the worker timestamps its own progress: under a 100 ms CFS period a 25%
cap runs the worker for 25 ms and then freezes it for 75 ms.  A controller
polling a counter every few milliseconds would not see where a burst starts,
and would smear each burst across the gap before it.  So the worker keeps a
ring of points ``(monotonic time, work, CPU time)`` in shared memory: one at
least every millisecond while it runs, and, whenever it notices it was frozen
(two batches further apart than ``GAP``), both the last point before the gap
and the first after it.  Between two published points progress is then linear
to within one batch (a few tens of microseconds) — the assumption
``calibration.stats`` makes.

``CPU time`` is the worker's ``CLOCK_THREAD_CPUTIME_ID``: the quantity a cap
actually rations, free of the machine running faster or slower meanwhile
(docs/calibration.md explains why both are reported).

Shared layout (float64): slot ``i`` = ``[written, ready]`` then ``RING`` entries
of ``[time, work, cpu]``.  The writer stores an entry, then bumps ``written``;
x86-64 keeps those stores in order, so a reader that sees ``written = k`` can
read entries below ``k`` (as long as it polls before the ring wraps: 4096
entries is over four seconds at the fastest publication rate).

Run as ``python -m calibration.workload SHM_PATH SLOT CPU``; the parent sets
``OPENBLAS_NUM_THREADS=1`` etc. in the child's environment before numpy loads.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import sys
import time
from pathlib import Path

HEADER = 2  # written, ready
WRITTEN, READY = range(HEADER)
RING = 4096
ENTRY = 3  # time, work, cpu
SLOT_FIELDS = HEADER + RING * ENTRY
MATRIX_SIZE = 64  # one DGEMM of 64x64 takes ~10 µs here: fine-grained yet BLAS-bound
BATCH = 4  # DGEMMs between two clock readings
PUBLISH_EVERY = 0.001  # seconds of running between two published points
GAP = 0.0005  # two batches further apart than this: the worker was frozen in between

# Environment that keeps numpy's BLAS on one thread: a worker must be one CPU's demand.
SINGLE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "BLIS_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}

Point = tuple[float, float, float]  # (monotonic time, work, CPU seconds)


def slot_bytes(n_slots: int) -> int:
    return n_slots * SLOT_FIELDS * 8


def is_ready(view: memoryview[float], slot: int) -> bool:
    return view[slot * SLOT_FIELDS + READY] > 0


def read_points(view: memoryview[float], slot: int, since: int) -> tuple[list[Point], int]:
    """Points published by worker ``slot`` from index ``since`` on, and the index to continue from."""
    base = slot * SLOT_FIELDS
    written = int(view[base + WRITTEN])
    start = max(since, written - RING + 1)  # never read an entry the writer may be overwriting
    points: list[Point] = []
    for k in range(start, written):
        e = base + HEADER + (k % RING) * ENTRY
        points.append((view[e], view[e + 1], view[e + 2]))
    return points, written


PARENT_ENV = "VCSCHED_CALIBRATION_PARENT"  # pid of the run that started the worker


def die_with_parent() -> None:
    """Have the kernel SIGKILL this worker when its parent dies (prctl PR_SET_PDEATHSIG).

    A calibration run killed outright must not leave a CPU-bound process behind.
    The parent's pid comes from the environment, not from ``getppid()`` here: the
    parent may already be dead when this runs (Python start-up is slow under
    load), and then ``getppid()`` would name the reaper and the check would pass.
    """
    parent = int(os.environ.get(PARENT_ENV, os.getppid()))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        sys.exit(0)


def run_worker(shm_path: str, slot: int, cpu: int) -> None:
    """Pin to ``cpu`` and multiply matrices forever, publishing progress; the parent kills us."""
    die_with_parent()
    os.sched_setaffinity(0, {cpu})
    import numpy as np  # after the pin and with the parent's single-thread BLAS environment

    with open(shm_path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
    view = memoryview(mm).cast("d")
    base = slot * SLOT_FIELDS
    ring = base + HEADER
    rng = np.random.default_rng(slot)
    a = rng.random((MATRIX_SIZE, MATRIX_SIZE))
    b = rng.random((MATRIX_SIZE, MATRIX_SIZE)) / MATRIX_SIZE  # keeps values bounded across iterations
    c = np.empty_like(a)
    for _ in range(50):  # warm caches and BLAS before claiming to be ready
        np.matmul(a, b, out=c)
    clock, cpu_clock, matmul = time.monotonic, time.thread_time, np.matmul
    written = 0
    work = 0.0
    prev = (clock(), work, cpu_clock())
    prev_published = False
    last_publish = prev[0]

    def publish(point: tuple[float, float, float]) -> None:
        nonlocal written
        e = ring + (written % RING) * ENTRY
        view[e], view[e + 1], view[e + 2] = point
        written += 1
        view[base + WRITTEN] = written

    publish(prev)
    view[base + READY] = 1.0
    while True:
        for _ in range(BATCH):
            matmul(a, b, out=c)
        work += BATCH
        now = (clock(), work, cpu_clock())
        if now[0] - prev[0] > GAP:
            if not prev_published:
                publish(prev)  # where the frozen stretch began
            publish(now)
            last_publish, prev_published = now[0], True
        elif now[0] - last_publish >= PUBLISH_EVERY:
            publish(now)
            last_publish, prev_published = now[0], True
        else:
            prev_published = False
        prev = now


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m calibration.workload SHM_PATH SLOT CPU", file=sys.stderr)
        return 2
    path, slot, cpu = argv[0], int(argv[1]), int(argv[2])
    if not Path(path).exists():
        print(f"calibration.workload: {path}: no such file", file=sys.stderr)
        return 2
    try:
        run_worker(path, slot, cpu)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
