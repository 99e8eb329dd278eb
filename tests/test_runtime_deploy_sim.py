"""End to end: deploy.py's `deploy` drives the MuJoCo sim robot with a slow policy and records the run."""

from __future__ import annotations

import numpy as np
from test_runtime_fakes import SlowSmoothPolicy

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import ACTION, STATE, image_key
from worldloop.real_robot.deploy import DeployConfig, deploy


def test_deploy_on_the_sim_robot_with_a_slow_policy_records_a_valid_dataset(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cfg = DeployConfig(episode_time_s=2.0, stop_on_success=False)
    cfg.robot.image_size = 32
    cfg.runtime.status_every_s = 0.0
    cfg.fuser.name = "rail"
    cfg.record.root = str(tmp_path / "run")
    result = deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.2))

    assert len(result.log.switch_times) >= 3 and result.rejections == {}
    assert all(abs(d - 0.2) < 0.15 for d in result.log.delays), result.log.delays
    ds = LeRobotDataset("local/deploy_runs", root=result.dataset_root)
    assert ds.num_episodes == 1 and 15 <= ds.num_frames <= 22  # 10 fps for 2 s (+ the frame at t=0)
    frame = ds[5]
    assert frame[image_key("front")].shape == (3, 32, 32) and frame[image_key("wrist")].shape == (3, 32, 32)
    actions = np.stack([ds[i][ACTION].numpy() for i in range(ds.num_frames)])
    states = np.stack([ds[i][STATE].numpy() for i in range(ds.num_frames)])
    assert np.all(actions >= TABLETOP_ARM.lower() - 1e-6) and np.all(actions <= TABLETOP_ARM.upper() + 1e-6)
    # the arm follows the commands: the state one frame later is near the frame's action
    assert np.max(np.abs(states[1:] - actions[:-1])) < 0.1
    assert ds[ds.num_frames - 1]["next.done"].item() and not ds[0]["next.done"].item()
    assert ds[0]["task"]  # the sim's instruction was used
