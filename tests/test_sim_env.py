"""The tabletop env: registration, observation contract, determinism, limits, success and progress."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from worldloop import sim
from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import STATE, image_key
from worldloop.sim.scene import CUBE_HALF_SIZE, ZONE_HALF_SIZE
from worldloop.sim.tabletop_env import TabletopEnv
from worldloop.sim.tasks import REACH_RADIUS, SceneState, TaskInstance, is_success, progress


@pytest.fixture
def push_env():
    env = TabletopEnv(task="push", image_size=32)
    yield env
    env.close()


@pytest.mark.parametrize("task", ["reach", "push"])
def test_registered_env_reset_and_step_shapes(task):
    env = gym.make(sim.ENV_IDS[task], image_size=32)
    obs, info = env.reset(seed=0)
    assert set(obs) == {image_key("front"), image_key("wrist"), STATE}
    for cam in ("front", "wrist"):
        assert obs[image_key(cam)].shape == (32, 32, 3) and obs[image_key(cam)].dtype == np.uint8
    assert obs[STATE].shape == (TABLETOP_ARM.num_joints,) and obs[STATE].dtype == np.float32
    assert info["task"].startswith(task) and info["success"] is False and info["progress"] == 0.0
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs)
    assert 0.0 <= reward <= 1.0 and not terminated and not truncated
    env.close()


def test_same_seed_same_frames_other_seed_other_layout(push_env):
    def rollout(seed):
        obs, info = push_env.reset(seed=seed)
        frames = [obs[image_key("front")]]
        for i in range(3):
            obs, *_ = push_env.step(push_env.sim.home + 0.2 * (i + 1))
            frames.append(obs[image_key("front")])
        return np.stack(frames), obs[STATE], info["task"]

    a, b, c = rollout(7), rollout(7), rollout(8)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert not np.array_equal(a[0][0], c[0][0])


def test_actions_are_clipped_and_joints_move_within_velocity_limits(push_env):
    obs, _ = push_env.reset(seed=1)
    far = TABLETOP_ARM.upper() + 5.0
    for _ in range(15):
        prev = obs[STATE]
        obs, *_ = push_env.step(far)
        step = np.abs(obs[STATE] - prev)
        assert np.all(step <= TABLETOP_ARM.max_velocity() / TABLETOP_ARM.fps * 1.05 + 1e-3)
    assert np.all(push_env.sim.target == TABLETOP_ARM.upper())
    assert np.all(obs[STATE] <= TABLETOP_ARM.upper() + 0.02)
    with pytest.raises(ValueError, match="shape"):
        push_env.step(np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        push_env.step(np.full(4, np.nan))


def test_front_camera_shows_the_arm_moving(push_env):
    obs, _ = push_env.reset(seed=2)
    before = obs[image_key("front")].astype(int)
    for _ in range(8):
        obs, *_ = push_env.step(push_env.sim.home + np.array([0.8, 0.6, -0.6, 0.0]))
    changed = np.abs(obs[image_key("front")].astype(int) - before).sum(-1) > 30
    assert changed.mean() > 0.03, f"only {changed.mean():.1%} of front pixels changed when the arm moved"


def _state(tip, cube_xyz, zone_xy=(0.3, 0.0)):
    return SceneState(
        tip=np.asarray(tip, float),
        cubes={"red": np.asarray(cube_xyz, float), "blue": np.array([0.1, 0.2, CUBE_HALF_SIZE])},
        zones={"green": np.asarray(zone_xy, float), "purple": np.array([0.1, -0.2])},
    )


def test_reach_success_check():
    task = TaskInstance("reach", "red", None)
    cube = (0.2, 0.0, CUBE_HALF_SIZE)
    assert is_success(task, _state((0.2, 0.0, 2 * CUBE_HALF_SIZE + 0.01), cube))
    assert not is_success(task, _state((0.2, 0.0, CUBE_HALF_SIZE + REACH_RADIUS + 0.01), cube))
    assert not is_success(TaskInstance("reach", "blue", None), _state((0.2, 0.0, 0.05), cube))


def test_success_along_a_joint_path_uses_the_reset_layout():
    env = TabletopEnv(task="reach", cameras=())
    env.reset(seed=3)
    cube = env.scene_state().cubes[env.task.cube]
    home = env.sim.joint_positions()
    at_cube = env.sim.kinematics.inverse(cube)
    assert at_cube is not None
    assert env.success_along(np.stack([home, at_cube]))  # the path passes through the target cube
    assert not env.success_along(np.stack([home, home]))
    others = [c for c in env.scene_state().cubes if c != env.task.cube]
    wrong = env.sim.kinematics.inverse(env.scene_state().cubes[others[0]])
    assert not env.success_along(np.stack([home, wrong]))  # another cube is not the target
    env.close()
    push = TabletopEnv(task="push", cameras=())
    push.reset(seed=0)
    with pytest.raises(ValueError, match="reach only"):
        push.success_along(np.zeros((2, 4)))
    push.close()


def test_an_instruction_names_its_task_and_other_text_is_refused():
    for task in (TaskInstance("push", "blue", "purple"), TaskInstance("reach", "yellow", None)):
        assert TaskInstance.from_instruction(task.instruction) == task
    with pytest.raises(ValueError, match="'push the pink cube onto the green square'"):
        TaskInstance.from_instruction("push the pink cube onto the green square")


def test_push_success_check_and_progress():
    task = TaskInstance("push", "red", "green")
    start = _state((0.1, 0.0, 0.15), (0.15, 0.0, CUBE_HALF_SIZE))
    inside = _state((0.2, 0.0, 0.02), (0.3 + ZONE_HALF_SIZE - 0.01, 0.0, CUBE_HALF_SIZE))
    outside = _state((0.2, 0.0, 0.02), (0.3 - ZONE_HALF_SIZE - 0.01, 0.0, CUBE_HALF_SIZE))
    lifted = _state((0.3, 0.0, 0.1), (0.3, 0.0, 0.08))
    assert is_success(task, inside) and not is_success(task, outside) and not is_success(task, lifted)
    assert not is_success(TaskInstance("push", "red", "purple"), inside)
    assert progress(task, start, start) == 0.0
    assert progress(task, inside, start) == 1.0
    assert 0.5 < progress(task, outside, start) < 1.0


def test_teleported_cube_counts_as_success_in_the_env(push_env):
    push_env.reset(seed=3)
    task = push_env.task
    zone = push_env.scene_state().zones[task.zone]
    push_env.sim.set_cube_position(task.cube, np.array([zone[0], zone[1], CUBE_HALF_SIZE]))
    _, reward, terminated, _, info = push_env.step(push_env.sim.target)
    assert info["success"] and terminated and reward == 1.0


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="task"):
        TabletopEnv(task="stack")
    with pytest.raises(ValueError, match="camera"):
        TabletopEnv(cameras=("side",))
    with pytest.raises(ValueError, match="imagesize"):
        TabletopEnv(imagesize=32)


def test_reset_can_name_another_cube_in_the_same_scene(push_env):
    env = TabletopEnv(task="reach", image_size=32)
    obs, info = env.reset(seed=5)
    other = next(c for c in env.scene_state().cubes if c != env.task.cube)
    again, info_other = env.reset(seed=5, options={"cube": other})
    assert info_other["task"] == f"reach the {other} cube" != info["task"]
    np.testing.assert_array_equal(again[image_key("front")], obs[image_key("front")])  # same scene and arm
    np.testing.assert_array_equal(again[STATE], obs[STATE])
    with pytest.raises(ValueError, match="cube='purple'"):
        env.reset(seed=5, options={"cube": "purple"})
    env.close()
    with pytest.raises(ValueError, match="on reach"):
        push_env.reset(seed=0, options={"cube": other})
