"""The tabletop MuJoCo model, compiled from `assets/tabletop.xml` with the arm's limits from the embodiment.

Joint ranges and position-actuator control ranges are written from `EmbodimentSpec` here, so the MJCF and
the spec cannot disagree. Velocity limits have no MJCF equivalent for position actuators: the env's
set-point rate limiter (`sim/arm_control.py`) enforces them.
"""

from __future__ import annotations

from pathlib import Path

import mujoco

from worldloop.common.embodiment import TABLETOP_ARM, EmbodimentSpec

ASSET_PATH = Path(__file__).parent / "assets" / "tabletop.xml"

CUBE_COLORS = ("red", "blue", "yellow")
ZONE_COLORS = ("green", "purple")
CUBE_HALF_SIZE = 0.025  # m; must match the `cube` default class in the MJCF (checked in build_model)
ZONE_HALF_SIZE = 0.05  # m; must match the `zone` default class
TIP_SITE = "tip"
FINGER_GEOM = "finger"


def build_spec(embodiment: EmbodimentSpec = TABLETOP_ARM, asset_path: Path = ASSET_PATH) -> mujoco.MjSpec:
    """The MJCF as an editable spec with the embodiment's limits written in (other backends start here)."""
    spec = mujoco.MjSpec.from_file(str(asset_path))
    for name, lo, hi in zip(embodiment.joint_names, embodiment.position_lower, embodiment.position_upper):
        joint = spec.joint(name)
        actuator = spec.actuator(name)
        if joint is None or actuator is None:
            raise ValueError(
                f"{asset_path}: embodiment {embodiment.name!r} names joint {name!r}, but the MJCF has no "
                f"joint and position actuator called {name!r}"
            )
        joint.range = [lo, hi]
        joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
        actuator.ctrlrange = [lo, hi]
        actuator.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
    return spec


def build_model(embodiment: EmbodimentSpec = TABLETOP_ARM, asset_path: Path = ASSET_PATH) -> mujoco.MjModel:
    model = build_spec(embodiment, asset_path).compile()
    if model.nu != embodiment.num_joints:
        raise ValueError(
            f"{asset_path}: {model.nu} actuators, expected exactly one per embodiment joint "
            f"({embodiment.num_joints})"
        )
    cube = model.geom("cube_red").size
    zone = model.geom("zone_green").size
    if abs(cube[0] - CUBE_HALF_SIZE) > 1e-9 or abs(zone[0] - ZONE_HALF_SIZE) > 1e-9:
        raise ValueError(f"{asset_path}: cube/zone sizes differ from sim/scene.py's CUBE/ZONE_HALF_SIZE")
    return model
