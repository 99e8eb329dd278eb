"""The gym-pusht scripted pusher (sim/pusht.py) as a `Policy`: a member of a pusht policy zoo whose skill is
set, not trained, and which acts in the env and in imagination alike, since it reads only the camera frame
and the agent position.

    ScriptedPusherPolicy(ScriptedPusherConfig(skill=0.6)).save_pretrained("outputs/pusht_zoo/pusher_0.6")
    load_policy("outputs/pusht_zoo/pusher_0.6")   # config.yaml names the type; there are no weights

Its random draws (when to wander, where to, the aim noise) come from a numpy generator seeded from torch's
generator at `reset()`, so evaluations seeded the usual way (`common.rng.torch_seeded`) reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from worldloop.common.checkpoint import atomic_directory
from worldloop.common.config import load_config, save_config
from worldloop.data.features import STATE, image_key
from worldloop.sim.pusht import PushTPusher, PushTPusherConfig
from worldloop.vla.policy import Policy


@dataclass
class ScriptedPusherConfig:
    type: str = "scripted_pusher"  # read by vla.factory.load_policy to pick the class
    skill: float = 1.0  # see sim/pusht.py: PushTPusherConfig
    camera: str = "top"
    cameras: tuple[str, ...] = ("top",)  # what evaluation backends check a policy reads
    image_size: tuple[int, int] = (96, 96)  # frames of another size are read as they come (any size works)

    def __post_init__(self) -> None:
        PushTPusherConfig(skill=self.skill).validate()
        if tuple(self.cameras) != (self.camera,):
            raise ValueError(f"ScriptedPusherConfig.cameras={self.cameras} must be ({self.camera!r},)")


class ScriptedPusherPolicy(Policy):
    chunk_size = 1
    n_action_steps = 1
    action_dim = 2

    def __init__(self, config: ScriptedPusherConfig | None = None, stats: dict | None = None):
        super().__init__()
        self.config = config or ScriptedPusherConfig()
        self.pusher = PushTPusher(PushTPusherConfig(skill=self.config.skill))
        self._batch = 0

    def reset(self) -> None:
        self._batch = 0  # the pusher is reset at the first batch, whose size it learns from it

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        images = batch[image_key(self.config.camera)]  # [B, 3, H, W] in [0, 1]
        frames = (images.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        agent = batch[STATE].double().cpu().numpy()
        if len(frames) != self._batch:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
            self.pusher.reset(len(frames), np.random.default_rng(seed))
            self._batch = len(frames)
        action = self.pusher.act(frames, agent)
        return torch.from_numpy(action)[:, None].to(images.device)

    def select_action(self, batch: dict) -> torch.Tensor:
        return self.predict_action_chunk(batch)[:, 0]

    def save_pretrained(self, path: str | Path) -> None:
        with atomic_directory(path) as tmp:
            save_config(self.config, tmp / "config.yaml")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ScriptedPusherPolicy:
        return cls(load_config(ScriptedPusherConfig, Path(path) / "config.yaml"))
