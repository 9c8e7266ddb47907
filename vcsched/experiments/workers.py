"""Running one function over many work items, in this process or in worker processes, with progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

from vcsched.experiments import OnProgress

I = TypeVar("I")  # noqa: E741 - a work item
R = TypeVar("R")


def map_items(fn: Callable[[I], R], items: Sequence[I], jobs: int = 1, on_progress: OnProgress | None = None,
              unit: str = "instances") -> Iterator[R]:
    """``fn`` on each item, in ``jobs`` worker processes (in this one when ``jobs`` is 1).

    Yields each result as soon as it is there (in completion order with
    workers), so that the caller can save as it goes; ``fn`` must be a
    module-level function for the workers.  ``on_progress(done, total,
    unit)`` is called here, in the caller's process: once before the first
    item, then after each.
    """
    total = len(items)

    def progress(done: int) -> None:
        if on_progress is not None:
            on_progress(done, total, unit)

    progress(0)
    if jobs == 1:
        for done, item in enumerate(items, 1):
            result = fn(item)
            progress(done)
            yield result
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(fn, item) for item in items]
        for done, fut in enumerate(as_completed(futures), 1):
            result = fut.result()
            progress(done)
            yield result
