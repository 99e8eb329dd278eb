"""Reward / success / done heads: the world model tells the policy how it is doing.

They read the backbone's pooled features of a frame in the clean (context) pass, i.e. of a frame after it
is generated, so in a rollout they cost nothing extra: the pass that caches the new frame's keys/values
also produces these features. Frame i's outputs are the labels of the transition i-1 -> i
(`next.reward`, `next.success`, `next.done` of step i-1 in LeRobot's alignment).
"""

from __future__ import annotations

import torch
from torch import nn


class OutcomeHeads(nn.Module):
    def __init__(self, width: int, hidden: int = 128):
        super().__init__()
        self.trunk = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, 3)  # reward (normalised), success logit, done logit

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        """features [..., width] -> reward [...], success_logit [...], done_logit [...]."""
        reward, success, done = self.out(self.trunk(features)).unbind(-1)
        return {"reward": reward, "success_logit": success, "done_logit": done}
