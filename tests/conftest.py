"""Shared pytest fixtures.

`tiny_lerobot_dataset` writes a small synthetic LeRobotDataset v3 to disk whose every value is a known
function of (episode, frame, camera), so tests can check alignment by construction:

    image (camera c), every pixel:  channel 0 = frame index, channel 1 = episode index, channel 2 = c
    observation.state[j]          = 100 * episode + frame + j / 10
    action[j]                     = state[j] + 0.5          (the action taken at that frame)
    next.reward                   = frame / length
    next.success                  = last frame of an even episode
    next.done                     = last frame
    task                          = "task <episode % 2>"

Use the `pattern_*` helpers below instead of repeating these formulas in tests.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import ACTION, DONE, REWARD, STATE, SUCCESS, TASK, image_key, lerobot_features

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub

TINY_REPO_ID = "worldloop/tiny"


def pattern_image(episode: int, frame: int, camera_number: int, image_size: tuple[int, int]) -> np.ndarray:
    h, w = image_size
    img = np.empty((h, w, 3), dtype=np.uint8)
    img[..., 0] = frame
    img[..., 1] = episode
    img[..., 2] = camera_number
    return img


def pattern_state(episode: int, frame: int, dim: int = TABLETOP_ARM.num_joints) -> np.ndarray:
    return (100 * episode + frame + np.arange(dim) / 10).astype(np.float32)


def pattern_action(episode: int, frame: int, dim: int = TABLETOP_ARM.num_joints) -> np.ndarray:
    return pattern_state(episode, frame, dim) + np.float32(0.5)


def pattern_task(episode: int) -> str:
    return f"task {episode % 2}"


def make_tiny_lerobot_dataset(
    root: str | Path,
    episodes: int = 3,
    length: int | Sequence[int] = 8,
    image_size: tuple[int, int] = (16, 16),
    cameras: tuple[str, ...] = ("front",),
    use_videos: bool = False,
    with_rewards: bool = True,
) -> Path:
    """Write the synthetic dataset under `root` (which must not exist yet) and return `root`.

    `with_rewards=False` leaves out next.reward/success/done, like most converted public datasets."""
    root = Path(root)
    lengths = [length] * episodes if isinstance(length, int) else list(length)
    if len(lengths) != episodes:
        raise ValueError(f"got {len(lengths)} episode lengths for {episodes} episodes")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = lerobot_features(TABLETOP_ARM.joint_names, cameras, image_size)
    if not with_rewards:
        for key in (REWARD, SUCCESS, DONE):
            del features[key]
    if use_videos:
        for cam in cameras:
            features[image_key(cam)]["dtype"] = "video"
    ds = LeRobotDataset.create(
        TINY_REPO_ID,
        fps=TABLETOP_ARM.fps,
        features=features,
        root=root,
        robot_type=TABLETOP_ARM.name,  # its joints: training resolves embodiment=auto to the built-in arm
        use_videos=use_videos,
    )
    for ep, n in enumerate(lengths):
        for t in range(n):
            frame = {image_key(cam): pattern_image(ep, t, c, image_size) for c, cam in enumerate(cameras)}
            frame[STATE] = pattern_state(ep, t)
            frame[ACTION] = pattern_action(ep, t)
            if with_rewards:
                frame[REWARD] = np.array([t / n], dtype=np.float32)
                frame[SUCCESS] = np.array([t == n - 1 and ep % 2 == 0])
                frame[DONE] = np.array([t == n - 1])
            frame[TASK] = pattern_task(ep)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


@pytest.fixture
def tiny_lerobot_dataset():
    """A factory: `tiny_lerobot_dataset(tmp_path, episodes=3, length=8, image_size=(16, 16))` -> root.

    The dataset is written to `tmp_path / "dataset"` (a fresh name per call with `name=`)."""

    def make(tmp_path: Path, name: str = "dataset", **kwargs) -> Path:
        return make_tiny_lerobot_dataset(Path(tmp_path) / name, **kwargs)

    return make


SHARED_LENGTHS = (6, 3, 9, 5)  # episode 1 is shorter than a 4-frame window


@pytest.fixture(scope="session")
def shared_tiny_dataset_root(tmp_path_factory) -> Path:
    """One read-only synthetic dataset for the whole session: 4 episodes of SHARED_LENGTHS frames,
    cameras front and wrist, 16x16. Tests must not modify it (copy it first)."""
    return make_tiny_lerobot_dataset(
        tmp_path_factory.mktemp("shared") / "dataset",
        episodes=len(SHARED_LENGTHS),
        length=list(SHARED_LENGTHS),
        cameras=("front", "wrist"),
    )


def record_tiny_push(root: Path, episodes: int, image_size: int, max_steps: int, **config) -> Path:
    """Push episodes from our simulator (scripted expert, front camera), not stopped at success, with the
    cubes' positions recorded (`observation.environment_state`): the data the object metrics score. `config`:
    further `RecordingConfig` fields."""
    from worldloop.sim.recording import RecordingConfig, record_demos

    record_demos(
        RecordingConfig(
            root=str(root),
            task="push",
            episodes=episodes,
            image_size=image_size,
            cameras=["front"],
            max_steps=max_steps,
            terminate_on_success=False,
            image_writer_threads=0,
            environment_state=True,
            **config,
        )
    )
    return root
