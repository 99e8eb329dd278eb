"""The config system: YAML + dotted overrides, and clear errors that name the key and the file."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from worldloop.common.config import ConfigError, load_config, parse_cli, save_config


@dataclass
class ModelCfg:
    depth: int = 4
    width: int = 64


@dataclass
class Cfg:
    model: ModelCfg = field(default_factory=ModelCfg)
    lr: float = 1e-3
    name: str = "run"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  depth: 7\nlr: 0.5\n")
    cfg = parse_cli(Cfg, ["--config", str(path), "--model.width=32", "--name", "x"])
    assert cfg == Cfg(model=ModelCfg(depth=7, width=32), lr=0.5, name="x")


def test_a_str_override_that_yaml_reads_as_a_bool_keeps_its_text():
    assert parse_cli(Cfg, ["--name=no"]).name == "no"
    assert parse_cli(Cfg, ["--name", "off"]).name == "off"
    assert parse_cli(Cfg, ["--name=yes", "--model.depth=3"]) == Cfg(model=ModelCfg(depth=3), name="yes")


def test_round_trip(tmp_path):
    cfg = Cfg(model=ModelCfg(depth=2), lr=0.25)
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(Cfg, tmp_path / "config.yaml") == cfg


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model.dept=3"], "unknown option --model.dept"),
        (["--model.depth=abc"], "model.depth"),
        (["stray"], "unexpected argument 'stray'"),
        (["--config", "/nonexistent.yaml"], "/nonexistent.yaml does not exist"),
    ],
)
def test_bad_overrides_name_the_key(args, message):
    with pytest.raises(ConfigError, match=message):
        parse_cli(Cfg, args)


@pytest.mark.parametrize(
    "text, message",
    [
        ("model:\n  wdth: 3\n", "unknown key 'model.wdth'"),
        ("model:\n  depth: seven\n", "model.depth"),
        ("- 1\n- 2\n", "expected a mapping"),
    ],
)
def test_bad_yaml_names_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as e:
        parse_cli(Cfg, ["--config", str(path)])
    assert str(path) in str(e.value)


@dataclass
class WithFactory:
    model: ModelCfg = field(default_factory=lambda: ModelCfg(depth=9))


def test_nested_config_built_by_a_lambda_takes_dotted_overrides(tmp_path):
    assert parse_cli(WithFactory, []) == WithFactory()
    assert parse_cli(WithFactory, ["--model.width=8"]).model.width == 8
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  widht: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'model.widht'"):
        parse_cli(WithFactory, ["--config", str(path)])
