"""`temporal_ensemble`: ACT's exponentially weighted average of every chunk that covers the current time.

ACT weights the prediction of the i-th oldest chunk by exp(-m * i), so older predictions count more
(m = 0.01 in the ACT paper). A chunk stops voting once its last action is in the past.
"""

from __future__ import annotations

import numpy as np

from worldloop.real_robot.fusion.base import Chunk, ChunkFuser, KinematicState


class TemporalEnsembleFuser(ChunkFuser):
    def __init__(self, spec, control_dt, coeff: float = 0.01):
        super().__init__(spec, control_dt)
        self.coeff = coeff
        self._chunks: list[Chunk] = []  # oldest first

    def reset(self, position: np.ndarray) -> None:
        super().reset(position)
        self._chunks = []

    def add_chunk(self, chunk: Chunk, now: float, executed: KinematicState) -> None:
        self._chunks = [c for c in self._chunks if c.end_time > now]
        self._chunks.append(chunk)
        self._chunks.sort(key=lambda c: c.obs_time)

    def command(self, now: float) -> np.ndarray:
        hold = self._require_reset()
        voters = [c for c in self._chunks if c.end_time >= now]
        if not voters:
            return hold.copy() if not self._chunks else self._chunks[-1].sample(now)
        weights = np.exp(-self.coeff * np.arange(len(voters)))
        samples = np.stack([c.sample(now) for c in voters])
        return (weights[:, None] * samples).sum(0) / weights.sum()

    def plan_end(self) -> float:
        return max((c.end_time for c in self._chunks), default=-np.inf)
