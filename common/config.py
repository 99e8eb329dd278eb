"""One config system for every entry script: dataclasses + YAML + dotted CLI overrides (draccus, as LeRobot).

    cfg = parse_cli(TrainWorldModelConfig)          # reads sys.argv
    python train_world_model.py --config configs/world_model/tiny.yaml --train.steps=2000 --model.depth=4

A wrong key or a value of the wrong type is a `ConfigError` that names the key (and the file).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import draccus
import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or command-line override that does not fit the config dataclass."""


def _choices(cls: type) -> dict[str, type]:
    """The registered subclasses of a draccus choice type (`--robot.type=so101_follower`), else {}."""
    if isinstance(cls, type) and issubclass(cls, draccus.ChoiceRegistry):
        return dict(cls.get_known_choices())
    return {}


def _known_keys(cls: type, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        keys.add(name)
        sub = _field_class(cls, f)
        if sub is None:
            continue
        keys |= _known_keys(sub, name + ".")
        choices = _choices(sub)
        if choices:  # any registered choice may be selected with `.type`; draccus checks its fields
            keys.add(name + ".type")
            for choice in choices.values():
                keys |= _known_keys(choice, name + ".")
    return keys


def _field_hint(cls: type, dotted: str) -> object:
    """The annotation of the field a dotted key names (`train.mixed_precision` -> str), None if not resolved."""
    *parents, name = dotted.split(".")
    owner: type | None = cls
    for part in parents:
        f = {f.name: f for f in dataclasses.fields(owner)}.get(part)
        owner = _field_class(owner, f) if f is not None else None
        if owner is None:
            return None
    try:
        return typing.get_type_hints(owner).get(name)
    except (NameError, TypeError):
        return None


def _keep_text(cls: type, key: str, value: str) -> str:
    """`value` quoted where the field is a str and YAML would read it as a bool (`no`, `off`, `yes`): draccus
    reads override values as YAML, and `--train.mixed_precision=no` would otherwise hold 'False'."""
    if _field_hint(cls, key) is str and isinstance(yaml.safe_load(value or "''"), bool):
        return f"'{value}'"
    return value


def _check_yaml_keys(cls: type, data: dict, path: Path, prefix: str = "") -> None:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(
                f"{path}: unknown key '{prefix}{key}'; {cls.__name__} has: {', '.join(sorted(fields))}"
            )
        ftype = _field_class(cls, fields[key])
        choices = _choices(ftype) if ftype is not None else {}
        if choices and not isinstance(value, dict):
            raise ConfigError(
                f"{path}: {prefix}{key}={value!r}: {prefix}{key} is a choice, a mapping with a type: "
                f"{{type: {sorted(choices)[0]}, ...}}; its types are {', '.join(sorted(choices))}"
            )
        if ftype is not None and isinstance(value, dict):
            if "type" in value and choices:
                if value["type"] not in choices:
                    raise ConfigError(
                        f"{path}: {prefix}{key}.type={value['type']!r} is not one of {', '.join(sorted(choices))}"
                    )
                ftype, value = choices[value["type"]], {k: v for k, v in value.items() if k != "type"}
            _check_yaml_keys(ftype, value, path, f"{prefix}{key}.")


def _field_class(owner: type, f: dataclasses.Field) -> type | None:
    """The dataclass type of a nested config field, if it is one (string annotations resolved)."""
    try:
        hint = typing.get_type_hints(owner).get(f.name, f.type)
    except (NameError, TypeError):
        hint = f.type
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if f.default_factory is not dataclasses.MISSING:
        if isinstance(f.default_factory, type):
            return f.default_factory if dataclasses.is_dataclass(f.default_factory) else None
        value = f.default_factory()  # e.g. `lambda: SimEvalConfig(videos=0)`
        return type(value) if dataclasses.is_dataclass(value) else None
    if f.default is not dataclasses.MISSING and dataclasses.is_dataclass(f.default):
        return type(f.default)
    return None


def _split_config_flag(args: Sequence[str]) -> tuple[str | None, list[str]]:
    rest: list[str] = []
    config_path = None
    it = iter(args)
    for a in it:
        if a in ("--config", "--config_path"):
            config_path = next(it, None)
            if config_path is None:
                raise ConfigError(f"{a} needs a path to a YAML file")
        elif a.startswith(("--config=", "--config_path=")):
            config_path = a.split("=", 1)[1]
        else:
            rest.append(a)
    return config_path, rest


def parse_cli(config_class: type[T], args: Sequence[str] | None = None) -> T:
    """Build `config_class` from an optional `--config FILE.yaml` and dotted `--a.b=value` overrides."""
    args = list(sys.argv[1:] if args is None else args)
    config_path, rest = _split_config_flag(args)
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path}: expected a mapping of config keys at the top level, got {type(data).__name__}"
            )
        _check_yaml_keys(config_class, data, path)
    known = _known_keys(config_class)
    choice_keys = {k.removesuffix(".type") for k in known if k.endswith(".type")}
    expects_value = False
    key, overrides = "", []
    for a in rest:
        if a in ("-h", "--help"):
            overrides.append(a)
            continue
        if not a.startswith("--"):
            if not expects_value:
                raise ConfigError(f"unexpected argument {a!r}; overrides look like --key.subkey=value")
            expects_value = False
            overrides.append(_keep_text(config_class, key, a))
            continue
        key, eq, value = a[2:].partition("=")
        expects_value = not eq
        overrides.append(f"--{key}={_keep_text(config_class, key, value)}" if eq else a)
        if key not in known:
            raise ConfigError(f"unknown option --{key} for {config_class.__name__}")
        if key in choice_keys:
            raise ConfigError(
                f"--{key} is a choice: select it with --{key}.type=<name>, then --{key}.<field>=..."
            )
    try:
        return draccus.parse(config_class, config_path=config_path, args=overrides, exit_on_error=False)
    except (
        argparse.ArgumentError,
        draccus.ParsingError,
        draccus.utils.DecodingError,
        TypeError,
        ValueError,
    ) as e:
        where = f"{config_path}: " if config_path else ""
        # draccus reports a dataclass whose __post_init__ refused a value as "Couldn't instantiate class
        # X"; the refusal (which field, what was expected) is the error it wraps.
        cause = e.__cause__ or e.__context__
        detail = (
            f" ({cause})" if isinstance(e, draccus.ParsingError) and isinstance(cause, ValueError) else ""
        )
        raise ConfigError(f"{where}{e}{detail}") from e


def load_config(config_class: type[T], path: str | Path) -> T:
    """Read a config YAML written by `save_config` (e.g. a checkpoint's config.yaml)."""
    return parse_cli(config_class, ["--config", str(path)])


def save_config(cfg, path: str | Path) -> None:
    with open(path, "w") as f:
        draccus.dump(cfg, f)


def config_differences(a, b, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs of one dataclass (nested ones walked)."""
    out = []
    for f in dataclasses.fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(va) and type(va) is type(vb):
            out += config_differences(va, vb, f"{prefix}{f.name}.")
        elif va != vb:
            out.append(f"{prefix}{f.name}")
    return out
