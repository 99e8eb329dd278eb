"""Robots the runtime drives: LeRobot `Robot` drivers (any registered type) and the MuJoCo sim robot.

`--robot.type=<name>` picks a config from LeRobot's `RobotConfig` registry; worldloop adds `sim` to it, so
one option selects a simulated or a real arm. Each robot type maps to an `EmbodimentSpec` whose limits
the safety layer enforces.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

from lerobot.robots import RobotConfig, make_robot_from_config

from worldloop.common.embodiment import SO101_ARM, TABLETOP_ARM, EmbodimentSpec

logger = logging.getLogger(__name__)

# LeRobot registers a robot type when its config module is imported; import the drivers LeRobot ships so
# that every type is selectable (a driver whose optional dependencies are missing is skipped).
_LEROBOT_ROBOT_MODULES = (
    "so_follower",
    "koch_follower",
    "omx_follower",
    "bi_so_follower",
    "lekiwi",
    "hope_jr",
    "reachy2",
    "openarm_follower",
    "bi_openarm_follower",
    "unitree_g1",
    "earthrover_mini_plus",
)
for _name in _LEROBOT_ROBOT_MODULES:
    try:
        importlib.import_module(f"lerobot.robots.{_name}")
    except ImportError as _e:  # optional hardware SDKs
        logger.debug("lerobot robot %s unavailable: %s", _name, _e)


@RobotConfig.register_subclass("sim")
@dataclass(kw_only=True)
class SimRobotConfig(RobotConfig):
    """The MuJoCo tabletop arm behind LeRobot's `Robot` interface (lock-step: one physics advance per command)."""

    task: str = "push"  # reach | push
    seed: int = 0  # scene layout and task sampling
    image_size: int = 64
    camera_names: tuple[str, ...] = ("front", "wrist")
    backend: str = "mujoco"  # physics/rendering: mujoco | genesis (pip install 'worldloop[genesis]')


EMBODIMENTS = {"sim": TABLETOP_ARM, "so100_follower": SO101_ARM, "so101_follower": SO101_ARM}


def embodiment_for(cfg: RobotConfig) -> EmbodimentSpec:
    spec = EMBODIMENTS.get(cfg.type)
    if spec is None:
        raise ValueError(
            f"robot.type={cfg.type!r}: no embodiment spec (joint limits) is known for it; add one to "
            f"worldloop.real_robot.robots.EMBODIMENTS (known: {', '.join(sorted(EMBODIMENTS))})"
        )
    return spec


def make_robot(cfg: RobotConfig, control_hz: float):
    """The robot driver for `cfg` (not yet connected)."""
    if isinstance(cfg, SimRobotConfig):
        from worldloop.sim.robot import SimRobot
        from worldloop.sim.robot import SimRobotConfig as SimDriverConfig

        if control_hz != int(control_hz):
            raise ValueError(f"runtime.control_hz={control_hz}: the sim robot needs a whole number of Hz")
        driver = SimDriverConfig(
            task=cfg.task,
            seed=cfg.seed,
            control_hz=int(control_hz),  # lock-step: one physics advance of 1/control_hz per command
            image_size=cfg.image_size,
            cameras=tuple(cfg.camera_names),
            id=cfg.id or "sim",
            backend=cfg.backend,
        )
        return SimRobot(driver)
    try:
        return make_robot_from_config(cfg)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"robot.type={cfg.type!r}: its LeRobot driver needs the Python module {e.name!r}; install the "
            f"matching LeRobot extra (e.g. pip install 'lerobot[feetech]' for SO-100/SO-101)"
        ) from e
