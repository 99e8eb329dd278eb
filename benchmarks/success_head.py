"""Does the world model's success head generalise? Its per-frame success probability on real frames.

    python benchmarks/success_head.py --world_model=outputs/world_model/tiny/pretrained_model \
        --dataset.root=outputs/data/reach_wm

The heads read real frames with their joint states and instructions (in a rollout they read the generated
frames and the integrated states). For training and held-out episodes (the dataset's
seeded split, the one world-model training uses) it reports the AUROC of the per-frame success probability
against `next.success`, and per episode whether the head ever crosses 0.5 against whether the episode
succeeded. A head that scores well on training episodes only has learned them by heart.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.common.stats import auroc  # noqa: E402
from worldloop.data.dataset import DatasetConfig, EpisodeDataset  # noqa: E402
from worldloop.world_model.model import WorldModel  # noqa: E402


@dataclass
class SuccessHeadBenchmarkConfig:
    world_model: str = "outputs/world_model/tiny/pretrained_model"
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    episodes: int = 40  # per split
    batch: int = 10
    threads: int = 2
    name: str = "success_head"  # result file: benchmarks/results/<name>.json


@torch.no_grad()
def success_probabilities(
    wm: WorldModel, dataset: EpisodeDataset, episodes: list[int], length: int, batch: int
):
    """Per-frame success probabilities [N, length - 1] and labels of the first `length` frames of each episode."""
    table = dataset.frame_table()
    camera = wm.cfg.cameras[0]
    probs, labels = [], []
    for i in range(0, len(episodes), batch):
        starts = [dataset.episodes[e].start for e in episodes[i : i + batch]]
        window = [slice(s, s + length) for s in starts]
        frames = torch.stack([table.images[camera][w] for w in window]).float() / 255
        state = torch.stack([table.state[w] for w in window])
        task = [table.task[s] for s in starts]
        pixels = wm.frames_in(frames.unsqueeze(2))  # one camera; frame 0 is the episode's first
        out = wm.outcomes(pixels[:, 1:], task, state[:, 1:], pixels[:, 0])
        probs.append(torch.sigmoid(out["success_logit"]))
        labels.append(torch.stack([table.success[s : s + length - 1] for s in starts]).float())
    return torch.cat(probs), torch.cat(labels)


def main() -> None:
    cfg = parse_cli(SuccessHeadBenchmarkConfig)
    torch.set_num_threads(cfg.threads)
    wm = WorldModel.from_pretrained(cfg.world_model)
    if len(wm.cfg.cameras) != 1:
        raise SystemExit(f"{cfg.world_model}: this check reads one camera, the model draws {wm.cfg.cameras}")
    cfg.dataset.cameras = list(wm.cfg.cameras)
    cfg.dataset.image_size = [wm.pixel_size] * 2
    dataset = EpisodeDataset(cfg.dataset)
    train, held_out = dataset.split()
    length = min(dataset.episodes[e].length for e in train + held_out)
    rows = []
    for name, episodes in (("train", train), ("held_out", held_out)):
        probs, labels = success_probabilities(wm, dataset, episodes[: cfg.episodes], length, cfg.batch)
        succeeded, predicted = labels.max(1).values, (probs > 0.5).float().max(1).values
        rows.append(
            {
                "split": name,
                "episodes": len(probs),
                "frames_labelled_success": float(labels.mean()),
                "per_frame_auroc": auroc(probs.flatten().tolist(), labels.flatten().bool().tolist()),
                "episode_agreement": float((predicted == succeeded).float().mean()),
                "head_episode_success": float(predicted.mean()),
                "real_episode_success": float(succeeded.mean()),
            }
        )
    print_table(rows, title=f"success head on real frames ({length} frames per episode)")
    figures = {
        "world_model": cfg.world_model,
        "dataset": cfg.dataset.root,
        "frames_per_episode": length,
        "rows": rows,
    }
    path = write_result(cfg.name, figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
