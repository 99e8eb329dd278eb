"""`rail` (after VLA-RAIL): smooth each chunk, then blend into it with C2 continuity at the switch.

At the switch time s the executing command has state (p0, v0, a0) and the smoothed new chunk q(t) has
(q(s), q'(s), q''(s)). The command becomes q(t) + e(t - s), where e is the quintic with
e(0) = p0 - q(s), e'(0) = v0 - q'(s), e''(0) = a0 - q''(s) and e, e', e'' all zero at the blend's end T:
position, velocity and acceleration are continuous at both ends of the blend. T is the shortest candidate
in [blend_min_s, blend_max_s] whose blended motion stays within the embodiment's velocity and
acceleration limits (a larger mismatch needs a longer blend).
"""

from __future__ import annotations

import numpy as np

from worldloop.real_robot.fusion.base import Chunk, ChunkFuser, KinematicState
from worldloop.real_robot.fusion.smoother import PolynomialSmoother, PolynomialTrajectory


def quintic_correction(dp: np.ndarray, dv: np.ndarray, da: np.ndarray, duration: float) -> np.ndarray:
    """Coefficients [6, D] (in powers of tau) of the quintic that starts at (dp, dv, da) and ends at rest at 0."""
    T = duration
    c3 = -(20 * dp + 12 * dv * T + 3 * da * T**2) / (2 * T**3)
    c4 = (30 * dp + 16 * dv * T + 3 * da * T**2) / (2 * T**4)
    c5 = -(12 * dp + 6 * dv * T + da * T**2) / (2 * T**5)
    return np.stack([dp, dv, da / 2, c3, c4, c5])


def eval_quintic(c: np.ndarray, taus: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N, D] value, first and second derivative of the quintic `c` [6, D] at `taus` [N]."""
    powers = taus[:, None] ** np.arange(6)
    p = powers @ c
    v = (powers[:, :5] * np.arange(1, 6)) @ c[1:]
    a = (powers[:, :4] * np.array([2.0, 6.0, 12.0, 20.0])) @ c[2:]
    return p, v, a


class RailFuser(ChunkFuser):
    def __init__(
        self,
        spec,
        control_dt,
        smoother_degree: int = 3,
        blend_min_s: float = 0.1,
        blend_max_s: float = 0.8,
        resync_tolerance: float = 1e-3,
    ):
        super().__init__(spec, control_dt)
        if not 0 < blend_min_s <= blend_max_s:
            raise ValueError(f"fuser: need 0 < blend_min_s <= blend_max_s, got {blend_min_s}, {blend_max_s}")
        self.smoother = PolynomialSmoother(smoother_degree)
        self.blend_min_s = blend_min_s
        self.blend_max_s = blend_max_s
        self.resync_tolerance = resync_tolerance
        self._traj: PolynomialTrajectory | None = None
        self._last_obs_time = -np.inf
        self._correction: np.ndarray | None = None  # [6, D]
        self._switch_time = 0.0
        self._blend = 0.0

    def reset(self, position: np.ndarray) -> None:
        super().reset(position)
        self._traj = None
        self._correction = None
        self._last_obs_time = -np.inf

    def state(self, t: float) -> KinematicState:
        """The fused trajectory's exact position, velocity and acceleration at `t`."""
        hold = self._require_reset()
        if self._traj is None:
            return KinematicState.at_rest(hold)
        p, v, a = self._traj.evaluate(t)
        tau = t - self._switch_time
        if self._correction is not None and 0.0 <= tau < self._blend:
            ep, ev, ea = eval_quintic(self._correction, np.array([tau]))
            p, v, a = p + ep[0], v + ev[0], a + ea[0]
        return KinematicState(p, v, a)

    def add_chunk(self, chunk: Chunk, now: float, executed: KinematicState) -> None:
        if chunk.obs_time < self._last_obs_time:
            return  # computed from an older observation than the executing chunk: stale
        start = self.state(now)
        # `executed` is the last command sent (one tick ago). If safety (limits, the watchdog's brake)
        # moved it off the plan, continue from it, extrapolated to now, instead of from the plan.
        planned_prev = self.state(now - self.control_dt).position
        if np.max(np.abs(planned_prev - executed.position)) > self.resync_tolerance:
            dt = self.control_dt
            start = KinematicState(
                executed.position + executed.velocity * dt + 0.5 * executed.acceleration * dt**2,
                executed.velocity + executed.acceleration * dt,
                executed.acceleration,
            )
        traj = self.smoother.fit(chunk, now)
        q_p, q_v, q_a = traj.evaluate(now)
        dp, dv, da = start.position - q_p, start.velocity - q_v, start.acceleration - q_a
        self._traj, self._last_obs_time, self._switch_time = traj, chunk.obs_time, now
        self._correction, self._blend = self._pick_blend(dp, dv, da, now)

    def _pick_blend(self, dp, dv, da, now: float) -> tuple[np.ndarray, float]:
        vmax, amax = self.spec.max_velocity(), self.spec.max_acceleration()
        taus = self.control_dt * np.arange(int(np.ceil(self.blend_max_s / self.control_dt)) + 1)
        _, q_v, q_a = self._traj.evaluate_many(now + taus)
        best = None
        duration = self.blend_min_s
        while True:
            correction = quintic_correction(dp, dv, da, duration)
            inside = taus <= duration
            _, e_v, e_a = eval_quintic(correction, taus[inside])
            excess = max(np.max(np.abs(q_v[inside] + e_v) / vmax), np.max(np.abs(q_a[inside] + e_a) / amax))
            if best is None or excess < best[0]:
                best = (excess, correction, duration)
            if excess <= 1.0 or duration >= self.blend_max_s:
                break
            duration = min(1.5 * duration, self.blend_max_s)
        return best[1], best[2]

    def command(self, now: float) -> np.ndarray:
        return self.state(now).position

    def plan_end(self) -> float:
        return -np.inf if self._traj is None else self._traj.end
