"""``vcsched generate``: write a random instance by the paper's protocol (section 4.1)."""

from __future__ import annotations

import json
from typing import Any

import click

from cli.app import EXIT_OK, console
from cli.params import FiniteFloatRange, output_option
from hypervisor.files import write_output
from vcsched.experiments.generate import GeneratorSpec, generate
from vcsched.formats.instance import instance_to_dict


def _one_entry_per_line(doc: dict[str, Any]) -> str:
    """The instance JSON with one host or job per line: diffable and still small at 10,000 tasks."""
    parts = []
    for key in ("hosts", "jobs"):
        rows = ",\n  ".join(json.dumps(row) for row in doc[key])
        parts.append(f' "{key}": [\n  {rows}\n ]' if rows else f' "{key}": []')
    return "{\n" + ",\n".join(parts) + "\n}\n"


@click.command("generate")
@click.option("--hosts", type=click.IntRange(min=1), required=True, help="Number of identical unit hosts H.")
@click.option("--tasks", type=click.IntRange(min=1), required=True,
              help="Number of tasks J (one VM each).  With --parallel: the total over all jobs.")
@click.option("--slack", type=FiniteFloatRange(0, 1, max_open=True), required=True,
              help="Memory slack s in [0, 1): mean task memory is (1 - s) * H / J, so about a "
                   "fraction s of total memory stays free.")
@click.option("--cv-mem", type=FiniteFloatRange(min=0, max=10), default=0.25, show_default=True,
              help="Coefficient of variation of task memory (paper: 0.25 or 0.75).")
@click.option("--cv-cpu", type=FiniteFloatRange(min=0, max=10), default=0.25, show_default=True,
              help="Coefficient of variation of task CPU need, mean 0.5 (paper: 0.25 or 0.75).")
@click.option("--parallel", is_flag=True,
              help="Parallel jobs: tasks per job from the Lublin-Feitelson model (1..64, biased to powers of two).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Random seed; the same seed gives the same instance.")
@output_option("Write the instance here instead of stdout.")
def generate_cmd(hosts: int, tasks: int, slack: float, cv_mem: float, cv_cpu: float, parallel: bool,
                 seed: int, output: str | None) -> int:
    """Generate a random instance as in the paper's experiments (section 4.1).

    \b
    Per task, CPU need ~ normal(0.5, cv_cpu * 0.5) and memory ~
    normal((1 - s) * H / J, cv_mem * mean), both conditioned on (0, 1] by
    resampling out-of-range draws.  A feasible placement is not guaranteed:
    low slack and high variation make some instances impossible.

    \b
    Example (one instance of the paper's large set):
      vcsched generate --hosts 64 --tasks 500 --slack 0.3 --cv-mem 0.75 \\
                       --cv-cpu 0.75 --seed 1 --output inst.json
      vcsched solve inst.json --algorithm mcb8

    The output is the instance JSON that `vcsched solve` reads.

    Exit codes: 0 written, 2 bad input.
    """
    spec = GeneratorSpec(hosts=hosts, tasks=tasks, slack=slack, cv_mem=cv_mem, cv_cpu=cv_cpu, parallel=parallel)
    instance = generate(spec, seed)
    text = _one_entry_per_line(instance_to_dict(instance))
    if output is None:
        click.echo(text, nl=False)
        return EXIT_OK
    write_output("--output", output, text)
    console.print(f"wrote {output}: {instance.n_hosts} hosts, {instance.n_jobs} jobs, {instance.n_tasks} tasks",
                  highlight=False)
    return EXIT_OK
