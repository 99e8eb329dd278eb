"""Test doubles for the runtime: a robot with LeRobot's `Robot` shape and a slow chunking policy.

Imported by the other runtime tests (`from test_runtime_fakes import ...`); the tests below check that the
doubles themselves behave as the runtime expects.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.vla.policy import Policy


class FakeRobot:
    """Follows every command exactly; returns small camera images; records what it was sent."""

    name = "fake"

    def __init__(
        self,
        start=None,
        image_size=(8, 8),
        joint_names=TABLETOP_ARM.joint_names,
        fail_after=None,
        interrupt_at=None,
    ):
        self.joint_names = joint_names
        self.position = np.zeros(len(joint_names)) if start is None else np.asarray(start, dtype=float)
        self.image_size = image_size
        self.sent: list[np.ndarray] = []
        self.connected = False
        self.fail_after = fail_after  # raise on this many-th send_action (an error mid-run)
        self.interrupt_at = interrupt_at  # raise KeyboardInterrupt once, as Ctrl-C would, at this send
        self.task = "reach the red cube"

    @property
    def observation_features(self) -> dict:
        return {**{f"{j}.pos": float for j in self.joint_names}, "front": (*self.image_size, 3)}

    @property
    def action_features(self) -> dict:
        return {f"{j}.pos": float for j in self.joint_names}

    @property
    def is_connected(self) -> bool:
        return self.connected

    def connect(self, calibrate: bool = True) -> None:
        self.connected = True

    def disconnect(self) -> None:
        self.connected = False

    def get_observation(self) -> dict:
        assert self.connected, "get_observation on a disconnected robot"
        obs = {f"{j}.pos": float(p) for j, p in zip(self.joint_names, self.position)}
        obs["front"] = np.full((*self.image_size, 3), len(self.sent) % 256, dtype=np.uint8)
        return obs

    def send_action(self, action: dict) -> dict:
        assert self.connected, "send_action on a disconnected robot"
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise OSError("fake robot: serial bus error")
        if self.interrupt_at is not None and len(self.sent) == self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt
        self.position = np.array([action[f"{j}.pos"] for j in self.joint_names])
        self.sent.append(self.position.copy())
        return action

    def task_success(self) -> bool:
        return False


class SlowSmoothPolicy(Policy):
    """Sleeps `latency_s`, then returns a slow sine around the current state (a smooth chunk)."""

    def __init__(
        self, latency_s: float = 0.15, chunk_size: int = 10, amplitude: float = 0.3, hang_after=None
    ):
        super().__init__()
        self.latency_s, self.chunk_size, self.n_action_steps = latency_s, chunk_size, chunk_size // 2
        self.action_dim = TABLETOP_ARM.num_joints
        self.amplitude = amplitude
        self.hang_after = hang_after  # stop answering after this many chunks (watchdog tests)
        self.calls = 0
        self.unblock = threading.Event()  # set it to let a hung policy return

    def reset(self) -> None:
        self.calls = 0

    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        self.calls += 1
        if self.hang_after is not None and self.calls > self.hang_after:
            self.unblock.wait(60)
        time.sleep(self.latency_s)
        state = batch["observation.state"][0].double()
        t = torch.arange(1, self.chunk_size + 1, dtype=torch.float64) / TABLETOP_ARM.fps
        phase = torch.tensor(float(self.calls))
        offsets = self.amplitude * 0.1 * torch.sin(2 * t + phase)[:, None] * torch.ones(self.action_dim)
        return (state + offsets).unsqueeze(0).float()

    def select_action(self, batch: dict) -> torch.Tensor:
        return self.predict_action_chunk(batch)[:, 0]

    def save_pretrained(self, path) -> None:
        raise NotImplementedError("a test double has no weights")

    @classmethod
    def from_pretrained(cls, path):
        raise NotImplementedError("a test double has no weights")


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
