"""Choosing the CPU to measure on, and describing how busy the machine was.

The paper ran all VMs on one physical CPU and its controller on the other.  On
a shared machine the measured CPU should be the least busy one, and the report
must say how busy the machine was: a cap can only be as exact as the CPU it
rations is free.
"""

from __future__ import annotations

import os
from typing import Any

import psutil

from vcsched.errors import InputError


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def check_cpu(cpu: int) -> int:
    cpus = usable_cpus()
    if cpu not in cpus:
        raise InputError(f"--cpu: {cpu} is not one of the CPUs this process may use ({', '.join(map(str, cpus))})")
    return cpu


def cpu_busy(sample_seconds: float = 0.5) -> dict[int, float]:
    """Per-CPU busy fraction over a short sample (0 = idle, 1 = fully busy)."""
    percents = psutil.cpu_percent(interval=sample_seconds, percpu=True)
    return {c: percents[c] / 100.0 for c in usable_cpus() if c < len(percents)}


def least_loaded_cpu(busy: dict[int, float]) -> int:
    """The idlest usable CPU; ties go to the highest number (CPU 0 tends to take more interrupts)."""
    return max(busy, key=lambda c: (-busy[c], c))


def conditions(busy: dict[int, float], cpu: int) -> dict[str, Any]:
    """What the report states about the machine when the run started."""
    load1, load5, _ = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "loadavg_1m": round(load1, 2),
        "loadavg_5m": round(load5, 2),
        "measured_cpu_busy_before": round(busy.get(cpu, float("nan")), 3),
        "other_cpus_busy_before": {str(c): round(b, 3) for c, b in busy.items() if c != cpu},
    }
