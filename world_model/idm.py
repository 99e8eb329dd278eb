"""Inverse dynamics model: (frame_t, frame_t+1[, state_t]) -> the action taken at t.

Trained on real frames only. Used for the action-following metric here (do generated frames show the
commanded motion?) and, later, for the executability reward of world-model post-training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class InverseDynamicsConfig:
    channels: int = 32  # width of the first conv stage; doubles at each of the 4 stages
    use_state: bool = False  # also read the joint state at t (needs observation.state in the data)
    state_dim: int = 4
    action_dim: int = 4


class InverseDynamicsModel(nn.Module):
    def __init__(self, cfg: InverseDynamicsConfig, image_channels: int = 3, num_views: int = 1):
        super().__init__()
        self.cfg = cfg
        c = cfg.channels
        layers, in_ch = [], 2 * image_channels * num_views
        for out_ch in (c, 2 * c, 4 * c, 4 * c):
            layers += [nn.Conv2d(in_ch, out_ch, 4, stride=2, padding=1), nn.GroupNorm(8, out_ch), nn.SiLU()]
            in_ch = out_ch
        self.encoder = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(4), nn.Flatten())
        state_in = cfg.state_dim if cfg.use_state else 0
        self.head = nn.Sequential(
            nn.Linear(in_ch * 16 + state_in, 256), nn.SiLU(), nn.Linear(256, cfg.action_dim)
        )

    def forward(
        self, frame: torch.Tensor, next_frame: torch.Tensor, state: torch.Tensor | None = None
    ) -> torch.Tensor:
        """frame, next_frame [N, V, C, H, W] in [-1, 1]; state [N, state_dim] normalised -> [N, action_dim]
        normalised actions."""
        h = self.encoder(torch.cat([frame.flatten(1, 2), next_frame.flatten(1, 2)], 1))
        if self.cfg.use_state:
            if state is None:
                raise ValueError("the inverse dynamics model was configured with use_state=True: pass state")
            h = torch.cat([h, state], -1)
        return self.head(h)
