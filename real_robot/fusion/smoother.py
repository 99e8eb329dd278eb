"""The `rail` trajectory smoother: a least-squares polynomial through a chunk's remaining actions.

Policy chunks carry step-to-step noise (flow-matching samples, quantised tokens); executed through linear
interpolation that noise becomes velocity steps at every knot and acceleration spikes at the control rate.
A low-order polynomial over the chunk keeps the motion the policy intends and drops the jitter, and its
derivatives are exact, which the C2 blend in `rail.py` needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.polynomial import polynomial as P  # least-squares fit only

from worldloop.real_robot.fusion.base import Chunk


@dataclass(frozen=True)
class PolynomialTrajectory:
    """p(t) = sum_i coeffs[i] * u**i with u = (t - center) / scale, for t in [start, end]; held outside."""

    coeffs: np.ndarray  # [degree + 1, D]
    center: float
    scale: float
    start: float
    end: float

    def evaluate(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Position, velocity and acceleration at `t`; beyond the ends the arm holds the end position."""
        p, v, a = self.evaluate_many(np.array([t], dtype=np.float64))
        return p[0], v[0], a[0]

    def evaluate_many(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[N, D] positions, velocities, accelerations at `times` (vectorised: this runs inside a tick)."""
        inside = ((times >= self.start) & (times <= self.end))[:, None]
        u = (np.clip(times, self.start, self.end) - self.center) / self.scale
        k = np.arange(len(self.coeffs), dtype=np.float64)
        powers = u[:, None] ** k  # [N, degree + 1]
        p = powers @ self.coeffs
        v = (powers[:, :-1] * k[1:]) @ self.coeffs[1:] / self.scale
        a = (powers[:, : max(len(k) - 2, 0)] * (k[2:] * (k[2:] - 1))) @ self.coeffs[2:] / self.scale**2
        return p, np.where(inside, v, 0.0), np.where(inside, a, 0.0)


class PolynomialSmoother:
    def __init__(self, degree: int = 3):
        if degree < 1:
            raise ValueError(f"fuser.smoother_degree must be >= 1, got {degree}")
        self.degree = degree

    def fit(self, chunk: Chunk, t_from: float) -> PolynomialTrajectory:
        """Fit the actions from the last one at or before `t_from` (the knot the arm is leaving) to the end."""
        times = chunk.knot_times()
        first = max(0, int(np.searchsorted(times, t_from, side="right")) - 1)
        times, actions = times[first:], np.asarray(chunk.actions[first:], dtype=np.float64)
        degree = min(self.degree, len(times) - 1)
        center = 0.5 * (times[0] + times[-1])
        scale = max(0.5 * (times[-1] - times[0]), 1e-9)
        coeffs = P.polyfit((times - center) / scale, actions, degree)
        # Before the first action (a chunk that arrives within one policy step of its observation) the
        # polynomial is extrapolated by less than a step rather than held, which would break continuity.
        return PolynomialTrajectory(coeffs, center, scale, float(min(times[0], t_from)), float(times[-1]))
