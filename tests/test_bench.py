"""``vcsched bench``: sizes, skip rules, the machine description, and the command on a tiny size."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.bench import bench_markdown, time_commands
from cli.common import machine_info
from cli.main import cli
from vcsched.errors import InputError, VcschedError
from vcsched.experiments.bench import (
    DEFAULT_CASES,
    WHOLE_PROCESS,
    BenchCase,
    Timing,
    parse_cases,
    row_time_limit,
    run_bench,
    skip_reason,
)


def test_default_sizes_are_the_small_the_papers_large_and_a_thousand_hosts() -> None:
    assert [c.name for c in DEFAULT_CASES] == ["4x12", "64x500", "1000x10000"]


def test_sizes_parse_as_hosts_by_tasks() -> None:
    assert parse_cases("4x12, 64x500") == (BenchCase(4, 12), BenchCase(64, 500))


@pytest.mark.parametrize("text", ["4*12", "0x5", "4x", "", "2x1"])
def test_malformed_or_impossible_sizes_are_rejected(text: str) -> None:
    with pytest.raises(InputError, match=r"--sizes|slack"):
        parse_cases(text)


def test_milp_is_timed_only_on_the_small_size() -> None:
    assert skip_reason("milp", BenchCase(4, 12)) is None
    reason = skip_reason("milp", BenchCase(64, 500))
    assert reason is not None and "12 tasks" in reason


def test_lp_rounding_and_backtracking_stop_at_500_tasks() -> None:
    for algo in ("rrnd", "rrnz", "gb", "sgb"):
        assert skip_reason(algo, BenchCase(64, 500)) is None
        assert skip_reason(algo, BenchCase(1000, 10_000)) is not None


def test_mcb_runs_at_every_size() -> None:
    assert all(skip_reason("mcb8", c) is None for c in DEFAULT_CASES)


def test_median_of_the_runs() -> None:
    assert Timing("a", "4x12", (3.0, 1.0, 2.0), True, 0.5).median_s == 2.0
    assert Timing("a", "4x12", (), False, None, "skipped").median_s is None


def test_machine_info_names_cpu_cores_and_python() -> None:
    info = machine_info()
    assert info.cores >= 1
    assert info.python.count(".") == 2
    assert info.cpu in info.summary() and "MCB kernel" in info.summary()


def test_cli_bench_on_a_tiny_size_writes_markdown_and_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    r = CliRunner().invoke(cli, ["bench", "--repeat", "1", "--sizes", "3x6", "--algorithms", "lpbound",
                                 "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["repeat"] == 1 and doc["machine"]["cores"] >= 1
    (t,) = doc["timings"]
    assert t["algorithm"] == "lpbound" and t["size"] == "3x6" and len(t["runs_s"]) == 1
    assert t["median_s"] == t["runs_s"][0] > 0
    text = out.read_text()
    assert "| lpbound |" in text and "3x6" in text and "cores" in text


def test_markdown_shows_skipped_solvers_with_the_reason() -> None:
    cases = (BenchCase(4, 12), BenchCase(64, 500))
    reason = skip_reason("milp", cases[1])
    assert reason is not None
    timings = [Timing("milp", "4x12", (0.5,), True, 0.7), Timing("milp", "64x500", (), False, None, reason)]
    text = bench_markdown(timings, cases, 1, machine_info())
    row = next(line for line in text.splitlines() if line.startswith("| milp |"))
    assert "0.5 s" in row and "skipped (a)" in row
    assert f"- (a) {reason}" in text


def test_markdown_marks_runs_that_found_no_placement() -> None:
    text = bench_markdown([Timing("sg", "4x12", (0.01,), False, None)], (BenchCase(4, 12),), 1, machine_info())
    assert "0.01 s (none)" in text


@pytest.mark.parametrize("bad", [["--repeat", "0"], ["--sizes", "4y12"], ["--algorithms", "nosuch"],
                                 ["--sizes", "2x1"]])
def test_cli_bad_flags_exit_2_with_one_line(bad: list[str]) -> None:
    r = CliRunner().invoke(cli, ["bench", *bad])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vcsched: error:")


def test_adapt_rows_time_the_heuristic_at_three_budgets(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["bench", "--repeat", "1", "--sizes", "8x30", "--algorithms", "adapt", "--json"])
    assert r.exit_code == 0, r.output
    rows = {t["algorithm"]: t for t in json.loads(r.stdout)["timings"]}
    assert sorted(rows) == ["adapt 0 %", "adapt 10 %", "adapt unlimited", "drain 10 %"]
    assert all(t["size"] == "8x30" and len(t["runs_s"]) == 1 and t["runs_s"][0] > 0 for t in rows.values())
    # a larger budget can only help the minimum yield (the heuristic keeps the best candidate it found)
    assert rows["adapt unlimited"]["min_yield"] >= rows["adapt 0 %"]["min_yield"] - 1e-9


def test_the_adaptation_problem_is_fixed_and_within_its_budget() -> None:
    import math

    from vcsched.experiments.bench import adapt_problem

    a, b = adapt_problem(BenchCase(8, 30), 0.1), adapt_problem(BenchCase(8, 30), 0.1)
    assert (a.current == b.current).all() and a.budget == b.budget > 0
    assert (a.current == -1).any() and (a.current >= 0).any()  # arrivals and running VMs
    assert adapt_problem(BenchCase(8, 30), math.inf).budget > a.budget


# ------------------------------------------------------------------ the timing runs as a library call (no CLI)


def test_run_bench_times_each_algorithm_then_the_adaptation_rows_reporting_progress() -> None:
    calls: list[tuple[int, int, str]] = []
    timings = run_bench((BenchCase(3, 6),), ["lpbound", "mcb8"], repeat=2, adapt=True,
                        on_progress=lambda done, total, what: calls.append((done, total, what)))
    assert [t.algorithm for t in timings] == ["lpbound", "mcb8", "adapt 0 %", "adapt 10 %", "adapt unlimited",
                                              "drain 10 %"]
    assert all(t.case == "3x6" and len(t.runs_s) == 2 and t.skipped is None for t in timings)
    assert calls == [(0, 6, "generating instances"), (0, 6, "lpbound on 3x6"), (1, 6, "mcb8 on 3x6"),
                     (2, 6, "adapt 0 % on 3x6"), (3, 6, "adapt 10 % on 3x6"), (4, 6, "adapt unlimited on 3x6"),
                     (5, 6, "drain 10 % on 3x6"), (6, 6, "done")]


def test_run_bench_gives_a_too_slow_algorithm_a_row_with_the_reason_and_no_runs() -> None:
    (t,) = run_bench((BenchCase(4, 20),), ["milp"], repeat=1)
    assert t.runs_s == () and t.skipped == skip_reason("milp", BenchCase(4, 20)) and not t.feasible


def test_best_runs_at_its_own_budget_unless_its_row_names_one() -> None:
    assert row_time_limit("best", 60.0) is None  # its default budget, not the MILP's minute
    assert row_time_limit("best@0.01", 60.0) == 0.01
    assert row_time_limit("milp", 60.0) == 60.0
    (t,) = run_bench((BenchCase(8, 40),), ["best@0.01"], repeat=2, time_limit=60.0)
    assert t.algorithm == "best@0.01" and t.feasible and len(t.runs_s) == 2
    assert max(t.runs_s) < 1.0


def test_time_commands_runs_each_command_repeat_times_after_an_untimed_run(tmp_path: Path) -> None:
    log = tmp_path / "runs"
    count = [sys.executable, "-c", f"open({str(log)!r}, 'a').write('x')"]
    calls: list[tuple[int, int, str]] = []
    timings = time_commands([("count", count), ("nothing", [sys.executable, "-c", "pass"])], repeat=3,
                            on_progress=lambda done, total, what: calls.append((done, total, what)))
    assert log.read_text() == "x" * 4
    assert [(t.algorithm, t.case, len(t.runs_s), t.feasible) for t in timings] == [
        ("count", WHOLE_PROCESS, 3, True), ("nothing", WHOLE_PROCESS, 3, True)]
    assert all(r > 0 for t in timings for r in t.runs_s)
    assert calls == [(0, 2, "count"), (1, 2, "nothing"), (2, 2, "done")]


def test_a_command_that_fails_is_an_error_not_a_timing() -> None:
    failing = [sys.executable, "-c", "import sys; sys.exit('no such file')"]
    with pytest.raises(VcschedError, match=r"^broken: .* exited with status 1: no such file$"):
        time_commands([("broken", failing)], repeat=1)


def test_cli_bench_times_vcsched_itself_start_to_exit(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    r = CliRunner().invoke(cli, ["bench", "--repeat", "1", "--algorithms", "cli", "--json", "--output", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["timings"] == []
    assert [(s["row"], len(s["runs_s"])) for s in doc["startup"]] == [("cli --help", 1), ("cli solve 64x500", 1)]
    assert all(s["median_s"] > 0 for s in doc["startup"])
    text = out.read_text()
    assert "## Start-up: whole processes" in text and "| cli --help |" in text and "| cli solve 64x500 |" in text


def test_by_default_bench_includes_the_start_up_rows() -> None:
    r = CliRunner().invoke(cli, ["bench", "--help"])
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "[default: all registered, adapt, cli, policies, simulate and hosts]" in text
    assert "DRF within 60 s, PF within 3 times DRF's time" in text


def test_simulate_rows_time_drf_then_pf_against_the_target() -> None:
    from vcsched.simulate.bench import PF_FACTOR, bench, markdown

    seen: list[str] = []
    rows = bench(arrivals=300, warmup=30, on_progress=lambda d, t, desc: seen.append(desc))
    assert [r.name for r in rows] == ["simulate drf", "simulate pf"]
    drf, pf = rows
    assert drf.target_s == 60.0 and pf.target_s == pytest.approx(PF_FACTOR * drf.wall_s)
    assert all(r.arrivals == 300 and r.events >= 2 * 270 and r.wall_s > 0 and r.mean_in_progress > 0 for r in rows)
    assert drf.within_target and {"simulate drf", "simulate pf"} <= set(seen)
    text = markdown(rows)
    assert "| simulate drf | 300 |" in text and "(3 x DRF)" in text
    with pytest.raises(ValueError, match="warm-up"):
        bench(arrivals=10, warmup=10)


def test_cli_bench_simulate_rows_in_json_and_markdown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vcsched.simulate.bench as sim_bench

    small = sim_bench.bench
    monkeypatch.setattr(sim_bench, "bench", lambda on_progress=None: small(200, 20, on_progress))
    out = tmp_path / "bench.md"
    r = CliRunner().invoke(cli, ["bench", "-a", "simulate", "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [(s["policy"], s["arrivals"], s["within_target"]) for s in doc["simulate"]] == [
        ("drf", 200, True), ("pf", 200, doc["simulate"][1]["wall_s"] <= doc["simulate"][1]["target_s"])]
    assert doc["timings"] == [] and "## Simulation" in out.read_text()


def test_the_hosts_rows_time_status_and_place_and_count_libvirt_calls_per_host(tmp_path: Path) -> None:
    from cli.bench import vcsched_command
    from cli.bench_hosts import HSPACE_ROW, _calls, scale_markdown, target_of, time_scale
    from hypervisor.testhosts import write_scale_cluster

    # The rows (16 whole vcsched processes) on one size; the count per VM, which needs a second size, from the
    # in-process count that fills the rows' calls_per_host column, on both schemes.
    got = time_scale(vcsched_command(), 1, hosts=3, vms_per_host=2)
    hspace = [r for r in got if r.command == HSPACE_ROW]  # Ganeti's, when installed (a yardstick, not a dependency)
    got = [r for r in got if r.command != HSPACE_ROW]
    assert [(r.command, r.hosts, r.vms) for r in got] == [("status --sample 0", 3, 6),
                                                          ("place (dry run)", 3, 6),
                                                          ("test driver alone: open + close", 3, 6),
                                                          ("status --sample 0 [sim]", 3, 6),
                                                          ("place (dry run) [sim]", 3, 6),
                                                          ("headroom [sim]", 3, 6),
                                                          ("headroom --failures 1 [sim]", 3, 6),
                                                          ("simulated libvirt alone: read the node files", 3, 6)]
    assert all(r.wall_median > 0 and r.cpu_median > 0 for r in got)
    assert len(hspace) == (shutil.which("hspace") is not None) and all(not r.unfinished for r in hspace)
    assert [target_of(r.command) for r in got] == [1.0, 1.0, None, 1.0, 1.0, 2.0, 5.0, None]
    # The simulated libvirt (sim:///) answers the same calls as the test driver: the same count per host for
    # status.  place's dry run runs --apply's whole-plan check, but only reads: libvirt's define-time validation of
    # each new VM's domain XML (a define and an undefine) is left to --apply, so the dry run makes the calls status
    # makes, on the simulated hosts as on the test driver (where the check stops at the first cap step, exit 1).
    assert got[3].calls_per_host == got[0].calls_per_host
    assert got[4].calls_per_host == got[1].calls_per_host
    assert "| headroom --failures 1 [sim] | 3 | 6 |" in "\n".join(scale_markdown(got, 1))
    four = {scheme: _calls(["status", "--cluster", str(write_scale_cluster(tmp_path / scheme, 3, 4, scheme=scheme)
                                                        .cluster_file), "--sample", "0", "--json"], 3)
            for scheme in ("test", "sim")}
    assert four["sim"] == four["test"]
    status = {2: got[0].calls_per_host, 4: four["test"]}
    # Per host: the open and the close, the host's type, info and capabilities (its UUID: who it is), one
    # getAllDomainStats, and one XML read per VM (libvirt has no bulk call for a domain's XML, where vcsched's
    # metadata lives), and one jobStats per active VM (status lists the migrations in flight; libvirt has no bulk
    # call for jobs either): two more VMs, four more calls.
    assert status[2] == (10, 10) and status[4] == (14, 14)
    assert "| status --sample 0 | 3 | 6 |" in "\n".join(scale_markdown(got, 1))


def test_the_ganeti_text_file_holds_the_same_cluster() -> None:
    """hspace's copy of the scale cluster: every node with its memory free after its instances, every instance."""
    from cli.bench_hosts import ganeti_text

    sections = ganeti_text(3, 2).split("\n\n")
    groups, nodes, instances = (s.splitlines() for s in sections[:3])
    assert len(groups) == 1 and len(nodes) == 3 and len(instances) == 6
    assert [n.split("|")[:4] for n in nodes] == [[f"h{h}", "32768", "0", str(32768 - 2 * 512)] for h in range(3)]
    assert [i.split("|")[6] for i in instances] == ["h0", "h0", "h1", "h1", "h2", "h2"]
