"""The embodiment specs: each arm's joints and their limits, declared once, and a registry by name.

Everything that must respect the robot reads its limits from here: the MuJoCo model (joint ranges and
actuator limits are written from this spec), the scripted experts, the real-time runtime's safety layer,
the imagination env and the world model's executability reward. Configs name an arm with
`embodiment: <name>` (see `EMBODIMENTS`), resolved by `embodiment_by_name`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class EmbodimentSpec:
    name: str
    joint_names: tuple[str, ...]
    position_lower: tuple[float, ...]  # rad
    position_upper: tuple[float, ...]  # rad
    velocity_limit: tuple[float, ...]  # rad/s, symmetric
    acceleration_limit: tuple[float, ...]  # rad/s^2, symmetric
    fps: int  # rate of observations and policy actions in datasets

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        for field in ("position_lower", "position_upper", "velocity_limit", "acceleration_limit"):
            if len(getattr(self, field)) != n:
                raise ValueError(
                    f"EmbodimentSpec {self.name!r}: {field} has {len(getattr(self, field))} entries, "
                    f"expected one per joint ({n})"
                )
        if any(lo >= hi for lo, hi in zip(self.position_lower, self.position_upper)):
            raise ValueError(f"EmbodimentSpec {self.name!r}: position_lower must be below position_upper")

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
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EmbodimentSpec:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


# The tabletop arm of our MuJoCo suite: base yaw, shoulder, elbow, wrist pitch; absolute joint-position
# targets like the SO-101. The sim's MJCF is generated from these numbers.
TABLETOP_ARM = EmbodimentSpec(
    name="worldloop_arm4",
    joint_names=("base_yaw", "shoulder_pitch", "elbow_pitch", "wrist_pitch"),
    position_lower=(-1.8, -0.6, -0.2, -1.6),
    position_upper=(1.8, 1.4, 2.4, 1.6),
    velocity_limit=(2.0, 2.0, 2.5, 3.0),
    acceleration_limit=(12.0, 12.0, 15.0, 20.0),
    fps=10,
)


# SO-100/SO-101 follower in LeRobot's degree mode (`so101_follower` with use_degrees=true: body joints in
# degrees, gripper 0-100), the units its datasets record. Conservative starting limits: widen them only
# after checking the calibrated range of your arm.
SO101_ARM = EmbodimentSpec(
    name="so101_follower",
    joint_names=("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"),
    position_lower=(-110.0, -100.0, -100.0, -100.0, -150.0, 0.0),
    position_upper=(110.0, 100.0, 100.0, 100.0, 150.0, 100.0),
    velocity_limit=(120.0, 120.0, 120.0, 150.0, 180.0, 200.0),
    acceleration_limit=(600.0, 600.0, 600.0, 800.0, 900.0, 1000.0),
    fps=30,
)

EMBODIMENTS: dict[str, EmbodimentSpec] = {spec.name: spec for spec in (TABLETOP_ARM, SO101_ARM)}


def embodiment_by_name(name: str) -> EmbodimentSpec:
    """The registered spec called `name` (an `embodiment:` config value)."""
    spec = EMBODIMENTS.get(name)
    if spec is None:
        raise ValueError(
            f"embodiment={name!r} is not a known arm; expected one of {sorted(EMBODIMENTS)} "
            "(add an EmbodimentSpec to common/embodiment.py for another robot)"
        )
    return spec
