"""Any LeRobot policy from a directory LeRobot saved, behind our Policy interface (vla/lerobot_pretrained.py)."""

from __future__ import annotations

import json

import pytest
import torch
from lerobot_fixtures import ACTION_MEAN, save_lerobot_policy

from worldloop.data.features import STATE, TASK, image_key
from worldloop.evaluate_policy import EvaluatePolicyConfig, PolicyPath, evaluate
from worldloop.vla.factory import load_policy
from worldloop.vla.lerobot_pretrained import LeRobotPolicyUnavailable, LeRobotPretrainedPolicy
from worldloop.vla.sim_evaluation import SimEvalConfig

SIM_CAMERAS = {image_key("front"): (32, 32), image_key("wrist"): (32, 32)}


def sim_batch(b: int = 2, size: int = 32, cameras=("front", "wrist")) -> dict:
    g = torch.Generator().manual_seed(0)
    batch = {image_key(c): torch.rand(b, 3, size, size, generator=g) for c in cameras}
    batch[STATE] = torch.randn(b, 4, generator=g)
    batch[TASK] = ["reach the red target"] * b
    return batch


@pytest.fixture(scope="module", params=["act", "diffusion"])
def saved(request, tmp_path_factory):
    return request.param, save_lerobot_policy(
        request.param, tmp_path_factory.mktemp(request.param), SIM_CAMERAS
    )


def test_loads_what_lerobot_saved_and_gives_our_interface(saved):
    kind, path = saved
    policy = load_policy(path)  # config.json and no config.yaml: a LeRobot directory
    assert isinstance(policy, LeRobotPretrainedPolicy) and policy.config.lerobot_type == kind
    assert policy.config.cameras == ("front", "wrist") and policy.config.image_size == (32, 32)
    assert (policy.config.state_dim, policy.action_dim) == (4, 4)
    batch = sim_batch()
    torch.manual_seed(0)
    chunk = policy.predict_action_chunk(batch)
    assert chunk.shape == (2, policy.chunk_size, 4)
    # LeRobot's postprocessor unnormalised them: around the action mean 5 (std 0.1), not around 0.
    assert (chunk - ACTION_MEAN).abs().max() < 2.0
    policy.reset()
    torch.manual_seed(0)
    first = policy.select_action(batch)
    assert first.shape == (2, 4)
    if kind == "act":  # deterministic at inference: the queue starts with the predicted chunk
        torch.testing.assert_close(first, chunk[:, 0])
    # Larger frames are resized to the policy's 32x32 inputs.
    assert policy.predict_action_chunk(sim_batch(size=48)).shape == chunk.shape


def test_runs_in_our_sim_through_evaluate_policy(saved, tmp_path):
    kind, path = saved
    cfg = EvaluatePolicyConfig(
        backend="sim",
        policy=PolicyPath(path=str(path), type="lerobot"),
        episodes=2,
        output_dir=str(tmp_path / "eval"),
        sim=SimEvalConfig(max_steps=5, batch_envs=2, videos=0),
    )
    summary, out = evaluate(cfg)
    assert summary["episodes"] == 2 and [e["length"] for e in summary["per_episode"]] == [5, 5]
    assert json.loads((out / "summary.json").read_text())["policy_path"] == str(path)


def test_save_pretrained_round_trip(saved, tmp_path):
    kind, path = saved
    policy = load_policy(path)
    policy.save_pretrained(tmp_path / "again")
    again = load_policy(tmp_path / "again", policy_type="lerobot")
    batch = sim_batch()
    for p in (policy, again):
        p.reset()
    torch.manual_seed(1)
    a = policy.predict_action_chunk(batch)
    torch.manual_seed(1)
    b = again.predict_action_chunk(batch)
    torch.testing.assert_close(a, b)


def test_loading_fetches_no_initial_backbone(tmp_path):
    # LeRobot's ACT default starts from torchvision's ImageNet ResNet-18 (a download); a saved policy's
    # weights replace it, so loading must not construct it.
    path = save_lerobot_policy("act", tmp_path / "act", SIM_CAMERAS)
    config = json.loads((path / "config.json").read_text())
    config["pretrained_backbone_weights"] = "ResNet18_Weights.IMAGENET1K_V1"
    (path / "config.json").write_text(json.dumps(config))
    policy = load_policy(path)
    assert policy.inner.config.pretrained_backbone_weights is None
    assert policy.predict_action_chunk(sim_batch()).shape == (2, 6, 4)


def test_camera_map_and_state_checks(tmp_path):
    path = save_lerobot_policy("act", tmp_path / "top", {image_key("top"): (32, 32)})
    unmapped = load_policy(path)
    with pytest.raises(KeyError, match="reads camera 'top'.*camera_map"):
        unmapped.predict_action_chunk(sim_batch(cameras=("front",)))
    policy = load_policy(path, camera_map={image_key("top"): "front"})
    assert policy.config.cameras == ("front",)
    assert policy.predict_action_chunk(sim_batch(cameras=("front",))).shape == (2, 6, 4)
    with pytest.raises(ValueError, match=r"camera_map names \['observation.images.side'\]"):
        load_policy(path, camera_map={image_key("side"): "front"})
    batch = sim_batch(cameras=("front",))
    batch[STATE] = torch.zeros(2, 6)
    with pytest.raises(ValueError, match="expects 4 values, the batch has 6"):
        policy.predict_action_chunk(batch)


@pytest.mark.parametrize("lerobot_type", ["smolvla", "pi0", "pi05"])
def test_vla_without_local_weights_says_what_is_missing(lerobot_type, tmp_path):
    from lerobot.policies.factory import make_policy_config

    with pytest.raises(
        LeRobotPolicyUnavailable, match=f"not a local directory.*hf download lerobot/{lerobot_type}"
    ):
        load_policy(f"lerobot/{lerobot_type}", policy_type="lerobot")
    make_policy_config(lerobot_type)._save_pretrained(tmp_path)  # config.json alone
    with pytest.raises(LeRobotPolicyUnavailable, match="lacks model.safetensors"):
        load_policy(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(LeRobotPolicyUnavailable, match="policy_preprocessor.json is missing.*migrate"):
        load_policy(tmp_path)
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        (tmp_path / name).write_text(json.dumps({"name": name, "steps": []}))
    # Its code needs transformers here (not installed), or, where it is, a backbone the offline hub lacks.
    with pytest.raises(
        LeRobotPolicyUnavailable, match=f"'{lerobot_type}'.*(not installed|not on this machine)"
    ):
        load_policy(tmp_path)


def test_factory_routes_by_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.yaml does not exist.*'lerobot'"):
        load_policy(tmp_path)
    with pytest.raises(ValueError, match="camera_map applies to LeRobot policies"):
        load_policy(tmp_path, camera_map={"a": "b"})
