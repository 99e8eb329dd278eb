"""Every current benchmark result (benchmarks/results/; the history in docs/results/ is not checked) names
the command that reproduces it: that command must still parse with today's benchmark options (a renamed or
dropped option, or a scratch config file, breaks it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from command_fixtures import parse_command

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


@pytest.mark.parametrize("result", RESULTS, ids=[p.stem for p in RESULTS])
def test_recorded_command_parses(result, monkeypatch):
    monkeypatch.chdir(ROOT)
    parse_command(json.loads(result.read_text())["command"], result.name)
