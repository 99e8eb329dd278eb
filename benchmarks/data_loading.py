"""How fast world-model windows and policy samples come out of a LeRobotDataset: in-memory cache vs lerobot.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/data_loading.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/data_loading.py --videos=true   # mp4 instead of PNG frames

Writes a synthetic dataset (textured frames so PNG/mp4 decoding costs what it does on rendered images),
then times `WorldModelWindows` and `PolicySamples` through a DataLoader with `cache=True` (frames decoded
once into uint8 tensors) and `cache=False` (lerobot's `__getitem__` with `delta_timestamps`). The world
model trains at ~80 samples/s on this machine, so a path well above that keeps it fed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.embodiment import TABLETOP_ARM  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.data.dataset import DatasetConfig, EpisodeDataset  # noqa: E402
from worldloop.data.features import ACTION, DONE, REWARD, STATE, SUCCESS, TASK, image_key, lerobot_features  # noqa: E402
from worldloop.data.windows import PolicySamples, WorldModelWindows  # noqa: E402


@dataclass
class DataLoadingBenchmarkConfig:
    episodes: int = 50
    length: int = 50
    image_size: int = 64
    videos: bool = False
    context: int = 4
    horizon: int = 1
    chunk_size: int = 8
    batch_size: int = 32
    cached_items: int = 4096  # items timed per cached path
    lerobot_items: int = 512  # items timed per lerobot path (slower)
    seed: int = 0
    name: str = "data_loading"


def write_dataset(root: Path, cfg: DataLoadingBenchmarkConfig) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = lerobot_features(TABLETOP_ARM.joint_names, ("front",), (cfg.image_size, cfg.image_size))
    if cfg.videos:
        features[image_key("front")]["dtype"] = "video"
    ds = LeRobotDataset.create(
        "bench/data_loading", fps=TABLETOP_ARM.fps, features=features, root=root, use_videos=cfg.videos
    )
    rng = np.random.default_rng(cfg.seed)
    s = cfg.image_size
    yy, xx = np.mgrid[0:s, 0:s]
    for _ in range(cfg.episodes):
        background = rng.integers(0, 256, size=(s, s, 3), dtype=np.uint8) // 4 + 96  # texture, not flat
        center = rng.uniform(8, s - 8, size=2)
        for t in range(cfg.length):
            center = np.clip(center + rng.normal(0, 1.5, size=2), 4, s - 4)
            blob = (yy - center[0]) ** 2 + (xx - center[1]) ** 2 < 36
            img = background.copy()
            img[blob] = (220, 60, 40)
            joints = rng.uniform(-1, 1, size=TABLETOP_ARM.num_joints).astype(np.float32)
            ds.add_frame(
                {
                    image_key("front"): img,
                    STATE: joints,
                    ACTION: joints + np.float32(0.1),
                    REWARD: np.array([0.0], dtype=np.float32),
                    SUCCESS: np.array([False]),
                    DONE: np.array([t == cfg.length - 1]),
                    TASK: "push the red block",
                }
            )
        ds.save_episode()
    ds.finalize()


def items_per_second(dataset: torch.utils.data.Dataset, n: int, batch_size: int, seed: int) -> float:
    """Items/s through a single-process DataLoader over a random subset of `n` items."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    subset = Subset(dataset, (order.repeat(n // len(dataset) + 1)[:n]).tolist())
    start = time.perf_counter()
    count = sum(len(batch[TASK]) for batch in DataLoader(subset, batch_size=batch_size, num_workers=0))
    return count / (time.perf_counter() - start)


def main() -> None:
    cfg = parse_cli(DataLoadingBenchmarkConfig)
    torch.manual_seed(cfg.seed)
    tmp = Path(tempfile.mkdtemp(prefix="worldloop-bench-"))
    try:
        root = tmp / "dataset"
        t0 = time.perf_counter()
        write_dataset(root, cfg)
        write_s = time.perf_counter() - t0
        dataset = EpisodeDataset(DatasetConfig(root=str(root)))
        t0 = time.perf_counter()
        table = dataset.frame_table()
        cache_s = time.perf_counter() - t0
        cache_mb = sum(t.numel() for t in table.images.values()) / 2**20
        rows = []
        for cache in (True, False):
            n = cfg.cached_items if cache else cfg.lerobot_items
            windows = WorldModelWindows(dataset, context=cfg.context, horizon=cfg.horizon, cache=cache)
            samples = PolicySamples(dataset, chunk_size=cfg.chunk_size, cache=cache)
            rows.append(
                {
                    "path": "cache" if cache else "lerobot __getitem__",
                    "wm_windows_per_s": items_per_second(windows, n, cfg.batch_size, cfg.seed),
                    "policy_samples_per_s": items_per_second(samples, n, cfg.batch_size, cfg.seed),
                    "items_timed": n,
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    frames = cfg.episodes * cfg.length
    title = (
        f"{cfg.episodes} episodes x {cfg.length} frames, {cfg.image_size}x{cfg.image_size}, "
        f"{'mp4' if cfg.videos else 'PNG'} frames, window {cfg.context}+{cfg.horizon}, chunk {cfg.chunk_size}, "
        f"batch {cfg.batch_size}, torch threads {torch.get_num_threads()}"
    )
    print_table(rows, title)
    print(
        f"cache build: {cache_s:.2f} s ({frames / cache_s:.0f} frames/s, {cache_mb:.1f} MiB); write: {write_s:.1f} s"
    )
    figures = {
        "setup": title,
        "frames": frames,
        "write_dataset_s": round(write_s, 2),
        "cache_build_s": round(cache_s, 3),
        "cache_frames_per_s": round(frames / cache_s, 1),
        "cache_image_mib": round(cache_mb, 2),
        "paths": [{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
        "load_average_1m_at_end": round(
            os.getloadavg()[0], 2
        ),  # the machine is shared: context for the numbers
    }
    command = " ".join(
        [
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}",
            ".venv/bin/python",
            *map(shlex.quote, sys.argv),
        ]
    )
    path = write_result(cfg.name + ("_videos" if cfg.videos else ""), figures, command)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
