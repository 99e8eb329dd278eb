"""Datasets whose cameras are stored as mp4 (lerobot's default for recorded data) read like PNG ones."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_lerobot_dataset

from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.windows import WorldModelWindows


@pytest.mark.slow
def test_video_dataset_cache_matches_lerobot_decoding(tmp_path):
    root = make_tiny_lerobot_dataset(
        tmp_path / "ds", episodes=2, length=[6, 8], image_size=(64, 64), use_videos=True
    )
    dataset = EpisodeDataset(DatasetConfig(root=str(root)))
    assert dataset.meta.video_keys == ["observation.images.front"]
    table = dataset.frame_table()
    # Lossy codec: the frame index in channel 0 survives only approximately.
    assert (table.images["front"][:, 0].float().mean((1, 2)) - table.frame_index.float()).abs().max() < 4
    cached = WorldModelWindows(dataset, context=3, horizon=2, cache=True)
    direct = WorldModelWindows(dataset, context=3, horizon=2, cache=False)
    assert len(cached) == len(direct) == 2 + 4
    for i in range(len(cached)):
        # Both decode the same mp4 at the same timestamps through lerobot: identical frames.
        assert torch.equal(cached[i]["frames"], direct[i]["frames"])
