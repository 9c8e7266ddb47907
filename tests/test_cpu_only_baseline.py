"""CPU-only instances give bit for bit what they gave before the placing algorithms learned the resource vector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cpu_only_baseline import baseline

PINNED = Path(__file__).parent / "data" / "cpu_only_baseline.json"


@pytest.mark.slow
def test_every_algorithm_matches_the_pinned_cpu_only_results() -> None:
    pinned = json.loads(PINNED.read_text())
    now = json.loads(json.dumps(baseline(), sort_keys=True))
    assert now.keys() == pinned.keys()
    for name in pinned:
        for algo in pinned[name]:
            assert now[name][algo] == pinned[name][algo], f"{name}: {algo} changed"
