"""An embodiment derived from a LeRobot dataset (`--embodiment=from_dataset`), and the training-time
resolution of an `--embodiment=` value against the dataset it trains on.

What a derived spec holds, and where each number comes from:
- joint names: the `names` of `observation.state` (a list, or a dict holding one list, as LeRobot writes
  them); action names likewise from `action`; `joint_<i>` when a dataset gives none;
- fps: `meta/info.json`;
- position limits: the recorded range of state and action together, widened by `margin` times the
  range on each side;
- velocity and acceleration limits: the largest recorded joint speed (first difference of the state
  within an episode, times fps) and acceleration (second difference, times fps^2), times (1 + margin).

A joint that never moves in the recording (a constant value, a gripper left open) still gets limits it
can move within: its range is the median range of the joints that do move (1.0 if none does), centred on
its value, and its speed and acceleration are the median of the moving joints' relative to their range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worldloop.common.embodiment import EmbodimentSpec, known_embodiments, load_embodiment
from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset
from worldloop.data.features import ACTION, STATE

FROM_DATASET = "from_dataset"
# `auto` (the training default): the built-in spec named by the dataset's robot_type if there is one, else
# the spec derived from the dataset.
AUTO = "auto"
DEFAULT_MARGIN = 0.1


def feature_names(feature: dict, dim: int, default_prefix: str) -> tuple[str, ...]:
    """A vector feature's per-dimension names from its `names` entry (list, or dict of one list)."""
    names = feature.get("names")
    if isinstance(names, dict):
        lists = [v for v in names.values() if isinstance(v, list)]
        names = lists[0] if len(lists) == 1 else None
    if isinstance(names, list) and len(names) == dim and all(isinstance(n, str) and n for n in names):
        if len(set(names)) == dim:
            return tuple(names)
    return tuple(f"{default_prefix}_{i}" for i in range(dim))


def _spread(values: np.ndarray, moving: np.ndarray, fallback: float) -> np.ndarray:
    """`values` with the entries of non-moving joints replaced by the median over moving ones."""
    out = values.copy()
    out[~moving] = float(np.median(values[moving])) if moving.any() else fallback
    return out


def derive_embodiment(
    name: str,
    joint_names: tuple[str, ...],
    action_names: tuple[str, ...],
    fps: int,
    states: list[np.ndarray],
    actions: list[np.ndarray],
    margin: float = DEFAULT_MARGIN,
) -> EmbodimentSpec:
    """The spec of recorded episodes: states and actions, one [T, J] array per episode (module docstring)."""
    if margin < 0:
        raise ValueError(f"embodiment margin={margin} must be >= 0")
    if not states:
        raise ValueError(f"embodiment {name!r}: no episodes to derive limits from")
    every = np.concatenate([*states, *actions]).astype(np.float64)
    lo, hi = every.min(0), every.max(0)
    span = hi - lo
    moving = span > 1e-6 * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi)))
    span = _spread(span, moving, 1.0)
    centre = (lo + hi) / 2
    lower, upper = centre - span / 2 - margin * span, centre + span / 2 + margin * span

    def largest(order: int) -> np.ndarray:
        steps = [np.abs(np.diff(s.astype(np.float64), n=order, axis=0)) for s in states if len(s) > order]
        if not steps:
            return np.zeros(len(joint_names))
        return np.concatenate(steps).max(0) * fps**order

    velocity, acceleration = largest(1), largest(2)
    # Relative to the range, so that a fallback in one joint's units fits that joint.
    velocity = _spread(velocity / span, moving & (velocity > 0), 1.0) * span
    # With no recorded acceleration: reach the speed limit in one step.
    fallback = float(np.median(velocity / span)) * fps
    acceleration = _spread(acceleration / span, moving & (acceleration > 0), fallback) * span
    return EmbodimentSpec(
        name=name,
        joint_names=joint_names,
        action_names=action_names,
        position_lower=tuple(float(v) for v in lower),
        position_upper=tuple(float(v) for v in upper),
        velocity_limit=tuple(float(v) * (1 + margin) for v in velocity),
        acceleration_limit=tuple(float(v) * (1 + margin) for v in acceleration),
        fps=int(fps),
    )


def _derived(dataset: EpisodeDataset, margin: float) -> EmbodimentSpec:
    """The spec derived from `dataset` (every episode; see the module docstring). Named after the dataset's
    `robot_type`, else its folder. The imagination env integrates the state from the actions as position
    targets, so state and action must have one entry per joint each."""
    root = dataset.root
    features = dataset.meta.features
    if dataset.state_dim != dataset.action_dim:
        raise DatasetError(
            f"dataset {root}: observation.state has {dataset.state_dim} values and action "
            f"{dataset.action_dim}; an embodiment's actions are joint-position targets, one per state "
            "joint: write its embodiment YAML by hand (--embodiment=<file.yaml>) or record them alike"
        )
    cols = dataset.numeric_columns([STATE, ACTION])
    n = len(cols["index"])
    state = cols[STATE].astype(np.float64).reshape(n, -1)
    action = cols[ACTION].astype(np.float64).reshape(n, -1)
    episodes = dataset.select_episodes(None)
    joint_names = feature_names(features[STATE], dataset.state_dim, "joint")
    action_names = feature_names(features[ACTION], dataset.action_dim, "action")
    if action_names == tuple(f"action_{i}" for i in range(dataset.action_dim)):
        action_names = joint_names
    robot_type = getattr(dataset.meta, "robot_type", None)
    return derive_embodiment(
        str(robot_type or root.resolve().name),
        joint_names,
        action_names,
        dataset.fps,
        [state[ep.start : ep.end] for ep in episodes],
        [action[ep.start : ep.end] for ep in episodes],
        margin,
    )


def embodiment_for_dataset(value: str, root: str | Path, margin: float = DEFAULT_MARGIN) -> EmbodimentSpec:
    """The spec a model trained on the dataset at `root` is for: `value` is `auto`, `from_dataset`, a
    built-in name or a YAML file. A named or written spec must have one joint per state and action value."""
    dataset = EpisodeDataset(DatasetConfig(root=str(root)))
    if value == AUTO:
        robot_type = getattr(dataset.meta, "robot_type", None)
        value = robot_type if robot_type in known_embodiments() else FROM_DATASET
    if value == FROM_DATASET:
        return _derived(dataset, margin)
    spec = load_embodiment(value)
    if {dataset.state_dim, dataset.action_dim} != {spec.num_joints}:
        raise DatasetError(
            f"embodiment={value!r} has {spec.num_joints} joints but dataset {root} records "
            f"{dataset.state_dim} state and {dataset.action_dim} action values: pass the robot the data was "
            f"recorded on, or --embodiment={FROM_DATASET}"
        )
    return spec
