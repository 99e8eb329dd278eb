"""The last layer before the robot: every command passes the embodiment's position, velocity and
acceleration limits, and malformed targets are rejected with a logged reason.

The limiter keeps the command stream's own position and velocity. Each tick it picks the velocity closest
to the one the target asks for among those that (a) stay within the velocity limit, (b) change by at most
the acceleration limit per tick, and (c) still allow stopping before a position limit at full
deceleration (v*dt + v^2/(2a) <= distance left). (c) holds for every velocity (c) allowed one tick
earlier minus one tick of deceleration, so the three bounds never conflict and the limits hold exactly.
A rejected target is replaced by a hold: the arm brakes to a stop.

Start: the stream starts at the measured position with zero velocity, even outside the position limits
(up to `start_margin`; further out the start is refused). A joint outside its limits may only move
inwards, and a hold brings it inside, both at the velocity and acceleration limits: no first-tick jump.

`TrackingGuard` compares the measured position with the command: the limiter bounds how fast commands
change, not how far they are from a blocked arm, which would move at full servo speed once freed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from worldloop.common.embodiment import EmbodimentSpec
from worldloop.real_robot.fusion.base import KinematicState
from worldloop.real_robot.helpers import check_number

logger = logging.getLogger(__name__)


@dataclass
class SafetyConfig:
    """Distances are in the embodiment's joint units (radians for the sim arm, degrees for the SO-101)."""

    position_tolerance: float = 0.05  # targets this far beyond a joint limit are clamped; farther: rejected
    limit_scale: float = 1.0  # fraction of the spec's velocity / acceleration limits to allow
    # A joint measured at most this far outside its limits at start is moved in; farther: refuse to start.
    start_margin: float = 0.3
    # Tracking guard: measured and commanded position differing by more than `tracking_margin` for more
    # than `tracking_ticks` control ticks stops the run safely (null: no guard). Joints in
    # `tracking_exclude` are not compared (a gripper closed on an object never reaches its command).
    tracking_margin: float | None = 0.3
    tracking_ticks: int = 30
    tracking_exclude: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_number("safety.position_tolerance", self.position_tolerance, low=0.0)
        check_number("safety.limit_scale", self.limit_scale, low=0.0, high=1.0, low_open=True)
        check_number("safety.start_margin", self.start_margin, low=0.0)
        if self.tracking_margin is not None:
            check_number("safety.tracking_margin", self.tracking_margin, low=0.0, low_open=True)
        check_number("safety.tracking_ticks", self.tracking_ticks, low=1, integer=True)


class SafetyStop(RuntimeError):
    """The runtime refused to start, or stopped the run early, for safety (the reason is the message)."""


class SafetyLimiter:
    def __init__(self, spec: EmbodimentSpec, control_dt: float, cfg: SafetyConfig | None = None):
        cfg = cfg or SafetyConfig()
        check_number("control period (1 / runtime.control_hz)", control_dt, low=0.0, low_open=True)
        self.spec = spec
        self.dt = control_dt
        self.tolerance = cfg.position_tolerance
        self.start_margin = cfg.start_margin
        self.lower, self.upper = spec.lower(), spec.upper()
        self.vmax = spec.max_velocity() * cfg.limit_scale
        self.amax = spec.max_acceleration() * cfg.limit_scale
        self.rejections: dict[str, int] = {}
        self.limited_ticks = 0  # ticks on which the limits changed the target
        self._p: np.ndarray | None = None
        self._v = np.zeros(spec.num_joints)
        self._a = np.zeros(spec.num_joints)

    def reset(self, position: np.ndarray, check_margin: bool = True) -> np.ndarray:
        """Start the command stream at the robot's measured `position` at rest; returns where it is headed
        (the position clamped into the limits). Raises if a joint is more than `start_margin` outside its
        limits (unless not `check_margin`: re-anchoring on a measured position mid-run)."""
        p = np.asarray(position, dtype=np.float64)
        if p.shape != (self.spec.num_joints,) or not np.all(np.isfinite(p)):
            raise ValueError(f"safety: robot position must be {self.spec.num_joints} finite numbers, got {p}")
        beyond = np.maximum(self.lower - p, p - self.upper)
        j = int(np.argmax(beyond))
        if check_margin and beyond[j] > self.start_margin:
            raise SafetyStop(
                f"safety: {self.spec.joint_names[j]} is at {p[j]:.4g}, {beyond[j]:.4g} outside its limits "
                f"[{self.lower[j]:.4g}, {self.upper[j]:.4g}], more than safety.start_margin="
                f"{self.start_margin:g}; move the arm into its limits before starting"
            )
        if beyond[j] > 0:
            logger.warning(
                "safety: robot starts outside the joint limits at %s; moving it into %s..%s at the velocity "
                "and acceleration limits",
                p,
                self.lower,
                self.upper,
            )
        self._p, self._v, self._a = p.copy(), np.zeros_like(p), np.zeros_like(p)
        return np.clip(p, self.lower, self.upper)

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

    def filter(self, target, speed_scale: float = 1.0) -> np.ndarray:
        """The command to send this tick for `target` (None or a rejected target: brake to a hold, inside
        the limits). `speed_scale` < 1 lowers the velocity limit (a slow move), reached at full deceleration.
        Raises (state unchanged, nothing to send) if the result is not finite."""
        p = self._require()
        desired = self.check(target) if target is not None else None
        if desired is None:
            desired = np.clip(p, self.lower, self.upper)  # hold; a joint outside its limits comes inside
        dt, amax = self.dt, self.amax
        vmax = self.vmax * speed_scale
        v_want = (desired - p) / dt
        # Fastest velocity from which full braking still stops inside the limits (discrete, conservative).
        # Outside a limit there is no room that way: the joint may only move inwards.
        room_up, room_down = np.maximum(self.upper - p, 0.0), np.maximum(p - self.lower, 0.0)
        v_brake_up = -amax * dt + np.sqrt((amax * dt) ** 2 + 2 * amax * room_up)
        v_brake_down = -amax * dt + np.sqrt((amax * dt) ** 2 + 2 * amax * room_down)
        # Faster than a lowered velocity limit: come down to it at full deceleration, not in one tick.
        hi = np.minimum(np.minimum(np.maximum(vmax, self._v - amax * dt), self._v + amax * dt), v_brake_up)
        lo = np.maximum(
            np.maximum(np.minimum(-vmax, self._v + amax * dt), self._v - amax * dt), -v_brake_down
        )
        lo = np.minimum(lo, hi)  # only float rounding can cross them; the position bound wins
        v = np.clip(v_want, lo, hi)
        new_p = np.clip(p + v * dt, np.minimum(self.lower, p), np.maximum(self.upper, p))
        v_actual = (new_p - p) / dt
        if not (np.all(np.isfinite(new_p)) and np.all(np.isfinite(v_actual))):
            raise FloatingPointError(
                f"safety: the limiter computed a non-finite command {new_p} (control period {dt}); not sent"
            )
        if np.any(np.abs(v - v_want) > 1e-9):
            self.limited_ticks += 1
        self._a = (v_actual - self._v) / dt
        self._p, self._v = new_p, v_actual
        return new_p.copy()

    def at_rest(self, target: np.ndarray | None = None, atol: float = 1e-9) -> bool:
        """Whether the stream is still (and at `target`, if given)."""
        p = self._require()
        still = bool(np.all(np.abs(self._v) <= atol))
        return still and (target is None or bool(np.all(np.abs(p - target) <= atol)))

    def _require(self) -> np.ndarray:
        if self._p is None:
            raise RuntimeError("SafetyLimiter.reset(position) must be called before use")
        return self._p


class TrackingGuard:
    """Trips when a joint's measured position has differed from the command by more than `margin` for
    more than `ticks` control ticks (sampled whenever the runtime observes the robot)."""

    def __init__(self, spec: EmbodimentSpec, cfg: SafetyConfig):
        unknown = sorted(set(cfg.tracking_exclude) - set(spec.joint_names))
        if unknown:
            raise ValueError(
                f"safety.tracking_exclude: {unknown} are not joints of {spec.name} {list(spec.joint_names)}"
            )
        self.spec = spec
        self.margin, self.ticks = cfg.tracking_margin, int(cfg.tracking_ticks)
        self.compared = np.array([j not in cfg.tracking_exclude for j in spec.joint_names])
        self._since: int | None = None  # first tick of the current run of errors over the margin

    def update(self, tick: int, measured: np.ndarray, command: np.ndarray) -> str | None:
        """The reason to stop, once the error has stayed over the margin too long; else None."""
        if self.margin is None:
            return None
        error = np.where(self.compared, np.abs(np.asarray(measured) - command), 0.0)
        j = int(np.argmax(error))
        if error[j] <= self.margin:
            self._since = None
            return None
        if self._since is None:
            self._since = tick
        if tick - self._since <= self.ticks:
            return None
        return (
            f"tracking: {self.spec.joint_names[j]} measured at {measured[j]:.4g} but commanded "
            f"{command[j]:.4g} (error {error[j]:.4g} > safety.tracking_margin={self.margin:g}) for "
            f"{tick - self._since} ticks (> safety.tracking_ticks={self.ticks}): blocked or overloaded"
        )


def limit_violations(
    spec: EmbodimentSpec, dt: float, start, commands, limit_scale: float = 1.0, rtol: float = 1e-6
) -> list[str]:
    """What a stream of `commands` sent from rest at the measured `start` breaks, one line per kind
    (empty: nothing): position limits (a joint that starts outside may only move inwards), velocity and
    acceleration limits (scaled by `limit_scale`), with a relative tolerance `rtol` for float rounding."""
    path = np.vstack([np.asarray(start, dtype=np.float64), np.asarray(commands, dtype=np.float64)])
    lower, upper = spec.lower(), spec.upper()
    problems = []
    if not np.all(np.isfinite(path)):
        return ["non-finite command"]
    outside = np.maximum(np.maximum(lower - path, path - upper), 0.0)
    if np.any(np.diff(outside, axis=0) > rtol):
        problems.append(f"position: {np.max(np.diff(outside, axis=0)):.3g} further outside the limits")
    velocity = np.diff(path, axis=0) / dt
    vmax, amax = spec.max_velocity() * limit_scale, spec.max_acceleration() * limit_scale
    if np.any(np.abs(velocity) > vmax * (1 + rtol) + rtol):
        problems.append(f"velocity: {np.max(np.abs(velocity) / vmax):.3f}x the limit")
    accel = np.diff(np.vstack([np.zeros(spec.num_joints), velocity]), axis=0) / dt
    if np.any(np.abs(accel) > amax * (1 + rtol) + rtol):
        problems.append(f"acceleration: {np.max(np.abs(accel) / amax):.3f}x the limit")
    return problems
