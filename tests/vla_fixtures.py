"""Helpers shared by the tests/test_vla_*.py and tests/test_policy_*.py files: stats and batches."""

from __future__ import annotations

import numpy as np
import torch

from worldloop.data.features import ACTION, STATE, TASK, image_key
from worldloop.data.stats import compute_stats

STATE_MEAN, STATE_STD = [0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 1.0, 2.0]
ACTION_MEAN, ACTION_STD = [0.0, 0.5, 1.0, -0.5], [0.3, 0.6, 0.9, 1.2]


def make_stats(seed: int = 0) -> dict:
    """data/stats.py-format statistics of made-up state and action data with known mean and std."""
    g = np.random.default_rng(seed)
    return {
        STATE: compute_stats(g.normal(STATE_MEAN, STATE_STD, size=(2000, 4))),
        ACTION: compute_stats(g.normal(ACTION_MEAN, ACTION_STD, size=(2000, 4))),
    }


def make_batch(
    b: int, cameras: tuple[str, ...], image_size: tuple[int, int], chunk: int, seed: int = 0
) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {image_key(c): torch.rand(b, 3, *image_size, generator=g) for c in cameras}
    batch[STATE] = torch.randn(b, 4, generator=g)
    batch[TASK] = [f"reach target {i % 2}" for i in range(b)]
    batch[ACTION] = torch.randn(b, chunk, 4, generator=g)
    return batch
