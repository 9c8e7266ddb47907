"""The ``vcsched`` group: every command is listed by ``--help`` and loaded only when it runs."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

import cli as cli_package
from cli.app import stdout_for_vcsched_only
from cli.main import COMMANDS, cli

VCSCHED = [sys.executable, "-m", "cli.main"]


def _defined_commands() -> dict[str, click.Command]:
    """The top-level commands the cli package defines (a group's own subcommands excluded)."""
    found: dict[int, click.Command] = {}
    for module in pkgutil.iter_modules(cli_package.__path__):
        for value in vars(importlib.import_module(f"cli.{module.name}")).values():
            if isinstance(value, click.Command) and value is not cli:
                found[id(value)] = value
    subcommands = {id(c) for g in found.values() if isinstance(g, click.Group) for c in g.commands.values()}
    return {c.name or "": c for i, c in found.items() if i not in subcommands}


def test_every_command_of_the_package_is_registered_under_its_own_name() -> None:
    defined = _defined_commands()
    assert sorted(defined) == sorted(COMMANDS)
    for name, (where, _) in COMMANDS.items():
        module, _, attribute = where.partition(":")
        assert getattr(importlib.import_module(module), attribute) is defined[name]


def test_help_lists_every_command_with_its_one_line_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    fresh = subprocess.run([*VCSCHED, "--help"], capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 0, fresh.stderr
    listed = fresh.stdout.split("\nCommands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == sorted(COMMANDS)
    for name in COMMANDS:  # once loaded, a command's summary comes from its own docstring
        assert cli.get_command(click.Context(cli), name) is not None
    assert sorted(cli.commands) == sorted(COMMANDS)
    with click.Context(cli, info_name="vcsched", **cli.context_settings) as ctx:
        assert ctx.get_help() + "\n" == fresh.stdout


def _modules_loaded_by(args: list[str], cwd: Path) -> list[str]:
    """The modules a fresh ``vcsched ARGS`` process has imported when it exits."""
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
            "from cli.main import main\n"
            f"sys.argv = ['vcsched', *{args!r}]\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert r.returncode == 0, r.stderr
    loaded: list[str] = json.loads(r.stderr.strip().splitlines()[-1])
    return loaded


def _under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages)]


def test_help_imports_no_command_and_no_numerical_or_hypervisor_module(tmp_path: Path) -> None:
    loaded = _modules_loaded_by(["--help"], tmp_path)
    assert _under(loaded, "numpy", "scipy", "hypervisor", "libvirt", "vcsched.solvers", "rich.progress") == []
    assert [m for m in _under(loaded, "cli") if m not in ("cli", "cli.main", "cli.app")] == []


def test_solve_imports_neither_the_hypervisor_adapter_nor_the_adaptation_nor_the_bench(tmp_path: Path) -> None:
    inst = tmp_path / "inst.json"
    inst.write_text(json.dumps({"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0}],
                                "jobs": [{"name": "j0", "cpu_need": 0.5, "memory": 0.5}]}))
    loaded = _modules_loaded_by(["solve", str(inst)], tmp_path)
    assert "vcsched.solvers.registry" in loaded
    assert _under(loaded, "hypervisor", "libvirt", "vcsched.adaptation", "vcsched.control", "vcsched.experiments",
                  "cli.bench", "cli.adapt", "cli.place", "cli.common") == []


def test_a_native_print_during_a_command_goes_to_stderr_not_into_its_output(capfd: pytest.CaptureFixture[str]) -> None:
    with stdout_for_vcsched_only():
        os.write(1, b"native line\n")  # what a C library's printf() does
        print("mine")
    os.write(1, b"after\n")
    out = capfd.readouterr()
    assert out.out == "mine\nafter\n"
    assert "native line" in out.err


def test_highs_printing_during_solve_json_leaves_stdout_one_json_document(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    # HiGHS sometimes printf()s a debug line; a stand-in solver prints it on file descriptor 1 every time.
    import vcsched.solvers.milp as milp
    from cli.main import main

    real = milp.scipy_milp

    def noisy(*args: object, **kwargs: object) -> object:
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    inst = tmp_path / "inst.json"
    inst.write_text(json.dumps({"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0},
                                          {"name": "h1", "cpu": 1.0, "memory": 1.0}],
                                "jobs": [{"name": f"j{i}", "cpu_need": 0.6, "memory": 0.3} for i in range(3)]}))
    monkeypatch.setattr(milp, "scipy_milp", noisy)
    monkeypatch.setattr(sys, "argv", ["vcsched", "solve", str(inst), "-a", "milp", "--json"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code in (0, None)
    out = capfd.readouterr()
    assert json.loads(out.out)["feasible"] is True
    assert "transformNewIntegerFeasibleSolution" in out.err


def test_main_is_not_ended_by_threads_an_earlier_command_of_the_process_left(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    # main() ends its process at once (os._exit) when the command left threads blocked on a hung host.  A thread an
    # earlier call left (an earlier test of the same pytest worker) must not end this one: before, the whole test
    # session ended here with this command's exit code, 0, and every later test silently never ran.
    import hypervisor.connections as connections
    from cli.main import main

    monkeypatch.setattr(connections, "_abandoned", [1])  # an earlier command's hung host
    ended: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: ended.append(code))
    monkeypatch.setattr(sys, "argv", ["vcsched", "--help"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code in (0, None) and ended == []
    assert "Usage" in capfd.readouterr().out

    def hangs() -> None:  # this command leaves a thread on a hung host: it still ends at once
        connections._abandoned[0] += 1
        raise SystemExit(0)

    monkeypatch.setattr("cli.main.cli", lambda **_: hangs())
    with pytest.raises(SystemExit):
        main()
    assert ended == [0]
