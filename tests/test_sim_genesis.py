"""The Genesis backend of the tabletop suite: same observations, actions, tasks and experts as MuJoCo.

The fast tests need only MuJoCo (the arm MJCF handed to Genesis, backend selection, the missing-extra error).
The rest build a Genesis scene, whose first build in a process compiles kernels (about a minute with a warm
on-disk cache, several minutes cold), so they are `slow` and share one env per module; they skip with the
install command when genesis-world is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest

from worldloop.common.config import parse_cli
from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import ACTION, STATE, image_key
from worldloop.sim.backends import make_tabletop_sim
from worldloop.sim.tabletop_env import TabletopEnv

needs_genesis = pytest.mark.skipif(
    importlib.util.find_spec("genesis") is None,
    reason="genesis-world is not installed: pip install 'worldloop[genesis]'",
)
IMAGE_SIZE = 32


def test_arm_mjcf_keeps_only_the_arm_with_the_embodiment_limits():
    from worldloop.sim.genesis_backend import arm_mjcf

    model = mujoco.MjModel.from_xml_string(arm_mjcf(TABLETOP_ARM))
    assert model.nu == TABLETOP_ARM.num_joints
    names = [model.body(i).name for i in range(model.nbody)]
    assert not any(n.startswith(("cube_", "zone_")) for n in names)
    assert model.ngeom > 0 and "table" not in [model.geom(i).name for i in range(model.ngeom)]
    for name, lo, hi in zip(
        TABLETOP_ARM.joint_names, TABLETOP_ARM.position_lower, TABLETOP_ARM.position_upper
    ):
        np.testing.assert_allclose(model.joint(name).range, [lo, hi])
    assert [model.camera(i).name for i in range(model.ncam)] == ["wrist"]


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="backend='bullet'.*mujoco"):
        TabletopEnv(backend="bullet")


def test_missing_genesis_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "genesis", None)  # import genesis -> ImportError, installed or not
    with pytest.raises(ImportError, match=r"pip install 'worldloop\[genesis\]'"):
        make_tabletop_sim("genesis", cameras=(), image_size=IMAGE_SIZE)


@pytest.fixture(scope="module")
def genesis_env():
    env = TabletopEnv(task="push", image_size=IMAGE_SIZE, backend="genesis")
    yield env
    env.close()


def _rollout(env: TabletopEnv, seed: int, steps: int) -> list[dict]:
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    trajectory = [obs]
    for _ in range(steps):
        action = env.sim.home + rng.uniform(-0.3, 0.3, env.embodiment.num_joints)
        obs, *_ = env.step(action.astype(np.float32))
        trajectory.append(obs)
    return trajectory


@pytest.mark.slow
@needs_genesis
def test_reset_step_render_shapes_match_the_spaces(genesis_env):
    env = genesis_env
    obs, info = env.reset(seed=0)
    assert set(obs) == {image_key("front"), image_key("wrist"), STATE}
    assert env.observation_space.contains(obs)
    assert info["task"].startswith("push the ") and not info["success"]
    np.testing.assert_allclose(obs[STATE], env.sim.joint_positions(), atol=1e-6)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs)
    assert 0.0 <= reward <= 1.0 and not truncated
    frame = obs[image_key("front")]
    assert frame.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and frame.dtype == np.uint8
    assert frame.std() > 5  # a rendered scene, not a blank buffer
    assert not np.array_equal(obs[image_key("front")], obs[image_key("wrist")])


@pytest.mark.slow
@needs_genesis
def test_same_seed_same_episode_and_the_arm_follows_commands(genesis_env):
    first, second = _rollout(genesis_env, seed=7, steps=5), _rollout(genesis_env, seed=7, steps=5)
    for a, b in zip(first, second):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    other = _rollout(genesis_env, seed=8, steps=1)
    assert not np.array_equal(first[0][image_key("front")], other[0][image_key("front")])
    # Hold a pose: the servo settles on the commanded joints, as on MuJoCo.
    genesis_env.reset(seed=1)
    target = genesis_env.sim.home + np.array([0.3, 0.1, -0.2, 0.1])
    for _ in range(10):
        obs, *_ = genesis_env.step(target.astype(np.float32))
    np.testing.assert_allclose(obs[STATE], target, atol=0.03)


@pytest.mark.slow
@needs_genesis
@pytest.mark.parametrize("task", ["reach", "push"])
def test_scripted_expert_succeeds(genesis_env, task):
    from worldloop.sim.experts import ScriptedExpert

    env = TabletopEnv(task=task, cameras=(), backend="genesis")
    expert = ScriptedExpert(env)
    successes = 0
    for seed in range(3):
        env.reset(seed=seed)
        expert.reset(seed=seed)
        for _ in range(env.config.max_steps):
            _, _, terminated, truncated, info = env.step(expert.act())
            if terminated or truncated:
                break
        successes += info["success"]
    env.close()
    assert successes >= 2, f"the expert succeeded in {successes}/3 {task} episodes on Genesis"


@pytest.mark.slow
@needs_genesis
def test_recorded_episode_reads_back_as_a_lerobot_dataset(tmp_path, genesis_env):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from worldloop.sim.recording import RecordingConfig, record_demos

    cfg = RecordingConfig(
        root=str(tmp_path / "demos"),
        repo_id="worldloop/test_genesis",
        task="reach",
        episodes=1,
        image_size=IMAGE_SIZE,
        max_steps=4,
        terminate_on_success=False,
        backend="genesis",
    )
    record_demos(cfg)
    ds = LeRobotDataset(cfg.repo_id, root=cfg.root)
    assert ds.num_episodes == 1 and ds.num_frames == 4 and ds.fps == TABLETOP_ARM.fps
    frame = ds[0]
    assert frame[image_key("front")].shape == (3, IMAGE_SIZE, IMAGE_SIZE)
    assert frame[STATE].shape == (4,) and frame[ACTION].shape == (4,)
    assert frame["task"].startswith("reach the ")


@pytest.mark.parametrize(
    "config_file, config_class, backend_of",
    [
        ("configs/record/tiny_genesis.yaml", "worldloop.sim.recording:RecordingConfig", lambda c: c.backend),
        ("configs/eval/tiny_genesis.yaml", "evaluate_policy:EvaluatePolicyConfig", lambda c: c.sim.backend),
    ],
)
def test_genesis_configs_select_the_genesis_backend(config_file, config_class, backend_of):
    module, name = config_class.split(":")
    cls = getattr(importlib.import_module(module), name)
    cfg = parse_cli(cls, ["--config", str(Path(__file__).resolve().parents[1] / config_file)])
    assert backend_of(cfg) == "genesis"


def test_deploy_robot_config_passes_the_backend_to_the_sim_robot():
    from worldloop.real_robot.robots import SimRobotConfig, make_robot

    robot = make_robot(SimRobotConfig(backend="genesis"), control_hz=100)
    assert robot.config.backend == "genesis" and not robot.is_connected  # built on connect()


@pytest.mark.slow
@needs_genesis
def test_sim_robot_runs_on_genesis(genesis_env):
    from worldloop.sim.robot import SimRobot, SimRobotConfig, vector_to_action

    with SimRobot(SimRobotConfig(task="reach", image_size=IMAGE_SIZE, backend="genesis", seed=2)) as robot:
        obs = robot.get_observation()
        assert set(obs) == set(robot.observation_features)
        assert obs["front"].shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and obs["front"].dtype == np.uint8
        start = np.array([obs[f"{j}.pos"] for j in TABLETOP_ARM.joint_names])
        target = np.clip(start + 0.1, TABLETOP_ARM.lower(), TABLETOP_ARM.upper())
        for _ in range(30):  # 0.3 s at 100 Hz
            sent = robot.send_action(vector_to_action(target, TABLETOP_ARM.joint_names))
        assert sent == vector_to_action(target, TABLETOP_ARM.joint_names)
        obs = robot.get_observation()
        reached = np.array([obs[f"{j}.pos"] for j in TABLETOP_ARM.joint_names])
        np.testing.assert_allclose(reached, target, atol=0.05)
        assert robot.task.startswith("reach the ")
