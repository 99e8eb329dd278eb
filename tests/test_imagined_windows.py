"""Windows of the model's own rollouts carry the real episode's labels and the model's frames."""

from __future__ import annotations

import torch
from imagination_fixtures import IMAGE_SIZE, tiny_world_model

from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.windows import WorldModelWindows
from worldloop.world_model.imagined_windows import ImaginedWindows


def test_imagined_windows_match_the_real_layout_and_the_models_rollout(tmp_path, tiny_lerobot_dataset):
    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=8, image_size=(IMAGE_SIZE, IMAGE_SIZE))
    dataset = EpisodeDataset(DatasetConfig(root=str(root), cameras=["front"], image_size=[IMAGE_SIZE] * 2))
    wm = tiny_world_model()
    imagined = ImaginedWindows(wm, dataset, [0, 2], length=4, seed=3)
    real = WorldModelWindows(dataset, [0, 2], context=1, horizon=3)
    assert len(imagined) == len(real)
    for i in (0, len(real) - 1):
        a, b = imagined[i], real[i]
        assert a.keys() == b.keys()
        assert a["frames"].shape == b["frames"].shape and a["frames"].dtype == torch.uint8
        for key in ("actions", "state", "reward", "success", "done"):
            assert torch.equal(a[key], b[key])
    first = imagined[0]
    assert torch.equal(first["frames"][0], real[0]["frames"][0])  # the rollout starts from the real frame
    assert not torch.equal(first["frames"][1:], real[0]["frames"][1:])  # then the model draws
    # The same rollout as the world model's own, under the episode's recorded actions.
    table = dataset.frame_table()
    ep = dataset.episodes[0]
    start = table.images["front"][ep.start : ep.start + 1][None].unsqueeze(2).float() / 255
    actions = table.action[ep.start : ep.end - 1][None]
    again = ImaginedWindows(wm, dataset, [0], length=4, seed=3)
    frames, _, _ = wm.rollout(start, actions[:, :0], actions, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again[0]["frames"][1:4], (frames[0, :3] * 255).round().to(torch.uint8))
