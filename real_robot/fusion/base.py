"""The `ChunkFuser` interface: turn action chunks arriving at the policy rate into one command per control tick.

Time is the runtime's control clock in seconds. A chunk is stamped with the time of the observation it was
computed from; action k is the joint-position target for `obs_time + (k + 1) * dt` (the first action is
where the arm should be one policy step after the observation, as in a LeRobot dataset). A chunk that
arrives `delay` seconds after its observation therefore has its first actions in the past already: every
fuser samples chunks at the current time, which aligns them to the tick they are executed on.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from worldloop.common.embodiment import EmbodimentSpec


@dataclass(frozen=True)
class Chunk:
    actions: np.ndarray  # [H, D] absolute joint-position targets at the policy rate
    obs_time: float  # control-clock seconds of the observation the chunk was computed from
    dt: float  # seconds between consecutive actions (1 / policy fps)

    def __post_init__(self) -> None:
        if self.actions.ndim != 2 or len(self.actions) == 0:
            raise ValueError(f"a chunk needs actions of shape [H, D] with H >= 1, got {self.actions.shape}")

    @property
    def horizon(self) -> int:
        return len(self.actions)

    def knot_times(self) -> np.ndarray:
        return self.obs_time + self.dt * (np.arange(self.horizon) + 1)

    @property
    def end_time(self) -> float:
        return self.obs_time + self.dt * self.horizon

    def sample(self, t: float) -> np.ndarray:
        """Linear interpolation between actions (the upsampling to the control rate); held beyond the ends."""
        u = (t - self.obs_time) / self.dt - 1.0  # fractional action index
        if u <= 0.0:
            return self.actions[0].copy()
        if u >= self.horizon - 1:
            return self.actions[-1].copy()
        k = int(np.floor(u))
        w = u - k
        return (1.0 - w) * self.actions[k] + w * self.actions[k + 1]


@dataclass
class KinematicState:
    """Position, velocity and acceleration of the command stream (per joint)."""

    position: np.ndarray
    velocity: np.ndarray
    acceleration: np.ndarray

    @classmethod
    def at_rest(cls, position: np.ndarray) -> KinematicState:
        p = np.asarray(position, dtype=np.float64)
        return cls(p.copy(), np.zeros_like(p), np.zeros_like(p))


class ChunkFuser(abc.ABC):
    """Fuses a stream of chunks into a position target per control tick.

    The runtime calls `reset` once, `add_chunk` whenever inference returns, and `command` once per tick with
    non-decreasing times.
    """

    wants_prefix = False  # True: the runtime passes the executing plan to the policy (real-time chunking)

    def __init__(self, spec: EmbodimentSpec, control_dt: float):
        self.spec = spec
        self.control_dt = control_dt
        self._hold: np.ndarray | None = None

    def reset(self, position: np.ndarray) -> None:
        """Forget all chunks; hold `position` until the first chunk arrives."""
        self._hold = np.asarray(position, dtype=np.float64).copy()

    @abc.abstractmethod
    def add_chunk(self, chunk: Chunk, now: float, executed: KinematicState) -> None:
        """A chunk arrived at `now`; `executed` is the state of the commands actually sent (after safety)."""

    @abc.abstractmethod
    def command(self, now: float) -> np.ndarray:
        """The joint-position target for the control tick at `now`."""

    @abc.abstractmethod
    def plan_end(self) -> float:
        """Control-clock time at which the fused plan runs out (-inf before the first chunk)."""

    def remaining(self, now: float) -> float:
        """Seconds of planned motion left after `now`; <= 0 means the fuser is holding (a stall)."""
        return self.plan_end() - now

    def planned_actions(self, obs_time: float, dt: float, horizon: int) -> np.ndarray:
        """The plan sampled at the knot times of a chunk stamped `obs_time` (prefix for real-time chunking)."""
        return np.stack([self.command(obs_time + dt * (k + 1)) for k in range(horizon)])

    def _require_reset(self) -> np.ndarray:
        if self._hold is None:
            raise RuntimeError(f"{type(self).__name__}.reset(position) must be called before use")
        return self._hold
