"""Rollout metrics and the sampler: values checked against hand-computed cases."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.metrics import (
    HeldOutWindows,
    imagine,
    masked_psnr,
    moving_mask,
    pooled_psnr,
    psnr,
    rollout_fidelity,
    ssim,
    summarize,
)
from worldloop.world_model.model import WorldModel
from worldloop.world_model.sampler import SamplerConfig, noise_levels, sample


def test_psnr_and_ssim_of_known_errors():
    a = torch.full((2, 3, 16, 16), 0.5)
    b = a + 0.1
    assert psnr(a, b).shape == (2,)
    # Pooled over windows: one exact window (per-frame 100 dB) and one at mse 0.01 pool to mse 0.005 (23 dB).
    pair = torch.stack([a, b])[:, None]  # [N=2, H=1, 2, 3, 16, 16]
    assert pooled_psnr(torch.stack([a, a])[:, None], pair) == pytest.approx([10 * math.log10(200)], rel=1e-4)
    torch.testing.assert_close(psnr(a, b), torch.full((2,), 20.0), rtol=1e-4, atol=1e-4)  # mse 0.01 -> 20 dB
    img = torch.rand(2, 1, 3, 32, 32)
    torch.testing.assert_close(ssim(img, img), torch.ones(2, 1), rtol=1e-4, atol=1e-4)
    assert (ssim(img, torch.rand(2, 1, 3, 32, 32)) < 0.5).all()


def test_moving_pixels_are_those_that_changed():
    prev = torch.zeros(1, 3, 4, 4)
    cur = prev.clone()
    cur[0, 1, 2, 3] = 0.5
    mask = moving_mask(prev, cur, 0.05)
    assert mask.shape == (1, 1, 4, 4) and mask.sum() == 1 and mask[0, 0, 2, 3]
    pred = cur.clone()
    pred[0, :, 2, 3] += 0.1  # error of 0.1 on the moving pixel's 3 channels, none elsewhere counts
    pred[0, :, 0, 0] += 0.9
    assert masked_psnr(pred, cur, mask) == pytest.approx(20.0, abs=1e-3)
    assert math.isnan(masked_psnr(pred, cur, torch.zeros_like(mask)))


def test_oracle_denoiser_is_integrated_exactly():
    """With a perfect x0 estimate every Euler/Heun step lands on the straight path: the result is x0."""
    x0 = torch.randn(2, 5)
    for method in ("euler", "heun"):
        for steps in (1, 2, 7):
            out = sample(
                lambda x, t: (x0, None), torch.randn(2, 5), SamplerConfig(method=method, steps=steps)
            )
            torch.testing.assert_close(out, x0, rtol=1e-5, atol=1e-5)
    levels = noise_levels(4, shift=3.0)
    assert levels[0] == 1 and levels[-1] == 0 and all(a > b for a, b in zip(levels, levels[1:]))


def test_guidance_extrapolates_from_unconditional_to_conditional():
    cond, uncond = torch.ones(1, 3), torch.zeros(1, 3)
    out = sample(lambda x, t: (cond, uncond), torch.randn(1, 3), SamplerConfig(steps=1, guidance_scale=3.0))
    torch.testing.assert_close(out, torch.full((1, 3), 3.0))


def test_sampler_config_errors():
    with pytest.raises(ValueError, match="sampler.method"):
        SamplerConfig(method="ddim").validate()
    with pytest.raises(ValueError, match="sampler.steps"):
        SamplerConfig(steps=0).validate()


def test_rollout_fidelity_reports_every_horizon_step_and_the_copy_last_baseline():
    torch.manual_seed(0)
    dit = VideoDiTConfig(
        image_size=16, patch_size=4, width=32, depth=1, heads=2, context_frames=2, output_conv_channels=0
    )
    model = WorldModel(WorldModelConfig(dit=dit)).eval()
    n, ctx, horizon = 3, 2, 4
    frames = torch.rand(n, ctx + horizon, 1, 3, 16, 16)
    windows = HeldOutWindows(
        frames,
        torch.randn(n, ctx + horizon, 4),
        torch.rand(n, ctx + horizon),
        torch.zeros(n, ctx + horizon, dtype=torch.bool),
        state=torch.randn(n, ctx + horizon, 4),
        task=["reach the red cube"] * n,
    )
    imagined = imagine(model, windows, ctx, steps=1)
    assert imagined[0].shape == (n, horizon, 1, 3, 16, 16) and imagined[1].shape == (n, horizon)
    frames_only = imagine(model, windows, ctx, steps=1, judge=False)
    assert frames_only[1] is None and frames_only[2] is None
    assert torch.equal(frames_only[0], imagined[0])  # judging draws nothing from the rollout's noise
    curves = rollout_fidelity(model, windows, ctx, imagined)
    for key in (
        "psnr",
        "psnr_copy_last",
        "ssim",
        "ssim_copy_last",
        "moving_psnr",
        "idm_error_generated",
        "idm_error_real",
        "success_accuracy",
        "reward_mae",
    ):
        assert len(curves[key]) == horizon, key
    # the copy-last baseline is exactly the PSNR of the last context frame against each real frame
    expected = psnr(frames[:, ctx - 1 : ctx].expand(-1, horizon, -1, -1, -1, -1), frames[:, ctx:]).mean(
        (0, 2)
    )
    torch.testing.assert_close(torch.tensor(curves["psnr_copy_last"]), expected, rtol=1e-5, atol=1e-5)
    assert curves["unchanged_fraction"] == [0.0] * horizon
    still = dataclasses.replace(windows, frames=frames[:, [0, 1, 1, 1, 2, 3]])  # h1, h2 repeat frame 1
    assert rollout_fidelity(model, still, ctx, imagined)["unchanged_fraction"] == [1.0, 1.0, 0.0, 0.0]
    assert "psnr@1" in summarize(curves) and "psnr@5" not in summarize(curves)
    with pytest.raises(ValueError, match="do not fit"):
        rollout_fidelity(model, windows, ctx, tuple(x[:, :2] for x in imagined))
