"""Record a deployment run as a LeRobotDataset v3 episode (the closed loop: robot runs become training data).

Frames are taken at the embodiment's fps. A frame's action is the last command sent before the next
frame's observation (where the arm was told to be one step later, as in recorded demonstrations). Image
encoding and disk writes happen in a writer thread so the control loop never waits on the disk.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worldloop.data.features import ACTION, DONE, REWARD, STATE, SUCCESS, image_key, lerobot_features

logger = logging.getLogger(__name__)


@dataclass
class RecordConfig:
    root: str | None = None  # directory of the dataset to write; None: do not record
    repo_id: str = "local/deploy_runs"  # dataset name in its metadata (nothing is uploaded)


class EpisodeRecorder:
    def __init__(self, cfg: RecordConfig, joint_names: tuple[str, ...], fps: int, task: str, robot_type: str):
        if cfg.root is None:
            raise ValueError("record.root: a directory is needed to record")
        if Path(cfg.root).exists():
            raise FileExistsError(f"record.root: {cfg.root} exists; choose a new directory for this run")
        self.cfg, self.joint_names, self.fps, self.task = cfg, joint_names, fps, task
        self.robot_type = robot_type
        self.keys = [f"{j}.pos" for j in joint_names]
        self._dataset = None
        self._pending: dict | None = None  # the last observation, waiting for its action
        self._frames: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="episode-recorder", daemon=True)
        self._thread.start()
        self.frames_written = 0

    def on_observation(self, observation: dict, now: float, last_command: np.ndarray) -> None:
        """Called by the runtime at every frame time; completes the previous frame with its action."""
        if self._pending is not None:
            self._frames.put(self._frame(self._pending, last_command, done=False))
        self._pending = dict(observation)

    def finish(self, last_command: np.ndarray, success: bool) -> Path:
        """Write the last frame (done, with the run's success) and the episode; returns the dataset root."""
        if self._pending is not None:
            self._frames.put(self._frame(self._pending, last_command, done=True, success=success))
            self._pending = None
        self._frames.put(None)
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"recording to {self.cfg.root} failed") from self._error
        if self._dataset is not None:
            self._dataset.save_episode()
            self._dataset.finalize()
        return Path(self.cfg.root)

    def _frame(self, observation: dict, action: np.ndarray, done: bool, success: bool = False) -> dict:
        frame = {
            STATE: np.array([observation[k] for k in self.keys], dtype=np.float32),
            ACTION: np.asarray(action, dtype=np.float32),
            REWARD: np.array([float(success)], dtype=np.float32),
            SUCCESS: np.array([success]),
            DONE: np.array([done]),
            "task": self.task,
        }
        for key, value in observation.items():
            if isinstance(value, np.ndarray) and value.ndim == 3:
                frame[image_key(key)] = value
        return frame

    def _create(self, frame: dict):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        cameras = tuple(k[len("observation.images.") :] for k in frame if k.startswith("observation.images."))
        sizes = {frame[image_key(c)].shape[:2] for c in cameras}
        if len(sizes) > 1:
            raise ValueError(f"recording needs cameras of one size, got {sizes}")
        size = sizes.pop() if sizes else (0, 0)
        features = lerobot_features(self.joint_names, cameras, size)
        return LeRobotDataset.create(
            self.cfg.repo_id,
            self.fps,
            features,
            root=self.cfg.root,
            robot_type=self.robot_type,
            use_videos=False,
        )

    def _write(self) -> None:
        while True:
            frame = self._frames.get()
            if frame is None:
                return
            if self._error is not None:
                continue  # drain: the control loop must never block on a failed recorder
            try:
                if self._dataset is None:
                    self._dataset = self._create(frame)
                self._dataset.add_frame(frame)
                self.frames_written += 1
            except BaseException as e:
                logger.error("recording failed: %s", e)
                self._error = e
