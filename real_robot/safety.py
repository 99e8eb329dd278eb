"""The last layer before the robot: every command passes the embodiment's position, velocity and
acceleration limits, and malformed targets are rejected with a logged reason.

The limiter keeps the command stream's own position and velocity. Each tick it picks the velocity closest
to the one the target asks for among those that (a) stay within the velocity limit, (b) change by at most
the acceleration limit per tick, and (c) still allow stopping before a position limit at full
deceleration (v*dt + v^2/(2a) <= distance left). (c) holds for every velocity (c) allowed one tick
earlier minus one tick of deceleration, so the three bounds never conflict and the limits hold exactly.
A rejected target is replaced by the last command: the arm brakes to a hold.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from worldloop.common.embodiment import EmbodimentSpec
from worldloop.real_robot.fusion.base import KinematicState

logger = logging.getLogger(__name__)


@dataclass
class SafetyConfig:
    position_tolerance: float = 0.05  # targets this far beyond a joint limit are clamped; farther: rejected
    limit_scale: float = 1.0  # fraction of the spec's velocity / acceleration limits to allow


class SafetyLimiter:
    def __init__(self, spec: EmbodimentSpec, control_dt: float, cfg: SafetyConfig | None = None):
        cfg = cfg or SafetyConfig()
        if not 0 < cfg.limit_scale <= 1:
            raise ValueError(f"safety.limit_scale must be in (0, 1], got {cfg.limit_scale}")
        self.spec = spec
        self.dt = control_dt
        self.tolerance = cfg.position_tolerance
        self.lower, self.upper = spec.lower(), spec.upper()
        self.vmax = spec.max_velocity() * cfg.limit_scale
        self.amax = spec.max_acceleration() * cfg.limit_scale
        self.rejections: dict[str, int] = {}
        self.limited_ticks = 0  # ticks on which the limits changed the target
        self._p: np.ndarray | None = None
        self._v = np.zeros(spec.num_joints)
        self._a = np.zeros(spec.num_joints)

    def reset(self, position: np.ndarray) -> np.ndarray:
        """Start from the robot's measured position (clamped into the limits, with a warning if outside)."""
        p = np.asarray(position, dtype=np.float64)
        if p.shape != (self.spec.num_joints,) or not np.all(np.isfinite(p)):
            raise ValueError(f"safety: robot position must be {self.spec.num_joints} finite numbers, got {p}")
        clamped = np.clip(p, self.lower, self.upper)
        if np.any(clamped != p):
            logger.warning("safety: robot starts outside the joint limits at %s; commanding %s", p, clamped)
        self._p, self._v, self._a = clamped, np.zeros_like(p), np.zeros_like(p)
        return clamped.copy()

    @property
    def started(self) -> bool:
        return self._p is not None

    @property
    def state(self) -> KinematicState:
        if self._p is None:
            raise RuntimeError("SafetyLimiter.reset(position) must be called before use")
        return KinematicState(self._p.copy(), self._v.copy(), self._a.copy())

    def _reject(self, reason: str, target) -> None:
        count = self.rejections.get(reason, 0) + 1
        self.rejections[reason] = count
        if count == 1 or count % 100 == 0:  # log the first and every 100th: a bad policy must not flood
            logger.warning("safety: rejected action (%s, %d so far): %s", reason, count, target)

    def check(self, target) -> np.ndarray | None:
        """The target as a float vector, or None (logged) if it must not be executed."""
        t = np.asarray(target, dtype=np.float64)
        if t.shape != (self.spec.num_joints,):
            self._reject(f"shape {t.shape}, expected ({self.spec.num_joints},)", target)
            return None
        if not np.all(np.isfinite(t)):
            self._reject("non-finite value", target)
            return None
        beyond = np.maximum(self.lower - t, t - self.upper)
        if np.any(beyond > self.tolerance):
            j = int(np.argmax(beyond))
            self._reject(
                f"{self.spec.joint_names[j]} target out of range [{self.lower[j]}, {self.upper[j]}]", target
            )
            return None
        return np.clip(t, self.lower, self.upper)

    def filter(self, target) -> np.ndarray:
        """The command to send this tick for `target` (None or a rejected target: brake to a hold)."""
        p = self._require()
        desired = self.check(target) if target is not None else None
        if desired is None:
            desired = p
        dt, amax = self.dt, self.amax
        v_want = (desired - p) / dt
        # Fastest velocity from which full braking still stops inside the limits (discrete, conservative).
        room_up, room_down = np.maximum(self.upper - p, 0.0), np.maximum(p - self.lower, 0.0)
        v_brake_up = -amax * dt + np.sqrt((amax * dt) ** 2 + 2 * amax * room_up)
        v_brake_down = -amax * dt + np.sqrt((amax * dt) ** 2 + 2 * amax * room_down)
        hi = np.minimum(np.minimum(self.vmax, self._v + amax * dt), v_brake_up)
        lo = np.maximum(np.maximum(-self.vmax, self._v - amax * dt), -v_brake_down)
        lo = np.minimum(lo, hi)  # only float rounding can cross them; the position bound wins
        v = np.clip(v_want, lo, hi)
        if np.any(np.abs(v - v_want) > 1e-9):
            self.limited_ticks += 1
        new_p = np.clip(p + v * dt, self.lower, self.upper)
        v_actual = (new_p - p) / dt
        self._a = (v_actual - self._v) / dt
        self._p, self._v = new_p, v_actual
        return new_p.copy()

    def _require(self) -> np.ndarray:
        if self._p is None:
            raise RuntimeError("SafetyLimiter.reset(position) must be called before use")
        return self._p
