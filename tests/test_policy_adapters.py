"""LeRobot ACT / Diffusion behind our Policy interface, and the factory that builds and loads policies."""

from __future__ import annotations

import pytest
import torch
import vla_fixtures

from worldloop.data.features import ACTION, STATE
from worldloop.vla.factory import load_policy, make_policy
from worldloop.vla.flow_vla import FlowVLAConfig, VisionConfig
from worldloop.vla.lerobot_adapters import ACTAdapterConfig, DiffusionAdapterConfig
from worldloop.vla.policy import Policy

SIZE = (32, 32)
CONFIGS = {
    "act": ACTAdapterConfig(image_size=SIZE, dim_model=32, dim_feedforward=64, n_encoder_layers=1),
    "diffusion": DiffusionAdapterConfig(image_size=SIZE, down_dims=(16, 32), horizon=8, n_action_steps=4),
    "flow_vla": FlowVLAConfig(image_size=SIZE, vision=VisionConfig(channels=(8, 16)), dim=32, heads=2),
}


@pytest.fixture(params=sorted(CONFIGS))
def policy(request) -> Policy:
    torch.manual_seed(0)
    return make_policy(request.param, CONFIGS[request.param], vla_fixtures.make_stats())


def batch_for(policy, b: int = 2) -> dict:
    return vla_fixtures.make_batch(b, policy.config.cameras, SIZE, policy.training_chunk_size)


def test_conformance_train_predict_select(policy):
    assert isinstance(policy, Policy)
    batch = batch_for(policy)
    policy.train()
    loss, logs = policy(batch)
    assert loss.ndim == 0 and torch.isfinite(loss) and all(isinstance(v, float) for v in logs.values())
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())

    policy.eval()
    chunk = policy.predict_action_chunk(batch)
    assert chunk.shape == (2, policy.chunk_size, policy.action_dim)
    # Unnormalised: outputs live around the action stats, not around 0 with unit spread.
    assert torch.isfinite(chunk).all()
    policy.reset()
    first = [policy.select_action(batch) for _ in range(policy.n_action_steps)]
    assert all(a.shape == (2, policy.action_dim) for a in first)


def test_act_ignores_padded_actions():
    # ACT sees actions only through its VAE encoder (padding-masked) and the masked L1 loss. (Diffusion and
    # FlowVLA mask padded steps in the loss only: their denoisers look at the whole noisy chunk.)
    torch.manual_seed(0)
    policy = make_policy("act", CONFIGS["act"], vla_fixtures.make_stats())
    batch = batch_for(policy)
    policy.train()  # the same seed gives both losses the same dropout
    batch["action_is_pad"] = torch.zeros(2, policy.training_chunk_size, dtype=torch.bool)
    batch["action_is_pad"][:, -2:] = True
    torch.manual_seed(0)
    base, _ = policy(batch)
    changed = dict(batch)
    changed[ACTION] = batch[ACTION].clone()
    changed[ACTION][:, -2:] += 100.0  # garbage in padded steps only
    torch.manual_seed(0)
    other, _ = policy(changed)
    torch.testing.assert_close(base, other)


def test_save_load_round_trip(policy, tmp_path):
    policy.eval()
    batch = batch_for(policy)
    policy.save_pretrained(tmp_path / "p")
    loaded = load_policy(tmp_path / "p")
    assert type(loaded) is type(policy) and loaded.config == policy.config
    torch.manual_seed(3)
    a = policy.predict_action_chunk(batch)
    torch.manual_seed(3)
    b = loaded.predict_action_chunk(batch)
    assert torch.equal(a, b)


def test_factory_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown policy type 'nope'"):
        make_policy("nope")
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        load_policy(tmp_path)
    (tmp_path / "config.yaml").write_text("dim: 3\n")
    with pytest.raises(ValueError, match="'type'"):
        load_policy(tmp_path)
    with pytest.raises(ValueError, match="needs dataset stats"):
        make_policy("act", CONFIGS["act"], None)
    with pytest.raises(ValueError, match=r"stats\['observation.state'\]\['std'\]: expected 4"):
        stats = vla_fixtures.make_stats()
        stats[STATE]["std"] = stats[STATE]["std"][:2]
        make_policy("flow_vla", CONFIGS["flow_vla"], stats)
