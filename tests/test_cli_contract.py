"""The command-line contract of docs/cli.md, checked over every command (walked recursively from the group).

A command added without a row in docs/cli.md's table, or whose ``--help`` does not state the exit codes the
table gives it, fails here; so does any option that accepts a value it cannot use.  Commands that need a
cluster run on libvirt's test driver (hypervisor/testhosts.py): hosts in files, no daemon.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from cli.main import cli
from cli.params import Bytes, Duration
from hypervisor.testhosts import ScaleCluster, node_xml, write_scale_cluster

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
CODES = (0, 1, 2, 70, 130, 143)


def walk(cmd: click.Command = cli, path: tuple[str, ...] = ("vcsched",),
         parent: click.Context | None = None) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command and subcommand, loading the lazy ones (cli/main.py)."""
    ctx = click.Context(cmd, info_name=path[-1], parent=parent)
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from walk(sub, (*path, name), ctx)


COMMANDS = dict(walk())


def documented() -> dict[tuple[str, ...], tuple[str, set[int]]]:
    """docs/cli.md's *Every command* table: command path -> (kind, exit codes)."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.fullmatch(r"\| `(vcsched(?: [\w-]+)*)` \| (\w+) \| ([\d, ]+) \|", line.strip())
        if m:
            rows[tuple(m.group(1).split())] = (m.group(2), {int(c) for c in m.group(3).split(",")})
    return rows


DOCUMENTED = documented()


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def help_exit_codes(text: str) -> set[int]:
    """The codes the paragraph ``Exit codes...`` of a --help names (a code is a number followed by its meaning)."""
    start = text.find("Exit codes")
    assert start >= 0, "no 'Exit codes:' paragraph"
    paragraph = re.split(r"\n\s*\n", text[start:])[0]
    return {int(c) for c in re.findall(r"(?<![\w.])(\d{1,3})(?=\s+[a-zA-Z(-])", paragraph)}


def one_line(result: Any, code: int) -> str:
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error: "), result.stderr
    return str(lines[0])


# ---------------------------------------------------------------------------------------------- every command


def test_every_command_has_a_row_in_docs_cli_md() -> None:
    assert sorted(" ".join(p) for p in COMMANDS) == sorted(" ".join(p) for p in DOCUMENTED)


@pytest.mark.parametrize("path", sorted(DOCUMENTED), ids=" ".join)
def test_help_works_and_states_the_documented_exit_codes(path: tuple[str, ...]) -> None:
    result = run(*path[1:], "--help")
    assert result.exit_code == 0, result.stderr
    kind, codes = DOCUMENTED[path]
    assert help_exit_codes(result.stdout) == codes
    assert kind in ("group", "deciding", "reporting")
    if kind == "deciding":
        assert "--json" in result.stdout


def test_apply_help_says_ctrl_c_exits_130_not_1() -> None:
    text = run("apply", "--help").stdout
    assert "130 interrupted by Ctrl-C" in " ".join(text.split())


def _value_options() -> list[Any]:
    out = []
    for path, cmd in COMMANDS.items():
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.is_flag or not p.opts[-1].startswith("--"):
                continue
            if isinstance(p.type, click.types.StringParamType | click.Path | click.types.UnprocessedParamType):
                continue
            option = max(p.opts, key=len)
            out.append(pytest.param(path, option, p.type, id=f"{' '.join(path[1:])} {option}"))
    return out


@pytest.mark.parametrize(("path", "option", "kind"), _value_options())
def test_every_typed_option_refuses_a_value_it_cannot_use_with_exit_2_naming_it(
        path: tuple[str, ...], option: str, kind: click.ParamType) -> None:
    # NaN is the value every number check must catch (it passes comparisons); a choice or a size gets garbage.
    bad = "nan" if not isinstance(kind, click.Choice | Bytes | Duration) else "no-such-value"
    line = one_line(run(*path[1:], option, bad), 2)
    assert option in line and bad in line


def test_drain_time_limit_nan_is_bad_input() -> None:
    line = one_line(run("drain", "h0", "--budget", "0", "--time-limit", "nan"), 2)
    assert "--time-limit" in line and "nan" in line


# ---------------------------------------------------------------------------------------------- on test hosts


@pytest.fixture
def hosts(tmp_path: Path) -> ScaleCluster:
    """Two simulated hosts (``sim://``, hypervisor/simlibvirt.py): they cap CPU, so a dry run exits 0 where
    --apply would act (libvirt's test driver cannot, and --apply, so the dry run, refuses a cap there)."""
    return write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2, scheme="sim")


def _json(result: Any, code: int) -> dict[str, Any]:
    assert result.exit_code == code, (result.stdout, result.stderr)
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict)
    return doc


def test_deciding_commands_say_ok_true_when_they_exit_0(hosts: ScaleCluster, tmp_path: Path) -> None:
    c = hosts.cluster_file
    inst, running = tmp_path / "inst.json", tmp_path / "running.json"
    hosts_doc, job = [{"name": "h0", "cpu": 1.0, "memory": 1.0}], {"name": "j0", "cpu_need": 0.5, "memory": 0.5}
    inst.write_text(json.dumps({"hosts": hosts_doc, "jobs": [job]}))
    running.write_text(json.dumps({"hosts": hosts_doc, "jobs": [job | {"current": [0]}]}))
    for args in (["solve", inst], ["solve-adapt", running, "--budget", "0"],
                 ["place", hosts.request_file, "--cluster", c],
                 ["headroom", "--vm", "cpu_cores=1,memory=512MiB", "--cluster", c],
                 ["adapt", "--budget", "0", "--cluster", c],
                 ["drain", "h0", "--budget", "unlimited", "--cluster", c], ["status", "--sample", "0", "--cluster", c],
                 ["cordon", "h1", "--cluster", c], ["uncordon", "h1", "--cluster", c],
                 ["observe", "--window", "1s", "--cluster", c], ["repair", "--cluster", c]):
        doc = _json(run(*args, "--json"), 0)
        assert doc["ok"] is True, args


def test_a_refusal_exits_1_with_ok_false_and_its_reason_on_stderr(hosts: ScaleCluster, tmp_path: Path) -> None:
    c = hosts.cluster_file
    huge = tmp_path / "huge.toml"
    huge.write_text('name = "huge"\nvms = 200\nvcpus = 1\nmemory = "512MiB"\ncpu_cores = 0.5\n')
    result = run("place", huge, "--cluster", c, "--json")
    doc = _json(result, 1)
    assert doc["ok"] is False and doc["admitted"] is False  # the deprecated key still says it
    assert result.stderr.startswith("vcsched: refused: huge: ")
    result = run("drain", "h0", "--budget", "0", "--cluster", c, "--json")
    doc = _json(result, 1)
    assert doc["ok"] is False and doc["complete"] is False
    assert "vcsched: refused: h0 cannot be emptied: 2 VMs stay (vm0, vm1)" in result.stderr


def test_a_plan_that_no_longer_fits_the_live_cluster_is_refused_with_exit_1_not_2(tmp_path: Path) -> None:
    # libvirt's test driver: each connection reads the host files afresh, so rewriting them changes the cluster.
    hosts = write_scale_cluster(tmp_path / "hosts", hosts=2, vms_per_host=2)
    plan = tmp_path / "plan.json"
    made = run("place", hosts.request_file, "--cluster", hosts.cluster_file, "-o", plan)
    assert made.exit_code == 1 and "cannot set CPU caps" in made.stderr and plan.exists()  # as --apply would
    for h in range(2):  # the hosts fill up: 62 VMs of 512 MiB on each 32 GiB host leave no room for the plan's 8
        (hosts.cluster_file.parent / f"h{h}.xml").write_text(node_xml(h, 62))
    stale = one_line(run("apply", plan, "--cluster", hosts.cluster_file), 1)
    assert "changed since this plan was computed" in stale
    full = one_line(run("apply", plan, "--cluster", hosts.cluster_file, "--force"), 1)
    assert re.match(r"vcsched: error: plan\.steps\[\d+\]", full), full  # the step and field it fails on


@pytest.mark.parametrize("command", ["place", "apply", "solve", "solve-adapt"])
def test_a_missing_or_garbled_input_file_is_bad_input_naming_it(command: str, hosts: ScaleCluster,
                                                                tmp_path: Path) -> None:
    extra = {"solve-adapt": ["--budget", "0"]}.get(command, [])
    missing = tmp_path / "nowhere.txt"
    assert str(missing) in one_line(run(command, missing, *extra, "--cluster", hosts.cluster_file)
                                    if command in ("place", "apply") else run(command, missing, *extra), 2)
    garbled = tmp_path / "garbled.txt"
    garbled.write_text("{[ this is not a file vcsched reads\n")
    args = [command, garbled, *extra] + (["--cluster", hosts.cluster_file] if command in ("place", "apply") else [])
    assert str(garbled) in one_line(run(*args), 2)


def _cluster_commands() -> list[list[str]]:
    """A command line of every command that reads --cluster, with its other required arguments."""
    needs: dict[tuple[str, ...], list[str]] = {
        ("place",): ["REQUEST"], ("headroom",): ["--vm", "cpu_cores=1,memory=512MiB"], ("apply",): ["PLAN"],
        ("drain",): ["h0", "--budget", "0"], ("cordon",): ["h0"],
        ("uncordon",): ["h0"], ("adapt",): ["--budget", "0"], ("run",): ["--budget-per-interval", "0"],
        ("status",): ["--sample", "0"], ("top",): ["--once"], ("observe",): ["--window", "1s"], ("repair",): [],
        ("recover",): ["h0"], ("restart",): ["vm-0"], ("recommendations",): [], ("approve",): ["r00000000"],
        ("skip",): ["r00000000"], ("audit",): [], ("adopt",): ["legacy", "--vc", "old"], ("release",): ["legacy"],
        ("power", "status"): [], ("power", "sleep"): ["h0"], ("power", "wake"): ["h0"], ("power", "clear"): ["h0"]}
    exempt = {("calibrate",)}  # reads --cluster only to boot guests, after connecting to --connect (lab tests)
    out = []
    for path, cmd in COMMANDS.items():
        if any(p.name == "cluster_file" for p in cmd.params) and path[1:] not in exempt:
            assert path[1:] in needs, f"add {' '.join(path)} to _cluster_commands"
            out.append([*path[1:], *needs[path[1:]]])
    return out


@pytest.mark.parametrize("argv", _cluster_commands(), ids=lambda a: a[0])
def test_every_cluster_command_refuses_a_missing_or_garbled_cluster_file_with_exit_2(
        argv: list[str], hosts: ScaleCluster, tmp_path: Path) -> None:
    argv = [str(hosts.request_file) if a == "REQUEST" else a for a in argv]
    if "PLAN" in argv:
        plan = tmp_path / "plan.json"
        assert run("place", hosts.request_file, "--cluster", hosts.cluster_file, "-o", plan).exit_code == 0
        argv = [str(plan) if a == "PLAN" else a for a in argv]
    missing = tmp_path / "nowhere.toml"
    assert f"cluster file {missing}: no such file" in one_line(run(*argv, "--cluster", missing), 2)
    garbled = tmp_path / "garbled.toml"
    garbled.write_text("[[hosts]\nname = \n")
    assert f"cluster file {garbled}: malformed TOML" in one_line(run(*argv, "--cluster", garbled), 2)


# ---------------------------------------------------------------------------------------------- start-up


@pytest.mark.parametrize("command", ["cordon", "uncordon"])
def test_cordon_and_uncordon_import_no_numpy(command: str, hosts: ScaleCluster) -> None:
    """They edit one line of the cluster file: numpy and the solvers would only slow them down."""
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
            "from cli.main import main\n"
            f"sys.argv = ['vcsched', {command!r}, 'h1', '--cluster', {str(hosts.cluster_file)!r}]\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=hosts.cluster_file.parent)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stderr.strip().splitlines()[-1])
    assert "cli.maintenance" in loaded
    heavy = [m for m in loaded if m.split(".")[0] in ("numpy", "scipy") or m.startswith(("vcsched.solvers",
                                                                                            "vcsched.adaptation"))]
    assert heavy == []


# ---------------------------------------------------------------------------------------------- 80 columns


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """An 80-column terminal for the command's tables (cli.app's console, as $COLUMNS=80 makes it)."""
    from cli.app import console

    monkeypatch.setattr(console, "width", 80)


def _fits_80(result: Any) -> str:
    assert result.exit_code in (0, 1), (result.stdout, result.stderr)
    out: str = result.stdout
    too_wide = [line for line in out.splitlines() if len(line) > 80]
    assert too_wide == [], "\n".join(too_wide)
    assert "…" not in out, out  # rich cuts a cell or a header it squeezes with "…"
    return out


def test_every_table_of_the_cluster_commands_fits_80_columns_without_cutting_a_value(
        narrow: None, hosts: ScaleCluster, tmp_path: Path) -> None:
    c = hosts.cluster_file
    inst, running = tmp_path / "inst.json", tmp_path / "running.json"
    machines = [{"name": f"h{i}", "cpu": 1.0, "memory": 1.0} for i in range(2)]
    jobs = [{"name": f"job-{j}", "cpu_need": 0.6, "memory": 0.3} for j in range(3)]
    inst.write_text(json.dumps({"hosts": machines, "jobs": jobs}))
    running.write_text(json.dumps({"hosts": machines, "jobs": [j | {"current": [0]} for j in jobs]}))
    status = _fits_80(run("status", "--sample", "0", "--cluster", c))
    assert "0.500" in status and all(h in status for h in ("vCPUs", "floor", "rules", "weight", "tenant"))
    for args in (["place", hosts.request_file, "--cluster", c], ["adapt", "--budget", "unlimited", "--cluster", c],
                 ["drain", "h0", "--budget", "unlimited", "--cluster", c],
                 ["drain", "h0", "--budget", "0", "--cluster", c],
                 ["observe", "--window", "1s", "--cluster", c], ["solve", inst], ["solve", inst, "--policy", "drf"],
                 ["solve-adapt", running, "--budget", "unlimited"]):
        _fits_80(run(*args))


def test_a_table_too_wide_moves_its_last_columns_to_a_second_table_keyed_by_its_first() -> None:
    from rich.console import Console

    from cli.tables import FitTable

    table = FitTable(title="VMs")
    for col in ("VM", "need", "cap", "a long column name", "another long column", "the last one"):
        table.add_column(col, justify="right", key=col == "VM")
    table.add_row("web-0", "0.123456", "0.654321", "x" * 20, "y" * 20, "z" * 20)
    console = Console(width=60, record=True, file=io.StringIO())
    console.print(table)
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 60 for line in text.splitlines())
    assert "0.123456" in text and "0.654321" in text and "VMs (continued)" in text
    assert text.count("web-0") == 2  # the key names the row in both tables
    assert all(name in text for name in ("a long column name", "another long column"))


# ---------------------------------------------------------------------------------------------- a failed step


@pytest.mark.parametrize("command", ["place", "apply", "adapt", "drain"])
def test_a_failed_steps_reason_goes_to_stderr_as_well_as_into_the_table(
        command: str, hosts: ScaleCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, narrow: None) -> None:
    # The test driver cannot run a step (it caps nothing), so the executor is replaced by one whose first step
    # fails: what the command makes of a failed step is what is checked.
    import cli.apply
    import cli.common
    import cli.drain
    import cli.place
    from acting.executor import FAILED, NOT_RUN, ApplyReport, StepResult

    def failing(_hv: Any, plan: Any, **_: Any) -> ApplyReport:
        return ApplyReport((StepResult(plan.steps[0], FAILED, "the host said no"),
                            *(StepResult(s, NOT_RUN) for s in plan.steps[1:])), True)

    for module in (cli.common, cli.place, cli.apply, cli.drain):
        monkeypatch.setattr(module, "run_apply", failing)
    c, lock = hosts.cluster_file, f"file://{tmp_path}/lock"
    plan = tmp_path / "plan.json"
    assert run("place", hosts.request_file, "--cluster", c, "-o", plan).exit_code == 0
    argv = {"place": ["place", hosts.request_file, "--apply"], "apply": ["apply", plan],
            "adapt": ["adapt", "--budget", "0", "--set-need", "vm0=0.3", "--apply"],
            "drain": ["drain", "h0", "--budget", "unlimited", "--apply"]}[command]
    if command == "drain":
        monkeypatch.setattr(cli.drain, "set_maintenance", lambda *_: True)  # the cluster file stays as it is
    result = run(*argv, "--cluster", c, "--coordination", lock)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "the host said no" in _fits_80(result)  # the report's table, at 80 columns
    line = result.stderr.strip().splitlines()[-1]
    assert re.match(r"vcsched: error: the plan stopped at step 1 \(\S+ \S+ on h\d\), failed: the host said no", line)
    doc = _json(run(*argv, "--cluster", c, "--coordination", lock, "--json"), 1)
    assert doc["ok"] is False


def test_a_bug_exits_70_with_its_traceback_and_one_line_naming_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import cli.solve

    def broken(*_: Any, **__: Any) -> Any:
        raise ZeroDivisionError("a slip")

    monkeypatch.setattr(cli.solve, "solve", broken)
    inst = tmp_path / "inst.json"
    inst.write_text(json.dumps({"hosts": [{"name": "h0", "cpu": 1.0, "memory": 1.0}],
                                "jobs": [{"name": "j0", "cpu_need": 0.5, "memory": 0.5}]}))
    result = run("solve", inst)
    assert result.exit_code == 70
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "vcsched: error: internal error: ZeroDivisionError: a slip (a bug in vcsched")
