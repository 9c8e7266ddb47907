"""What a whole ``status`` or ``place`` process loads: at 1,000 hosts its start-up is a third of its
time (docs/benchmarks.md), so the modules it never needs stay out of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.sax import saxutils

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypervisor import xmltext
from hypervisor.testhosts import write_scale_cluster

#: scipy (~0.2 s with what it pulls in: numpy.testing, numpy.f2py) and xml.sax.saxutils (urllib.request,
#: http.client, email, ssl: ~15 ms), which neither command needs on a CPU-only cluster under `yield`.  (headroom
#: may: its N+1 question can take the average-yield LP of parallel jobs, vcsched/yields.py.)
NEVER_LOADED = ("scipy", "xml.sax.saxutils", "urllib.request", "http.client")


@pytest.mark.parametrize("command", ["status", "place"])
def test_a_whole_command_on_a_cpu_only_cluster_loads_neither_scipy_nor_urllib(command: str, tmp_path: Path) -> None:
    scale = write_scale_cluster(tmp_path, 3, 2, scheme="sim")
    args = {"status": ["status", "--sample", "0"], "place": ["place", str(scale.request_file)]}[command]
    code = ("import sys; from cli.main import cli\n"
            f"try: cli({[*args, '--cluster', str(scale.cluster_file), '--json']!r}, standalone_mode=False)\n"
            "finally: print('LOADED', [m for m in " + repr(NEVER_LOADED) + " if m in sys.modules], file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LOADED []" in done.stderr, done.stderr[-2000:]


@given(st.text(alphabet=st.sampled_from("ab &<>\"'\n\r\t\u00fc\u20ac"), max_size=12))
def test_xml_text_is_written_as_saxutils_writes_it(text: str) -> None:
    assert xmltext.escape(text) == saxutils.escape(text)
    assert xmltext.quoteattr(text) == saxutils.quoteattr(text)


@pytest.mark.parametrize(("args", "gen0"), [(["status", "--json"], 250_000), (["place", "r.toml"], 250_000),
                                            (["run", "--interval", "5"], 50_000), (["top"], 50_000), ([], 250_000)])
def test_a_command_collects_cycles_rarely_and_a_watching_one_more_often(args: list[str], gen0: int) -> None:
    """At 250,000 a status or place of 10,000 VMs runs no collection (two of 0.035 s at 50,000); run and top,
    which watch until stopped, keep a lower bound on what their cycles hold."""
    from cli.main import gc_thresholds

    assert gc_thresholds(args)[0] == gen0
