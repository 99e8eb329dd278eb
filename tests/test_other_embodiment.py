"""Imagination and post-training for an arm other than the built-in one: a 6-joint SO-101-shaped world
model, policy and dataset (24x32 frames, one camera). The world model's checkpoint stores the arm; an
older checkpoint without it is named by the `embodiment` option."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from worldloop.common.config import ConfigError, parse_cli
from worldloop.common.embodiment import SO101_ARM, TABLETOP_ARM, embodiment_by_name, known_embodiments
from worldloop.data.features import ACTION, DONE, REWARD, STATE, SUCCESS, TASK, image_key, lerobot_features
from worldloop.data.stats import compute_stats
from worldloop.real_robot.robots import SimRobotConfig, embodiment_for
from worldloop.rl_finetune.imagination.evaluation import ImaginationEvalConfig
from worldloop.rl_finetune.imagination.initial_states import dataset_starts
from worldloop.rl_finetune.imagination.policy_ranking import load_world_model_env, rank_policies
from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig, PolicyPath, finetune
from worldloop.rl_finetune.wm_posttrain.posttrain import PosttrainConfig, run_posttraining
from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.idm import InverseDynamicsConfig
from worldloop.world_model.model import WorldModel

JOINTS = SO101_ARM.num_joints
SIZE = 16  # the models' frame size; the dataset's frames are 24x32 and resized to it
CAMERA = "laptop"
SIM = SimEvalConfig(task="reach", max_steps=3)


def six_joint_world_model(stored: bool = True) -> WorldModel:
    """`stored=False`: as a checkpoint written before embodiments were stored."""
    torch.manual_seed(0)
    dit = VideoDiTConfig(
        image_size=SIZE, patch_size=4, width=32, depth=1, heads=2, context_frames=2, output_conv_channels=8,
        action_dim=JOINTS,
    )  # fmt: skip
    idm = InverseDynamicsConfig(channels=8, state_dim=JOINTS, action_dim=JOINTS)
    wm = WorldModel(
        WorldModelConfig(dit=dit, idm=idm, cameras=(CAMERA,)), None, SO101_ARM if stored else None
    )
    with torch.no_grad():  # zero-initialised output layers would draw one grey frame whatever the input
        for p in wm.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(std=0.1)
    return wm.eval()


def six_joint_policy() -> FlowVLAPolicy:
    torch.manual_seed(0)
    cfg = FlowVLAConfig(
        cameras=(CAMERA,), image_size=(SIZE, SIZE), state_dim=JOINTS, action_dim=JOINTS, chunk_size=4,
        n_action_steps=2, dim=32, heads=2, obs_layers=1, action_layers=1, num_inference_steps=2,
    )  # fmt: skip
    cfg.vision.channels = (8, 16)
    g = np.random.default_rng(0)
    centre = (SO101_ARM.lower() + SO101_ARM.upper()) / 2
    stats = {key: compute_stats(g.normal(centre, 10.0, size=(500, JOINTS))) for key in (STATE, ACTION)}
    return FlowVLAPolicy(cfg, stats).eval()


@pytest.fixture(scope="module")
def so101(tmp_path_factory) -> dict[str, Path]:
    """A 3-episode SO-101-shaped LeRobotDataset (no reward features) and the saved 6-joint models."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    tmp = tmp_path_factory.mktemp("so101")
    features = lerobot_features(tuple(f"{j}.pos" for j in SO101_ARM.joint_names), (CAMERA,), (24, 32))
    for key in (REWARD, SUCCESS, DONE):
        del features[key]
    ds = LeRobotDataset.create(
        "someone/so101", fps=SO101_ARM.fps, features=features, root=tmp / "data", use_videos=False
    )
    rng = np.random.default_rng(0)
    for _ in range(3):
        q = rng.uniform(SO101_ARM.lower() / 2, SO101_ARM.upper() / 2).astype(np.float32)
        for t in range(8):
            frame = {image_key(CAMERA): rng.integers(0, 255, (24, 32, 3), dtype=np.uint8), STATE: q + t}
            ds.add_frame(frame | {ACTION: q + t + 1, TASK: "pick up the cube"})
        ds.save_episode()
    ds.finalize()
    six_joint_world_model().save_pretrained(tmp / "wm")
    six_joint_world_model(stored=False).save_pretrained(tmp / "wm_old")
    six_joint_policy().save_pretrained(tmp / "policy")
    return {"data": tmp / "data", "wm": tmp / "wm", "wm_old": tmp / "wm_old", "policy": tmp / "policy"}


def test_registry_holds_one_definition_of_each_arm():
    assert (
        embodiment_by_name("worldloop_arm4") is TABLETOP_ARM
        and embodiment_by_name("so101_follower") is SO101_ARM
    )
    assert SO101_ARM.joint_names[-1] == "gripper" and SO101_ARM.position_upper[-1] == 100.0  # lerobot's 0-100
    # The deploy runtime maps robot types to the very same specs.
    assert embodiment_for(SimRobotConfig()) is TABLETOP_ARM
    with pytest.raises(ValueError, match=r"embodiment='ur5' is not a known arm.*so101_follower"):
        embodiment_by_name("ur5")
    assert set(known_embodiments()) == {"worldloop_arm4", "so101_follower"}


def test_an_older_checkpoint_is_named_by_the_option(so101):
    old = ImaginationEvalConfig(world_model=str(so101["wm_old"]), horizon=3, batch_envs=2, videos=0)
    with pytest.raises(
        ConfigError, match=r"stores no embodiment.*acts in 6 dims: pass --imagination.embodiment"
    ):
        load_world_model_env(old, SIM)
    old.embodiment = "from_dataset"
    with pytest.raises(
        ConfigError, match="a dataset is read for the embodiment when the world model is trained"
    ):
        load_world_model_env(old, SIM)
    old.embodiment = "worldloop_arm4"
    with pytest.raises(ConfigError, match="'worldloop_arm4' has 4 joints but the world model acts in 6"):
        load_world_model_env(old, SIM)
    old.embodiment = "so101_follower"
    assert load_world_model_env(old, SIM).embodiment is SO101_ARM


def test_imagination_of_a_six_joint_arm_starts_from_its_dataset(so101, tmp_path):
    cfg = ImaginationEvalConfig(world_model=str(so101["wm"]), horizon=3, batch_envs=2, videos=0)
    assert load_world_model_env(cfg, SIM).embodiment == SO101_ARM  # stored in the checkpoint: no flag
    cfg.embodiment = "worldloop_arm4"
    with pytest.raises(
        ConfigError, match=r"--imagination.embodiment='worldloop_arm4' contradicts.*'so101_follower'"
    ):
        load_world_model_env(cfg, SIM)
    cfg.embodiment = "so101_follower"  # the same robot: accepted
    # Without a dataset there is nowhere to start: the simulator has only the tabletop arm.
    with pytest.raises(ConfigError, match="imagination.starts_dataset"):
        rank_policies([str(so101["policy"])], cfg, SIM, 2, 0, tmp_path / "none", compare_sim=False)
    cfg.starts_dataset = str(so101["data"])
    with pytest.raises(ConfigError, match="--compare-sim runs the simulator"):
        rank_policies([str(so101["policy"])], cfg, SIM, 2, 0, tmp_path / "none", compare_sim=True)
    env = load_world_model_env(cfg, SIM)
    with pytest.raises(Exception, match=r"24x32, expected 16x16.*dataset.resize"):
        dataset_starts(env, cfg.starts_dataset, 2)
    with pytest.raises(ConfigError, match="has 3 episodes; 5 start states"):
        dataset_starts(env, cfg.starts_dataset, 5, "crop")
    starts = dataset_starts(env, cfg.starts_dataset, 2, "stretch")
    assert starts.frames[CAMERA].shape == (2, 1, 3, SIZE, SIZE) and starts.state.shape == (2, JOINTS)

    cfg.starts_resize = "stretch"
    result = rank_policies([str(so101["policy"])], cfg, SIM, 2, 0, tmp_path / "rank", compare_sim=False)
    record = json.loads((tmp_path / "rank" / "ranking.json").read_text())["policies"]
    (only,) = record.values()
    assert only["imagination"]["sim_steps"] == 0 and len(only["imagination"]["per_episode"]) == 2
    assert [e["task"] for e in only["imagination"]["per_episode"]] == ["pick up the cube"] * 2
    assert 0 <= result["rows"][0]["imagined"] <= 1


def test_finetune_names_what_another_arm_needs(so101, tmp_path):
    cfg = FinetunePolicyConfig(policy=PolicyPath(str(so101["policy"])), world_model=str(so101["wm"]))
    cfg.output_dir = str(tmp_path)
    cfg.env.horizon = cfg.eval.sim.max_steps
    with pytest.raises(ConfigError, match=r"MuJoCo simulator has only the 'worldloop_arm4' arm.*lerobot_env"):
        finetune(cfg)
    cfg.embodiment = "ur5"
    with pytest.raises(ConfigError, match="not a known arm"):
        finetune(cfg)


def test_posttraining_scores_the_six_joint_arm(so101, tmp_path):
    args = [
        f"--world_model.path={so101['wm']}", f"--dataset.root={so101['data']}", "--dataset.resize=crop",
        "--dataset.held_out_fraction=0", "--stages=[executability]", "--rollouts.group_size=2",
        "--rollouts.min_length=4", "--rollouts.max_length=4", "--fidelity.ssim_window=7", "--train.steps=1",
        "--train.batch_size=2", "--train.report_to=none",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match=r"--embodiment='worldloop_arm4' contradicts .*'so101_follower'"):
        run_posttraining(parse_cli(PosttrainConfig, [*args, "--embodiment=worldloop_arm4"]))
    with pytest.raises(ConfigError, match="not a known arm"):
        run_posttraining(parse_cli(PosttrainConfig, [*args, "--embodiment=ur5"]))
    # The older checkpoint, named by the option: its post-trained export stores the arm from then on.
    out = tmp_path / "so101"
    old = [a.replace(str(so101["wm"]), str(so101["wm_old"])) for a in args]
    final = run_posttraining(
        parse_cli(PosttrainConfig, [*old, f"--output_dir={out}", "--embodiment=so101_follower"])
    )
    assert WorldModel.from_pretrained(final).cfg.dit.action_dim == JOINTS
    assert WorldModel.from_pretrained(final).embodiment == SO101_ARM
