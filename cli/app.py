"""The click group and the one place that turns errors into one line and an exit code.

Exit codes (docs/cli.md): 0 success, 1 a well-formed request that cannot be satisfied (no feasible placement,
admission refused, a stale plan, the lock held) or a step that failed, 2 bad input (nothing was changed), 70 an
internal error (a bug), 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from vcsched.errors import InputError, VcschedError

EXIT_OK, EXIT_UNSATISFIED, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 70, 130

#: Piped output (a file, grep, CI logs) is not cut at rich's default 80 columns, which hid values behind "…":
#: without a terminal, tables get room to show every column in full ($COLUMNS still wins).
PIPED_WIDTH = 240


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None)


console = _console()
err_console = _console(stderr=True)


@contextlib.contextmanager
def stdout_for_vcsched_only() -> Iterator[None]:
    """While a command runs, only vcsched writes to stdout: its tables and ``--json`` documents, which scripts parse.

    Python's ``sys.stdout`` writes to a private copy of the real stdout, and file descriptor 1, where native
    libraries print, points at stderr: HiGHS (scipy's MILP solver) ``printf()``s a debug line at times
    (``HighsMipSolverData::transformNewIntegerFeasibleSolution ...``), which would corrupt ``vcsched solve
    --json``; on stderr it is a diagnostic.  The process owns its descriptors, so this is the CLI's business,
    not the solver's.  Nothing changes when stdout cannot be duplicated (no stdout at all).
    """
    try:
        sys.stdout.flush()
        real = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    before = sys.stdout
    try:
        ours = os.fdopen(real, "w", buffering=1 if before.isatty() else -1, encoding=before.encoding,
                         errors=before.errors, closefd=False)
        os.dup2(2, 1)
    except (OSError, ValueError):
        os.close(real)
        yield
        return
    sys.stdout = ours
    try:
        yield
    finally:
        ours.flush()
        sys.stdout = before
        os.dup2(real, 1)
        os.close(real)


def refuse(reason: str) -> int:
    """A well-formed request that cannot be satisfied: its reason as one line on stderr, whatever went to stdout
    (the table or the ``--json`` document, which says it too); returns exit code 1 for the command to return."""
    click.echo(f"vcsched: refused: {reason}", err=True)
    return EXIT_UNSATISFIED


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one line on stderr and exit; the single way commands report errors."""
    click.echo(f"vcsched: error: {message}", err=True)
    sys.exit(code)


class LazyGroup(click.Group):
    """A group whose subcommands are imported when they run, not when the program starts.

    A command's module imports what the command needs (numpy, scipy, the
    libvirt adapter, ...), and that costs far more than most commands take to
    run.  A lazy command is registered by name with where it lives
    (``"module:attribute"``) and its one-line summary, so that ``--help`` lists
    every command without importing any; the summary must be the first
    paragraph of the command's docstring (tests/test_cli_main.py checks it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: dict[str, tuple[str, str]] = {}

    def add_lazy_command(self, name: str, import_path: str, summary: str) -> None:
        self.lazy_commands[name] = (import_path, summary)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module, _, attribute = self.lazy_commands[cmd_name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click.Group's, but a command not loaded yet is shown by its summary instead of being imported."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name) or click.Command(name, help=self.lazy_commands[name][1])
            if not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


class VcschedGroup(LazyGroup):
    """Maps every error a user can cause to one line on stderr and exit code 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(EXIT_OK)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            fail("aborted", EXIT_INTERRUPTED)
        except click.ClickException as exc:
            hint = ""
            ctx = getattr(exc, "ctx", None)
            if ctx is not None:
                hint = f" (see '{ctx.command_path} --help')"
            fail(f"{exc.format_message()}{hint}", EXIT_BAD_INPUT)
        except VcschedError as exc:  # InputError: 2; a refusal says its own code (PlanRefused, LockBusy: 1)
            fail(str(exc), getattr(exc, "exit_code", EXIT_BAD_INPUT))
        except BrokenPipeError:  # the reader of stdout went away (`vcsched status | head`): not a bug of ours
            raise
        except Exception as exc:  # a bug: where it happened for the report, then the one line and exit 70
            traceback.print_exc()
            fail(f"internal error: {type(exc).__name__}: {exc} (a bug in vcsched; the traceback above says where)",
                 EXIT_INTERNAL)
        if isinstance(rv, int):
            sys.exit(rv)
        return rv


def read_text_file(path: str | Path, what: str) -> str:
    """A file's text; a missing, unreadable or non-UTF-8 file is an InputError naming it (``what``: "plan"...)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror})") from None


def read_document(path: str | Path, what: str, loads: Callable[[str], Any],
                  malformed: Callable[[Exception], str | None]) -> Any:
    """A file read and decoded by ``loads``; every failure is an InputError naming the file (``what``: "plan",
    "cluster file"...): unreadable, not UTF-8, nested too deeply, or what ``malformed`` says of the decoder's
    error (None: not a decoding error, re-raised)."""
    text = read_text_file(path, what)
    try:
        return loads(text)
    except RecursionError:
        raise InputError(f"{what} {path}: nested too deeply to be a {what}") from None
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        why = malformed(exc)
        if why is None:
            raise
        raise InputError(f"{what} {path}: {why}") from None


def read_json_file(path: str, what: str) -> Any:
    """Read and decode a JSON file, turning every failure into an InputError naming the file."""
    return read_document(path, what, json.loads, lambda e: f"malformed JSON at line {e.lineno} column {e.colno}: "
                         f"{e.msg}" if isinstance(e, json.JSONDecodeError) else None)


def emit_json(value: Any) -> None:
    """One JSON object on stdout, for scripts."""
    click.echo(json.dumps(value, indent=None, separators=(",", ":"), default=_json_default))


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


@click.group(cls=VcschedGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="vcsched")
def cli() -> None:
    """vcsched — place virtual clusters on hosts, cap their CPU for a fair, high yield.

    \b
    The solver core (no hypervisor needed):
      vcsched generate ... > inst.json     make an instance by the paper's protocol
      vcsched solve inst.json -a mcb8      place it and report yields
      vcsched experiment small             reproduce the paper's section 4
      vcsched bench                        time the solvers

    \b
    Real hypervisors (libvirt; --cluster FILE, default the running lab's):
      vcsched lab up --hosts 2             a real local cluster of libvirtd hosts
      vcsched status                       hosts, VMs, caps, predicted and measured yields
      vcsched place web.toml [--apply]     admit a virtual cluster: decision and plan
      vcsched apply plan.json              apply a saved plan (idempotent)
      vcsched adapt --budget 2GiB          re-balance with live migrations under a byte budget
      vcsched calibrate                    measure how precisely CPU caps take effect
      vcsched lab down                     remove the lab and everything it made

    Exit codes: 0 done, 1 refused (no feasible placement, does not fit, a
    stale plan, the lock held) or failed, 2 bad input (nothing changed), 70
    internal error (a bug in vcsched), 130 interrupted by Ctrl-C.  Results
    go to stdout, errors and progress to stderr; docs/cli.md is the contract.
    """
