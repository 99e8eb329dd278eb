"""`SimRobot`: the tabletop simulator seen as a robot, with the shape of LeRobot's `Robot`.

The real-time runtime drives it exactly like a LeRobot robot: `send_action({"<joint>.pos": target})` sets
absolute joint-position targets and, lock-step, advances physics by 1/control_hz; `get_observation()`
returns `"<joint>.pos"` floats and one HxWx3 uint8 image per camera. It does not subclass lerobot's
`Robot` because that constructor creates calibration directories; the method names are the same
(lerobot 0.4 and 0.6). `task`, `task_success()` and `progress()` serve evaluation; `reset()` starts a new
episode (new layout and instruction).

`observation_to_frame` / `observation_to_batch` turn a robot observation into the dataset keys and the
policy batch (`frame_to_batch` does the latter for an env observation); `action_to_vector` / `vector_to_action` convert between action dicts and joint vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldloop.common.embodiment import TABLETOP_ARM, EmbodimentSpec
from worldloop.data.features import IMAGE_PREFIX, STATE, TASK, image_key
from worldloop.sim.tabletop_env import TabletopEnv, TabletopEnvConfig


@dataclass
class SimRobotConfig:
    task: str = "push"  # reach | push
    seed: int = 0  # layout and instruction of the first episode
    control_hz: int = 100  # send_action rate; must divide the 200 Hz physics rate
    image_size: int = 64
    cameras: tuple[str, ...] = ("front", "wrist")
    id: str = "sim"
    backend: str = "mujoco"  # physics/rendering: mujoco | genesis (pip install 'worldloop[genesis]')


class NotConnectedError(RuntimeError):
    """Raised when a SimRobot is used before connect() or after disconnect()."""


def joint_feature(joint: str) -> str:
    return f"{joint}.pos"


class SimRobot:
    name = "worldloop_sim"

    def __init__(self, config: SimRobotConfig | None = None):
        self.config = config or SimRobotConfig()
        self.id = self.config.id
        self.robot_type = self.name
        self.embodiment: EmbodimentSpec = TABLETOP_ARM
        self.env: TabletopEnv | None = None

    @property
    def observation_features(self) -> dict:
        size = self.config.image_size
        return {
            **{joint_feature(j): float for j in self.embodiment.joint_names},
            **{cam: (size, size, 3) for cam in self.config.cameras},
        }

    @property
    def action_features(self) -> dict:
        return {joint_feature(j): float for j in self.embodiment.joint_names}

    @property
    def is_connected(self) -> bool:
        return self.env is not None

    @property
    def is_calibrated(self) -> bool:
        return True  # simulated joints need no calibration

    def calibrate(self) -> None:
        """Nothing to calibrate in simulation."""

    def configure(self) -> None:
        """Nothing to configure in simulation."""

    def connect(self, calibrate: bool = True) -> None:
        if self.is_connected:
            raise RuntimeError(f"{self} is already connected")
        cfg = self.config
        env = TabletopEnv(
            TabletopEnvConfig(
                task=cfg.task, image_size=cfg.image_size, cameras=cfg.cameras, backend=cfg.backend
            )
        )
        try:
            self._substeps = env.sim.substeps(1.0 / cfg.control_hz)
        except ValueError as e:
            env.close()
            raise ValueError(f"SimRobotConfig.control_hz={cfg.control_hz}: {e}") from e
        self.env = env
        self.reset(cfg.seed)

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode: a fresh layout and instruction (deterministic under `seed`)."""
        self._env().reset(seed=seed)

    def get_observation(self) -> dict:
        env = self._env()
        q = env.sim.joint_positions()
        obs = {joint_feature(j): float(v) for j, v in zip(self.embodiment.joint_names, q)}
        if env.sim.cameras:
            obs.update(env.sim.render())
        return obs

    def send_action(self, action: dict) -> dict:
        """Set joint-position targets, run physics for 1/control_hz s; returns the (clipped) targets sent."""
        env = self._env()
        sent = env.sim.set_target(action_to_vector(action, self.embodiment.joint_names))
        env.sim.advance(1.0 / self.config.control_hz)
        return vector_to_action(sent, self.embodiment.joint_names)

    def disconnect(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    @property
    def task(self) -> str:
        return self._env().task.instruction

    def task_success(self) -> bool:
        return bool(self._env().task_info()["success"])

    def progress(self) -> float:
        return float(self._env().task_info()["progress"])

    def _env(self) -> TabletopEnv:
        if self.env is None:
            raise NotConnectedError(f"{self} is not connected; call connect() first")
        return self.env

    def __enter__(self) -> SimRobot:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()

    def __str__(self) -> str:
        return f"{self.id} {type(self).__name__}"


def action_to_vector(action: dict, joint_names: tuple[str, ...]) -> np.ndarray:
    missing = [joint_feature(j) for j in joint_names if joint_feature(j) not in action]
    if missing:
        raise KeyError(
            f"action is missing {missing}; expected keys {[joint_feature(j) for j in joint_names]}"
        )
    return np.array([float(action[joint_feature(j)]) for j in joint_names], dtype=np.float64)


def vector_to_action(vector, joint_names: tuple[str, ...]) -> dict[str, float]:
    vector = np.asarray(vector, dtype=np.float64).reshape(-1)
    if vector.shape != (len(joint_names),):
        raise ValueError(f"action vector has shape {vector.shape}, expected ({len(joint_names)},)")
    return {joint_feature(j): float(v) for j, v in zip(joint_names, vector)}


def observation_to_frame(
    observation: dict, joint_names: tuple[str, ...], cameras: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """A robot observation as dataset features: `observation.state` float32 and uint8 HxWx3 images."""
    missing = [k for k in [*(joint_feature(j) for j in joint_names), *cameras] if k not in observation]
    if missing:
        raise KeyError(f"robot observation is missing {missing}; it has {sorted(observation)}")
    frame = {image_key(cam): np.asarray(observation[cam], dtype=np.uint8) for cam in cameras}
    frame[STATE] = np.array([observation[joint_feature(j)] for j in joint_names], dtype=np.float32)
    return frame


def observation_to_batch(
    observation: dict, joint_names: tuple[str, ...], cameras: tuple[str, ...], task: str, device="cpu"
) -> dict:
    """A robot observation as a policy batch of one: images float [1, 3, H, W] in [0, 1], state [1, n]."""
    return frame_to_batch(observation_to_frame(observation, joint_names, cameras), task, device)


def frame_to_batch(frame: dict[str, np.ndarray], task: str, device="cpu") -> dict:
    """Dataset-keyed observations (a `TabletopEnv` observation, a recorded frame) as a policy batch of one."""
    import torch

    if STATE not in frame:
        raise KeyError(f"frame has no {STATE!r}; it has {sorted(frame)}")
    batch = {
        key: torch.from_numpy(value).to(device).permute(2, 0, 1).unsqueeze(0).float().div_(255.0)
        for key, value in frame.items()
        if key.startswith(IMAGE_PREFIX)
    }
    batch[STATE] = torch.from_numpy(frame[STATE]).to(device).unsqueeze(0)
    batch[TASK] = [task]
    return batch
