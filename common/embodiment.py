"""The embodiment spec: a robot's joints and their limits, as data.

A spec is a YAML file (`configs/embodiment/<name>.yaml`: the built-in tabletop arm and the SO-101 are two
such files), or derived from a LeRobot dataset (`worldloop.data.embodiment`, `--embodiment=from_dataset`).
A world model's checkpoint stores the spec it was trained for (`embodiment.yaml` beside its config), and
every later stage reads it from there. Everything that must respect the robot reads its limits from a spec:
the MuJoCo model (joint ranges and actuator limits are written from it), the scripted experts, the
real-time runtime's safety layer, the imagination env and the world model's executability reward.

    spec = load_embodiment("so101_follower")                    # a built-in file, by name
    spec = load_embodiment("configs/embodiment/my_arm.yaml")    # any file
    write_embodiment(spec, "my_arm.yaml")                       # the same format back
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import yaml

from worldloop.common.checkpoint import atomic_write_text

# The built-in specs, one YAML file per robot, found by name (`embodiment_by_name`).
EMBODIMENT_DIR = Path(__file__).resolve().parents[1] / "configs" / "embodiment"
_LIMIT_FIELDS = ("position_lower", "position_upper", "velocity_limit", "acceleration_limit")


@dataclass(frozen=True)
class EmbodimentSpec:
    """Joint names and limits in the dataset's units (radians, degrees, pixels: whatever it records).

    Actions are absolute joint-position targets, one per joint, in the joints' order: `action_names` name
    the action dimensions (the dataset's `action` feature), `joint_names` the state's.
    """

    name: str
    joint_names: tuple[str, ...]
    position_lower: tuple[float, ...]
    position_upper: tuple[float, ...]
    velocity_limit: tuple[float, ...]  # units/s, symmetric
    acceleration_limit: tuple[float, ...]  # units/s^2, symmetric
    fps: int  # rate of observations and policy actions in datasets
    action_names: tuple[str, ...] = ()  # () -> the joint names

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        if not self.name:
            raise ValueError("EmbodimentSpec: name is empty")
        if n == 0:
            raise ValueError(f"EmbodimentSpec {self.name!r}: joint_names is empty")
        if not self.action_names:
            object.__setattr__(self, "action_names", tuple(self.joint_names))
        for key in ("joint_names", "action_names"):
            names = getattr(self, key)
            if len(set(names)) != len(names) or not all(isinstance(x, str) and x for x in names):
                raise ValueError(f"EmbodimentSpec {self.name!r}: {key} must be distinct non-empty strings")
        for key in ("action_names", *_LIMIT_FIELDS):
            if len(getattr(self, key)) != n:
                raise ValueError(
                    f"EmbodimentSpec {self.name!r}: {key} has {len(getattr(self, key))} entries, "
                    f"expected one per joint ({n})"
                )
        for key in _LIMIT_FIELDS:
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in getattr(self, key)):
                raise ValueError(f"EmbodimentSpec {self.name!r}: {key} must hold finite numbers")
        if any(lo >= hi for lo, hi in zip(self.position_lower, self.position_upper)):
            raise ValueError(f"EmbodimentSpec {self.name!r}: position_lower must be below position_upper")
        for key in ("velocity_limit", "acceleration_limit"):
            if any(v <= 0 for v in getattr(self, key)):
                raise ValueError(f"EmbodimentSpec {self.name!r}: {key} must be positive")
        if not isinstance(self.fps, int) or isinstance(self.fps, bool) or self.fps < 1:
            raise ValueError(
                f"EmbodimentSpec {self.name!r}: fps must be a positive integer, got {self.fps!r}"
            )

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    def lower(self) -> np.ndarray:
        return np.asarray(self.position_lower, dtype=np.float64)

    def upper(self) -> np.ndarray:
        return np.asarray(self.position_upper, dtype=np.float64)

    def max_velocity(self) -> np.ndarray:
        return np.asarray(self.velocity_limit, dtype=np.float64)

    def max_acceleration(self) -> np.ndarray:
        return np.asarray(self.acceleration_limit, dtype=np.float64)

    def clip_target(self, q) -> np.ndarray:
        """A commanded joint-position target, checked (shape, finite) and clipped to the position limits."""
        q = np.asarray(q, dtype=np.float64)
        if q.shape != (self.num_joints,):
            raise ValueError(f"joint target has shape {q.shape}, expected ({self.num_joints},)")
        if not np.all(np.isfinite(q)):
            raise ValueError(f"joint target must be finite, got {q}")
        return np.clip(q, self.lower(), self.upper())

    def to_dict(self) -> dict:
        """Plain YAML/JSON values (lists, floats): what `write_embodiment` writes."""
        d = asdict(self)
        for key in ("joint_names", "action_names"):
            d[key] = list(d[key])
        for key in _LIMIT_FIELDS:
            d[key] = [float(v) for v in d[key]]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> EmbodimentSpec:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def differences(self, other: EmbodimentSpec) -> list[str]:
        """`field: mine vs other's` for every field that differs (empty when the two are the same robot)."""
        return [
            f"{f.name}: {getattr(self, f.name)!r} vs {getattr(other, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


def parse_embodiment(data, source: str) -> EmbodimentSpec:
    """A spec from the mapping of a YAML file; errors name `source` (the file) and the key."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping of embodiment keys, got {type(data).__name__}")
    known = {f.name for f in fields(EmbodimentSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"{source}: unknown key {unknown[0]!r}; an embodiment has: {', '.join(sorted(known))}"
        )
    required = sorted(f.name for f in fields(EmbodimentSpec) if f.name != "action_names")
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"{source}: key {missing[0]!r} is missing (required: {', '.join(required)})")
    for key in ("joint_names", "action_names", *_LIMIT_FIELDS):
        if key in data and not isinstance(data[key], list):
            raise ValueError(f"{source}: key {key!r} must be a list, got {data[key]!r}")
    for key in _LIMIT_FIELDS:
        bad = [v for v in data[key] if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            raise ValueError(f"{source}: key {key!r} must hold numbers, got {bad[0]!r}")
    values = {k: [float(v) for v in data[k]] if k in _LIMIT_FIELDS else data[k] for k in data}
    try:
        return EmbodimentSpec.from_dict(values)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def load_embodiment_file(path: str | Path) -> EmbodimentSpec:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"embodiment file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from e
    return parse_embodiment(data, str(path))


def write_embodiment(spec: EmbodimentSpec, path: str | Path) -> None:
    atomic_write_text(path, yaml.safe_dump(spec.to_dict(), sort_keys=False))


def known_embodiments() -> list[str]:
    """Names of the built-in specs (the YAML files in `configs/embodiment/`)."""
    return sorted(p.stem for p in EMBODIMENT_DIR.glob("*.yaml"))


@functools.cache
def embodiment_by_name(name: str) -> EmbodimentSpec:
    """The built-in spec `configs/embodiment/<name>.yaml` (the same object on every call)."""
    path = EMBODIMENT_DIR / f"{name}.yaml"
    if not name or "/" in name or not path.is_file():
        raise ValueError(
            f"embodiment={name!r} is not a known arm; expected one of {known_embodiments()} (the files in "
            f"{EMBODIMENT_DIR}), a path to an embodiment YAML file, or from_dataset"
        )
    spec = load_embodiment_file(path)
    if spec.name != name:
        raise ValueError(f"{path}: name is {spec.name!r}, expected {name!r} (the file's name)")
    return spec


def load_embodiment(value: str) -> EmbodimentSpec:
    """An `--embodiment=` value that needs no dataset: a built-in name, or a path to a YAML file."""
    if value.endswith((".yaml", ".yml")) or "/" in value:
        return load_embodiment_file(value)
    return embodiment_by_name(value)


TABLETOP_ARM = embodiment_by_name("worldloop_arm4")
SO101_ARM = embodiment_by_name("so101_follower")
