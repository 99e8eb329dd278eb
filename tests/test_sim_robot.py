"""SimRobot has LeRobot's Robot shape, runs lock-step at control_hz, and converts to dataset/policy keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import STATE, TASK, image_key
from worldloop.sim.robot import (
    NotConnectedError,
    SimRobot,
    SimRobotConfig,
    frame_to_batch,
    observation_to_batch,
    observation_to_frame,
    vector_to_action,
)

JOINTS = TABLETOP_ARM.joint_names


@pytest.fixture
def robot():
    r = SimRobot(SimRobotConfig(task="reach", image_size=32, control_hz=100, seed=3))
    r.connect()
    yield r
    r.disconnect()


def test_features_and_observation_shape(robot):
    keys = [f"{j}.pos" for j in JOINTS]
    assert robot.action_features == dict.fromkeys(keys, float)
    assert robot.observation_features == {
        **dict.fromkeys(keys, float),
        "front": (32, 32, 3),
        "wrist": (32, 32, 3),
    }
    obs = robot.get_observation()
    assert set(obs) == set(robot.observation_features)
    assert obs["front"].shape == (32, 32, 3) and obs["front"].dtype == np.uint8
    assert all(isinstance(obs[k], float) for k in keys)
    assert robot.is_calibrated and robot.task.startswith("reach the ")
    assert robot.task_success() is False and robot.progress() == 0.0


def test_send_action_is_lock_step_and_clipped(robot):
    start = robot.env.sim.data.time
    sent = robot.send_action(vector_to_action(TABLETOP_ARM.upper() + 1.0, JOINTS))
    assert robot.env.sim.data.time == pytest.approx(start + 0.01)
    assert sent == vector_to_action(TABLETOP_ARM.upper(), JOINTS)
    before = np.array([robot.get_observation()[f"{j}.pos"] for j in JOINTS])
    for _ in range(10):
        robot.send_action(sent)
    after = np.array([robot.get_observation()[f"{j}.pos"] for j in JOINTS])
    assert np.all(after > before)  # moving towards the upper limits
    with pytest.raises(KeyError, match="missing"):
        robot.send_action({"base_yaw.pos": 0.0})


def test_same_seed_same_episode():
    def run():
        with SimRobot(SimRobotConfig(image_size=16, seed=5)) as r:
            for _ in range(5):
                r.send_action(vector_to_action(np.array([0.3, 0.5, 1.0, 0.5]), JOINTS))
            return r.get_observation(), r.task

    (a, ta), (b, tb) = run(), run()
    assert ta == tb and np.array_equal(a["front"], b["front"]) and a["base_yaw.pos"] == b["base_yaw.pos"]


def test_not_connected_and_bad_rate_are_clear_errors():
    r = SimRobot()
    assert not r.is_connected
    with pytest.raises(NotConnectedError):
        r.get_observation()
    with pytest.raises(ValueError, match="control_hz=30"):
        SimRobot(SimRobotConfig(control_hz=30)).connect()


def test_observation_to_frame_and_batch(robot):
    obs = robot.get_observation()
    frame = observation_to_frame(obs, JOINTS, ("front", "wrist"))
    assert frame[STATE].dtype == np.float32 and frame[STATE].shape == (4,)
    assert np.array_equal(frame[image_key("front")], obs["front"])
    batch = observation_to_batch(obs, JOINTS, ("front",), robot.task)
    assert batch[image_key("front")].shape == (1, 3, 32, 32)
    assert batch[image_key("front")].dtype == torch.float32 and batch[image_key("front")].max() <= 1.0
    torch.testing.assert_close(batch[STATE][0], torch.from_numpy(frame[STATE]))
    assert batch[TASK] == [robot.task]
    with pytest.raises(KeyError, match="missing"):
        observation_to_frame({"front": obs["front"]}, JOINTS, ("front",))


def test_env_observation_to_batch():
    from worldloop.sim.tabletop_env import TabletopEnv

    env = TabletopEnv(task="push", image_size=16)
    obs, info = env.reset(seed=0)
    env.close()
    batch = frame_to_batch(obs, info["task"])
    assert batch[image_key("wrist")].shape == (1, 3, 16, 16) and batch[STATE].shape == (1, 4)
    assert batch[TASK] == [info["task"]]
