"""Random instances by the paper's protocol (section 4.1; parallel jobs, section 5).

Pure: every function takes a ``numpy.random.Generator`` (or a seed) and returns
values, so the same seed gives the same instance on every machine with the
same numpy.

Sequential instances (section 4.1)
    ``H`` identical unit hosts, ``J`` one-task jobs.  CPU need ``alpha`` is
    drawn from a normal distribution of mean 0.5 and standard deviation
    ``cv_cpu * 0.5``; memory from a normal of mean ``(1 - s) * H / J`` and
    standard deviation ``cv_mem`` times that mean, where ``s`` is the memory
    slack (the fraction of total memory left free on average).  The paper
    says the values are "truncated to (0, 1]" without saying how; we
    *resample* every value that falls outside (0, 1] (rejection sampling,
    i.e. an exact draw from the normal conditioned on (0, 1]) rather than
    clipping, because clipping would pile probability mass on exactly 1 and
    make "needs a whole host" tasks far more common than the normal suggests.
    The conditioned mean is a little off the nominal mean when the normal
    has mass outside (0, 1] (``cv = 0.75`` with a mean near 0.5 or 1): that
    is inherent to truncation, and the tests check against the truncated
    normal's mean, not the nominal one.

Parallel instances (section 5)
    The number of tasks of each job follows the Lublin & Feitelson (2003)
    model: with probability ``SERIAL_PROB`` a job is serial (1 task);
    otherwise ``x`` is drawn from a two-stage uniform on ``[ULOW, UMED]``
    (probability ``UPROB``) or ``[UMED, UHI]``, rounded to an integer for the
    power-of-two jobs (probability ``POW2_PROB``), and the size is
    ``round(2 ** x)``.  The paper uses "the same parameters as in [30],
    assuming that jobs can consist of between 1 and 64 tasks"; we take the
    model's typeless ("whole sample") parameters, which describe all jobs
    rather than only batch or interactive ones, and set ``UHI = log2(64)``
    with ``UMED = UHI - 2.5`` as the model prescribes for a given maximum
    size (its own default, 4.5 for 128 nodes, follows the same rule).  A
    serial job is simply a 1-task job, so the serial probability belongs in
    a 1..64 model.
    In parallel mode ``tasks`` is the *total* number of tasks: jobs are drawn
    until their sizes reach it, and the last job is cut to fit exactly, so
    an instance has exactly the requested number of VMs and the memory mean
    ``(1 - s) * H / tasks`` keeps the intended slack.  All tasks of a job
    share its CPU need and memory (the model: identical tasks, section 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vcsched.errors import InputError
from vcsched.model import Host, Instance, Job

CPU_MEAN = 0.5  # section 4.1: the mean CPU need of a task

# Lublin & Feitelson 2003, typeless parameters (their m_lublin99.c), sized to 1..64 tasks.
MAX_TASKS_PER_JOB = 64
SERIAL_PROB = 0.244
POW2_PROB = 0.576
ULOW = 0.8  # log2 of the smallest parallel job, lowered by 0.2 to give size 2 more weight (per the model)
UHI = math.log2(MAX_TASKS_PER_JOB)
UMED = UHI - 2.5
UPROB = 0.86


@dataclass(frozen=True)
class GeneratorSpec:
    """The protocol's knobs for one instance family (section 4.1)."""

    hosts: int
    tasks: int
    slack: float
    cv_mem: float = 0.25
    cv_cpu: float = 0.25
    parallel: bool = False

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise InputError(f"hosts: {self.hosts} must be at least 1")
        if self.tasks < 1:
            raise InputError(f"tasks: {self.tasks} must be at least 1")
        if not 0.0 <= self.slack < 1.0:
            raise InputError(f"slack: {self.slack} must be in [0, 1)")
        for name, cv in (("cv_mem", self.cv_mem), ("cv_cpu", self.cv_cpu)):
            if not (math.isfinite(cv) and cv >= 0.0):
                raise InputError(f"{name}: {cv} must be a finite number >= 0")
        if self.mem_mean > 1.0:
            raise InputError(
                f"slack: {self.slack} with {self.hosts} hosts and {self.tasks} tasks gives a mean task memory of "
                f"{self.mem_mean:.3g}, above 1 (a task cannot need more than one host)"
            )

    @property
    def mem_mean(self) -> float:
        """Mean task memory ``(1 - s) * H / J`` (section 4.1)."""
        return (1.0 - self.slack) * self.hosts / self.tasks


def truncated_normal(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    """``size`` draws from normal(mean, cv * mean) conditioned on (0, 1], by resampling the rejects."""
    if not 0.0 < mean <= 1.0:
        raise InputError(f"mean: {mean} must be in (0, 1]")
    sd = cv * mean
    if sd == 0.0:
        return np.full(size, mean)
    out = rng.normal(mean, sd, size)
    bad = (out <= 0.0) | (out > 1.0)
    while bad.any():  # accept rate >= ~1/3 for every mean in (0, 1] and cv <= 1; terminates fast
        out[bad] = rng.normal(mean, sd, int(bad.sum()))
        bad = (out <= 0.0) | (out > 1.0)
    return out


def lublin_job_size(rng: np.random.Generator) -> int:
    """Tasks of one job by the Lublin-Feitelson two-stage log-uniform model, biased to powers of two."""
    u = rng.random()
    if u <= SERIAL_PROB:
        return 1
    # two-stage uniform over log2(size): the lower stage with probability UPROB
    x = rng.uniform(ULOW, UMED) if rng.random() < UPROB else rng.uniform(UMED, UHI)
    if u <= SERIAL_PROB + POW2_PROB:
        x = float(math.floor(x + 0.5))
    return int(min(MAX_TASKS_PER_JOB, max(1, math.floor(2.0**x + 0.5))))


def job_sizes(rng: np.random.Generator, total_tasks: int) -> list[int]:
    """Draw job sizes until they sum to ``total_tasks``; the last job is cut to fit exactly."""
    sizes: list[int] = []
    remaining = total_tasks
    while remaining > 0:
        k = min(lublin_job_size(rng), remaining)
        sizes.append(k)
        remaining -= k
    return sizes


def generate(spec: GeneratorSpec, rng: np.random.Generator | int) -> Instance:
    """One instance of ``spec``; an int ``rng`` is used as the seed of a fresh PCG64 generator."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    sizes = job_sizes(rng, spec.tasks) if spec.parallel else [1] * spec.tasks
    n_jobs = len(sizes)
    cpu = truncated_normal(rng, CPU_MEAN, spec.cv_cpu, n_jobs)
    mem = truncated_normal(rng, spec.mem_mean, spec.cv_mem, n_jobs)
    hosts = tuple(Host(f"h{i}") for i in range(spec.hosts))
    jobs = tuple(
        Job(f"j{i}", float(cpu[i]), float(mem[i]), sizes[i]) for i in range(n_jobs)
    )
    return Instance(hosts=hosts, jobs=jobs)
