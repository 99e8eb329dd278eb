"""The pipelines are installed with the wheel, so they write their summaries into their own output
directories (never benchmarks/results/) and import nothing from benchmarks/; each runs as
`python -m worldloop.pipelines.<name>`."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

from worldloop.common.run_record import cpu_model, write_run_record

PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"


def test_run_record_has_command_machine_date_and_leaves_no_temporary_file(tmp_path):
    path = write_run_record(tmp_path / "out" / "summary.json", "policy_zoo", {"count": 3}, "python -m x")
    record = json.loads(path.read_text())
    assert (record["benchmark"], record["command"], record["figures"]) == (
        "policy_zoo",
        "python -m x",
        {"count": 3},
    )
    assert record["machine"]["cpu_count"] and record["date"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json"]


def test_cpu_model_reads_the_first_processor_and_names_its_vector_extensions(tmp_path):
    entry = "processor\t: {}\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2445.406\nflags\t\t: fpu sse avx2 fma avx512f\n"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(entry.format(0) + "\n" + entry.format(1).replace("AMD EPYC", "other"))
    assert cpu_model(cpuinfo) == {
        "cpu_model": "AMD EPYC",
        "cpu_extensions": ["avx2", "avx512f"],
    }
    assert cpu_model(tmp_path / "missing") == {"cpu_model": None, "cpu_extensions": None}


@pytest.mark.parametrize("path", sorted(PIPELINES.glob("*.py")), ids=lambda p: p.stem)
def test_pipelines_import_nothing_from_benchmarks(path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        assert not any(n.split(".")[0] == "benchmarks" for n in names), f"{path.name} imports {names}"


@pytest.mark.parametrize("name", ["rl_setting", "policy_zoo"])
def test_builders_run_as_modules(name):
    assert callable(importlib.import_module(f"worldloop.pipelines.{name}").main)
