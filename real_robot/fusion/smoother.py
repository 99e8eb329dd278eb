"""The `rail` trajectory smoother: a least-squares polynomial through a chunk's remaining actions.

Policy chunks carry step-to-step noise (flow-matching samples, quantised tokens); executed through linear
interpolation that noise becomes velocity steps at every knot and acceleration spikes at the control rate.
A low-order polynomial over the chunk keeps the motion the policy intends and drops the jitter, and its
derivatives are exact, which the C2 blend in `rail.py` needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.polynomial import polynomial as P

from real_robot.fusion.base import Chunk


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
        if t > self.end or t < self.start:
            p, _, _ = self.evaluate(min(max(t, self.start), self.end))
            return p, np.zeros_like(p), np.zeros_like(p)
        u = (t - self.center) / self.scale
        p = P.polyval(u, self.coeffs)
        v = P.polyval(u, P.polyder(self.coeffs, 1)) / self.scale if len(self.coeffs) > 1 else 0.0 * p
        a = P.polyval(u, P.polyder(self.coeffs, 2)) / self.scale**2 if len(self.coeffs) > 2 else 0.0 * p
        return p, v, a


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
