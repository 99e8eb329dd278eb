"""A researcher's own LeRobotDataset, not shaped like ours, trains both models with config overrides only.

The dataset looks like an SO-101 recording: 6-dim state and action, cameras `laptop` and `phone` at 96x128
(not square, not the model's size), 30 fps, no next.reward / next.success / next.done.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from worldloop import train_policy
from worldloop.common.config import parse_cli
from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset
from worldloop.data.features import ACTION, DONE, REWARD, STATE, SUCCESS, TASK, image_key, lerobot_features
from worldloop.data.images import resize_frames
from worldloop.data.windows import PolicySamples, WorldModelWindows
from worldloop.vla.factory import load_policy
from worldloop.world_model.model import WorldModel
from worldloop.world_model.trainer import TrainWorldModelConfig, train

REPO = Path(__file__).resolve().parents[1]
SO101_JOINTS = tuple(
    f"{j}.pos" for j in ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
)
CAMERAS = ("laptop", "phone")
SOURCE = (96, 128)
BORDER = 16  # columns at each side that a centre crop to a square removes: (128 - 96) / 2
LENGTHS = (10, 12, 9)
FPS = 30


def own_image(camera_number: int, frame: int) -> np.ndarray:
    """White side bands (the columns a square centre crop drops), the frame index in the middle."""
    img = np.full((*SOURCE, 3), 255, dtype=np.uint8)
    img[:, BORDER:-BORDER] = 0
    img[:, BORDER:-BORDER, 0] = frame
    img[:, BORDER:-BORDER, 2] = 10 * camera_number
    return img


@pytest.fixture(scope="module")
def own_root(tmp_path_factory) -> Path:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path_factory.mktemp("own") / "so101_pick"
    features = lerobot_features(SO101_JOINTS, CAMERAS, SOURCE)
    for key in (REWARD, SUCCESS, DONE):
        del features[key]
    ds = LeRobotDataset.create(
        "someone/so101_pick",
        fps=FPS,
        features=features,
        root=root,
        robot_type="so101_follower",
        use_videos=False,
    )
    rng = np.random.default_rng(0)
    for n in LENGTHS:
        for t in range(n):
            frame = {image_key(cam): own_image(c, t) for c, cam in enumerate(CAMERAS)}
            frame[STATE] = rng.normal(size=6).astype(np.float32)
            frame[ACTION] = rng.normal(size=6).astype(np.float32)
            frame[TASK] = "pick up the cube"
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


def test_resize_crop_keeps_aspect_and_stretch_does_not():
    frames = torch.from_numpy(np.stack([own_image(0, 7), own_image(1, 9)])).permute(0, 3, 1, 2)
    cropped = resize_frames(frames, (32, 32), "crop")
    stretched = resize_frames(frames, (32, 32), "stretch")
    assert cropped.shape == stretched.shape == (2, 3, 32, 32) and cropped.dtype == torch.uint8
    # The crop drops the white side bands exactly; the stretch squeezes them in.
    assert torch.equal(cropped[0, 0], torch.full((32, 32), 7, dtype=torch.uint8))
    assert int(cropped[:, 1].max()) == 0 and int(cropped[1, 2, 0, 0]) == 10
    assert int(stretched[0, 1, :, 0].min()) > 200 and int(stretched[0, 1, :, 16].max()) == 0
    # uint8 and [0, 1] float inputs resize to the same values (cached vs lerobot-decoded frames).
    as_float = resize_frames(frames.float() / 255, (24, 40), "crop")
    assert torch.equal((as_float * 255).round().to(torch.uint8), resize_frames(frames, (24, 40), "crop"))
    assert resize_frames(frames, SOURCE, "") is frames
    with pytest.raises(ValueError, match="resize is 'squash'"):
        resize_frames(frames, (32, 32), "squash")


def test_opens_with_its_own_cameras_resized_and_rewards_filled(own_root):
    cfg = DatasetConfig(root=str(own_root), cameras=list(CAMERAS), image_size=[32, 32], resize="crop")
    ds = EpisodeDataset(cfg)
    assert ds.source_sizes == {"laptop": SOURCE, "phone": SOURCE} and ds.image_size == (32, 32)
    assert ds.state_dim == ds.action_dim == 6 and ds.fps == FPS and ds.reward_keys == []
    table = ds.frame_table()
    assert table.images["phone"].shape == (sum(LENGTHS), 3, 32, 32)
    assert torch.equal(table.images["phone"][3, 0], torch.full((32, 32), 3, dtype=torch.uint8))
    assert table.done.nonzero().flatten().tolist() == [9, 21, 30] and not table.success.any()
    # The lerobot-decoded path (no cache) resizes to the same frames.
    cached = WorldModelWindows(ds, [1], context=2, horizon=2, cache=True)
    direct = WorldModelWindows(ds, [1], context=2, horizon=2, cache=False)
    assert torch.equal(cached[5]["frames"], direct[5]["frames"]) and cached[5]["frames"].shape == (
        4,
        2,
        3,
        32,
        32,
    )
    sample = PolicySamples(ds, [0], chunk_size=4, cache=False)[2]
    assert sample[image_key("laptop")].shape == (3, 32, 32)


def test_what_cannot_work_is_named(own_root):
    with pytest.raises(DatasetError, match=r"camera 'front' not found.*\['laptop', 'phone'\]"):
        EpisodeDataset(DatasetConfig(root=str(own_root), cameras=["front"]))
    with pytest.raises(DatasetError, match=r"camera 'laptop' is 96x128, expected 64x64.*dataset.resize=crop"):
        EpisodeDataset(DatasetConfig(root=str(own_root), cameras=["laptop"], image_size=[64, 64]))
    with pytest.raises(DatasetError, match=r"resize is 'squash'"):
        EpisodeDataset(DatasetConfig(root=str(own_root), image_size=[64, 64], resize="squash"))
    with pytest.raises(DatasetError, match=r"required features \['next.reward'"):
        EpisodeDataset(DatasetConfig(root=str(own_root), require_rewards=True))
    # The world model's default state and action sizes (4, the tabletop arm) against this 6-dim dataset.
    wrong_action = rf"{re.escape(str(own_root))}: feature 'observation.state' has size 6, expected 4"
    with pytest.raises(DatasetError, match=wrong_action):
        args = [f"--dataset.root={own_root}", "--dataset.resize=crop", "--model.cameras=[laptop]"]
        train(parse_cli(TrainWorldModelConfig, args))


def test_world_model_trains_on_it_with_overrides_only(own_root, tmp_path):
    out = tmp_path / "wm"
    args = [
        f"--config={REPO / 'configs/world_model/tiny.yaml'}",
        f"--dataset.root={own_root}",
        "--dataset.resize=crop",
        "--dataset.held_out_fraction=0.34",
        "--model.cameras=[laptop,phone]",
        "--model.dit.num_views=2",
        "--model.dit.action_dim=6",
        "--model.idm.action_dim=6",
        "--model.idm.state_dim=6",
        # smaller than tiny so the test is quick
        "--model.dit.image_size=32",
        "--model.dit.width=32",
        "--model.dit.depth=1",
        "--model.dit.heads=2",
        "--model.dit.context_frames=2",
        "--window=3",
        "--train.steps=2",
        "--train.batch_size=2",
        "--train.report_to=none",
        "--eval.context=2",
        "--eval.horizon=3",
        "--eval.max_windows=2",
        f"--output_dir={out}",
    ]
    train(parse_cli(TrainWorldModelConfig, args))
    model = WorldModel.from_pretrained(out / "pretrained_model")
    assert list(model.cfg.cameras) == ["laptop", "phone"] and len(model.stats[ACTION]["mean"]) == 6
    assert (out / "eval").is_dir()


def test_policy_trains_on_it_with_overrides_only(own_root, tmp_path):
    out = tmp_path / "policy"
    train_policy.main(
        [
            f"--config={REPO / 'configs/policy/tiny.yaml'}",
            f"--dataset.root={own_root}",
            "--dataset.resize=stretch",
            "--policy.flow_vla.cameras=[laptop,phone]",
            "--policy.flow_vla.state_dim=6",
            "--policy.flow_vla.action_dim=6",
            "--policy.flow_vla.image_size=[32,48]",
            "--policy.flow_vla.vision.channels=[8,16]",
            "--policy.flow_vla.dim=32",
            "--policy.flow_vla.heads=2",
            "--train.steps=2",
            "--train.batch_size=2",
            "--train.report_to=none",
            f"--output_dir={out}",
        ]
    )
    policy = load_policy(out / "pretrained_model")
    batch = {image_key(c): torch.rand(1, 3, 32, 48) for c in CAMERAS}
    batch |= {STATE: torch.zeros(1, 6), TASK: ["pick up the cube"]}
    assert policy.predict_action_chunk(batch).shape == (1, policy.chunk_size, 6)


@pytest.mark.slow
def test_video_encoded_cameras_are_resized_the_same_on_both_read_paths(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = lerobot_features(SO101_JOINTS, ("laptop",), SOURCE)
    features[image_key("laptop")]["dtype"] = "video"
    for key in (REWARD, SUCCESS, DONE):
        del features[key]
    ds = LeRobotDataset.create("someone/so101_video", fps=FPS, features=features, root=tmp_path / "v")
    for t in range(8):
        frame = {image_key("laptop"): own_image(0, 20 * t), STATE: np.zeros(6, np.float32)}
        ds.add_frame(frame | {ACTION: np.zeros(6, np.float32), TASK: "pick up the cube"})
    ds.save_episode()
    ds.finalize()
    cfg = DatasetConfig(root=str(tmp_path / "v"), cameras=["laptop"], image_size=[32, 32], resize="crop")
    dataset = EpisodeDataset(cfg)
    assert dataset.meta.video_keys == [image_key("laptop")]
    table = dataset.frame_table()
    # Lossy codec: the frame index (x20) in channel 0 survives only approximately; the bands are cropped.
    centre = table.images["laptop"][:, 0, 8:24, 8:24].float().mean((1, 2))
    assert (centre - 20 * torch.arange(8)).abs().max() < 8 and table.images["laptop"][:, 1].float().mean() < 8
    cached = WorldModelWindows(dataset, context=2, horizon=1, cache=True)
    direct = WorldModelWindows(dataset, context=2, horizon=1, cache=False)
    for i in range(len(cached)):
        assert torch.equal(cached[i]["frames"], direct[i]["frames"])


def test_so101_deploy_config_is_lerobots_so101_follower():
    from lerobot.cameras.opencv import OpenCVCameraConfig
    from lerobot.robots.so_follower import SO101FollowerConfig

    from worldloop.real_robot.deploy import DeployConfig

    cfg = parse_cli(
        DeployConfig, [f"--config={REPO / 'configs/deploy/so101.yaml'}", "--robot.port=/dev/ttyUSB1"]
    )
    robot = cfg.robot
    # lerobot registers one config class under both names; its type reads back as the first (so100).
    assert isinstance(robot, SO101FollowerConfig) and robot.type in ("so100_follower", "so101_follower")
    assert (robot.port, robot.id, robot.calibration_dir, robot.use_degrees) == (
        "/dev/ttyUSB1",
        "follower",
        None,
        True,
    )
    assert isinstance(robot.cameras["front"], OpenCVCameraConfig) and robot.cameras["front"].fps == 30
