"""gym-pusht: the T located in frames, the scripted pusher graded by skill, its recording, and the pusher as a
policy evaluated through LeRobot's env backend."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gym_pusht")

from worldloop.common.rng import torch_seeded  # noqa: E402
from worldloop.sim.pusht import T_COLOUR, PushTPusher, PushTPusherConfig, locate_t, make_pusht_env  # noqa: E402


def _centre_of_gravity(block_pose):
    # gym-pusht's T: its body origin is at the top of the bar; the centre of gravity is 45 units down its stem.
    x, y, th = block_pose
    return np.array([x - np.sin(th) * 45, y + np.cos(th) * 45])


def test_locate_t_finds_the_t_and_says_when_it_is_hidden():
    env = make_pusht_env(96)
    try:
        for seed in range(5):
            obs, info = env.reset(seed=seed)
            found = locate_t(obs["pixels"])
            assert np.linalg.norm(found - _centre_of_gravity(info["block_pose"])) < 10  # world units
        # Occluded (its pixels painted over, as the agent or a blurred drawn frame would) -> None.
        frame = obs["pixels"].copy()
        frame[np.abs(frame.astype(int) - T_COLOUR).sum(-1) < 40] = 255
        assert locate_t(frame) is None
        assert locate_t(np.full((96, 96, 3), 255, np.uint8)) is None
    finally:
        env.close()


def _mean_max_coverage(skill: float, episodes: int = 6, steps: int = 80) -> float:
    env, pusher = make_pusht_env(96), PushTPusher(PushTPusherConfig(skill=skill))
    best = []
    try:
        for seed in range(episodes):
            obs, info = env.reset(seed=seed)
            pusher.reset(1, np.random.default_rng(seed))
            cov = 0.0
            for _ in range(steps):
                action = pusher.act(obs["pixels"][None], obs["agent_pos"][None])[0]
                assert np.linalg.norm(action - obs["agent_pos"]) <= pusher.config.max_step + 1e-3
                obs, _, terminated, _, info = env.step(action)
                cov = max(cov, info["coverage"])
                if terminated:
                    break
            best.append(cov)
    finally:
        env.close()
    return float(np.mean(best))


@pytest.mark.slow  # 12 episodes of 80 steps in gym-pusht: ~20 s
def test_skill_grades_the_pusher():
    assert _mean_max_coverage(1.0) > _mean_max_coverage(0.0) + 0.05


def test_record_pusht_writes_lerobot_data(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from worldloop.record_demos import main

    root = tmp_path / "pusht"
    main(["--task=pusht", "--cameras=[top]", "--image_size=96", "--max_steps=6", "--episodes=2",
          "--skill_range=[0.5,1.0]", f"--root={root}", "--image_writer_threads=0"])  # fmt: skip
    ds = LeRobotDataset("local/pusht", root=root)
    assert ds.meta.total_episodes == 2 and ds.fps == 10
    assert ds.features["observation.state"]["names"] == ["x", "y"]
    assert ds.features["observation.images.top"]["shape"] == (96, 96, 3)
    item = ds[0]
    assert item["action"].shape == (2,) and 0 <= float(item["next.reward"]) <= 1
    meta = json.loads((root / "meta" / "recording.json").read_text())
    assert [e["seed"] for e in meta["episodes"]] == [0, 1]
    assert all(0.5 <= e["skill"] <= 1.0 and 0 <= e["max_coverage"] <= 1 for e in meta["episodes"])
    with pytest.raises(ValueError, match="--cameras=\\[top\\]"):
        main(["--task=pusht", f"--root={tmp_path / 'x'}"])


def test_scripted_pusher_policy_in_lerobot_env_is_seeded(tmp_path):
    from worldloop.vla.factory import load_policy
    from worldloop.vla.lerobot_env_evaluation import LeRobotEnvEvalConfig, evaluate_in_lerobot_env
    from worldloop.vla.scripted_pusher import ScriptedPusherConfig, ScriptedPusherPolicy

    ScriptedPusherPolicy(ScriptedPusherConfig(skill=0.5)).save_pretrained(tmp_path / "pusher")
    policy = load_policy(tmp_path / "pusher")
    assert isinstance(policy, ScriptedPusherPolicy) and policy.config.skill == 0.5
    cfg = LeRobotEnvEvalConfig(type="pusht", max_steps=8, batch_envs=2, videos=0)
    runs = []
    for _ in range(2):
        with torch_seeded(0):
            runs.append(evaluate_in_lerobot_env(policy, cfg, episodes=3, seed=7, progress_bar=False))
    assert runs[0]["per_episode"] == runs[1]["per_episode"] and runs[0]["episodes"] == 3
    with pytest.raises(ValueError, match="skill"):
        ScriptedPusherConfig(skill=1.5)
