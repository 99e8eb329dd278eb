"""What a measured or built run records beside its figures (the command, the machine, the date), and the
aligned text tables the runs print. Shared by benchmarks/ (into benchmarks/results/) and the pipelines (into
their own output directories)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

from worldloop.common.checkpoint import atomic_write_text

# Which CPU a figure ran on: two 2-core hosts trained the world model ~3x apart, and the JSONs, naming no CPU,
# could not tell them apart (docs/experiments.md, 2026-11-28). The vector extensions kept are the ones CPU
# kernels dispatch on.
VECTOR_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> dict:
    """{cpu_model, cpu_extensions} read from a Linux cpuinfo file (the first processor's entry);
    each is None where the file or the field is missing (macOS, Windows, some ARM kernels)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return {
        "cpu_model": fields.get("model name") or None,
        "cpu_extensions": [f for f in VECTOR_EXTENSIONS if f in flags] if flags else None,
    }


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def run_record(name: str, figures: dict, command: str | None = None) -> dict:
    """{name, command, machine, date, figures}; `command` defaults to how this process was started.
    The name's key is `benchmark` (the committed results use it)."""
    return {
        "benchmark": name,
        "command": command or " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "figures": figures,
    }


def write_run_record(path: str | Path, name: str, figures: dict, command: str | None = None) -> Path:
    """Write `run_record(...)` as JSON to `path` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(run_record(name, figures, command), indent=2, sort_keys=False) + "\n")
    return path


def print_table(rows: list[dict], title: str | None = None) -> None:
    """Print a list of dicts as an aligned text table."""
    if title:
        print(title)
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0])
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)
