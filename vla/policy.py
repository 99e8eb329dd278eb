"""The policy interface every part of worldloop sees (imagination, RL, the real-time runtime).

It has the shape of LeRobot's `PreTrainedPolicy`, so LeRobot policies plug in through a thin adapter.

A batch is a dict:
- `observation.images.<camera>`: float tensor in [0, 1], [B, 3, H, W]
- `observation.state`: float tensor [B, state_dim] (raw joint positions; the policy normalises)
- `task`: list of B instruction strings
Actions are returned unnormalised (absolute joint-position targets), [B, H, action_dim].
"""

from __future__ import annotations

import abc
from pathlib import Path

import torch
from torch import nn


class Policy(nn.Module, abc.ABC):
    """A policy that predicts chunks of `chunk_size` actions and executes `n_action_steps` of each."""

    chunk_size: int
    n_action_steps: int
    action_dim: int

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget any queued actions; call at the start of each episode."""

    @abc.abstractmethod
    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        """[B, chunk_size, action_dim] unnormalised actions."""

    @abc.abstractmethod
    def select_action(self, batch: dict) -> torch.Tensor:
        """[B, action_dim]: the next action, from a queue refilled with `predict_action_chunk`."""

    @abc.abstractmethod
    def save_pretrained(self, path: str | Path) -> None:
        """Write `config.yaml`, `model.safetensors` and `stats.json` into directory `path`."""

    @classmethod
    @abc.abstractmethod
    def from_pretrained(cls, path: str | Path) -> Policy:
        """Load what `save_pretrained` wrote (safetensors; never unpickles arbitrary objects)."""
