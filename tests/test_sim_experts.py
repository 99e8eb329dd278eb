"""Scripted experts: top skill succeeds, actions are smooth and seeded, low skill is worse."""

from __future__ import annotations

import numpy as np
import pytest

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.sim.experts import ExpertConfig, ScriptedExpert
from worldloop.sim.tabletop_env import TabletopEnv


def _run(task: str, skill: float, seeds, record_actions: bool = False):
    env = TabletopEnv(task=task, cameras=())  # no rendering: experts use privileged state
    expert = ScriptedExpert(env, ExpertConfig(skill=skill))
    successes, actions = [], []
    for seed in seeds:
        env.reset(seed=seed)
        expert.reset(seed=seed)
        start = env.sim.target.copy()
        episode = [start]
        for _ in range(env.config.max_steps):
            action = expert.act()
            episode.append(action.astype(np.float64))
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        successes.append(info["success"])
        actions.append(np.stack(episode))
    env.close()
    return np.array(successes), actions


@pytest.mark.parametrize("task,min_rate", [("reach", 1.0), ("push", 0.9)])
def test_top_skill_expert_succeeds(task, min_rate):
    successes, _ = _run(task, 1.0, range(10))
    assert successes.mean() >= min_rate, f"{task}: {successes.mean():.0%} success at skill 1"


def test_low_skill_expert_is_worse():
    good, _ = _run("push", 1.0, range(10))
    bad, _ = _run("push", 0.0, range(10))
    assert bad.mean() <= good.mean() - 0.5


def test_actions_respect_velocity_and_acceleration_limits():
    _, episodes = _run("push", 0.3, range(3))
    dt = 1.0 / TABLETOP_ARM.fps
    for actions in episodes:
        vel = np.diff(actions, axis=0) / dt
        acc = np.diff(vel, axis=0) / dt
        assert np.all(np.abs(vel) <= TABLETOP_ARM.max_velocity() + 1e-6)
        assert np.all(np.abs(acc[1:]) <= TABLETOP_ARM.max_acceleration() + 1e-6)
        assert np.all(actions >= TABLETOP_ARM.lower() - 1e-6) and np.all(
            actions <= TABLETOP_ARM.upper() + 1e-6
        )


def test_expert_is_deterministic_under_a_seed():
    _, a = _run("push", 0.5, [4])
    _, b = _run("push", 0.5, [4])
    np.testing.assert_array_equal(a[0], b[0])


def test_skill_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="skill"):
        ExpertConfig(skill=1.5).validate()
