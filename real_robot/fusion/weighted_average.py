"""`weighted_average`: LeRobot async inference's fixed blend of overlapping actions (0.3 old + 0.7 new).

When a chunk arrives, every one of its actions that the executing plan still covers becomes
`old_weight * plan + (1 - old_weight) * new`; actions beyond the plan are taken as they are.
"""

from __future__ import annotations

import numpy as np

from worldloop.real_robot.fusion.base import Chunk, ChunkFuser, KinematicState


class WeightedAverageFuser(ChunkFuser):
    def __init__(self, spec, control_dt, old_weight: float = 0.3):
        super().__init__(spec, control_dt)
        if not 0.0 <= old_weight <= 1.0:
            raise ValueError(f"fuser.old_weight must be in [0, 1], got {old_weight}")
        self.old_weight = old_weight
        self._plan: Chunk | None = None

    def reset(self, position: np.ndarray) -> None:
        super().reset(position)
        self._plan = None

    def add_chunk(self, chunk: Chunk, now: float, executed: KinematicState) -> None:
        if self._plan is None:
            self._plan = chunk
            return
        if chunk.obs_time < self._plan.obs_time:
            return  # stale
        blended = chunk.actions.astype(np.float64).copy()
        for k, t in enumerate(chunk.knot_times()):
            if t <= self._plan.end_time:
                blended[k] = self.old_weight * self._plan.sample(t) + (1.0 - self.old_weight) * blended[k]
        self._plan = Chunk(blended, chunk.obs_time, chunk.dt)

    def command(self, now: float) -> np.ndarray:
        hold = self._require_reset()
        return hold.copy() if self._plan is None else self._plan.sample(now)

    def plan_end(self) -> float:
        return -np.inf if self._plan is None else self._plan.end_time
