"""Executability: can the robot actually perform the motion a generated rollout shows? (after EVA)

The world model's inverse dynamics model (trained on real frames only, frozen here) decodes the action
behind every generated transition. The decoded trajectory a [B, L, J] (absolute joint-position targets,
the embodiment's joints, one per frame at `fps`) is scored against the embodiment spec from the sim:

    vel  = diff(a) * fps,  acc = diff(a, 2) * fps^2,  jerk = diff(a, 3) * fps^3      (finite differences)
    smoothness terms: mean (vel / v_max)^2, mean (acc / a_max)^2, mean (jerk / (a_max * fps))^2
        (the jerk scale is one full acceleration limit gained or lost within one control step)
    limit violations: the fraction of joint-steps outside [lower, upper] or with |vel| > v_max
    action following: RMS of (a - commanded) / (upper - lower), the commanded actions being the real ones

    R = -(w_vel vel + w_acc acc + w_jerk jerk + w_limit violation_rate + w_follow following_error)

Each term is returned per candidate so it can be logged on its own. No gradient flows through the IDM: the
reward only ranks candidates for the likelihood-free objective in rl_finetune/nft.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worldloop.common.embodiment import EmbodimentSpec

TERMS = ("velocity", "acceleration", "jerk", "violation_rate", "following_error")


@dataclass
class ExecutabilityRewardConfig:
    velocity_weight: float = 0.1
    acceleration_weight: float = 0.1
    jerk_weight: float = 1.0
    violation_weight: float = 1.0
    following_weight: float = 1.0

    def validate(self) -> None:
        for name in ("velocity", "acceleration", "jerk", "violation", "following"):
            if getattr(self, f"{name}_weight") < 0:
                raise ValueError(
                    f"executability.{name}_weight must be >= 0, got {getattr(self, f'{name}_weight')}"
                )

    def weights(self) -> dict[str, float]:
        return dict(
            zip(
                TERMS,
                (
                    self.velocity_weight,
                    self.acceleration_weight,
                    self.jerk_weight,
                    self.violation_weight,
                    self.following_weight,
                ),
            )
        )


class LimitTensors:
    """The spec's limits as tensors on a device, checked against the action size."""

    def __init__(self, spec: EmbodimentSpec, action_dim: int, device: torch.device | str = "cpu"):
        if action_dim != spec.num_joints:
            raise ValueError(
                f"decoded actions have {action_dim} dims but embodiment {spec.name!r} has {spec.num_joints} "
                f"joints ({', '.join(spec.joint_names)}); executability needs one action per joint"
            )

        def t(values) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.float32, device=device)

        self.lower, self.upper = t(spec.position_lower), t(spec.position_upper)
        self.velocity, self.acceleration = t(spec.velocity_limit), t(spec.acceleration_limit)
        self.fps = float(spec.fps)


def executability_terms(
    decoded: torch.Tensor, commanded: torch.Tensor, spec: EmbodimentSpec
) -> dict[str, torch.Tensor]:
    """decoded, commanded: [B, L, J] joint-position targets (L >= 4 for jerk) -> each of TERMS as [B].

    Also returns `position_violations` and `velocity_violations`: counts per candidate.
    """
    if decoded.dim() != 3 or decoded.shape != commanded.shape:
        raise ValueError(
            f"decoded {list(decoded.shape)} and commanded {list(commanded.shape)} actions must both be [B, L, J]"
        )
    if decoded.shape[1] < 4:
        raise ValueError(f"executability needs at least 4 decoded actions for jerk, got L={decoded.shape[1]}")
    lim = LimitTensors(spec, decoded.shape[-1], decoded.device)
    a = decoded.float()
    vel = torch.diff(a, dim=1) * lim.fps
    acc = torch.diff(a, n=2, dim=1) * lim.fps**2
    jerk = torch.diff(a, n=3, dim=1) * lim.fps**3
    pos_bad = (a < lim.lower) | (a > lim.upper)
    vel_bad = vel.abs() > lim.velocity
    entries = pos_bad[0].numel() + vel_bad[0].numel()
    span = lim.upper - lim.lower
    return {
        "velocity": (vel / lim.velocity).pow(2).mean((1, 2)),
        "acceleration": (acc / lim.acceleration).pow(2).mean((1, 2)),
        "jerk": (jerk / (lim.acceleration * lim.fps)).pow(2).mean((1, 2)),
        "violation_rate": (pos_bad.sum((1, 2)) + vel_bad.sum((1, 2))).float() / entries,
        "following_error": ((a - commanded.float()) / span).pow(2).mean((1, 2)).sqrt(),
        "position_violations": pos_bad.sum((1, 2)).float(),
        "velocity_violations": vel_bad.sum((1, 2)).float(),
    }


def executability_reward(
    decoded: torch.Tensor, commanded: torch.Tensor, spec: EmbodimentSpec, cfg: ExecutabilityRewardConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """R [B] (higher is better, 0 at best) and every term [B] for logging."""
    terms = executability_terms(decoded, commanded, spec)
    penalty = sum(w * terms[name] for name, w in cfg.weights().items())
    return -penalty, terms


def jerk_rms(actions: torch.Tensor, fps: float) -> torch.Tensor:
    """RMS jerk (units/s^3) of each trajectory [B, L, J] -> [B]: the benchmark's smoothness figure."""
    return (torch.diff(actions.float(), n=3, dim=1) * fps**3).pow(2).mean((1, 2)).sqrt()
