"""The wheel puts only `worldloop` (and its dist-info) into site-packages, with every module of every part.

The wheel is built offline from a copy of the repository (no build isolation, so nothing is downloaded and
nothing is written into the checkout).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ["common", "cuda_ext", "data", "pipelines", "real_robot", "rl_finetune", "sim", "vla", "world_model"]
NOT_SHIPPED = {".venv", "outputs", "tests", "benchmarks", "docs", "build", ".git"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for entry in ROOT.iterdir():
        if entry.name in NOT_SHIPPED or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, src / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(entry, src / entry.name)
    out = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    proc = subprocess.run([*cmd, "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("worldloop-*.whl")
    return zipfile.ZipFile(path)


def test_only_worldloop_reaches_site_packages(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"worldloop", next(t for t in tops if t.endswith(".dist-info"))}, sorted(tops)


def test_every_module_of_every_part_is_in_the_wheel(wheel):
    names = set(wheel.namelist())
    expected = {
        "worldloop/" + p.relative_to(ROOT).as_posix()
        for part in PARTS
        if (ROOT / part).is_dir()
        for p in (ROOT / part).rglob("*.py")
    }
    expected |= {f"worldloop/{p.name}" for p in ROOT.glob("*.py")}
    missing = sorted(expected - names)
    assert not missing, f"not in the wheel (list the subpackage in pyproject.toml's packages): {missing}"
    assert "worldloop/sim/assets/tabletop.xml" in names
    # The built-in robots are data the code reads by name; the other configs stay in the repository.
    assert {
        "worldloop/configs/embodiment/worldloop_arm4.yaml",
        "worldloop/configs/embodiment/so101_follower.yaml",
    } <= names
    assert "worldloop/configs/world_model/tiny.yaml" not in names


def test_console_scripts_point_into_worldloop(wheel):
    info = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    lines = wheel.read(info).decode().splitlines()
    scripts = [line for line in lines if line.startswith("worldloop-")]
    assert "worldloop-train-world-model = worldloop.train_world_model:main" in scripts
    assert scripts and all("= worldloop." in line for line in scripts), scripts
