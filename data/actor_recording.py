"""Record episodes of any actor in the tabletop sim into a new local LeRobotDataset v3, and grow a dataset
by appending others to it (the closed loop: what the policy did in the sim becomes world-model data).

    episodes = record_actor_episodes(env, actor, root, seeds)       # actor: reset(seed=...), act()
    grow_dataset([base_root, new_root], out_root)                    # lerobot's aggregate_datasets

Frames are written by `data.recording`'s episode recorder, so they have exactly the layout of recorded
demonstrations (observation at t, action at t, `next.*` after it): failures are kept, and each frame's
`next.success` labels whether the task was solved. Per-episode facts (seed, success, length) go to
`meta/recording.json` as in `record_demos.py`.

Growing copies every source into a fresh dataset with lerobot's `aggregate_datasets` (episode indices
renumbered in order, tasks merged), so the result is an ordinary dataset anything can read; the sources
must agree on fps, robot type and features, which is checked first with an error naming the one that
differs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from datasets.utils import logging as hf_logging

from worldloop.common.checkpoint import atomic_write_text
from worldloop.data.features import lerobot_features
from worldloop.data.recording import RECORDING_META, _record_episode


def record_actor_episodes(
    env, actor, root: str | Path, seeds: Sequence[int], repo_id: str = ""
) -> list[dict]:
    """One episode per seed of `actor` in `env` (a `TabletopEnv`, possibly wrapped) into a new dataset at
    `root` with the env's cameras and image size; returns per-episode seed, success and length."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(root)
    if root.exists():
        raise FileExistsError(f"recording root {root} exists; each recording needs a new directory")
    base = env.unwrapped
    size = base.config.image_size
    dataset = LeRobotDataset.create(
        repo_id or f"local/{root.name}",
        fps=base.embodiment.fps,
        features=lerobot_features(base.embodiment.joint_names, tuple(base.config.cameras), (size, size)),
        root=root,
        robot_type=base.embodiment.name,
        use_videos=False,
    )
    episodes: list[dict] = []
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        for seed in seeds:
            episodes.append(_record_episode(env, actor, dataset, int(seed)))
    finally:
        if dataset.episode_buffer is not None and dataset.episode_buffer["size"] > 0:
            dataset.clear_episode_buffer()  # an interrupted episode is incomplete: drop it
        dataset.finalize()
        dataset.stop_image_writer()
        if bars_were_on:
            hf_logging.enable_progress_bar()
        meta = {"complete": len(episodes) == len(seeds), "episodes": episodes}
        atomic_write_text(root / RECORDING_META, json.dumps(meta, indent=1) + "\n")
    return episodes


def check_compatible(roots: Sequence[str | Path]) -> None:
    """Raise naming the first dataset whose fps, robot type or features differ from the first one's."""
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    metas = [LeRobotDatasetMetadata(f"local/{Path(r).name}", root=r) for r in roots]
    first = metas[0]
    for root, meta in zip(roots[1:], metas[1:]):
        for name in ("fps", "robot_type"):
            if getattr(meta, name) != getattr(first, name):
                raise ValueError(
                    f"dataset {root}: {name}={getattr(meta, name)!r} differs from {roots[0]}'s "
                    f"{getattr(first, name)!r}; datasets must agree to be grown into one"
                )
        keys = set(meta.features) | set(first.features)
        differing = sorted(k for k in keys if meta.features.get(k) != first.features.get(k))
        if differing:
            k = differing[0]
            raise ValueError(
                f"dataset {root}: feature {k!r} is {meta.features.get(k)} but {first.features.get(k)} in "
                f"{roots[0]} ({len(differing)} features differ); record with the same cameras and image size"
            )


def grow_dataset(roots: Sequence[str | Path], out_root: str | Path, repo_id: str = "") -> Path:
    """A new dataset at `out_root` holding every episode of `roots`, in order; returns `out_root`."""
    from lerobot.datasets.aggregate import aggregate_datasets

    out_root = Path(out_root)
    if out_root.exists():
        raise FileExistsError(f"dataset root {out_root} exists; growing writes a new dataset")
    if not roots:
        raise ValueError("grow_dataset needs at least one source dataset")
    check_compatible(roots)
    aggregate_datasets(
        repo_ids=[f"local/{Path(r).name}" for r in roots],
        aggr_repo_id=repo_id or f"local/{out_root.name}",
        roots=[Path(r) for r in roots],
        aggr_root=out_root,
    )
    return out_root
