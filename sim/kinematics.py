"""Closed-form kinematics of the tabletop arm (yaw + three pitch joints in one vertical plane).

The link lengths are read from the compiled MuJoCo model, so they follow the MJCF. Tool angle `alpha` is
the finger's pitch from straight up (pi = pointing straight down); the one redundant degree of freedom is
spent on keeping the finger as close to vertical as the joint limits allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from worldloop.common.embodiment import EmbodimentSpec
from worldloop.sim.scene import TIP_SITE

# Finger pitches tried in order: vertical first, then tilted further and further either way.
_TOOL_ANGLES = tuple(math.pi + s * k * 0.1 for k in range(10) for s in ((1,) if k == 0 else (-1, 1)))


@dataclass(frozen=True)
class ArmKinematics:
    shoulder_height: float
    upper_arm: float
    forearm: float
    finger: float  # wrist axis to tip site
    lower: np.ndarray
    upper: np.ndarray

    @classmethod
    def from_model(cls, model: mujoco.MjModel, embodiment: EmbodimentSpec) -> ArmKinematics:
        data = mujoco.MjData(model)
        mujoco.mj_kinematics(model, data)
        shoulder = data.body("upper_arm").xpos.copy()
        elbow = data.body("forearm").xpos.copy()
        wrist = data.body("hand").xpos.copy()
        tip = data.site(TIP_SITE).xpos.copy()
        points = np.stack([shoulder, elbow, wrist, tip])
        if np.abs(points[:, :2]).max() > 1e-9:
            raise ValueError("ArmKinematics expects the arm's joints stacked on the base's z axis at q=0")
        return cls(
            shoulder_height=float(shoulder[2]),
            upper_arm=float(elbow[2] - shoulder[2]),
            forearm=float(wrist[2] - elbow[2]),
            finger=float(tip[2] - wrist[2]),
            lower=embodiment.lower(),
            upper=embodiment.upper(),
        )

    def forward(self, q: np.ndarray) -> np.ndarray:
        """Tip position (x, y, z) in the world frame for joint positions q."""
        yaw, a1 = q[0], q[1]
        a2, a3 = a1 + q[2], a1 + q[2] + q[3]
        r = self.upper_arm * math.sin(a1) + self.forearm * math.sin(a2) + self.finger * math.sin(a3)
        z = (
            self.shoulder_height
            + self.upper_arm * math.cos(a1)
            + self.forearm * math.cos(a2)
            + self.finger * math.cos(a3)
        )
        return np.array([r * math.cos(yaw), r * math.sin(yaw), z])

    def inverse(self, tip: np.ndarray) -> np.ndarray | None:
        """Joint positions within limits that put the tip at `tip` (finger as vertical as possible).

        None when no tried finger pitch reaches the point within the joint limits.
        """
        x, y, z = (float(v) for v in tip)
        yaw = math.atan2(y, x)
        r = math.hypot(x, y)
        l1, l2 = self.upper_arm, self.forearm
        for alpha in _TOOL_ANGLES:
            wr = r - self.finger * math.sin(alpha)
            wz = z - self.finger * math.cos(alpha) - self.shoulder_height
            c2 = (wr * wr + wz * wz - l1 * l1 - l2 * l2) / (2 * l1 * l2)
            if abs(c2) > 1.0:
                continue
            q2 = math.acos(c2)  # elbow bends forward (positive pitch)
            q1 = math.atan2(wr, wz) - math.atan2(l2 * math.sin(q2), l1 + l2 * math.cos(q2))
            q = np.array([yaw, q1, q2, alpha - q1 - q2])
            if np.all(q >= self.lower) and np.all(q <= self.upper):
                return q
        return None
