"""The DiffusionNFT-style objective and one post-training step on a tiny random world model."""

from __future__ import annotations

import copy

import pytest
import torch

from worldloop.rl_finetune.nft import NFTConfig, nft_loss
from worldloop.rl_finetune.wm_posttrain.denoise import NoisedClip, predict_x0
from worldloop.rl_finetune.wm_posttrain.posttrain import (
    PosttrainConfig,
    PosttrainObjective,
    RolloutGroupConfig,
)
from worldloop.rl_finetune.wm_posttrain.rollout_stability import FidelityRewardConfig
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.idm import InverseDynamicsConfig
from worldloop.world_model.model import WorldModel
from worldloop.world_model.sampler import SamplerConfig


def tiny_world_model(seed: int = 0, previous_frames: int = 1, previous_noise: bool = False) -> WorldModel:
    """16x16 frames, 2 blocks of width 32; weights perturbed so that the zero-initialised output and gates
    do not make every prediction trivially zero."""
    torch.manual_seed(seed)
    cfg = WorldModelConfig(
        dit=VideoDiTConfig(
            image_size=16,
            patch_size=4,
            width=32,
            depth=2,
            heads=2,
            context_frames=2,
            output_conv_channels=8,
            previous_frames=previous_frames,
            condition_on_previous_noise=previous_noise,
        ),
        idm=InverseDynamicsConfig(channels=8),
        sampler=SamplerConfig(steps=1),
    )
    model = WorldModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def tiny_posttrain_config(**overrides) -> PosttrainConfig:
    cfg = PosttrainConfig(
        rollouts=RolloutGroupConfig(group_size=3, min_length=4, max_length=5),
        fidelity=FidelityRewardConfig(ssim_window=7),
    )
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def _tensors(seed: int, shape=(6, 2, 3, 4, 4)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(4)]


def test_equal_rewards_reduce_to_a_pull_towards_the_old_model():
    theta, old, ref, data = _tensors(0)
    theta.requires_grad_(True)
    cfg = NFTConfig(beta=0.7, reference_weight=0.0)
    loss, _ = nft_loss(theta, old, ref, data, torch.full((6,), 0.5), cfg)
    a, d = old - data, theta - old
    expected = a.pow(2).flatten(1).mean(1).mean() + cfg.beta**2 * d.pow(2).flatten(1).mean(1).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # ... so at theta = old there is nothing to learn.
    at_old = old.clone().requires_grad_(True)
    nft_loss(at_old, old, ref, data, torch.full((6,), 0.5), cfg)[0].backward()
    assert at_old.grad.abs().max().item() < 1e-6


def test_all_positive_with_beta_one_is_supervised_flow_matching():
    theta, old, ref, data = _tensors(1)
    loss, _ = nft_loss(theta, old, ref, data, torch.ones(6), NFTConfig(beta=1.0, reference_weight=0.0))
    assert loss.item() == pytest.approx(torch.nn.functional.mse_loss(theta, data).item(), rel=1e-5)


def test_gradient_at_old_is_reward_weighted_regression():
    _, old, ref, data = _tensors(2)
    r = torch.tensor([1.0, 0.9, 0.5, 0.5, 0.2, 0.0])
    theta = old.clone().requires_grad_(True)
    nft_loss(theta, old, ref, data, r, NFTConfig(beta=1.0, reference_weight=0.0))[0].backward()
    # d/dtheta = beta (2 r - 1) d/dtheta ||theta - data||^2 / numel, per sample.
    per_sample = old[0].numel()
    expected = (2 * r - 1).view(-1, 1, 1, 1, 1) * 2 * (old - data) / per_sample / 6
    assert torch.allclose(theta.grad, expected, atol=1e-6)
    # A small step moves positives towards their sample and negatives away.
    stepped = old - 10.0 * theta.grad
    dist = lambda x: (x - data).pow(2).flatten(1).sum(1)  # noqa: E731
    assert (dist(stepped)[:2] < dist(old)[:2]).all() and (dist(stepped)[4:] > dist(old)[4:]).all()
    assert torch.allclose(dist(stepped)[2:4], dist(old)[2:4])


def test_reference_regulariser_is_active():
    theta, old, ref, data = _tensors(3)
    r = torch.full((6,), 0.5)
    base, _ = nft_loss(theta, old, ref, data, r, NFTConfig(reference_weight=0.0))
    with_ref, logs = nft_loss(theta, old, ref, data, r, NFTConfig(reference_weight=0.3))
    assert with_ref.item() == pytest.approx(
        base.item() + 0.3 * torch.nn.functional.mse_loss(theta, ref).item(), rel=1e-5
    )
    assert logs["loss/reference"] > 0
    # At theta = old (no policy gradient with equal rewards) the regulariser alone still pulls to ref.
    at_old = old.clone().requires_grad_(True)
    nft_loss(at_old, old, ref, data, r, NFTConfig(reference_weight=0.3))[0].backward()
    assert torch.allclose(at_old.grad, 0.3 * 2 * (old - ref) / old.numel(), atol=1e-7)


def test_nft_loss_rejects_mismatched_shapes():
    theta, old, ref, data = _tensors(4)
    with pytest.raises(ValueError, match="same shape"):
        nft_loss(theta[:, :1], old, ref, data, torch.ones(6), NFTConfig())
    with pytest.raises(ValueError, match="r: expected"):
        nft_loss(theta, old, ref, data, torch.ones(5), NFTConfig())


@pytest.mark.parametrize("previous_frames, previous_noise", [(1, False), (2, False), (1, True)])
def test_teacher_forced_prediction_matches_the_rollout(previous_frames, previous_noise):
    """predict_x0 must see what the cached rollout sees: replay a 1-step rollout's noise draws and compare
    (with condition_on_previous_noise, also the previous frames' noise level, context_noise_rollout)."""
    model = tiny_world_model(previous_frames=previous_frames, previous_noise=previous_noise).eval()
    b, c, h = 2, 3, 4
    ctx, ctx_actions, actions = torch.rand(b, c, 1, 3, 16, 16), torch.randn(b, c - 1, 4), torch.randn(b, h, 4)
    generated, _, _ = model.rollout(ctx, ctx_actions, actions, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(
        5
    )  # the rollout's draws: context noise, then (target, context) per frame
    context_noise, target_noise = [torch.randn(ctx.shape, generator=g)], []
    for _ in range(h):
        target_noise.append(torch.randn(b, 1, 1, 3, 16, 16, generator=g))
        context_noise.append(torch.randn(b, 1, 1, 3, 16, 16, generator=g))
    x = WorldModel.frames_in(torch.cat([ctx, generated], 1))
    noised = NoisedClip(
        t=torch.ones(b, c + h - 1),  # 1 Euler step from t = 1: the sample is the x0 estimate at t = 1
        noise=torch.cat([torch.zeros(b, c - 1, 1, 3, 16, 16), *target_noise], 1),
        context_noise=torch.cat(context_noise, 1),
    )
    all_actions = torch.cat([ctx_actions, actions, torch.zeros(b, 1, 4)], 1)
    x0 = predict_x0(model, x, all_actions, noised)[:, c - 1 :]
    assert x[:, c:].std() > 0.1  # a non-trivial model
    assert torch.allclose(x0.clamp(-1, 1), x[:, c:], atol=1e-4)


def _start_batch(b: int = 2, length: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "frames": (torch.rand(b, length, 1, 3, 16, 16, generator=g) * 255).to(torch.uint8),
        "actions": 0.2 * torch.randn(b, length, 4, generator=g),
    }


def _one_step(stage: str, seed: int = 0, reference_weight: float = 0.1):
    base, reference = tiny_world_model(), tiny_world_model()
    cfg = tiny_posttrain_config(nft=NFTConfig(reference_weight=reference_weight))
    objective = PosttrainObjective(base, reference, stage, cfg).train()
    before = copy.deepcopy(objective.policy.state_dict())
    optimizer = torch.optim.SGD([p for p in objective.parameters() if p.requires_grad], lr=1e-2)
    torch.manual_seed(seed)
    loss, logs = objective(_start_batch())
    loss.backward()
    optimizer.step()
    return objective, before, loss, logs


@pytest.mark.parametrize("stage", ["stability", "executability"])
def test_one_post_training_step(stage):
    objective, before, loss, logs = _one_step(stage)
    assert torch.isfinite(loss)
    after = objective.policy.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(k.startswith("dit.") for k in changed)
    assert not any(k.startswith(("idm.", "heads.")) for k in changed), "the reward model must stay frozen"
    for key in (
        "loss/nft",
        "loss/reference",
        "fidelity/ssim",
        "exec/jerk",
        "exec/violation_rate",
        "reward/mean",
    ):
        assert key in logs and logs[key] == logs[key]  # present and not NaN
    assert logs["reward/group_std"] > 0  # candidates differ, so there is a signal
    # The reference model never moves.
    ref = tiny_world_model().state_dict()
    assert all(torch.equal(ref[k], v) for k, v in objective.reference.state_dict().items())


def test_one_post_training_step_is_reproducible():
    a, _, loss_a, _ = _one_step("stability", seed=3)
    b, _, loss_b, _ = _one_step("stability", seed=3)
    c, _, loss_c, _ = _one_step("stability", seed=4)
    assert loss_a.item() == loss_b.item()
    assert all(torch.equal(v, b.policy.state_dict()[k]) for k, v in a.policy.state_dict().items())
    assert loss_a.item() != loss_c.item()


def test_old_model_follows_the_policy_softly():
    base = tiny_world_model()
    objective = PosttrainObjective(base, tiny_world_model(), "stability", tiny_posttrain_config())
    p_new = next(objective.policy.parameters())
    p_old = next(objective.old.parameters())
    old_value = p_old.detach().clone()
    with torch.no_grad():
        p_new.add_(1.0)
    objective.follow_policy()
    d = objective.cfg.nft.old_decay
    assert torch.allclose(p_old, d * old_value + (1 - d) * p_new.detach(), atol=1e-6)


def test_executability_needs_an_idm_without_state():
    base = tiny_world_model()
    base.cfg.idm.use_state = True
    with pytest.raises(ValueError, match="use_state"):
        PosttrainObjective(base, tiny_world_model(), "executability", tiny_posttrain_config())


def test_on_policy_shortcut_equals_the_old_models_pass():
    """old_decay=0 skips the old model's pass (it equals the policy): same loss as computing it."""
    losses = []
    for decay in (0.0, 0.5):
        cfg = tiny_posttrain_config(nft=NFTConfig(old_decay=decay))
        objective = PosttrainObjective(tiny_world_model(), tiny_world_model(), "stability", cfg).train()
        torch.manual_seed(0)
        losses.append(objective(_start_batch())[0].item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
