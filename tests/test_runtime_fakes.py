"""The runtime's test doubles (`worldloop.real_robot.fault_injection`) behave as the runtime expects."""

from __future__ import annotations

import torch

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.fault_injection import FakeRobot, SlowSmoothPolicy


def test_fake_robot_follows_commands():
    robot = FakeRobot()
    robot.connect()
    robot.send_action({f"{j}.pos": 0.1 * i for i, j in enumerate(TABLETOP_ARM.joint_names)})
    obs = robot.get_observation()
    assert obs["elbow_pitch.pos"] == 0.2 and obs["front"].shape == (8, 8, 3)


def test_slow_policy_chunk_is_smooth_and_near_state():
    policy = SlowSmoothPolicy(latency_s=0.0)
    chunk = policy.predict_action_chunk({"observation.state": torch.ones(1, 4)})
    assert chunk.shape == (1, 10, 4)
    assert torch.all((chunk - 1).abs() <= 0.03 + 1e-6)
    assert torch.all(torch.diff(chunk, dim=1).abs() < 0.01)
