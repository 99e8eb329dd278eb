"""Scripted experts for the tabletop tasks, with a `skill` knob for datasets of graded quality.

The expert plans in Cartesian space with privileged scene state (cube and square positions), turns tip
waypoints into joint targets with the arm's closed-form IK, and emits absolute joint-position targets that
respect the embodiment's velocity and acceleration limits. `skill` in [0, 1] scales three flaws linearly
from none (skill 1) to their maximum (skill 0):
- smooth joint noise (an AR(1) process, so it looks like wobble rather than jitter),
- hesitation: pauses of a few steps in which the arm brakes and holds still,
- a wrong target: reaching for / pushing the wrong cube, or pushing to the wrong square.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldloop.sim.scene import CUBE_COLORS, CUBE_HALF_SIZE, ZONE_COLORS
from worldloop.sim.tabletop_env import TabletopEnv
from worldloop.sim.tasks import TaskInstance

FINGER_RADIUS = 0.015  # m, the finger capsule in the MJCF
TRANSIT_HEIGHT = 0.1  # m, tip height when moving over the scene
PUSH_HEIGHT = 0.015  # m, tip height when pushing (the finger meets the cube's lower half)
CONTACT_OFFSET = 0.03 + FINGER_RADIUS  # m, cube centre to finger axis at contact (cube may be rotated)
# m, extra room behind the cube before descending; when the way down is blocked (the finger lands on
# another cube) the expert lifts and tries the next gap.
PRE_PUSH_GAPS = (0.03, 0.0, 0.06)
BLOCKED_HEIGHT = 0.02  # m, tip this far above the planned tip while descending -> blocked
PUSH_LEAD = 0.025  # m, how far past the contact point the push waypoint is placed
LATERAL_TOLERANCE = 0.022  # m, finger off the push line beyond this -> lift and re-approach
DONE_RADIUS = 0.015  # m, cube this close to the square's centre -> stop pushing
_EXPERT_STREAM = 0x5EED  # mixed into seeds so expert and env random streams differ


@dataclass
class ExpertConfig:
    skill: float = 1.0  # 1 = best behaviour; 0 = the flaws below at full strength
    max_noise: float = 0.06  # rad, std of the smooth joint noise at skill 0
    noise_correlation: float = 0.8  # AR(1) coefficient per step
    max_hesitation: float = 0.15  # per-step probability of starting a pause at skill 0
    pause_steps: tuple[int, int] = (2, 6)  # a pause lasts this many steps (inclusive range)
    max_wrong_target: float = 0.9  # probability of going for a wrong target at skill 0
    transit_speed: float = 0.3  # m/s of the tip when moving freely
    push_speed: float = 0.12  # m/s of the tip while pushing

    def validate(self) -> None:
        if not 0.0 <= self.skill <= 1.0:
            raise ValueError(f"ExpertConfig.skill must be in [0, 1], got {self.skill}")
        for name in ("max_hesitation", "max_wrong_target"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ExpertConfig.{name} must be a probability in [0, 1]")


class ScriptedExpert:
    """Acts in a `TabletopEnv` (call `reset` after each env reset, then `act` before each env step)."""

    def __init__(self, env: TabletopEnv, config: ExpertConfig | None = None, seed: int | None = None):
        self.env = env
        self.config = config or ExpertConfig()
        self.config.validate()
        self.rng = np.random.default_rng(None if seed is None else [seed, _EXPERT_STREAM])
        # Which of a start's counterfactual takes `reset(seed)` plays: variant k > 0 draws from a stream of its
        # own, so one start (one env seed) recorded k times is pushed k ways; 0 is the stream every recording
        # before variants used.
        self.variant = 0
        spec = env.embodiment
        dt = 1.0 / spec.fps
        self._max_dq = spec.max_velocity() * dt * 0.95  # per step; margin under the hard limit
        self._max_ddq = spec.max_acceleration() * dt * dt * 0.95  # change of the per-step delta
        self._lower, self._upper = spec.lower(), spec.upper()
        self._dt = dt

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            # A stream of its own: the env seeded with the same number must not draw the same numbers.
            stream = [seed, _EXPERT_STREAM] + ([self.variant] if self.variant else [])
            self.rng = np.random.default_rng(stream)
        if self.env.task is None:
            raise RuntimeError("reset the env before the expert")
        flaw = 1.0 - self.config.skill
        self.goal = self._pick_goal(
            self.env.task, wrong=self.rng.random() < flaw * self.config.max_wrong_target
        )
        self.phase = "approach"
        self._gap_index = 0
        self._plan = self.env.sim.target.copy()  # clean (noise-free) joint command
        self._action = self._plan.copy()  # last emitted action
        self._delta = np.zeros_like(self._plan)
        self._noise = np.zeros_like(self._plan)
        self._pause = 0

    def _pick_goal(self, task: TaskInstance, wrong: bool) -> TaskInstance:
        if not wrong:
            return task
        other_cubes = [c for c in CUBE_COLORS if c != task.cube]
        if task.kind == "push" and self.rng.random() < 0.5:
            other_zones = [z for z in ZONE_COLORS if z != task.zone]
            return TaskInstance(task.kind, task.cube, other_zones[self.rng.integers(len(other_zones))])
        return TaskInstance(task.kind, other_cubes[self.rng.integers(len(other_cubes))], task.zone)

    def act(self) -> np.ndarray:
        cfg, flaw = self.config, 1.0 - self.config.skill
        if self._pause == 0 and self.rng.random() < flaw * cfg.max_hesitation:
            self._pause = int(self.rng.integers(cfg.pause_steps[0], cfg.pause_steps[1] + 1))
        if self._pause > 0:
            # Hesitating: brake towards holding still (within the acceleration limit); the plan waits.
            self._pause -= 1
            self._action = self._limited(self._action)
            return self._action.astype(np.float32)
        waypoint, speed = self._waypoint()
        self._plan = self._joint_step_towards(waypoint, speed)
        rho = cfg.noise_correlation
        eps = self.rng.standard_normal(self._plan.shape)
        self._noise = rho * self._noise + np.sqrt(1 - rho * rho) * flaw * cfg.max_noise * eps
        self._action = self._limited(self._plan + self._noise)
        return self._action.astype(np.float32)

    def _limited(self, desired: np.ndarray) -> np.ndarray:
        """The next action: towards `desired` within velocity, acceleration and position limits."""
        delta = np.clip(desired - self._action, -self._max_dq, self._max_dq)
        delta = np.clip(delta, self._delta - self._max_ddq, self._delta + self._max_ddq)
        action = np.clip(self._action + delta, self._lower, self._upper)
        self._delta = action - self._action
        return action

    def _joint_step_towards(self, waypoint: np.ndarray, speed: float) -> np.ndarray:
        """Joint target one step along the straight tip path from the planned tip to `waypoint`."""
        kin = self.env.sim.kinematics
        tip = kin.forward(self._plan)
        step = waypoint - tip
        dist = float(np.linalg.norm(step))
        max_step = speed * self._dt
        if dist > max_step:
            step *= max_step / dist
        q = kin.inverse(tip + step)
        return self._plan if q is None else q

    def _waypoint(self) -> tuple[np.ndarray, float]:
        state = self.env.scene_state()
        cfg = self.config
        tip = state.tip
        cube = state.cubes[self.goal.cube]
        if self.goal.kind == "reach":
            above = np.array([cube[0], cube[1], TRANSIT_HEIGHT])
            if self.phase == "approach" and np.linalg.norm(tip[:2] - cube[:2]) < 0.015:
                self.phase = "descend"
            if self.phase == "approach":
                return above, cfg.transit_speed
            return np.array([cube[0], cube[1], 2 * CUBE_HALF_SIZE + 0.01]), cfg.transit_speed / 2

        zone = state.zones[self.goal.zone]
        to_zone = zone - cube[:2]
        u = to_zone / max(float(np.linalg.norm(to_zone)), 1e-6)
        normal = np.array([-u[1], u[0]])
        contact = cube[:2] - u * CONTACT_OFFSET
        pre = contact - u * PRE_PUSH_GAPS[self._gap_index]
        rel = tip[:2] - cube[:2]
        if np.linalg.norm(to_zone) < DONE_RADIUS:
            self.phase = "done"
        planned_height = self.env.sim.kinematics.forward(self._plan)[2]
        if self.phase == "descend" and tip[2] - planned_height > BLOCKED_HEIGHT:
            self._gap_index = (self._gap_index + 1) % len(PRE_PUSH_GAPS)
            self.phase = "retreat"
        if self.phase == "push" and (abs(rel @ normal) > LATERAL_TOLERANCE or rel @ u > -CUBE_HALF_SIZE):
            self.phase = "retreat"
        if self.phase == "retreat" and tip[2] > TRANSIT_HEIGHT - 0.02:
            self.phase = "approach"
        if self.phase == "approach" and np.linalg.norm(tip[:2] - pre) < 0.015:
            self.phase = "descend"
        if self.phase == "descend" and tip[2] < PUSH_HEIGHT + 0.012:
            self.phase = "push"

        if self.phase == "approach":
            return np.array([pre[0], pre[1], TRANSIT_HEIGHT]), cfg.transit_speed
        if self.phase == "descend":
            return np.array([pre[0], pre[1], PUSH_HEIGHT]), cfg.transit_speed / 2
        if self.phase == "push":
            target = contact + u * PUSH_LEAD
            return np.array([target[0], target[1], PUSH_HEIGHT]), cfg.push_speed
        if self.phase == "retreat":
            back = tip[:2] - u * 0.02
            return np.array([back[0], back[1], TRANSIT_HEIGHT]), cfg.transit_speed / 2
        return np.array([tip[0], tip[1], TRANSIT_HEIGHT]), cfg.transit_speed / 2  # done: lift clear
