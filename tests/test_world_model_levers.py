"""Training and sampling levers of the world-model recipe: self-rollout with gradient through the model's
own frames, and the re-noising sampler whose samples keep differing where the future is uncertain."""

from __future__ import annotations

import pytest
import torch
from test_world_model_steps import SIZE, tiny_model

from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.idm import InverseDynamicsConfig
from worldloop.world_model.sampler import SamplerConfig, sample


def _window(b=2, t=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, t, 3, SIZE, SIZE, generator=g), torch.randn(b, t, 4, generator=g)


def test_gradient_flows_through_the_self_rollout_frames_that_carry_it_and_only_those():
    model = tiny_model(self_rollout_frames=3, self_rollout_grad_frames=2).train()
    frames, actions = _window()
    pixels, x, a = model.encode_window(frames, actions)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(0)
    drawn = model.self_rollout(x, a)
    assert [f.shape[1] for f in drawn] == [1, 1, 1]
    # the first drawn frame is made without gradient, the last two with it
    assert [f.requires_grad for f in drawn] == [False, True, True]
    drawn[1].retain_grad()
    drawn[2].float().pow(2).sum().backward()
    # the last frame's loss reaches the frame before it, which it saw as context ...
    assert drawn[1].grad is not None and drawn[1].grad.abs().sum() > 0
    # ... and the weights, but not the real frames the rollout started from
    assert x.grad is None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.dit.parameters())


def test_the_self_rollout_draws_what_a_rollout_draws_from_the_same_noise():
    model = tiny_model(self_rollout_frames=2, self_rollout_grad_frames=2).eval()
    frames, actions = _window(t=5)
    _, x, a = model.encode_window(frames, actions)
    torch.manual_seed(11)
    own = torch.cat(model.self_rollout(x, a), 1)
    imagined, _, _ = model.rollout(
        frames[:, :3], actions[:, :2], actions[:, 2:4], generator=torch.Generator().manual_seed(11)
    )
    torch.testing.assert_close(model.frames_out(own).squeeze(2), imagined, atol=1e-5, rtol=0)


def test_the_self_rollout_loss_joins_the_training_loss_only_when_asked():
    frames, actions = _window()
    plain = tiny_model().train()
    torch.manual_seed(7)
    loss, logs = plain.compute_loss(frames, actions)
    assert "loss/self_rollout" not in logs
    model = tiny_model(self_rollout_frames=2, self_rollout_weight=0.5).train()
    torch.manual_seed(7)
    with_rollout, logs = model.compute_loss(frames, actions)
    # the same weights and draws up to the rollout: the difference is the weighted rollout loss
    torch.testing.assert_close(with_rollout - loss, torch.tensor(0.5 * logs["loss/self_rollout"]))
    with_rollout.backward()
    assert logs["loss/self_rollout"] > 0 and "loss/drawn_idm" not in logs
    with pytest.raises(ValueError, match="more than 6 frames"):
        tiny_model(self_rollout_frames=6).compute_loss(frames, actions)
    with pytest.raises(ValueError, match="self_rollout_grad_frames"):
        WorldModelConfig(self_rollout_frames=2, self_rollout_grad_frames=3).validate()


def test_the_drawn_idm_loss_moves_the_drawing_and_never_the_idm():
    model = tiny_model(self_rollout_frames=3, self_rollout_grad_frames=2, self_rollout_idm_weight=0.5).train()
    frames, actions = _window()
    torch.manual_seed(7)
    total, logs = model.compute_loss(frames, actions)
    assert logs["loss/drawn_idm"] > 0
    _, x, a = model.encode_window(frames, actions)
    torch.manual_seed(1)
    drawn = model.self_rollout(x, a)
    loss = model.drawn_idm_loss(x, a, drawn)
    # the IDM's error on the two frames with gradient, each read with the one before it (the first drawn one)
    seq = torch.cat(drawn, 1)
    expected = torch.nn.functional.mse_loss(
        model.idm(seq[:, :-1].flatten(0, 1), seq[:, 1:].flatten(0, 1)), a[:, 3:5].flatten(0, 1)
    )
    torch.testing.assert_close(loss, expected)
    model.zero_grad()
    loss.backward()
    assert all(p.grad is None for p in model.idm.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.dit.parameters())
    with pytest.raises(ValueError, match="no autoencoder.path and idm.use_state=false"):
        WorldModelConfig(
            self_rollout_frames=2, self_rollout_idm_weight=1.0, idm=InverseDynamicsConfig(use_state=True)
        ).validate()


def _moving_dot_window(t=4):
    """Grey frames with a 2x2 white dot that moves 4 pixels right each frame (the gym-pusht agent, small)."""
    frames = torch.full((1, t, 3, SIZE, SIZE), 0.5)
    for i in range(t):
        frames[0, i, :, 6:8, 2 + 4 * i : 4 + 4 * i] = 1.0
    return frames, torch.randn(1, t, 4, generator=torch.Generator().manual_seed(0))


def test_motion_weights_mark_what_moved_grown_by_a_pixel_and_nothing_else():
    frames, actions = _moving_dot_window()
    model = tiny_model(motion_loss_weight=9.0)
    _, x, _ = model.encode_window(frames, actions)
    w = model.motion_weights(x)
    assert w.shape == (1, 3, 1, 1, SIZE, SIZE)
    # frame 1: the dot left columns 2-3 and arrived at 6-7 (rows 6-7); grown by one pixel each way
    expected = torch.ones(SIZE, SIZE)
    expected[5:9, 1:5] = 10.0
    expected[5:9, 5:9] = 10.0
    torch.testing.assert_close(w[0, 0, 0, 0], expected)
    assert tiny_model().motion_weights(x) is None
    with pytest.raises(ValueError, match="motion_loss_weight"):
        WorldModelConfig(motion_loss_weight=-1.0).validate()


def test_window_span_weighs_every_pixel_that_moves_in_the_window_in_every_frame():
    frames, actions = _moving_dot_window()
    model = tiny_model(motion_loss_weight=9.0, motion_loss_span="window")
    _, x, _ = model.encode_window(frames, actions)
    w = model.motion_weights(x)
    per_frame = tiny_model(motion_loss_weight=9.0).motion_weights(x)
    # the dot's whole track (columns 1..17, rows 5..8) weighs 10 in each of the 3 target frames
    expected = torch.ones(SIZE, SIZE)
    expected[5:9, 1:17] = 10.0
    for i in range(3):
        torch.testing.assert_close(w[0, i, 0, 0], expected)
    # frame 1 alone does not weigh where the dot goes later
    assert per_frame[0, 0, 0, 0, 6, 12] == 1.0 and w[0, 0, 0, 0, 6, 12] == 10.0
    with pytest.raises(ValueError, match="motion_loss_span"):
        WorldModelConfig(motion_loss_span="episode").validate()


def test_motion_weighted_loss_counts_errors_on_the_mover_more():
    frames, actions = _moving_dot_window()
    model = tiny_model(motion_loss_weight=9.0)
    _, x, _ = model.encode_window(frames, actions)
    target = x[:, 1:]
    w = model.motion_weights(x)
    on_mover = target.clone()
    on_mover[0, 0, 0, :, 6, 6] += 1.0  # an error where the dot arrived
    on_background = target.clone()
    on_background[0, 0, 0, :, 12, 12] += 1.0  # the same error on the still background
    assert model.frame_loss(on_mover, target, w) > 5 * model.frame_loss(on_background, target, w)
    # the plain MSE cannot tell them apart; uniform weights give the plain MSE
    torch.testing.assert_close(
        model.frame_loss(on_mover, target, None), model.frame_loss(on_background, target, None)
    )
    torch.testing.assert_close(
        model.frame_loss(on_mover, target, torch.ones_like(w)), model.frame_loss(on_mover, target, None)
    )
    # still frames: nothing moved, so the weighted training loss is the plain one
    still = frames[:, :1].expand(-1, 4, -1, -1, -1)
    plain_model = tiny_model().train()
    torch.manual_seed(5)
    weighted, _ = model.train().compute_loss(still, actions)
    torch.manual_seed(5)
    plain, _ = plain_model.compute_loss(still, actions)
    torch.testing.assert_close(weighted, plain)


def _two_futures(x_t: torch.Tensor, t: float):
    """The exact clean-frame estimate when the future is either -1 or +1, equally likely."""
    if t >= 1:
        return torch.zeros_like(x_t), None
    return torch.tanh(x_t * (1 - t) / t**2), None


@pytest.mark.parametrize("steps", [4, 8])
def test_renoise_samples_differ_where_the_future_is_uncertain(steps):
    """Two futures: the ODE sampler from fixed noise and the re-noising sampler both end on a future, but
    re-noising draws afresh at every level: two runs from the same start noise differ."""
    noise = torch.randn(4000, generator=torch.Generator().manual_seed(0))
    renoise = SamplerConfig(method="renoise", steps=steps)
    a = sample(_two_futures, noise, renoise, torch.Generator().manual_seed(1))
    b = sample(_two_futures, noise, renoise, torch.Generator().manual_seed(2))
    assert (a.abs() > 0.5).float().mean() > 0.9  # it picks one of the two futures ...
    assert abs(float(a.mean())) < 0.1  # ... each about half the time
    assert (a.sign() != b.sign()).float().mean() > 0.4  # from the same start noise, often the other
    euler = sample(_two_futures, noise, SamplerConfig(method="euler", steps=steps))
    again = sample(_two_futures, noise, SamplerConfig(method="euler", steps=steps))
    assert torch.equal(euler, again)  # the ODE has no randomness but the start noise
    # determinism given the generator
    assert torch.equal(a, sample(_two_futures, noise, renoise, torch.Generator().manual_seed(1)))


def test_two_renoise_steps_are_two_euler_steps():
    """At 2 steps the re-noised level-0.5 input has the distribution Euler's has: same mean estimate."""
    noise = torch.randn(5, generator=torch.Generator().manual_seed(0))

    def denoise(x_t, t):
        return 0.5 * x_t, None

    euler = sample(denoise, noise, SamplerConfig(method="euler", steps=2))
    assert torch.allclose(euler, 0.5 * (0.5 * noise + 0.5 * 0.5 * noise))
    g = torch.Generator().manual_seed(3)
    fresh = torch.randn(5, generator=torch.Generator().manual_seed(3))
    out = sample(denoise, noise, SamplerConfig(method="renoise", steps=2), g)
    assert torch.allclose(out, 0.5 * (0.5 * fresh + 0.5 * 0.5 * noise))
