"""Reward / success / done heads: the world model tells the policy how it is doing.

They read the backbone's final tokens of a frame in the clean (context) pass, i.e. of a frame after it is
generated, so in a rollout they cost nothing extra: the pass that caches the new frame's keys/values
also produces these features. Frame i's outputs are the labels of the transition i-1 -> i
(`next.reward`, `next.success`, `next.done` of step i-1 in LeRobot's alignment).

Success depends on the instruction as much as on the picture ("reach the red cube" and "reach the blue
cube" differ only in words), so the heads also read the task: its hashed words (common/text.py). The
task embedding is the query of an attention pooling over the frame's tokens (look where the named object
is), and the pooled vector, the mean token and the task embedding meet in a hidden layer. A mean over
tokens alone lost where things are: that head learned its training episodes by heart (success AUROC 0.999
on training episodes, 0.68 on held-out ones). Without a task the embedding is zero.

With `use_state` the heads also read the robot's joint positions at the frame (normalised). In imagination
those are not drawn but integrated from the commanded actions (`WorldModelEnv`), so the verdict follows
what the policy actually commanded even where the drawn arm drifts towards the training data's habits;
the frame still tells where the objects are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from common.text import hashed_batch


@dataclass
class OutcomeHeadsConfig:
    hidden: int = 128
    use_state: bool = False  # also read the joint positions of the frame (see the module docstring)
    dropout: float = 0.0  # on the mixed features, against learning the training episodes by heart
    task_buckets: int = 1024
    task_words: int = 16

    def validate(self) -> None:
        if self.hidden < 1:
            raise ValueError(f"heads.hidden={self.hidden} must be >= 1")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"heads.dropout={self.dropout} must lie in [0, 1)")


class OutcomeHeads(nn.Module):
    def __init__(self, width: int, cfg: OutcomeHeadsConfig | None = None, state_dim: int = 0):
        super().__init__()
        cfg = cfg or OutcomeHeadsConfig()
        cfg.validate()
        if cfg.use_state and state_dim < 1:
            raise ValueError("heads.use_state=True needs the state size (idm.state_dim) to be >= 1")
        self.cfg = cfg
        hidden = cfg.hidden
        self.trunk = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.SiLU())
        self.task_embed = nn.EmbeddingBag(cfg.task_buckets + 1, hidden, mode="mean", padding_idx=0)
        self.query = nn.Linear(hidden, hidden)
        self.state_embed = (
            nn.Sequential(nn.Linear(state_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
            if cfg.use_state
            else None
        )
        parts = 4 if cfg.use_state else 3
        self.mix = nn.Sequential(nn.Linear(parts * hidden, hidden), nn.SiLU(), nn.Dropout(cfg.dropout))
        self.out = nn.Linear(hidden, 3)  # reward (normalised), success logit, done logit

    def task_features(self, task: list[str] | None, batch: int, device: torch.device) -> torch.Tensor:
        """[B, hidden] embedding of B instructions (zeros when there are none)."""
        if task is None:
            return torch.zeros(batch, self.trunk[1].out_features, device=device)
        if len(task) != batch:
            raise ValueError(f"outcome heads: {len(task)} instructions for a batch of {batch}")
        ids = hashed_batch(list(task), self.cfg.task_buckets, self.cfg.task_words)
        return self.task_embed(ids.to(device))

    def forward(
        self, tokens: torch.Tensor, task: list[str] | None = None, state: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """tokens [B, ..., P, width] (P tokens of a frame), task: B instructions, state [B, ..., S]
        (normalised joint positions, read with `use_state`) -> reward, success_logit, done_logit [B, ...]."""
        h = self.trunk(tokens)
        lead = [1] * (h.dim() - 2)  # the dims between the batch and the tokens
        t = self.task_features(task, h.shape[0], h.device)
        q = self.query(t).view(h.shape[0], *lead[:-1], 1, -1)
        weights = torch.softmax((h * q).sum(-1) / h.shape[-1] ** 0.5, -1)
        pooled = (weights.unsqueeze(-1) * h).sum(-2)
        t = t.view(h.shape[0], *lead[:-1], -1).expand_as(pooled)
        parts = [pooled, h.mean(-2), t]
        if self.state_embed is not None:
            if state is None or state.shape[:-1] != pooled.shape[:-1]:
                got = None if state is None else list(state.shape)
                raise ValueError(
                    f"outcome heads read the joint state (heads.use_state): expected state "
                    f"[{', '.join(map(str, pooled.shape[:-1]))}, S], got {got}"
                )
            parts.append(self.state_embed(state))
        z = self.mix(torch.cat(parts, -1))
        reward, success, done = self.out(z).unbind(-1)
        return {"reward": reward, "success_logit": success, "done_logit": done}
