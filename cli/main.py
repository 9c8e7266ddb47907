"""Entry point: assembles the command modules into the ``vcsched`` group."""

from __future__ import annotations

from cli.adapt import adapt_cmd, solve_adapt_cmd
from cli.app import cli
from cli.apply import apply_cmd
from cli.bench import bench_cmd
from cli.calibrate import calibrate_cmd
from cli.experiment import experiment_cmd
from cli.generate import generate_cmd
from cli.lab import lab_cmd
from cli.place import place_cmd
from cli.solve import solve_cmd
from cli.status import status_cmd

cli.add_command(solve_cmd)
cli.add_command(generate_cmd)
cli.add_command(lab_cmd)
cli.add_command(experiment_cmd)
cli.add_command(bench_cmd)
cli.add_command(calibrate_cmd)
cli.add_command(solve_adapt_cmd)
cli.add_command(adapt_cmd)
cli.add_command(place_cmd)
cli.add_command(apply_cmd)
cli.add_command(status_cmd)


def main() -> None:
    cli(prog_name="vcsched")


if __name__ == "__main__":
    main()
