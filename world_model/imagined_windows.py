"""Windows of the world model's own rollouts, labelled with the real episodes' outcomes.

In imagination the outcome heads judge generated frames, which drift from real ones as a rollout goes on
(blurrier, the arm a little off). Heads fitted on real frames only were right on real frames and near
chance on generated ones. These windows show the heads what they will be shown: each training episode is
rolled out from its first frame under its recorded actions, as `WorldModelEnv` rolls out from a reset, and
the generated frames keep the episode's joint states, rewards, success and done labels (the robot did
what the actions say; the frames are the model's picture of it).

Measured on reach (tiny world model): with 360 training episodes the heads learned these rollouts by
heart (held-out success AUROC on real frames 0.91 -> 0.67). With 1,440 episodes they did not: on open-loop
rollouts of held-out episodes the heads' AUROC went from 0.46 (fitted on real frames only) to 0.87, and the
policy-zoo ranking in imagination from Spearman -0.88 to 0.64 (Pearson 0.77)
(benchmarks/results/imagination_*_1600ep*.json).

Items have the layout of `data.windows.WorldModelWindows` items, so the two concatenate into one dataset.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from data.dataset import DatasetError, EpisodeDataset


class ImaginedWindows(Dataset):
    def __init__(
        self,
        model,
        dataset: EpisodeDataset,
        episodes: list[int],
        length: int,
        batch_size: int = 32,
        seed: int = 0,
    ):
        self.table = table = dataset.frame_table()
        self.cameras, self.length = list(dataset.cameras), length
        selected = [dataset.episodes[e] for e in episodes if dataset.episodes[e].length >= length]
        if not selected:
            raise DatasetError(f"dataset {dataset.root}: no episode has the {length} frames a window needs")
        self.frames: dict[int, torch.Tensor] = {}  # episode start -> uint8 [L, V, 3, H, W]
        by_length: dict[int, list] = {}
        for ep in selected:
            by_length.setdefault(ep.length, []).append(ep)
        generator = torch.Generator().manual_seed(seed)
        was_training = model.training
        model.eval()
        bar = tqdm(total=len(selected), desc="rolling out training episodes for the heads", unit="episode")
        for group in by_length.values():
            for i in range(0, len(group), batch_size):
                chunk = group[i : i + batch_size]
                real = torch.stack(
                    [
                        torch.stack([table.images[c][ep.start : ep.end] for c in self.cameras], 1)
                        for ep in chunk
                    ]
                )  # [B, n, V, 3, H, W] uint8
                actions = torch.stack([table.action[ep.start : ep.end - 1] for ep in chunk])
                generated, _, _ = model.rollout(
                    real[:, :1].float() / 255, actions[:, :0], actions, generator=generator
                )
                frames = torch.cat([real[:, :1], (generated * 255).round().to(torch.uint8)], 1)
                for ep, f in zip(chunk, frames):
                    self.frames[ep.start] = f
                bar.update(len(chunk))
        bar.close()
        model.train(was_training)
        self.starts = [
            (ep.index, ep.start, s) for ep in selected for s in range(ep.start, ep.end - length + 1)
        ]

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        episode, episode_start, start = self.starts[i]
        t, window = self.table, slice(start, start + self.length)
        offset = start - episode_start
        return {
            "frames": self.frames[episode_start][offset : offset + self.length],
            "actions": t.action[window],
            "state": t.state[window],
            "reward": t.reward[window],
            "success": t.success[window],
            "done": t.done[window],
            "task": t.task[start],
            "frame_index": int(t.frame_index[start]),
            "episode_index": episode,
        }
