"""Gymnasium env for the tabletop tasks: dataset-keyed observations at the embodiment's fps.

Observations are keyed exactly like the dataset features (`observation.images.<cam>` uint8 HxWx3,
`observation.state` float32 joint positions); actions are absolute joint-position targets, clipped to the
limits. One env step lasts 1/fps s of physics. Reward is the dense task progress in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import STATE, image_key
from worldloop.sim.backends import SIM_BACKENDS, make_tabletop_sim
from worldloop.sim.scene import CUBE_COLORS
from worldloop.sim.tasks import (
    TASK_KINDS,
    SceneState,
    TaskInstance,
    is_success,
    progress,
    sample_layout,
    sample_task,
)

# What `TabletopEnv.environment_state` holds: each cube's centre (m, world frame), in CUBE_COLORS order.
ENVIRONMENT_STATE_NAMES = tuple(f"cube_{c}.{axis}" for c in CUBE_COLORS for axis in "xyz")

# Measured joint positions may pass the limits slightly (MuJoCo's joint limits are soft constraints).
STATE_LIMIT_MARGIN = 0.05  # rad


@dataclass
class TabletopEnvConfig:
    task: str = "push"  # reach | push
    image_size: int = 64  # square frames, pixels
    cameras: tuple[str, ...] = ("front", "wrist")
    max_steps: int = 50  # episode length at the embodiment's fps (5 s at 10 Hz)
    terminate_on_success: bool = True
    init_joint_noise: float = 0.1  # rad, uniform perturbation of the home pose at reset
    backend: str = "mujoco"  # mujoco | genesis (pip install 'worldloop[genesis]')

    def validate(self) -> None:
        if self.task not in TASK_KINDS:
            raise ValueError(f"TabletopEnvConfig.task={self.task!r}; expected one of {TASK_KINDS}")
        if self.max_steps < 1:
            raise ValueError(f"TabletopEnvConfig.max_steps must be >= 1, got {self.max_steps}")
        if self.backend not in SIM_BACKENDS:
            raise ValueError(f"TabletopEnvConfig.backend={self.backend!r}; expected one of {SIM_BACKENDS}")


class TabletopEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": TABLETOP_ARM.fps}

    def __init__(self, config: TabletopEnvConfig | None = None, render_mode: str | None = None, **overrides):
        config = config or TabletopEnvConfig()
        unknown = set(overrides) - {f.name for f in fields(TabletopEnvConfig)}
        if unknown:
            raise ValueError(f"TabletopEnv got unknown option(s) {sorted(unknown)}; see TabletopEnvConfig")
        config = replace(config, **overrides)
        config.validate()
        self.config = config
        self.render_mode = render_mode
        self.embodiment = TABLETOP_ARM
        self.sim = make_tabletop_sim(
            config.backend, tuple(config.cameras), config.image_size, self.embodiment
        )
        self._dt = 1.0 / self.embodiment.fps
        self.sim.substeps(self._dt)  # fail now, not mid-episode, if fps does not fit the physics step
        lo, hi = self.embodiment.lower().astype(np.float32), self.embodiment.upper().astype(np.float32)
        margin = np.float32(STATE_LIMIT_MARGIN)
        size = config.image_size
        self.observation_space = spaces.Dict(
            {
                **{
                    image_key(c): spaces.Box(0, 255, (size, size, 3), dtype=np.uint8)
                    for c in self.sim.cameras
                },
                STATE: spaces.Box(lo - margin, hi + margin, dtype=np.float32),
            }
        )
        self.action_space = spaces.Box(lo, hi, dtype=np.float32)
        self.task: TaskInstance | None = None
        self._initial: SceneState | None = None
        self._steps = 0
        self._last_obs: dict | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """`options={"cube": colour}` (reach) names another cube in the same scene: the seed's layout and arm
        are kept, only the instruction changes (does a policy follow it, or go where it always goes?)."""
        super().reset(seed=seed)
        rng = self.np_random
        self.task = sample_task(self.config.task, rng)
        layout = sample_layout(self.task, rng)
        noise = rng.uniform(-1, 1, self.embodiment.num_joints) * self.config.init_joint_noise
        cube = (options or {}).get("cube")
        if cube is not None:
            if self.task.kind != "reach" or cube not in CUBE_COLORS:
                raise ValueError(
                    f"reset option cube={cube!r}: expected one of {list(CUBE_COLORS)} on reach "
                    f"(the task is {self.task.kind}: a push layout is sampled for its cube)"
                )
            self.task = replace(self.task, cube=cube)
        self.sim.reset(layout, self.sim.home + noise)
        self._initial = self.sim.scene_state()
        self._steps = 0
        obs = self._observation()
        return obs, self.task_info()

    def step(self, action):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        self.sim.set_target(np.asarray(action, dtype=np.float64).reshape(-1))
        self.sim.advance(self._dt)
        self._steps += 1
        info = self.task_info()
        terminated = bool(info["success"] and self.config.terminate_on_success)
        truncated = self._steps >= self.config.max_steps
        return self._observation(), float(info["progress"]), terminated, truncated, info

    def scene_state(self) -> SceneState:
        return self.sim.scene_state()

    def environment_state(self) -> np.ndarray:
        """The objects' state now, as recorded in `observation.environment_state` (ENVIRONMENT_STATE_NAMES)."""
        cubes = self.sim.scene_state().cubes
        return np.concatenate([cubes[c] for c in CUBE_COLORS]).astype(np.float32)

    def _observation(self) -> dict:
        frames = self.sim.render() if self.sim.cameras else {}
        obs = {image_key(c): f for c, f in frames.items()}
        obs[STATE] = self.sim.joint_positions().astype(np.float32)
        self._last_obs = obs
        return obs

    def task_info(self) -> dict:
        """The instruction, whether the current state is a success, and the dense progress in [0, 1]."""
        if self.task is None:
            raise RuntimeError("call reset() first")
        state = self.sim.scene_state()
        return {
            "task": self.task.instruction,
            "success": is_success(self.task, state),
            "progress": progress(self.task, state, self._initial),
        }

    def success_along(self, joint_positions: np.ndarray) -> bool:
        """Whether the task counts as solved at any of `joint_positions` [T, J] (a path of the arm) with the
        objects where the last reset put them: the simulator's own rule applied to a path it did not run,
        e.g. the joint states of an imagined episode. Only for tasks the arm solves alone (reach): a push
        moves the cube, which a path of joint positions does not say."""
        if self.task is None:
            raise RuntimeError("call reset() first")
        if self.task.kind != "reach":
            raise ValueError(
                f"success_along judges reach only (the arm alone decides it), not {self.task.kind!r}"
            )
        tips = (self.sim.kinematics.forward(q) for q in np.asarray(joint_positions, dtype=np.float64))
        return any(is_success(self.task, replace(self._initial, tip=tip)) for tip in tips)

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        if self._last_obs is None or "front" not in self.sim.cameras:
            raise RuntimeError("render() needs the 'front' camera and a reset() first")
        return self._last_obs[image_key("front")]

    def close(self) -> None:
        self.sim.close()
