"""Exponential moving average of a model's weights (the weights that are evaluated and exported)."""

from __future__ import annotations

import copy

import torch
from torch import nn


@torch.no_grad()
def follow(target: nn.Module, source: nn.Module, decay: float) -> None:
    """target <- decay * target + (1 - decay) * source, parameter by parameter; buffers are copied."""
    for t, s in zip(target.parameters(), source.parameters()):
        t.lerp_(s.detach().to(t.dtype), 1.0 - decay)
    for t, s in zip(target.buffers(), source.buffers()):
        t.copy_(s)


class EMA:
    """Keeps `decay`-averaged copies of parameters; buffers are copied as they are.

    The effective decay warms up as min(decay, (1 + n) / (10 + n)) so that early averages are not dominated
    by the random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.num_updates = 0
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        follow(self.model, model, self.current_decay())
        self.num_updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor], num_updates: int) -> None:
        self.model.load_state_dict(state)
        self.num_updates = num_updates
