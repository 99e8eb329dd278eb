"""Small LeRobotDatasets of any state/action size, written in tests (no hub), for the embodiment tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worldloop.data.features import ACTION, DONE, REWARD, STATE, SUCCESS, TASK, image_key


def write_vector_dataset(
    root: Path,
    states: list[np.ndarray],
    actions: list[np.ndarray],
    fps: int,
    state_names=None,
    action_names=None,
    robot_type: str | None = None,
    camera: str = "top",
    image_size: tuple[int, int] = (24, 24),
    success: list[bool] | None = None,
    task: str = "push the block",
) -> Path:
    """One episode per [T, D] array of `states` (and `actions`). Frames: a dot drawn where the first two
    state values put it, so frames follow the state. `success[i]`: episode i succeeds on its last frame
    (next.reward is the frame's share of the episode); None writes no reward features."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dim = states[0].shape[1]
    h, w = image_size
    features = {
        image_key(camera): {"dtype": "image", "shape": (h, w, 3), "names": ["height", "width", "channels"]},
        STATE: {"dtype": "float32", "shape": (dim,), "names": state_names},
        ACTION: {"dtype": "float32", "shape": (actions[0].shape[1],), "names": action_names},
    }
    if success is not None:
        features[REWARD] = {"dtype": "float32", "shape": (1,), "names": None}
        features[SUCCESS] = {"dtype": "bool", "shape": (1,), "names": None}
        features[DONE] = {"dtype": "bool", "shape": (1,), "names": None}
    ds = LeRobotDataset.create(
        "test/vectors", fps=fps, features=features, root=root, robot_type=robot_type, use_videos=False
    )
    lo = np.concatenate(states).min(0)
    span = np.maximum(np.concatenate(states).max(0) - lo, 1e-6)
    for ep, (s, a) in enumerate(zip(states, actions)):
        n = len(s)
        for t in range(n):
            img = np.full((h, w, 3), 40, dtype=np.uint8)
            y, x = (
                ((s[t, :2] - lo[:2]) / span[:2] * (np.array([h, w]) - 3)).astype(int) if dim > 1 else (0, 0)
            )
            img[y : y + 3, x : x + 3] = 230
            frame = {image_key(camera): img, STATE: s[t].astype(np.float32), ACTION: a[t].astype(np.float32)}
            if success is not None:
                frame[REWARD] = np.array([t / (n - 1)], dtype=np.float32)
                frame[SUCCESS] = np.array([bool(success[ep]) and t == n - 1])
                frame[DONE] = np.array([t == n - 1])
            ds.add_frame(frame | {TASK: task})
        ds.save_episode()
    ds.finalize()
    return root
