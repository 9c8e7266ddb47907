"""Bad input to the simulator: one InputError line from the library, exit 2 and one line from the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from vcsched.errors import InputError
from vcsched.simulate.fluid import Arrival, RunOptions
from vcsched.simulate.scenarios import scenario
from vcsched.simulate.trace import format_trace, parse_trace
from vcsched.simulate.workload import check_stable, workload_from_dict

VCSCHED = [sys.executable, "-m", "cli.main"]


def doc(**classes: Any) -> dict[str, Any]:
    base = {"name": "web", "rate": 1.0, "needs": {"cpu": 0.5, "disk": 0.2}, "vms": 2, "memory": 0.1}
    base.update(classes)
    return {"hosts": [{"name": "h", "cpu": 1, "memory": 1, "capacity": {"disk": 1}, "count": 4}], "classes": [base]}


def test_a_valid_workload_file() -> None:
    w = workload_from_dict(doc())
    assert w.resources == ("cpu", "disk") and w.n_hosts == 4
    assert w.loads() == pytest.approx([1.0 * 1.0 * 2 * 0.5 / 4, 1.0 * 2 * 0.2 / 4])


@pytest.mark.parametrize(("change", "message"), [
    ({"rate": -1.0}, r"classes\[0\].rate: -1.0 must be at least 0"),
    ({"needs": {"cpu": 0.0}}, r"needs nothing"),
    ({"needs": {"cpu": 1.5}}, r"is above 1"),
    ({"needs": {"gpu": 0.5}}, r"needs 'gpu', which no host has"),
    ({"memory": 2.0}, r"is above 1"),
    ({"vms": 0}, r"whole number >= 1"),
    ({"tenant": "nobody"}, r"unknown tenant"),
    ({"work": {"mean": 1, "dist": "pareto"}}, r"not one of exp, det, erlang"),
    ({"phases": [[{"needs": {"cpu": 0.5}, "fraction": 0.5}]], "needs": None}, r"either needs"),
    ({"colour": "red"}, r"unknown field 'colour'"),
])
def test_bad_classes_are_refused_with_the_field_named(change: dict[str, Any], message: str) -> None:
    d = doc(**change)
    if change.get("needs", 1) is None:
        d["classes"][0].pop("needs")
        d["classes"][0]["phases"] = change["phases"]
        message = r"add up to 0.5, not 1"
    with pytest.raises(InputError, match=message):
        workload_from_dict(d)


def test_no_classes_is_refused() -> None:
    with pytest.raises(InputError, match="at least one class"):
        workload_from_dict({"hosts": [{"name": "h"}], "classes": []})


def test_a_load_outside_the_capacity_region_names_the_bound() -> None:
    w = workload_from_dict(doc(rate=5.0))  # cpu load 5 × 2 × 0.5 / 4 = 1.25
    with pytest.raises(InputError, match=r"resource 'cpu' has load 1.25 >= 1.*eq. 10.*never be stable"):
        check_stable(w)
    with pytest.raises(InputError, match="outside the capacity region"):
        scenario("br-fig1a").scaled_to_load(1.0)


def test_run_options_are_checked() -> None:
    with pytest.raises(InputError, match="probability"):
        RunOptions(altruism=1.5).check()
    with pytest.raises(InputError, match="placement"):
        RunOptions(placement="random").check()


W = scenario("br-fig1b")


def test_a_trace_round_trips() -> None:
    arrivals = [Arrival(0.0, 0, 1.5), Arrival(0.5, 1, None), Arrival(0.5, 0, 0.25)]
    assert parse_trace(format_trace(arrivals, W), W) == arrivals


@pytest.mark.parametrize(("text", "message"), [
    ("", r"empty"),
    ("when,class\n0,class1\n", r"line 1: unknown column 'when'"),
    ("time,work\n0,1\n", r"missing column 'class'"),
    ("time,class\n", r"no arrivals"),
    ("time,class\nsoon,class1\n", r"line 2: time 'soon' is not a number"),
    ("time,class\n1,class1\n0.5,class1\n", r"line 3: time 0.5 is before the previous arrival"),
    ("time,class\n-1,class1\n", r"line 2: time -1 is negative"),
    ("time,class\n0,batch\n", r"line 2: unknown class 'batch'"),
    ("time,class,work\n0,class1,0\n", r"line 2: work 0 must be above 0"),
    ("time,class,work\n0,class1\n", r"line 2: 2 fields, expected 3"),
    ("time,class\n0,class1,nan\n", r"3 fields"),
    ("time,class,work\n0,class1,inf\n", r"not a finite number"),
])
def test_malformed_traces_are_refused_with_the_line_named(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_trace(text, W)


def run_cli(*args: str) -> Result:
    """``vcsched simulate ARGS`` in this process: the same command, flags and error mapping as the installed entry
    point (:class:`cli.app.VcschedGroup` turns every error into its one line and exit code), without a new
    interpreter importing numpy, click and rich (~1 CPU-second) for every case.  The process itself, where
    ``python -m cli.main`` exits with that code and writes that line, is checked once below
    (test_the_installed_entry_point_exits_and_prints_as_in_process)."""
    return CliRunner().invoke(cli, ["simulate", *args])


def run_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VCSCHED, "simulate", *args], capture_output=True, text=True, timeout=120)


def test_the_installed_entry_point_exits_and_prints_as_in_process(tmp_path: Path) -> None:
    bad = tmp_path / "w.json"
    bad.write_text(json.dumps(doc(rate=-2.0)))
    for args in (("br-fig1a", "--load", "1.0"), ("br-fig1a", "--alpha", "2"), (str(bad),)):
        process, here = run_process(*args), run_cli(*args)
        assert (process.returncode, process.stderr, process.stdout) == (here.exit_code, here.stderr, here.stdout)
        assert process.returncode == 2 and process.stderr.startswith("vcsched: error: ")
    trace = tmp_path / "t.csv"
    trace.write_text("time,class,work\n0,class1,1\n0.1,class2,\n")
    run = ("br-fig1a", "--trace", str(trace), "--warmup", "0", "-r", "1", "--json")
    process, here = run_process(*run), run_cli(*run)
    assert (process.returncode, here.exit_code) == (0, 0), (process.stderr, here.stderr)

    def result(stdout: str) -> list[dict[str, Any]]:  # the points, less wall_s: it measures the run
        return [{k: v for k, v in p.items() if k != "wall_s"} for p in json.loads(stdout)["points"]]

    assert result(process.stdout) == result(here.stdout)


@pytest.mark.parametrize("args", [
    ("br-fig1a", "--load", "1.0"),
    ("br-fig1a", "--load", "0.5,-0.1"),
    ("br-fig1a", "-p", "fastest"),
    ("nonsense",),
    ("br-tasks", "-p", "asset", "--load", "0.5"),
    ("br-fig1a", "-p", "alpha-fair"),
])
def test_cli_refuses_bad_input_with_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    r = run_cli(*args)
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("vcsched: error: ")


def test_cli_refuses_bad_files_with_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "w.json"
    bad.write_text(json.dumps(doc(rate=-2.0)))
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"hosts": [{"name": "h"}], "classes": []}))
    over = tmp_path / "o.json"
    over.write_text(json.dumps(doc(rate=5.0)))
    trace = tmp_path / "t.csv"
    trace.write_text("time,class\n0,web\nlater,web\n")
    good = tmp_path / "g.json"
    good.write_text(json.dumps(doc()))
    for args, message in (((str(bad),), "rate: -2.0"), ((str(empty),), "at least one class"),
                          ((str(over),), "capacity region"), ((str(good), "--trace", str(trace)), "line 3")):
        r = run_cli(*args)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_cli_json_csv_and_plot(tmp_path: Path) -> None:
    out_csv, out_png = tmp_path / "s.csv", tmp_path / "s.png"
    r = run_cli("br-fig2b", "--load", "0.3,0.6", "-n", "300", "--warmup", "30", "-r", "2", "--json",
                "--csv", str(out_csv), "--plot", str(out_png))
    assert r.exit_code == 0, r.stderr
    doc_ = json.loads(r.stdout)
    assert [(p["policy"], p["load"]) for p in doc_["points"]] == [("drf", 0.3), ("pf", 0.3), ("drf", 0.6),
                                                                   ("pf", 0.6)]
    gamma = doc_["points"][0]["classes"]["class1"]["service_rate"]
    assert 0 < gamma["mean"] <= 1.2 and gamma["n"] == 2 and gamma["ci95"] is not None
    assert out_csv.read_text().startswith("workload,policy,load,class,metric,mean,ci95,replications")
    assert out_png.stat().st_size > 1000


def test_cli_runs_a_trace_and_lists_scenarios(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time,class,work\n0,class1,1\n0.1,class2,\n0.2,class1,0.5\n")
    r = run_cli("br-fig1a", "--trace", str(trace), "--warmup", "0", "-r", "1", "--json")
    assert r.exit_code == 0, r.stderr
    classes = json.loads(r.stdout)["points"][0]["classes"]
    assert classes["class1"]["mean_time"]["n"] == 1
    listed = run_cli("--list")
    assert "br-fig1a" in listed.stdout and "br-tasks" in listed.stdout


def test_cli_exact_shows_the_chain_beside_the_simulation() -> None:
    # Load 0.2: the chain truncates at 16 VCs a class (256 states) where load 0.5 needs 35 (1,225 states, ~5x the
    # CPU); that the chains are right at 0.5 is test_simulate_fluid's.  The policies' and classes' values still
    # differ by more than the tolerance, so a chain shown beside the wrong policy or class is caught.
    r = run_cli("br-fig1b", "--load", "0.2", "-n", "200", "--warmup", "20", "-r", "2", "--exact", "--json")
    assert r.exit_code == 0, r.stderr
    drf, pf = json.loads(r.stdout)["points"]
    assert drf["exact_service_rate"] == pytest.approx([0.798, 0.890], abs=5e-4)
    assert pf["exact_service_rate"] == pytest.approx([0.800, 0.916], abs=5e-4)
    lie = run_cli("br-lie", "--load", "0.5", "-p", "pf", "-n", "100", "--warmup", "10", "-r", "2", "--exact",
                  "--json")
    assert lie.exit_code == 0, lie.stderr
    assert json.loads(lie.stdout)["points"][0]["exact_service_rate"][0] == pytest.approx(0.950, abs=5e-4)


def test_cli_exact_refuses_what_has_no_chain(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time,class,work\n0,class1,1\n")
    for args in (("br-fig1a", "--trace", str(trace), "--exact"), ("br-tasks", "--load", "0.5", "--exact")):
        r = run_cli(*args, "-n", "50", "--warmup", "0", "-r", "1")
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--exact" in r.stderr, r.stderr


def _write_doc(path: Path, change: Any) -> None:
    d = doc()
    change(d)
    path.write_text(json.dumps(d))


BAD_FILES: list[tuple[Any, str]] = [
    ("{hosts: [", "malformed JSON at line 1 column 2"),
    ([1, 2], "workload: expected an object, got list"),
    (lambda d: d["hosts"][0].update(cpu=-1), "hosts[0].cpu: -1 must be at least 0"),
    (lambda d: d["hosts"][0].update(count=0), "hosts[0].count: expected a whole number >= 1, got 0"),
    (lambda d: d.update(colour="red"), "unknown field 'colour'"),
    (lambda d: d["classes"].append(dict(d["classes"][0])), "classes[1].name: duplicate name 'web'"),
    (lambda d: d["classes"][0].update(work={"mean": -1}), "classes[0].work.mean: -1 must be above 0"),
    (lambda d: d["classes"][0].update(weight=0), "classes[0].weight: 0 must be above 0"),
    (lambda d: d["classes"][0].update(needs={"cpu": 1.5}), "classes[0].needs.cpu"),
    (lambda d: d.update(classes="web"), "classes: expected a list, got str"),
]


@pytest.mark.parametrize(("content", "message"), BAD_FILES)
def test_cli_names_the_field_and_value_of_a_bad_workload_file(tmp_path: Path, content: Any, message: str) -> None:
    f = tmp_path / "w.json"
    if isinstance(content, str):
        f.write_text(content)
    elif isinstance(content, list):
        f.write_text(json.dumps(content))
    else:
        _write_doc(f, content)
    r = run_cli(str(f))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"vcsched: error: workload {f}: ") and message in r.stderr, r.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("time,class\n0,db\n", "line 2: unknown class 'db'"),
    ("time,class\n1,web\n0,web\n", "line 3: time 0 is before the previous arrival (1)"),
    ("time,class,work\n0,web,-2\n", "line 2: work -2 must be above 0"),
    (None, "no such file"),
])
def test_cli_names_the_line_and_value_of_a_bad_trace(tmp_path: Path, text: str | None, message: str) -> None:
    good, trace = tmp_path / "g.json", tmp_path / "t.csv"
    good.write_text(json.dumps(doc()))
    if text is not None:
        trace.write_text(text)
    r = run_cli(str(good), "--trace", str(trace))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"trace {trace}" in r.stderr and message in r.stderr, r.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("-n", "0"), "'-n' / '--arrivals': 0"),
    (("--warmup", "-1"), "'--warmup': -1"),
    (("-r", "0"), "'--replications': 0"),
    (("--altruism", "1.5"), "'--altruism': 1.5"),
    (("--leftover", "bogus"), "'--leftover': 'bogus'"),
    (("--late-tolerance", "-0.1"), "'--late-tolerance': -0.1"),
    (("--placement", "random"), "'--placement': 'random'"),
    (("--migration-budget", "lots"), "--migration-budget: 'lots' is not a byte size"),
    (("--load", "abc"), "--load: 'abc' is not a number"),
    (("--load", "0"), "--load: 0.0 must be a number above 0"),
    (("--alpha", "2"), "--alpha: only the alpha-fair policy"),
    (("--seed", "-1"), "'--seed': -1"),
    (("--load", "0.5", "--csv", "/nonexistent-dir/x.csv"), "--csv /nonexistent-dir/x.csv: cannot write"),
    (("--plot", "x.png"), "--plot: needs --load"),
])
def test_cli_names_the_flag_and_value_it_refuses(args: tuple[str, ...], message: str) -> None:
    r = run_cli("br-fig1a", *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
