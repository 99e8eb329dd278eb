"""Record a deployment run as a LeRobotDataset v3 episode (the closed loop: robot runs become training data).

Frames are taken at the embodiment's fps. A frame's action is the last command sent before the next
frame's observation (where the arm was told to be one step later, as in recorded demonstrations). The
runtime drives; this module is its sink into the one dataset writer every recording shares
(`data.recording.EpisodeWriter`: same frame layout and `meta/recording.json` as sim recordings). Image
encoding and disk writes happen in a writer thread so the control loop never waits on the disk.

A crash must not lose the run: the run is saved in segments of `segment_s` seconds, each a durable
episode (readable on disk once saved, even after `kill -9`; see `data.recording`). The dataset's
episodes are the run's consecutive segments in order, with no frame between them: episode i's facts in
`meta/recording.json` hold `segment` (i) and `first_frame` (its first frame's index in the run), and only
the run's last frame has `next.done`. A crash loses the segment in progress (at most `segment_s` seconds
plus the time to save one segment); `data.recording.repair_recording` cleans up a crash that hit a save.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worldloop.data.features import IMAGE_PREFIX, STATE, image_key
from worldloop.data.recording import EpisodeWriter
from worldloop.real_robot.helpers import check_number

logger = logging.getLogger(__name__)


@dataclass
class RecordConfig:
    root: str | None = None  # directory of the dataset to write; None: do not record
    repo_id: str = "local/deploy_runs"  # dataset name in its metadata (nothing is uploaded)
    segment_s: float = 2.0  # save the run every this many seconds: what a crash can lose at most

    def __post_init__(self) -> None:
        check_number("record.segment_s", self.segment_s, low=0.0, low_open=True)


class EpisodeRecorder:
    def __init__(self, cfg: RecordConfig, joint_names: tuple[str, ...], fps: int, task: str, robot_type: str):
        if cfg.root is None:
            raise ValueError("record.root: a directory is needed to record")
        if Path(cfg.root).exists():
            raise FileExistsError(f"record.root: {cfg.root} exists; choose a new directory for this run")
        self.cfg, self.joint_names, self.fps, self.task = cfg, joint_names, fps, task
        self.robot_type = robot_type
        self.keys = [f"{j}.pos" for j in joint_names]
        self._writer: EpisodeWriter | None = None  # created from the first frame's cameras
        self._pending: dict | None = None  # the last observation, waiting for its action
        self._frames: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="episode-recorder", daemon=True)
        self._thread.start()
        self.frames_written = 0  # added to the writer (the segment in progress included)
        self.segment_frames = max(1, int(round(cfg.segment_s * fps)))
        self._segment_start = 0  # run frame index of the segment in progress's first frame

    def on_observation(self, observation: dict, now: float, last_command: np.ndarray) -> None:
        """Called by the runtime at every frame time; completes the previous frame with its action."""
        if self._pending is not None:
            self._frames.put(self._frame(self._pending, last_command, done=False))
        self._pending = dict(observation)

    def finish(self, last_command: np.ndarray, success: bool) -> Path:
        """Write the last frame (done, with the run's success) and the episode; returns the dataset root.

        If writing failed, the dataset is still finalized without the episode before the error is raised."""
        if self._pending is not None:
            self._frames.put(self._frame(self._pending, last_command, done=True, success=success))
            self._pending = None
        self._frames.put(None)
        self._thread.join()
        if self._writer is not None:
            with self._writer:
                if self._error is None and self.frames_written > self._segment_start:
                    self._end_segment()
                if self._error is None:  # every segment of the run is saved
                    self._writer.expected_episodes = len(self._writer.episodes)
        if self._error is not None:
            raise RuntimeError(f"recording to {self.cfg.root} failed") from self._error
        return Path(self.cfg.root)

    def _frame(self, observation: dict, action: np.ndarray, done: bool, success: bool = False) -> dict:
        """The robot's observation (joint positions by `<joint>.pos`, camera images) as a recorded frame."""
        recorded = {STATE: np.array([observation[k] for k in self.keys], dtype=np.float32)}
        for key, value in observation.items():
            if isinstance(value, np.ndarray) and value.ndim == 3:
                recorded[image_key(key)] = value
        return {
            "observation": recorded,
            "action": np.array(action, dtype=np.float32),  # a copy: the runtime updates its command in place
            "reward": float(success),
            "success": success,
            "done": done,
            "task": self.task,
        }

    def _open(self, observation: dict) -> EpisodeWriter:
        cameras = tuple(k[len(IMAGE_PREFIX) :] for k in observation if k.startswith(IMAGE_PREFIX))
        sizes = {observation[image_key(c)].shape[:2] for c in cameras}
        if len(sizes) > 1:
            raise ValueError(f"record: recording needs cameras of one size, got {sizes}")
        size = sizes.pop() if sizes else (0, 0)
        run = {
            "episodes": "consecutive segments of one deploy run, in order, with no frame between them",
            "segment_s": self.cfg.segment_s,
        }
        return EpisodeWriter(
            self.cfg.root,
            self.cfg.repo_id,
            self.fps,
            self.robot_type,
            self.joint_names,
            cameras,
            size,
            episodes=None,  # known at `finish`; a crashed run's recording says complete: false
            config=run,
            durable=True,
        )

    def _end_segment(self) -> None:
        segment = len(self._writer.episodes)
        self._writer.end_episode(segment=segment, first_frame=self._segment_start)
        self._segment_start = self.frames_written

    def _write(self) -> None:
        while True:
            frame = self._frames.get()
            if frame is None:
                return
            if self._error is not None:
                continue  # drain: the control loop must never block on a failed recorder
            try:
                if self._writer is None:
                    self._writer = self._open(frame["observation"])
                self._writer.add_frame(**frame)
                self.frames_written += 1
                if self.frames_written - self._segment_start >= self.segment_frames:
                    self._end_segment()
            except BaseException as e:
                logger.error("recording failed: %s", e)
                self._error = e
