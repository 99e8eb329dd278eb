"""End to end: deploy.py's `deploy` drives the MuJoCo sim robot with a slow policy and records the run; a
recording that fails keeps a finalized dataset without the episode."""

from __future__ import annotations

import json

import numpy as np
import pytest

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import ACTION, STATE, image_key
from worldloop.data.recording import RECORDING_META
from worldloop.real_robot.deploy import DeployConfig, deploy
from worldloop.real_robot.fault_injection import SlowSmoothPolicy
from worldloop.real_robot.recorder import EpisodeRecorder, RecordConfig


def test_deploy_on_the_sim_robot_with_a_slow_policy_records_a_valid_dataset(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cfg = DeployConfig(episode_time_s=2.0, stop_on_success=False)
    cfg.robot.image_size = 32
    cfg.runtime.status_every_s = 0.0
    cfg.fuser.name = "rail"
    cfg.record.root = str(tmp_path / "run")
    cfg.record.segment_s = 0.5  # saved every 5 frames: the run is 4-5 consecutive segments
    result = deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.2))

    assert len(result.log.switch_times) >= 3 and result.rejections == {}
    assert all(abs(d - 0.2) < 0.15 for d in result.log.delays), result.log.delays
    ds = LeRobotDataset("local/deploy_runs", root=result.dataset_root)
    assert 15 <= ds.num_frames <= 22  # 10 fps for 2 s (+ the frame at t=0)
    recording = json.loads((result.dataset_root / RECORDING_META).read_text())
    segments = recording["episodes"]
    assert recording["complete"] and ds.num_episodes == len(segments) >= 3
    assert [s["segment"] for s in segments] == list(range(len(segments)))
    assert [s["first_frame"] for s in segments] == list(np.cumsum([0] + [s["length"] for s in segments])[:-1])
    assert (
        all(s["length"] == 5 for s in segments[:-1]) and sum(s["length"] for s in segments) == ds.num_frames
    )
    frame = ds[5]
    assert frame[image_key("front")].shape == (3, 32, 32) and frame[image_key("wrist")].shape == (3, 32, 32)
    actions = np.stack([ds[i][ACTION].numpy() for i in range(ds.num_frames)])
    states = np.stack([ds[i][STATE].numpy() for i in range(ds.num_frames)])
    assert np.all(actions >= TABLETOP_ARM.lower() - 1e-6) and np.all(actions <= TABLETOP_ARM.upper() + 1e-6)
    # the arm follows the commands: the state one frame later is near the frame's action
    assert np.max(np.abs(states[1:] - actions[:-1])) < 0.1
    assert ds[ds.num_frames - 1]["next.done"].item() and not ds[0]["next.done"].item()
    assert ds[0]["task"]  # the sim's instruction was used


def test_a_failed_deploy_recording_drops_the_episode_and_leaves_a_finalized_dataset(tmp_path):
    root = tmp_path / "run"
    recorder = EpisodeRecorder(RecordConfig(root=str(root)), TABLETOP_ARM.joint_names, 10, "push", "sim")
    joints = {f"{j}.pos": 0.0 for j in TABLETOP_ARM.joint_names}
    command = np.zeros(TABLETOP_ARM.num_joints)
    recorder.on_observation({**joints, "front": np.zeros((8, 8, 3), np.uint8)}, 0.0, command)
    recorder.on_observation({**joints, "front": np.zeros((4, 4, 3), np.uint8)}, 0.1, command)  # wrong size
    with pytest.raises(RuntimeError, match=f"recording to {root} failed"):
        recorder.finish(command, success=False)
    recording = json.loads((root / RECORDING_META).read_text())
    assert recording["complete"] is False and recording["episodes"] == []
    assert (root / "meta" / "info.json").exists()
