"""The bounded pool hosts are read with: a hung host cannot hold the others up, nor the command past its
``host_timeout``; and, with one worker, a deterministic inline run for simulations.
"""

from __future__ import annotations

import collections
import heapq
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from hypervisor.connections import mark_bounded, note_abandoned

T = TypeVar("T")

#: Inventory threads reading hosts at once (each mostly waits on its host's answer).
INVENTORY_WORKERS = 32


def inventory_workers(uris: Iterable[str]) -> int:
    """How many threads read these hosts at once: INVENTORY_WORKERS, or one per core when every host is served by
    libvirt's test driver.

    The test driver answers inside this process (the scale benchmark's fake
    hosts), so reading it is CPU work: threads beyond the cores only queue for
    the interpreter's lock (measured at 1,000 hosts on 2 cores: 32 threads
    used about 1 s more CPU than 2 and finished later).  Real hosts answer over
    a socket, and their threads mostly wait.
    """
    if all(u.startswith(("test:", "sim:")) for u in uris):
        return max(1, min(INVENTORY_WORKERS, len(os.sched_getaffinity(0))))
    return INVENTORY_WORKERS


def run_bounded(tasks: Mapping[str, Callable[[], T]], workers: int, timeout_s: float | Mapping[str, float], *,
                clock: Callable[[], float] = time.monotonic) -> dict[str, T | Exception]:
    """Run ``tasks`` on at most ``workers`` daemon threads; a task running longer than ``timeout_s`` is abandoned.

    ``timeout_s``: one for every task, or one per task (a host known to be down gets a short probe,
    :mod:`hypervisor.down_hosts`; a task missing from the mapping gets the longest given).

    The answer has an entry for each task that finished in time (its value or
    its exception); an abandoned task's thread is replaced, so hung hosts
    cannot starve the others, and being a daemon it cannot hold the process at
    exit.  The caller's thread sleeps until every task is done or the oldest
    running one reaches its deadline, and each wake-up costs O(1) plus the
    tasks it abandons: with 1,000 hosts, re-scanning every task at each
    finished one cost a quadratic 0.2-0.4 s of the interpreter's lock.

    ``workers`` <= 1 runs the tasks inline, in the caller's thread and in the order given, with no deadline:
    what a deterministic simulation needs (its simulated hosts decide themselves when a call "hangs"), and
    what a single core reading in-process test-driver hosts gets anyway.  ``clock`` is the time source of
    the deadlines.
    """
    if workers <= 1:
        inline: dict[str, T | Exception] = {}
        for key, fn in tasks.items():
            try:
                inline[key] = fn()
            except Exception as exc:
                inline[key] = exc
        return inline
    if isinstance(timeout_s, Mapping):
        longest = max(timeout_s.values(), default=0.0)
        limits = {key: timeout_s.get(key, longest) for key in tasks}
    else:
        limits = dict.fromkeys(tasks, timeout_s)
    pending = collections.deque(tasks.items())
    results: dict[str, T | Exception] = {}
    running: dict[str, float] = {}  # started, not finished, not abandoned: key -> its deadline
    deadlines: list[tuple[float, str]] = []  # a heap of (deadline, key); a finished key's entry is skipped
    cond = threading.Condition()

    def worker() -> None:
        mark_bounded()
        while True:
            with cond:
                if not pending:
                    return
                key, fn = pending.popleft()
                running[key] = clock() + limits[key]
                heapq.heappush(deadlines, (running[key], key))
            try:
                value: T | Exception = fn()
            except Exception as exc:
                value = exc
            with cond:
                if running.pop(key, None) is not None:  # else: abandoned at its deadline, the host is down
                    results[key] = value
                if not pending and not running:
                    cond.notify_all()

    def spawn() -> None:
        threading.Thread(target=worker, name="inventory", daemon=True).start()

    with cond:
        for _ in range(max(1, min(workers, len(pending))) if pending else 0):
            spawn()
        while pending or running:
            now = clock()
            late = []
            while deadlines and deadlines[0][0] < now:  # earliest first: stop at the first one still in time
                _, key = heapq.heappop(deadlines)
                if key in running:  # else it finished in time
                    late.append(key)
                    del running[key]
            for _ in late:  # each late task holds a thread: give the queue a fresh one
                if pending:
                    spawn()
            if late:
                note_abandoned(len(late))
            while deadlines and deadlines[0][1] not in running:  # finished: not a deadline any more
                heapq.heappop(deadlines)
            if running and deadlines:
                cond.wait(max(deadlines[0][0] - now, 0.005))
            elif pending:  # workers starting (or replacements): they pick the queue up at once
                cond.wait(0.05)
        return dict(results)
