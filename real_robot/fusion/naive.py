"""`naive`: switch to the newest chunk the moment it arrives (the baseline every other fuser is judged by)."""

from __future__ import annotations

import numpy as np

from worldloop.real_robot.fusion.base import Chunk, ChunkFuser, KinematicState


class NaiveFuser(ChunkFuser):
    def __init__(self, spec, control_dt):
        super().__init__(spec, control_dt)
        self._chunk: Chunk | None = None

    def reset(self, position: np.ndarray) -> None:
        super().reset(position)
        self._chunk = None

    def add_chunk(self, chunk: Chunk, now: float, executed: KinematicState) -> None:
        # A chunk computed from an older observation than the executing one is stale: drop it.
        if self._chunk is None or chunk.obs_time >= self._chunk.obs_time:
            self._chunk = chunk

    def command(self, now: float) -> np.ndarray:
        hold = self._require_reset()
        return hold.copy() if self._chunk is None else self._chunk.sample(now)

    def plan_end(self) -> float:
        return -np.inf if self._chunk is None else self._chunk.end_time
