"""evaluate_policy --backend lerobot_env: LeRobot's gym envs (gym-pusht) and any gymnasium env with images."""

from __future__ import annotations

import json
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from worldloop.data.features import STATE, TASK, image_key
from worldloop.evaluate_policy import EvaluatePolicyConfig, PolicyPath, evaluate
from worldloop.vla.lerobot_env_evaluation import LeRobotEnvEvalConfig, evaluate_in_lerobot_env
from worldloop.vla.policy import Policy

TINY_ID = "worldloop_test/TinyGoal-v0"


class TinyGoalEnv(gym.Env):
    """A point in 2-D that must reach the origin; LeRobot-style observation (nested pixels + agent_pos)."""

    metadata = {"render_modes": [], "render_fps": 10}
    closed = 0  # envs closed so far, over every instance

    def __init__(self, two_cameras: bool = False):
        self.two_cameras = two_cameras
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = spaces.Dict({})  # not checked: the env checker is off, as LeRobot does

    def _obs(self):
        image = np.full((8, 8, 3), 128, np.uint8)
        pixels = {"top": image, "side": image} if self.two_cameras else {"top": image}
        return {"pixels": pixels, "agent_pos": self.pos.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(0.5, 1.0, 2)
        self.start = float(np.linalg.norm(self.pos))
        return self._obs(), {}

    def step(self, action):
        self.pos = self.pos + np.clip(action, -1.0, 1.0)
        dist = float(np.linalg.norm(self.pos))
        coverage = max(0.0, 1.0 - dist / self.start)
        success = dist < 0.05
        return self._obs(), coverage, success, False, {"is_success": success, "coverage": coverage}

    def close(self):
        type(self).closed += 1


gym.register(TINY_ID, entry_point=TinyGoalEnv)


@dataclass
class _Cfg:
    cameras: tuple[str, ...] = ("cam",)


class GoHome(Policy):
    """Moves the point to the origin (gain 1: one step) or not at all (gain 0); records the batches it sees."""

    chunk_size = n_action_steps = 1
    action_dim = 2

    def __init__(self, gain: float):
        super().__init__()
        self.gain, self.config, self.batches = gain, _Cfg(), []

    def reset(self):
        pass

    def predict_action_chunk(self, batch):
        return (-self.gain * batch[STATE])[:, None]

    def select_action(self, batch):
        self.batches.append(batch)
        return self.predict_action_chunk(batch)[:, 0]

    def save_pretrained(self, path):
        raise NotImplementedError

    @classmethod
    def from_pretrained(cls, path):
        raise NotImplementedError


def tiny_cfg(**kw) -> LeRobotEnvEvalConfig:
    return LeRobotEnvEvalConfig(
        **{"type": "", "gym_id": TINY_ID, "max_steps": 4, "batch_envs": 2, "videos": 0} | kw
    )


def test_success_progress_and_mapping_on_a_gymnasium_env(tmp_path):
    home = GoHome(1.0)
    summary = evaluate_in_lerobot_env(home, tiny_cfg(task="go home", videos=1), 3, seed=7, video_dir=tmp_path)
    assert (summary["episodes"], summary["successes"], summary["success_rate"]) == (3, 3, 1.0)
    assert summary["success_ci95"][0] > 0.4 and summary["success_ci95"][1] == 1.0
    assert [e["length"] for e in summary["per_episode"]] == [1, 1, 1]  # terminated on success
    assert summary["mean_progress"] == pytest.approx(1.0) and summary["mean_max_reward"] == pytest.approx(1.0)
    assert (tmp_path / "videos").is_dir() and "video" in summary["per_episode"][0]
    batch = home.batches[0]
    assert batch[image_key("cam")].shape == (2, 3, 8, 8) and batch[image_key("cam")].max() == pytest.approx(
        128 / 255
    )
    assert batch[STATE].dtype == torch.float32 and batch[TASK] == ["go home", "go home"]

    stay = evaluate_in_lerobot_env(GoHome(0.0), tiny_cfg(progress_key="coverage"), 2, seed=7)
    assert stay["successes"] == 0 and stay["success_ci95"][0] == 0.0
    assert [e["length"] for e in stay["per_episode"]] == [4, 4]  # max_steps
    assert stay["mean_progress"] == 0.0 and stay["mean_sum_reward"] == 0.0


def test_mapping_errors_name_the_fix():
    gym.register("worldloop_test/TinyGoal2-v0", entry_point=TinyGoalEnv, kwargs={"two_cameras": True})
    two = LeRobotEnvEvalConfig(type="", gym_id="worldloop_test/TinyGoal2-v0", max_steps=2, videos=0)
    with pytest.raises(ValueError, match=r"\['pixels/side', 'pixels/top'\].*--env.cameras"):
        evaluate_in_lerobot_env(GoHome(1.0), two, 1, seed=0)
    two.cameras = {"pixels/side": "cam"}
    assert evaluate_in_lerobot_env(GoHome(1.0), two, 1, seed=0)["successes"] == 1
    with pytest.raises(ValueError, match="state_key='qpos'"):
        evaluate_in_lerobot_env(GoHome(1.0), tiny_cfg(state_key="qpos"), 1, seed=0)
    wide = GoHome(1.0)
    wide.action_dim = 3
    with pytest.raises(ValueError, match=r"actions of shape \(2,\); the policy gives 3"):
        evaluate_in_lerobot_env(wide, tiny_cfg(), 1, seed=0)
    with pytest.raises(ValueError, match="not a LeRobot env preset"):
        evaluate_in_lerobot_env(GoHome(1.0), LeRobotEnvEvalConfig(type="nope"), 1, seed=0)
    with pytest.raises(ModuleNotFoundError, match="pip install gym-nothere"):
        evaluate_in_lerobot_env(GoHome(1.0), tiny_cfg(package="gym_nothere"), 1, seed=0)


def test_every_env_is_closed_when_an_evaluation_fails():
    wide = GoHome(1.0)
    wide.action_dim = 3
    before = TinyGoalEnv.closed
    with pytest.raises(ValueError, match="actions of shape"):
        evaluate_in_lerobot_env(wide, tiny_cfg(), 2, seed=0)
    assert TinyGoalEnv.closed - before == 2


def test_pusht_with_a_lerobot_policy_through_evaluate_policy(tmp_path):
    pytest.importorskip("gym_pusht")
    from lerobot_fixtures import save_lerobot_policy

    # A random-weight LeRobot ACT with pusht's features (LeRobot's pusht datasets: one 96x96 camera,
    # 2-D agent position and action in pixels of the 512x512 board).
    path = save_lerobot_policy(
        "act",
        tmp_path / "act_pusht",
        {"observation.image": (96, 96)},
        2,
        2,
        action_mean=256.0,
        action_std=50.0,
    )
    cfg = EvaluatePolicyConfig(
        backend="lerobot_env",
        policy=PolicyPath(path=str(path)),
        episodes=2,
        output_dir=str(tmp_path / "eval"),
        env=LeRobotEnvEvalConfig(type="pusht", max_steps=5, videos=1),
    )
    summary, out = evaluate(cfg)
    assert summary["gym_id"] == "gym_pusht/PushT-v0" and summary["backend"] == "lerobot_env"
    assert summary["episodes"] == 2 and [e["length"] for e in summary["per_episode"]] == [5, 5]
    assert 0.0 <= summary["mean_progress"] <= 1.0 and summary["success_rate"] == 0.0
    assert json.loads((out / "summary.json").read_text())["episodes"] == 2
    assert len(list((out / "videos").glob("*.mp4"))) == 1
