"""What every benchmark writes: its figures with the command, the machine and the date."""

from __future__ import annotations

from pathlib import Path

from worldloop.common.run_record import write_run_record

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, figures: dict, command: str | None = None) -> Path:
    """Write benchmarks/results/<name>.json (atomically); `command` defaults to how this process was started."""
    if not name or Path(name).name != name:
        raise ValueError(
            f"result name {name!r}: expected a plain file name (it becomes benchmarks/results/<name>.json)"
        )
    return write_run_record(RESULTS / f"{name}.json", name, figures, command)
