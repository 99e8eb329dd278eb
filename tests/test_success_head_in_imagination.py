"""benchmarks/success_head_in_imagination.py: the reach rule on imagined joint states, and the heads judged
against it, on known inputs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.success_head_in_imagination import judge, step_truth
from worldloop.sim.tabletop_env import TabletopEnv
from worldloop.vla.sim_evaluation import SimEvalConfig


def test_step_truth_is_the_reach_rule_on_each_imagined_step():
    sim_cfg = SimEvalConfig(task="reach", max_steps=5)
    env = TabletopEnv(sim_cfg.env_config(image_size=64, cameras=()))
    paths = []
    for seed in (7, 8):
        obs, _ = env.reset(seed=seed)
        home = obs["observation.state"].tolist()
        named = next(c for c in env.scene_state().cubes if c in env.task.instruction)
        at_cube = env.sim.kinematics.inverse(env.scene_state().cubes[named]).tolist()
        paths.append({"joint_states": [home, home, at_cube, home]})  # start, then three steps
    env.close()
    truth = step_truth(sim_cfg, paths, seed=7)
    np.testing.assert_array_equal(truth, [[False, True, False], [False, True, False]])


def test_judge_counts_episodes_the_heads_call_against_the_truth():
    truth = np.array([[False, True], [False, False], [False, False], [True, False]])
    probs = [[0.2, 0.99], [0.97, 0.1], [0.1, 0.2], [0.5, 0.4]]  # a hit, a false alarm, a reject, a miss
    result = judge([{"success_probs": p} for p in probs], truth, threshold=0.95)
    assert result["heads_success"] == 0.5 and result["true_success"] == 0.5
    assert result["precision"] == 0.5 and result["recall"] == 0.5
    assert 0 < result["per_step_auroc"] < 1
    with pytest.raises(ValueError, match="judged steps"):
        judge([{"success_probs": [0.1]}], truth, 0.5)
