"""Parse a recorded `python <script> --key=value ...` command with the options its script reads today."""

from __future__ import annotations

import dataclasses
import importlib
import shlex
from pathlib import Path

import pytest

from worldloop.common.config import parse_cli

ROOT = Path(__file__).resolve().parents[1]


def _config_class(module):
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == module.__name__
    ]
    return found[0] if len(found) == 1 else None


def parse_command(command: str, where: str):
    """The script's parsed config; `where` names the command's source in failures. Skips a script that reads
    its options with argparse. Run from the repository root (config paths are relative to it)."""
    args = shlex.split(command)
    script = next((a for a in args if a.endswith(".py")), None)
    assert script is not None, f"{where}: command names no script"
    assert (ROOT / script).is_file(), f"{where}: {script} does not exist"
    name = script.removesuffix(".py").replace("/", ".")
    module = importlib.import_module(
        name if "." in name else f"worldloop.{name}"
    )  # root scripts: worldloop.*
    config_class = _config_class(module)
    if config_class is None:
        pytest.skip(f"{script} reads its options with argparse")
    options = args[args.index(script) + 1 :]
    passed_on = getattr(module, "PASSED_ON", None)
    own = [a for a in options if not (passed_on and a.startswith(passed_on))]
    cfg = parse_cli(config_class, own)
    if passed_on:  # rl_in_imagination: the fine-tuning options it passes on, on top of its config file
        from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig

        forwarded = ["--" + a[len(passed_on) :] for a in options if a.startswith(passed_on)]
        parse_cli(FinetunePolicyConfig, ["--config", cfg.finetune_config, *forwarded])
    return cfg
