"""Reward / success / done heads: the world model tells the policy how it is doing.

They read the backbone's pooled features of a frame in the clean (context) pass, i.e. of a frame after it
is generated, so in a rollout they cost nothing extra: the pass that caches the new frame's keys/values
also produces these features. Frame i's outputs are the labels of the transition i-1 -> i
(`next.reward`, `next.success`, `next.done` of step i-1 in LeRobot's alignment).

Success depends on the instruction as much as on the picture ("reach the red cube" and "reach the blue
cube" differ only in words), so the heads also read the task: its hashed words (common/text.py), mixed
with the frame features through a hidden layer so the two can interact. Without a task the embedding is
zero, as for an empty instruction.
"""

from __future__ import annotations

import torch
from torch import nn

from common.text import hashed_batch


class OutcomeHeads(nn.Module):
    def __init__(self, width: int, hidden: int = 128, task_buckets: int = 1024, task_words: int = 16):
        super().__init__()
        self.task_buckets, self.task_words = task_buckets, task_words
        self.trunk = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.SiLU())
        self.task_embed = nn.EmbeddingBag(task_buckets + 1, hidden, mode="mean", padding_idx=0)
        self.mix = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, 3)  # reward (normalised), success logit, done logit

    def task_features(self, task: list[str] | None, batch: int, device: torch.device) -> torch.Tensor:
        """[B, hidden] embedding of B instructions (zeros when there are none)."""
        if task is None:
            return torch.zeros(batch, self.trunk[1].out_features, device=device)
        if len(task) != batch:
            raise ValueError(f"outcome heads: {len(task)} instructions for a batch of {batch}")
        return self.task_embed(hashed_batch(list(task), self.task_buckets, self.task_words).to(device))

    def forward(self, features: torch.Tensor, task: list[str] | None = None) -> dict[str, torch.Tensor]:
        """features [B, ..., width], task: B instructions -> reward, success_logit, done_logit [B, ...]."""
        h = self.trunk(features)
        t = self.task_features(task, h.shape[0], h.device)
        t = t.view(h.shape[0], *[1] * (h.dim() - 2), -1).expand_as(h)
        reward, success, done = self.out(self.mix(torch.cat([h, t], -1))).unbind(-1)
        return {"reward": reward, "success_logit": success, "done_logit": done}
