"""The world model's named steps: compute_loss and rollout are exactly their steps chained, and the
training steps see a target frame the way the rollout steps see the next frame."""

from __future__ import annotations

import pytest
import torch

from worldloop.common.checkpoint import load_matching_weights, save_tensors
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.idm import InverseDynamicsConfig
from worldloop.world_model.model import WorldModel

SIZE = 16


def tiny_model(dit: dict | None = None, **kw) -> WorldModel:
    base = dict(
        image_size=SIZE, patch_size=4, width=32, depth=2, heads=2, context_frames=2, output_conv_channels=8
    )
    cfg = WorldModelConfig(
        dit=VideoDiTConfig(**{**base, **(dit or {})}), idm=InverseDynamicsConfig(channels=8), **kw
    )
    torch.manual_seed(0)
    model = WorldModel(cfg)
    with torch.no_grad():  # zero-initialised output layers would make outputs ignore their inputs
        for p in model.parameters():
            p.normal_(std=0.1)
    return model


def window(b=2, t=4, seed=3):
    g = torch.Generator().manual_seed(seed)
    frames = torch.rand(b, t, 3, SIZE, SIZE, generator=g)
    actions = torch.randn(b, t, 4, generator=g)
    outcomes = {
        "reward": torch.randn(b, t, generator=g),
        "success": (torch.rand(b, t, generator=g) > 0.5).float(),
        "done": (torch.rand(b, t, generator=g) > 0.5).float(),
    }
    return frames, actions, outcomes, torch.randn(b, t, 4, generator=g)


@pytest.mark.parametrize("self_forcing", [0.0, 0.6])
def test_compute_loss_is_the_weighted_sum_of_its_steps(self_forcing):
    model = tiny_model(
        self_forcing=self_forcing, action_dropout=0.3, head_loss_weight=0.3, idm_loss_weight=2.0
    ).train()
    frames, actions, outcomes, state = window()
    task = ["push", "pick"]
    torch.manual_seed(7)
    loss, logs = model.compute_loss(frames, actions, outcomes, state, task)

    torch.manual_seed(7)
    pixels, x, a = model.encode_window(frames, actions)
    noised = model.noise_window(x)
    keep = model.sample_action_keep(noised.target_t)
    if self_forcing:
        replaced = model.self_force_context(noised, a)
        assert not torch.equal(replaced.clean, noised.clean)  # B=2 at 0.6: this seed replaces one
        assert torch.equal(replaced.clean[:, 0], noised.clean[:, 0])  # frame 0 is always the real one
        noised = replaced
    cond = model.compute_conditioners(noised.clean, noised.ctx_t, noised.target_t, a, keep)
    out = model.compute_model_output(noised.clean, noised.noisy, cond).out
    assert out.shape == x[:, 1:].shape
    diffusion, x0_mse = model.diffusion_loss(out, noised)
    heads = model.outcome_heads_loss(pixels, outcomes, state, task, None)
    idm = model.idm_loss(pixels, a, None)

    assert torch.equal(loss, diffusion + 0.3 * heads + 2.0 * idm)
    assert logs == {
        "loss/diffusion": diffusion.item(),
        "loss/x0_mse": x0_mse.item(),
        "loss/heads": heads.item(),
        "loss/idm": idm.item(),
        "loss/total": loss.item(),
    }


@pytest.mark.parametrize(
    "use_cache, method, guidance", [(True, "euler", 1.0), (False, "euler", 1.0), (True, "heun", 2.0)]
)
def test_rollout_is_its_steps_chained_frame_by_frame(use_cache, method, guidance):
    model = tiny_model(dit={"action_delta": True}, action_dropout=0.1).eval()
    model.cfg.sampler.method, model.cfg.sampler.guidance_scale = method, guidance
    g = torch.Generator().manual_seed(4)
    ctx = torch.rand(2, 3, 3, SIZE, SIZE, generator=g)
    ctx_a, fut = torch.randn(2, 2, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    task, state = ["push", "pick"], torch.randn(2, 5, 4, generator=g)
    frames, rewards, success = model.rollout(
        ctx,
        ctx_a,
        fut,
        generator=torch.Generator().manual_seed(5),
        use_cache=use_cache,
        task=task,
        future_state=state,
    )

    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        context = model.encode_context(ctx[:, :, None], ctx_a, gen, use_cache)
        first = model.frames_in(ctx[:, :1])  # the heads' first frame: the first context frame
        chained, judged = [], []
        for k in range(fut.shape[1]):
            context, pixels = model.rollout_step(context, fut[:, k : k + 1], model.cfg.sampler, gen)
            assert context.next_index == 3 + k + 1
            assert (context.cache is None) == (not use_cache) and (context.history is None) == use_cache
            chained.append(pixels)
            judged.append(model.judge_frame(pixels[:, 0], task, state[:, k], first))
    assert torch.equal(frames, model.frames_out(torch.cat(chained, 1)).squeeze(2))
    assert torch.equal(rewards, torch.stack([r for r, _ in judged], 1))
    assert torch.equal(success, torch.stack([s for _, s in judged], 1))


@pytest.mark.parametrize(
    "parameterisation, previous, warp",
    [("x0", 1, False), ("edm", 1, False), ("x0", 3, False), ("x0", 2, True)],
)
def test_training_steps_see_a_target_as_the_rollout_steps_see_the_next_frame(
    parameterisation, previous, warp
):
    """Without context noise, the training pass's x0 for target frame i (compute_conditioners,
    compute_model_output, wrap_model_output) equals the rollout's x0 for the frame after context 0..i-1
    (encode_context, next_frame_x0) at the same noisy frame and noise level."""
    dit = {
        "action_delta": True,
        "residual_to_previous_frame": parameterisation == "x0",
        "previous_frames": previous,
        "warp_previous_frame": warp,
    }
    model = tiny_model(
        dit, parameterisation=parameterisation, context_noise_max=0.0, context_noise_rollout=0.0
    ).eval()
    frames, actions, _, _ = window(b=1, t=5)
    with torch.no_grad():
        _, x, a = model.encode_window(frames, actions)
        torch.manual_seed(2)
        noised = model.noise_window(x)
        assert torch.equal(noised.clean, x)
        keep = torch.ones_like(noised.target_t, dtype=torch.bool)
        cond = model.compute_conditioners(noised.clean, noised.ctx_t, noised.target_t, a, keep)
        out = model.compute_model_output(noised.clean, noised.noisy, cond).out
        trained = model.wrap_model_output(out, noised.noisy, noised.target_t)
        for i in range(1, 5):  # target frame i after context frames 0..i-1 (more than dit.context_frames)
            context = model.encode_context(frames[:, :i, None], actions[:, : i - 1])
            features = model.action_features(
                model.normalize_action(actions[:, i - 1 : i]), context.previous_action
            )
            t = float(noised.target_t[0, i - 1])
            valid = torch.ones(1, 1, dtype=torch.bool)
            rolled = model.next_frame_x0(noised.noisy[:, i - 1 : i], t, context, features, valid)
            torch.testing.assert_close(rolled, trained[:, i - 1 : i], rtol=1e-4, atol=1e-4)


def test_previous_frames_stack_the_earlier_frames_newest_first():
    """Position i reads frames i-1, i-2 (k=2) on channels; before the first frame, the first repeats; the
    position after the window reads its last two frames."""
    model = tiny_model({"previous_frames": 2})
    clean = torch.arange(4.0).view(1, 4, 1, 1, 1, 1).expand(1, 4, 1, 3, 2, 2)
    prev = model.previous_frames(clean)
    assert prev.shape == (1, 5, 1, 6, 2, 2)
    newest, older = prev[0, :, 0, 0, 0, 0], prev[0, :, 0, 3, 0, 0]
    assert newest.tolist() == [0, 0, 1, 2, 3]
    assert older.tolist() == [0, 0, 0, 1, 2]


def test_previous_frames_reach_the_pixels_only_when_configured():
    """With previous_frames=2 the output for a frame changes with the frame two back in its `prev` input;
    with 1 that input has no second frame to read (its shape is the frame's)."""
    for k in (1, 2):
        model = tiny_model({"previous_frames": k}).eval()
        x = torch.rand(1, 1, 1, 3, SIZE, SIZE)
        prev = torch.rand(1, 1, 1, 3 * k, SIZE, SIZE)
        args = (
            torch.randn(1, 1, 4),
            torch.ones(1, 1, dtype=torch.bool),
            torch.full((1, 1), 0.5),
            torch.arange(1),
        )
        out, _ = model.dit(x, prev, *args)
        if k == 2:
            changed = prev.clone()
            changed[:, :, :, 3:] = torch.rand(1, 1, 1, 3, SIZE, SIZE)
            assert not torch.allclose(model.dit(x, changed, *args)[0], out)
        else:
            with pytest.raises(RuntimeError):
                model.dit(x, torch.rand(1, 1, 1, 6, SIZE, SIZE), *args)


def test_a_model_given_an_older_frame_starts_as_the_one_it_came_from(tmp_path):
    """load_matching_weights into a model with dit.previous_frames raised from 1 to 2: the layers that read
    the previous frames (patch input, output convolution) keep their weights for the newest frame and read
    the older one with zeros, so it draws what the 1-frame model draws, whatever the older frame holds; and
    training can still move those zeros (they are ordinary weights, not kept fresh)."""
    warp = {"residual_to_previous_frame": True, "warp_previous_frame": True}
    old = tiny_model(warp).eval()
    save_tensors(old.state_dict(), tmp_path / "model.safetensors")
    grown = tiny_model({**warp, "previous_frames": 2}).eval()
    assert load_matching_weights(grown, tmp_path / "model.safetensors") == []
    for layer in (grown.dit.patch.weight, grown.dit.refine[0].weight):
        assert layer[:, layer.shape[1] * 2 // 3 :].abs().sum() == 0
    g = torch.Generator().manual_seed(5)
    x = torch.rand(1, 1, 1, 3, SIZE, SIZE, generator=g)
    newest, older = torch.rand(2, 1, 1, 1, 3, SIZE, SIZE, generator=g)
    args = (
        torch.randn(1, 1, 4),
        torch.ones(1, 1, dtype=torch.bool),
        torch.full((1, 1), 0.5),
        torch.arange(1),
    )
    with torch.no_grad():
        drawn_before = old.dit(x, newest, *args)[0]
        drawn_after = grown.dit(x, torch.cat([newest, older], 3), *args)[0]
    torch.testing.assert_close(drawn_after, drawn_before)
    grown.train().dit(x, torch.cat([newest, older], 3), *args)[0].pow(2).sum().backward()
    assert grown.dit.patch.weight.grad[:, 2 * 3 * 4 * 4 :].abs().sum() > 0


def test_shared_noise_older_frames_differ_from_the_newest_by_the_motion_alone():
    """previous_frames_share_noise: the older frame a position reads is noised with the newest one's noise
    at its level, so older - newest == (1 - t) * (noise-free older - noise-free newest)."""
    model = tiny_model({"previous_frames": 2}, previous_frames_share_noise=True, context_noise_rollout=0.0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 4, 1, 3, SIZE, SIZE, generator=g) * 2 - 1
    noise = torch.randn(x.shape, generator=g)
    ctx_t = torch.rand(2, 4, generator=g) * 0.5
    clean = x.lerp(noise, ctx_t[..., None, None, None, None])
    prev = model.previous_frames(clean, x, ctx_t)
    for i in range(2, 5):  # position i reads frames i-1 (newest) and i-2
        t = ctx_t[:, i - 1].view(2, 1, 1, 1, 1)
        torch.testing.assert_close(prev[:, i, :, :3], clean[:, i - 1])
        torch.testing.assert_close(
            prev[:, i, :, 3:] - prev[:, i, :, :3], (1 - t) * (x[:, i - 2] - x[:, i - 1])
        )
    own = model.previous_frames(clean)  # without the noise-free frames: each frame with its own noise
    assert torch.equal(own[:, 3, :, 3:], clean[:, 1])
    with pytest.raises(ValueError, match="previous_frames >= 2"):
        tiny_model(previous_frames_share_noise=True, context_noise_rollout=0.0).cfg.validate()
    with pytest.raises(ValueError, match="context_noise_rollout=0"):
        tiny_model({"previous_frames": 2}, previous_frames_share_noise=True).cfg.validate()


def test_self_forced_windows_keep_their_noise_free_frames():
    model = tiny_model(
        {"previous_frames": 2}, self_forcing=1.0, previous_frames_share_noise=True, context_noise_rollout=0.0
    ).train()
    frames, actions, _, _ = window()
    _, x, a = model.encode_window(frames, actions)
    noised = model.noise_window(x)
    forced = model.self_force_context(noised, a)
    assert torch.equal(forced.base[:, 0], x[:, 0]) and not torch.equal(forced.base[:, 1:], x[:, 1:])
    # each replaced context frame is its noise-free estimate noised at the frame's level (so not equal to x)
    loss, _ = model.compute_loss(frames, actions)
    assert torch.isfinite(loss)


def test_previous_noise_conditioning_starts_as_the_model_without_it_and_reads_the_level():
    """condition_on_previous_noise: zero-initialised, the output equals the model's without it (same other
    weights); once trained (weights perturbed here) the output depends on the previous frame's level."""
    plain = tiny_model().eval()
    cond = tiny_model({"condition_on_previous_noise": True}).eval()
    fresh = cond.load_state_dict(plain.state_dict(), strict=False)
    assert fresh.missing_keys and all("previous_noise_embed" in k for k in fresh.missing_keys)
    torch.nn.init.zeros_(cond.dit.previous_noise_embed[-1].weight)
    torch.nn.init.zeros_(cond.dit.previous_noise_embed[-1].bias)
    x = torch.rand(1, 1, 1, 3, SIZE, SIZE)
    args = (
        x,
        torch.rand_like(x),
        torch.randn(1, 1, 4),
        torch.ones(1, 1, dtype=torch.bool),
        torch.full((1, 1), 0.5),
    )
    with torch.no_grad():
        base = plain.dit(*args, torch.arange(1))[0]
        torch.testing.assert_close(cond.dit(*args, torch.arange(1), prev_t=torch.full((1, 1), 0.4))[0], base)
        cond.dit.previous_noise_embed[-1].weight.normal_(std=0.1)
        clean = cond.dit(*args, torch.arange(1), prev_t=torch.zeros(1, 1))[0]
        noisy = cond.dit(*args, torch.arange(1), prev_t=torch.full((1, 1), 0.4))[0]
    assert not torch.allclose(clean, noisy)


def test_noise_free_residual_base_starts_the_residual_from_the_frame_without_its_context_noise():
    """noise_free_residual_base: target i's residual starts from noise-free frame i-1, so the training loss
    changes with context noise on and is the plain one with it off; rollouts with noise-free context are
    unchanged, and the cached and recomputed rollouts agree with noisy context."""
    flagged = tiny_model(noise_free_residual_base=True, context_noise_max=0.5)
    x = torch.rand(2, 4, 1, 3, SIZE, SIZE) * 2 - 1
    clean = x + 0.1 * torch.randn_like(x)
    cond = flagged.compute_conditioners(
        clean,
        torch.full((2, 4), 0.2),
        torch.full((2, 3), 0.5),
        torch.randn(2, 4, 4),
        torch.ones(2, 3).bool(),
        x,
    )
    assert cond.residual_base.shape[1] == 3  # targets 1..3 alone: context positions draw no output
    for target in range(3):
        assert torch.equal(cond.residual_base[:, target], x[:, target])
    assert torch.equal(cond.prev[:, 2], clean[:, 1])  # the pixel paths still read the noised frame

    plain = tiny_model(context_noise_max=0.5)
    frames, actions, _, _ = window()
    losses = {}
    for name, model in (("flagged", flagged), ("plain", plain)):
        for noise in (0.0, 0.5):
            model.cfg.context_noise_max = noise
            torch.manual_seed(7)
            losses[name, noise] = model.compute_loss(frames, actions)[0]
    assert torch.equal(losses["flagged", 0.0], losses["plain", 0.0])
    assert not torch.allclose(losses["flagged", 0.5], losses["plain", 0.5])

    ctx, ctx_a, fut = torch.rand(2, 3, 3, SIZE, SIZE), torch.randn(2, 2, 4), torch.randn(2, 4, 4)
    for model in (flagged, plain):
        model.cfg.context_noise_rollout = 0.0
    same = [
        m.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(1))[0] for m in (flagged, plain)
    ]
    torch.testing.assert_close(*same)
    flagged.cfg.context_noise_rollout = 0.1
    cached, recomputed = (
        flagged.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(1), use_cache=c)[0]
        for c in (True, False)
    )
    torch.testing.assert_close(cached, recomputed, rtol=1e-4, atol=1e-4)
    plain.cfg.context_noise_rollout = 0.1
    other = plain.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(1))[0]
    assert not torch.allclose(cached, other)
    with pytest.raises(ValueError, match="needs dit.residual_to_previous_frame"):
        tiny_model({"residual_to_previous_frame": False}, noise_free_residual_base=True).cfg.validate()
