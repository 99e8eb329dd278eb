"""What every worldloop policy class shares: dataset statistics, the action queue and the checkpoint layout.

A pretrained-policy directory holds `config.yaml` (the policy's config dataclass, whose `type` field names
the class for `vla.factory.load_policy`), `model.safetensors` and `stats.json` (data/stats.py format).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import torch

from worldloop.common.checkpoint import atomic_directory, load_model_weights, save_tensors
from worldloop.common.config import load_config, save_config
from worldloop.data.features import ACTION, STATE
from worldloop.data.stats import Normalizer, Stats, load_stats, save_stats
from worldloop.vla.policy import Policy


class PretrainedPolicy(Policy):
    """A `Policy` built from `(config, stats)`; subclasses set `config_class` and implement the model."""

    config_class: type

    def __init__(self, config, stats: Stats):
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__}: expected a {self.config_class.__name__}, got {type(config).__name__}"
            )
        self.config = config
        self.action_dim = config.action_dim
        self.n_action_steps = config.n_action_steps
        _check_stats(stats, {STATE: config.state_dim, ACTION: config.action_dim})
        self.stats = stats
        # The modes are fixed: a checkpoint's behaviour must not depend on a default changing later.
        self.normalizer = Normalizer(stats, {STATE: "mean_std", ACTION: "mean_std"})
        self._queue: deque[torch.Tensor] = deque()

    @property
    def training_chunk_size(self) -> int:
        """Length of the action windows the BC loss trains on (longer than `chunk_size` for Diffusion)."""
        return self.chunk_size

    def reset(self) -> None:
        self._queue.clear()

    @torch.no_grad()
    def select_action(self, batch: dict) -> torch.Tensor:
        if not self._queue:
            chunk = self.predict_action_chunk(batch)[:, : self.n_action_steps]
            self._queue.extend(chunk.transpose(0, 1))
        return self._queue.popleft()

    def save_pretrained(self, path: str | Path) -> None:
        with atomic_directory(path) as tmp:
            save_config(self.config, tmp / "config.yaml")
            save_tensors(self.state_dict(), tmp / "model.safetensors")
            save_stats(self.stats, tmp / "stats.json")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> PretrainedPolicy:
        path = Path(path)
        policy = cls(load_config(cls.config_class, path / "config.yaml"), load_stats(path / "stats.json"))
        load_model_weights(policy, path / "model.safetensors")
        return policy.eval()


def _check_stats(stats: Stats, dims: dict[str, int]) -> None:
    if stats is None:
        raise ValueError(
            "a policy needs dataset stats for observation.state and action (data.stats.dataset_stats)"
        )
    for key, dim in dims.items():
        if key not in stats:
            raise ValueError(f"stats: no entry for {key!r}; have {sorted(stats)}")
        for what in ("mean", "std"):
            size = len(stats[key][what]) if what in stats[key] else None
            if size != dim:
                raise ValueError(f"stats[{key!r}][{what!r}]: expected {dim} values, got {size}")
