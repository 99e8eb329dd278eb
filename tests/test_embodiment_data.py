"""An embodiment is data: derived from a dataset (names, limits, fps, motion limits, constant joints), or
read from a YAML file with errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from embodiment_fixtures import write_vector_dataset

from worldloop.common.embodiment import (
    SO101_ARM,
    TABLETOP_ARM,
    EmbodimentSpec,
    load_embodiment,
    load_embodiment_file,
    write_embodiment,
)
from worldloop.data.dataset import DatasetError
from worldloop.data.embodiment import FROM_DATASET, embodiment_for_dataset


def next_state_actions(states: list[np.ndarray]) -> list[np.ndarray]:
    """The action at t is the state at t + 1 (the last one holds still), as position targets are."""
    return [np.concatenate([s[1:], s[-1:]]) for s in states]


@pytest.fixture(scope="module")
def planar(tmp_path_factory) -> Path:
    """A pusht-shaped dataset: 2-D state and action, 10 fps, names given the two ways LeRobot writes them."""
    t = np.arange(10.0)[:, None]
    states = [
        np.hstack([100 + t**2, 200 + 5 * t]),  # x accelerates (speeds 10..170/s), y at 50/s
        np.hstack([300 - 20 * t, np.full_like(t, 250.0)]),  # x at 200/s, y still
    ]
    root = tmp_path_factory.mktemp("planar") / "pusht_like"
    return write_vector_dataset(
        root,
        states,
        next_state_actions(states),
        fps=10,
        state_names={"axes": ["x", "y"]},
        action_names=["target_x", "target_y"],
    )


def test_a_two_dimensional_dataset(planar):
    spec = embodiment_for_dataset(FROM_DATASET, planar)
    assert spec.name == "pusht_like" and spec.fps == 10  # no robot_type: the folder's name
    assert spec.joint_names == ("x", "y") and spec.action_names == ("target_x", "target_y")
    # Recorded x in [100, 300] and y in [200, 250], widened by 10% of the range on each side.
    assert spec.position_lower == pytest.approx((80.0, 195.0))
    assert spec.position_upper == pytest.approx((320.0, 255.0))
    # Fastest recorded step x 20 (ep 1), y 5, at 10 fps, times 1.1.
    assert spec.velocity_limit == pytest.approx((220.0, 55.0))
    # x's speed changes by 2 per step (100/s^2 per unit), y never accelerates: it gets x's relative rate
    # (200/s^2 over x's range 200 = 1 range/s^2), times its range 50; both times 1.1.
    assert spec.acceleration_limit == pytest.approx((220.0, 55.0))
    wider = embodiment_for_dataset(FROM_DATASET, planar, margin=0.5)
    assert wider.position_lower == pytest.approx((0.0, 175.0)) and wider.velocity_limit[0] == pytest.approx(
        300
    )


def test_a_six_joint_dataset_with_constant_joints(tmp_path):
    t = np.arange(8.0)[:, None]
    moving = np.arange(4) * 10 + (np.arange(4) + 1) * t  # joint j moves (j + 1) per frame
    state = np.hstack([moving, np.zeros_like(t), np.full_like(t, 50.0)])  # a still wrist, an open gripper
    names = ["pan", "lift", "elbow", "flex", "roll", "gripper"]
    root = write_vector_dataset(
        tmp_path / "arm", [state, state[::-1].copy()], [state, state[::-1].copy()], 30, names, names, "my_arm"
    )
    spec = embodiment_for_dataset(FROM_DATASET, root)
    assert spec.name == "my_arm" and spec.fps == 30 and spec.joint_names == tuple(names)
    assert spec.action_names == tuple(names)
    # Moving joints: range 7 (j + 1) from 10 j, plus 10% each side.
    for j in range(4):
        span = 7 * (j + 1)
        assert spec.position_lower[j] == pytest.approx(10 * j - 0.1 * span)
        assert spec.position_upper[j] == pytest.approx(10 * j + 1.1 * span)
        assert spec.velocity_limit[j] == pytest.approx(1.1 * 30 * (j + 1))
    # Constant joints: the median moving range (17.5) centred on their value, plus the margin, and the
    # moving joints' speed relative to their range (30/7 ranges per second).
    assert spec.position_lower[4:] == pytest.approx((-10.5, 39.5))
    assert spec.position_upper[4:] == pytest.approx((10.5, 60.5))
    assert spec.velocity_limit[4:] == pytest.approx((1.1 * 75.0, 1.1 * 75.0))
    assert all(a > 0 for a in spec.acceleration_limit)
    # Wide enough to move: a full-speed step from the recorded value stays inside the limits.
    step = np.asarray(spec.velocity_limit) / spec.fps
    for value in (state[0], state[0] + step, state[0] - step):
        assert np.all(spec.clip_target(value)[4:] == value[4:])

    # What the dataset records travels through the YAML format unchanged.
    write_embodiment(spec, tmp_path / "arm.yaml")
    assert load_embodiment(str(tmp_path / "arm.yaml")) == spec


def test_training_resolves_auto_named_and_derived(tmp_path, planar):
    t = np.arange(4.0)[:, None]
    six = [np.hstack([t] * 6)]
    so101 = write_vector_dataset(tmp_path / "so", six, six, 30, robot_type="so101_follower")
    assert embodiment_for_dataset("auto", so101) is SO101_ARM  # robot_type names a built-in file
    assert embodiment_for_dataset("auto", planar).joint_names == ("x", "y")  # none: derived
    assert embodiment_for_dataset("from_dataset", so101).name == "so101_follower"
    assert embodiment_for_dataset("from_dataset", so101) != SO101_ARM  # its limits are the recording's
    with pytest.raises(DatasetError, match=r"'worldloop_arm4' has 4 joints but dataset .* records 2 state"):
        embodiment_for_dataset("worldloop_arm4", planar)
    uneven = write_vector_dataset(tmp_path / "uneven", [np.hstack([t] * 3)], [np.hstack([t] * 2)], 10)
    with pytest.raises(DatasetError, match="observation.state has 3 values and action 2"):
        embodiment_for_dataset(FROM_DATASET, uneven)


def test_a_hand_written_file_is_read_strictly(tmp_path):
    good = TABLETOP_ARM.to_dict()
    path = tmp_path / "arm.yaml"
    write_embodiment(TABLETOP_ARM, path)
    assert load_embodiment_file(path) == TABLETOP_ARM
    assert load_embodiment("worldloop_arm4") is TABLETOP_ARM

    def broken(**change) -> str:
        data = {k: v for k, v in {**good, **change}.items() if v is not None}
        path.write_text(
            "\n".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in data.items())
        )
        return rf"{path}: .*"

    cases = {
        "unknown key 'joint_limits'": {"joint_limits": [1, 2]},
        "key 'fps' is missing": {"fps": None},
        "position_upper has 3 entries, expected one per joint": {"position_upper": [1.0, 2.0, 3.0]},
        "key 'velocity_limit' must hold numbers, got 'fast'": {"velocity_limit": ["fast", 1, 1, 1]},
        "key 'joint_names' must be a list": {"joint_names": "base_yaw"},
        "acceleration_limit must be positive": {"acceleration_limit": [1.0, 0.0, 1.0, 1.0]},
        "position_lower must be below position_upper": {"position_lower": [2.0, 0.0, 0.0, 0.0]},
    }
    for message, change in cases.items():
        pattern = broken(**change)
        with pytest.raises(ValueError, match=pattern + message.replace("(", r"\(")):
            load_embodiment_file(path)
    with pytest.raises(FileNotFoundError, match="embodiment file .*nowhere.yaml does not exist"):
        load_embodiment(str(tmp_path / "nowhere.yaml"))
    with pytest.raises(ValueError, match=r"embodiment='ur5' is not a known arm"):
        load_embodiment("ur5")


def test_the_built_in_arms_are_files():
    assert TABLETOP_ARM == EmbodimentSpec(
        name="worldloop_arm4",
        joint_names=("base_yaw", "shoulder_pitch", "elbow_pitch", "wrist_pitch"),
        position_lower=(-1.8, -0.6, -0.2, -1.6),
        position_upper=(1.8, 1.4, 2.4, 1.6),
        velocity_limit=(2.0, 2.0, 2.5, 3.0),
        acceleration_limit=(12.0, 12.0, 15.0, 20.0),
        fps=10,
    )
    assert SO101_ARM.fps == 30 and SO101_ARM.num_joints == 6
    source = Path(__file__).resolve().parents[1] / "common" / "embodiment.py"
    assert "shoulder_pitch" not in source.read_text()  # no spec is written in code
