"""What every benchmark writes: its figures with the command, the machine and the date."""

from __future__ import annotations

import json
from pathlib import Path

from worldloop.common.run_record import run_record

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, figures: dict, command: str | None = None) -> Path:
    """Write benchmarks/results/<name>.json; `command` defaults to how this process was started."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(run_record(name, figures, command), indent=2, sort_keys=False) + "\n")
    return path
