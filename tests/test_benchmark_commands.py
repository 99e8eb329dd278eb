"""Every current benchmark result (benchmarks/results/; the history in docs/results/ is not checked) names
the command that reproduces it: that command must still parse with today's benchmark options (a renamed or
dropped option, or a scratch config file, breaks it)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shlex
from pathlib import Path

import pytest

from worldloop.common.config import parse_cli

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


def _config_class(module):
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == module.__name__
    ]
    return found[0] if len(found) == 1 else None


@pytest.mark.parametrize("result", RESULTS, ids=[p.stem for p in RESULTS])
def test_recorded_command_parses(result, monkeypatch):
    args = shlex.split(json.loads(result.read_text())["command"])
    script = next((a for a in args if a.endswith(".py")), None)
    assert script is not None, f"{result.name}: command names no script"
    assert (ROOT / script).is_file(), f"{result.name}: {script} does not exist"
    name = script.removesuffix(".py").replace("/", ".")
    module = importlib.import_module(
        name if "." in name else f"worldloop.{name}"
    )  # root scripts: worldloop.*
    config_class = _config_class(module)
    if config_class is None:
        pytest.skip(f"{script} reads its options with argparse")
    options = args[args.index(script) + 1 :]
    monkeypatch.chdir(ROOT)
    passed_on = getattr(module, "PASSED_ON", None)
    own = [a for a in options if not (passed_on and a.startswith(passed_on))]
    cfg = parse_cli(config_class, own)
    if passed_on:  # rl_in_imagination: the fine-tuning options it passes on, on top of its config file
        from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig

        forwarded = ["--" + a[len(passed_on) :] for a in options if a.startswith(passed_on)]
        parse_cli(FinetunePolicyConfig, ["--config", cfg.finetune_config, *forwarded])
