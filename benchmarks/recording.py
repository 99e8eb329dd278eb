"""Demo recording throughput (episodes/min) and dataset size (MB per 100 episodes), LeRobotDataset v3.

    MUJOCO_GL=egl OMP_NUM_THREADS=1 python benchmarks/recording.py [--episodes 20]

Records push episodes from a skill mixture (as the world model's data would be), 64x64, both cameras,
PNG images inside parquet (use_videos=False), with and without lerobot's async image-writer threads.
The machine is shared: the load average is recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.data.recording import RECORDING_META  # noqa: E402
from worldloop.sim.recording import RecordingConfig, record_demos  # noqa: E402


def directory_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def measure(episodes: int, image_size: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RecordingConfig(
            root=f"{tmp}/demos",
            repo_id="worldloop/bench_recording",
            task="push",
            episodes=episodes,
            skill_range=[0.3, 1.0],
            image_size=image_size,
            image_writer_threads=threads,
        )
        t = time.perf_counter()
        root = record_demos(cfg)
        seconds = time.perf_counter() - t
        meta = json.loads((root / RECORDING_META).read_text())
        frames = sum(e["length"] for e in meta["episodes"])
        size = directory_mb(root)
    return {
        "image_size": f"{image_size}x{image_size}",
        "image_writer_threads": threads,
        "episodes": episodes,
        "frames": frames,
        "episodes_per_min": episodes / seconds * 60,
        "frames_per_s": frames / seconds,
        "mb_per_100_episodes": size / episodes * 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--threads", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64])
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = [measure(args.episodes, size, threads) for size in args.sizes for threads in args.threads]
    print_table(rows, title="recording push demos (skill mixture 0.3-1.0, cameras front+wrist)")
    load = {"load_avg_1min_before": load_before, "load_avg_1min_after": os.getloadavg()[0]}
    print(f"machine load (1-min average) before/after: {load_before:.1f} / {load['load_avg_1min_after']:.1f}")
    path = write_result("recording", {**load, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
