"""How long a world model took to train, kept with the model.

`train_world_model.py` writes `<output_dir>/pretrained_model/training.json` at the end of a run: its wall seconds
(training, held-out evals and the calibrations after it), steps, process count, machine, command, and the record
of the model it started from (`init_from`), nested. A recipe's time (two phases, each its own run) then travels
with its model, and a benchmark scoring the model reports it: the time is not left in a log that is lost with
the run's `outputs/` (docs/experiments.md, 2026-11-28). A resumed run counts only its own seconds and says so
(`resumed`), so the total is then a lower bound.
"""

from __future__ import annotations

from pathlib import Path

from worldloop.common.checkpoint import load_json, save_json
from worldloop.common.run_record import run_record

TRAINING_RECORD = "training.json"


def write_training_record(
    pretrained_dir: str | Path,
    seconds: float,
    steps: int,
    processes: int,
    resumed: bool,
    init_from: str | None,
) -> Path:
    """Write the record into `pretrained_dir` (atomically); `init_from`'s own record, where it has one, is
    nested under `init_from.record` (None where it has none, e.g. a model from before records were kept)."""
    earlier = None
    if init_from:
        earlier = {"path": str(init_from), "record": read_training_record(init_from)}
    record = run_record(
        "train_world_model",
        {
            "seconds": seconds,
            "steps": steps,
            "processes": processes,
            "resumed": resumed,
            "init_from": earlier,
        },
    )
    path = Path(pretrained_dir) / TRAINING_RECORD
    save_json(record, path)
    return path


def read_training_record(pretrained_dir: str | Path) -> dict | None:
    """The record in `pretrained_dir`, or None where there is none."""
    path = Path(pretrained_dir) / TRAINING_RECORD
    return load_json(path) if path.is_file() else None


def recipe_time(pretrained_dir: str | Path) -> dict | None:
    """The model's training time over every run behind it, first run first:
    {minutes, phases: [{steps, seconds, processes, resumed, cpu_model, date, command}], complete}. `complete`
    is False where a run was resumed or a model it started from has no record (the minutes are then a lower
    bound). None where the model itself has no record."""
    record = read_training_record(pretrained_dir)
    if record is None:
        return None
    phases, complete = [], True
    while record is not None:
        figures = record["figures"]
        phases.append(
            {
                "steps": figures["steps"],
                "seconds": figures["seconds"],
                "processes": figures["processes"],
                "resumed": figures["resumed"],
                "cpu_model": record["machine"].get("cpu_model"),
                "date": record["date"],
                "command": record["command"],
            }
        )
        complete = complete and not figures["resumed"]
        earlier = figures["init_from"]
        record = earlier["record"] if earlier else None
        if earlier and record is None:
            complete = False
    phases.reverse()
    return {"minutes": sum(p["seconds"] for p in phases) / 60, "phases": phases, "complete": complete}
