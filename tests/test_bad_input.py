"""Bad input of every kind is one line naming the problem and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line(result: Any, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error: "), result.stderr
    return str(lines[0])


@pytest.mark.parametrize("command,suffix", [("place", ".toml"), ("apply", ".json"), ("solve", ".json")])
def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path, command: str, suffix: str) -> None:
    bad = tmp_path / f"latin1{suffix}"
    bad.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('name = "t"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    line = one_line(run(command, bad, *(["--cluster", cluster] if command != "solve" else [])))
    assert f"{bad}: not UTF-8 text (byte 11" in line


def test_a_cluster_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_bytes(b'name = "\xff"\n')
    assert "cluster file" in one_line(run("status", "--cluster", cluster))


def test_a_deeply_nested_json_plan_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "plan.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    line = one_line(run("apply", deep, "--cluster", tmp_path / "c.toml"))
    assert "nested too deeply" in line


@pytest.mark.parametrize("args", [["status", "--sample", "nan"], ["status", "--sample", "inf"],
                                  ["solve", "x.json", "--time-limit", "nan"]])
def test_nan_and_infinite_numbers_are_refused_naming_the_option(args: list[str]) -> None:
    line = one_line(run(*args))
    assert ("is not a finite number" in line or "is not in the range" in line) and "--" in line


@pytest.mark.parametrize(("args", "message"), [
    (["--wait", "-1"], "--wait"),
    (["--wait", "nan"], "--wait"),
    (["--lock-ttl", "0"], "--lock-ttl"),
    (["--lock-ttl", "nan"], "--lock-ttl"),
])
def test_lock_options_are_checked_before_anything_is_touched(tmp_path: Path, args: list[str], message: str) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('name = "t"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    line = one_line(run("apply", plan, "--cluster", cluster, *args))
    assert message in line or "plan" in line  # the plan file itself is bad too: either may be named first


@pytest.mark.parametrize(("ttl", "message"), [("0", "lock_ttl: 0 must be at least 1"),
                                              ("nan", "lock_ttl: nan is not a finite number")])
def test_a_bad_lock_ttl_in_the_cluster_file_is_one_line(tmp_path: Path, ttl: str, message: str) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'name = "t"\nlock_ttl = {ttl}\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    assert message in one_line(run("status", "--cluster", cluster))


def test_an_unknown_coordination_scheme_in_the_cluster_file_is_one_line(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('name = "t"\ncoordination = "redis2://x"\n[[hosts]]\nname = "h0"\nuri = "test:///default"\n')
    assert "coordination: 'redis2://x' has no known coordination scheme" in one_line(run("status", "--cluster",
                                                                                            cluster))


def test_an_unknown_coordination_scheme_is_refused_even_in_a_dry_run(tmp_path: Path) -> None:
    req = tmp_path / "web.toml"
    req.write_text('name = "web"\nvms = 1\nvcpus = 1\nmemory = "128MiB"\ncpu_cores = 0.5\n')
    line = one_line(run("place", req, "--cluster", tmp_path / "none.toml", "--coordination", "zz://x"))
    assert "--coordination: 'zz://x' has no known coordination scheme" in line
