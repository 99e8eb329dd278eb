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
(docs/results/imagination_*_1600ep*.json).

Items have the layout of `data.windows.WorldModelWindows` items, so the two concatenate into one dataset.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from worldloop.data.dataset import EpisodeDataset
from worldloop.data.windows import WorldModelWindows


class ImaginedWindows(WorldModelWindows):
    """`WorldModelWindows` of `length` frames whose frames 1.. are the model's rollout of the episode."""

    def __init__(
        self,
        model,
        dataset: EpisodeDataset,
        episodes: list[int],
        length: int,
        batch_size: int = 32,
        seed: int = 0,
    ):
        super().__init__(dataset, episodes, context=1, horizon=length - 1)
        table, cameras = self.table, list(dataset.cameras)
        windowed = {e for e, _ in self.starts}
        selected = [dataset.episodes[e] for e in episodes if e in windowed]  # in the caller's order
        self.imagined: dict[int, torch.Tensor] = {}  # episode -> uint8 [L, V, 3, H, W], frame 0 real
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
                first = torch.stack(
                    [torch.stack([table.images[c][ep.start] for c in cameras]) for ep in chunk]
                )[:, None]  # [B, 1, V, 3, H, W] uint8
                actions = torch.stack([table.action[ep.start : ep.end - 1] for ep in chunk])
                generated, _, _ = model.rollout(
                    first.float() / 255, actions[:, :0], actions, generator=generator
                )
                frames = torch.cat([first, (generated * 255).round().to(torch.uint8)], 1)
                for ep, f in zip(chunk, frames):
                    self.imagined[ep.index] = f
                bar.update(len(chunk))
        bar.close()
        model.train(was_training)

    def _table_frames(self, episode: int, start: int) -> torch.Tensor:
        offset = start - self.dataset.episodes[episode].start
        return self.imagined[episode][offset : offset + self.length]
