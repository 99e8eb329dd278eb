"""world_model/motion_prior.py and `WorldModelConfig.motion_prior_radius`: the block-matched motion of the
step before, continued by the warp in rollouts and in teacher-forced training alike."""

from __future__ import annotations

import pytest
import torch
from test_world_model_dit import SIZE, dit_config, randomise

from worldloop.world_model.dit import warp
from worldloop.world_model.model import WorldModel, WorldModelConfig
from worldloop.world_model.motion_prior import motion_prior


def square(x: int, y: int, size: int = SIZE) -> torch.Tensor:
    """A grey frame [3, size, size] in [0, 1] with a 4-px red square whose corner is at (x, y)."""
    frame = torch.full((3, size, size), 0.45)
    frame[:, y : y + 4, x : x + 4] = torch.tensor([0.8, 0.15, 0.1]).view(3, 1, 1)
    return frame


def test_the_prior_continues_a_moving_square_and_leaves_a_still_frame():
    before, now, after = square(4, 5), square(5, 6), square(6, 7)
    shift = motion_prior(now, before, radius=2)
    assert shift.shape == (2, SIZE, SIZE)
    torch.testing.assert_close(warp(now, shift), after)  # one more step the same way
    assert not motion_prior(now, now, radius=2).any()  # nothing moved: no shift anywhere
    # two pixels a step is within radius 2, not within radius 1
    far = square(7, 5)
    torch.testing.assert_close(warp(far, motion_prior(far, square(5, 5), radius=2)), square(9, 5))
    assert not torch.allclose(warp(far, motion_prior(far, square(5, 5), radius=1)), square(9, 5))
    with pytest.raises(ValueError, match="radius"):
        motion_prior(now, before, radius=0)
    with pytest.raises(ValueError, match="must match"):
        motion_prior(now, before[:, :8], radius=1)


def model_with_prior(radius: int, random: bool = False) -> WorldModel:
    cfg = WorldModelConfig(
        dit=dit_config(warp_previous_frame=True), motion_prior_radius=radius, context_noise_rollout=0.0
    )
    model = WorldModel(cfg)
    return randomise(model) if random else model.eval()


def test_a_rollout_continues_the_motion_its_network_does_not_draw():
    """A fresh model's output layers are zero: its flow and change are 0, so what it draws is the previous
    frame warped by the prior alone. With the prior the square goes on moving; without it, it stands."""
    context = torch.stack([square(2, 3), square(3, 4), square(4, 5)])[None]  # [1, 3, 3, H, W]
    actions = torch.zeros(1, 2, 4)
    future = torch.zeros(1, 3, 4)
    frames = model_with_prior(2).rollout(context, actions, future, steps=2)[0][0]
    for k in range(3):
        torch.testing.assert_close(frames[k], square(5 + k, 6 + k), atol=1e-5, rtol=0)
    still = model_with_prior(0).rollout(context, actions, future, steps=2)[0][0]
    torch.testing.assert_close(still[2], square(4, 5), atol=1e-5, rtol=0)


def test_kv_cache_rollout_equals_recompute_with_the_prior():
    model = model_with_prior(2, random=True)
    g = torch.Generator().manual_seed(0)
    inputs = (
        torch.rand(2, 3, 3, SIZE, SIZE, generator=g),
        torch.randn(2, 2, 4, generator=g),
        torch.randn(2, 4, 4),
    )
    cached = model.rollout(*inputs, steps=2, generator=torch.Generator().manual_seed(5))[0]
    recomputed = model.rollout(*inputs, steps=2, generator=torch.Generator().manual_seed(5), use_cache=False)[
        0
    ]
    torch.testing.assert_close(cached, recomputed, rtol=1e-4, atol=1e-4)
    plain = model_with_prior(0, random=True).rollout(
        *inputs, steps=2, generator=torch.Generator().manual_seed(5)
    )
    assert (plain[0] - cached).abs().max() > 1e-3  # the prior changes what is drawn


def test_teacher_forcing_gives_each_target_the_motion_of_the_step_before():
    model = model_with_prior(2, random=True).train()
    window = torch.stack([square(2, 3), square(3, 4), square(4, 5), square(5, 6)])[None]  # T = 4
    x = model.frames_in(window)[:, :, None]  # [1, T, V, C, h, w] in [-1, 1]
    t_len = x.shape[1]
    cond = model.compute_conditioners(
        x, torch.zeros(1, t_len), torch.full((1, t_len - 1), 0.5), torch.zeros(1, t_len, 4),
        torch.ones(1, t_len - 1, dtype=torch.bool), base=x,
    )  # fmt: skip
    prior = cond.prior_flow
    assert prior.shape == (1, 2 * t_len - 1, 1, 2, SIZE, SIZE)
    assert not prior[:, : t_len + 1].any()  # context positions and the first target: nothing before to match
    for i in range(2, t_len):  # target frame i continues the move from frame i-2 to i-1
        torch.testing.assert_close(prior[:, t_len - 1 + i], motion_prior(x[:, i - 1], x[:, i - 2], 2))
    loss, _ = model.compute_loss(window, torch.zeros(1, t_len, 4))
    loss.backward()
    assert model.dit.final.weight.grad.abs().sum() > 0


def test_the_prior_needs_the_warp():
    with pytest.raises(ValueError, match="motion_prior_radius"):
        WorldModelConfig(dit=dit_config(), motion_prior_radius=2).validate()
    with pytest.raises(ValueError, match="motion_prior_radius"):
        WorldModelConfig(dit=dit_config(warp_previous_frame=True), motion_prior_radius=-1).validate()
