"""Language-instructed tabletop tasks: instructions, layouts, success checks and dense progress.

Everything here is a pure function of a `SceneState`, so tests can build success and failure states
directly. Progress is in [0, 1], is 0 at the start of an episode, and is 1 exactly when the task succeeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from worldloop.sim.scene import CUBE_COLORS, CUBE_HALF_SIZE, ZONE_COLORS, ZONE_HALF_SIZE

TASK_KINDS = ("reach", "push")
REACH_RADIUS = 0.05  # m, tip to cube centre: the finger touches the cube's top or side
REACH_WEIGHT_IN_PUSH = 0.25  # share of push progress earned by bringing the finger to the cube

# Where things may be placed: a ring sector in front of the arm (polar coordinates around the base).
CUBE_RADIUS_RANGE = (0.17, 0.31)
ZONE_RADIUS_RANGE = (0.16, 0.32)
ANGLE_RANGE = (-0.9, 0.9)  # rad
MIN_CUBE_GAP = 0.09  # m between cube centres
MIN_CUBE_ZONE_GAP = 0.085  # m from a cube centre to a square's centre (no cube starts on a square)
MIN_ZONE_GAP = 0.14  # m between square centres (squares never overlap)
PUSH_DISTANCE_RANGE = (0.1, 0.24)  # m, target cube to target square at the start


@dataclass(frozen=True)
class TaskInstance:
    kind: str  # reach | push
    cube: str  # colour of the cube to reach or push
    zone: str | None  # colour of the target square (push only)

    @property
    def instruction(self) -> str:
        if self.kind == "reach":
            return f"reach the {self.cube} cube"
        return f"push the {self.cube} cube onto the {self.zone} square"

    @classmethod
    def from_instruction(cls, instruction: str) -> TaskInstance:
        """The task an `instruction` (as `instruction` writes it) asks for; ValueError for any other text."""
        for cube in CUBE_COLORS:
            if instruction == f"reach the {cube} cube":
                return cls("reach", cube, None)
            for zone in ZONE_COLORS:
                if instruction == f"push the {cube} cube onto the {zone} square":
                    return cls("push", cube, zone)
        raise ValueError(
            f"instruction {instruction!r}: expected 'reach the <cube> cube' or 'push the <cube> cube onto the "
            f"<square> square' with a cube of {CUBE_COLORS} and a square of {ZONE_COLORS}"
        )


@dataclass
class SceneState:
    tip: np.ndarray  # (3,) finger tip position
    cubes: dict[str, np.ndarray]  # colour -> (3,) centre
    zones: dict[str, np.ndarray]  # colour -> (2,) centre on the table


@dataclass
class Layout:
    cubes: dict[str, np.ndarray]  # colour -> (x, y)
    cube_yaws: dict[str, float]
    zones: dict[str, np.ndarray]  # colour -> (x, y)


def sample_task(kind: str, rng: np.random.Generator) -> TaskInstance:
    if kind not in TASK_KINDS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {TASK_KINDS}")
    cube = CUBE_COLORS[rng.integers(len(CUBE_COLORS))]
    zone = ZONE_COLORS[rng.integers(len(ZONE_COLORS))] if kind == "push" else None
    return TaskInstance(kind, cube, zone)


def _polar_sample(rng: np.random.Generator, radius_range: tuple[float, float]) -> np.ndarray:
    r = rng.uniform(*radius_range)
    a = rng.uniform(*ANGLE_RANGE)
    return np.array([r * math.cos(a), r * math.sin(a)])


def sample_layout(task: TaskInstance, rng: np.random.Generator, max_tries: int = 1000) -> Layout:
    """Random cube and square positions that satisfy the spacing rules (and, for push, a fair distance)."""
    for _ in range(max_tries):
        zones = {c: _polar_sample(rng, ZONE_RADIUS_RANGE) for c in ZONE_COLORS}
        cubes = {c: _polar_sample(rng, CUBE_RADIUS_RANGE) for c in CUBE_COLORS}
        zone_pts, cube_pts = list(zones.values()), list(cubes.values())
        if any(
            np.linalg.norm(a - b) < MIN_ZONE_GAP for i, a in enumerate(zone_pts) for b in zone_pts[i + 1 :]
        ):
            continue
        if any(
            np.linalg.norm(a - b) < MIN_CUBE_GAP for i, a in enumerate(cube_pts) for b in cube_pts[i + 1 :]
        ):
            continue
        if any(np.linalg.norm(c - z) < MIN_CUBE_ZONE_GAP for c in cube_pts for z in zone_pts):
            continue
        if task.kind == "push":
            d = np.linalg.norm(cubes[task.cube] - zones[task.zone])
            if not PUSH_DISTANCE_RANGE[0] <= d <= PUSH_DISTANCE_RANGE[1]:
                continue
        yaws = {c: float(rng.uniform(-math.pi / 4, math.pi / 4)) for c in CUBE_COLORS}
        return Layout(cubes=cubes, cube_yaws=yaws, zones=zones)
    raise RuntimeError(
        f"could not place the objects for {task} in {max_tries} tries; loosen the spacing rules"
    )


def distance_outside_zone(point_xy: np.ndarray, zone_xy: np.ndarray) -> float:
    """Distance from a point to the target square (0 inside it)."""
    excess = np.maximum(np.abs(np.asarray(point_xy[:2]) - zone_xy) - ZONE_HALF_SIZE, 0.0)
    return float(np.linalg.norm(excess))


def is_success(task: TaskInstance, state: SceneState) -> bool:
    cube = state.cubes[task.cube]
    if task.kind == "reach":
        return bool(np.linalg.norm(state.tip - cube) <= REACH_RADIUS)
    on_table = cube[2] < 2 * CUBE_HALF_SIZE  # resting, not balanced on the finger
    return bool(on_table and distance_outside_zone(cube, state.zones[task.zone]) == 0.0)


def _closing(start: float, now: float, goal: float) -> float:
    """Fraction of the way from `start` to `goal` covered by `now`, clipped to [0, 1]."""
    if start <= goal:
        return 1.0 if now <= goal else 0.0
    return float(np.clip((start - now) / (start - goal), 0.0, 1.0))


_BELOW_SUCCESS = 0.999  # progress of any state that is not a success (1.0 is reserved for success)


def progress(task: TaskInstance, state: SceneState, initial: SceneState) -> float:
    if is_success(task, state):
        return 1.0
    reach = _closing(
        float(np.linalg.norm(initial.tip - initial.cubes[task.cube])),
        float(np.linalg.norm(state.tip - state.cubes[task.cube])),
        REACH_RADIUS,
    )
    if task.kind == "reach":
        return min(reach, _BELOW_SUCCESS)
    zone = state.zones[task.zone]
    push = _closing(
        distance_outside_zone(initial.cubes[task.cube], zone),
        distance_outside_zone(state.cubes[task.cube], zone),
        0.0,
    )
    # e.g. a cube held above the square: every distance is closed, yet it is not a success
    return min(REACH_WEIGHT_IN_PUSH * reach + (1 - REACH_WEIGHT_IN_PUSH) * push, _BELOW_SUCCESS)
