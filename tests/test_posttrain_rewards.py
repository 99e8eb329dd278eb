"""Rewards of world-model post-training on inputs whose answer is known."""

from __future__ import annotations

import math

import pytest
import torch

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.rl_finetune.nft import optimality_probability
from worldloop.rl_finetune.wm_posttrain.executability import (
    ExecutabilityRewardConfig,
    executability_reward,
    executability_terms,
    jerk_rms,
)
from worldloop.rl_finetune.wm_posttrain.rollout_stability import (
    FidelityRewardConfig,
    clip_fidelity_reward,
    frame_fidelity,
)

FID = FidelityRewardConfig(ssim_window=7)


def _clip(seed: int, shape=(2, 5, 3, 32, 32)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # Smooth-ish images: SSIM is meaningful on structure, not on white noise.
    low = torch.rand(shape[:-2] + (8, 8), generator=g)
    return torch.nn.functional.interpolate(low.flatten(0, -4), size=shape[-2:], mode="bilinear").view(shape)


def test_identical_clips_score_best():
    real = _clip(0)
    reward, terms = clip_fidelity_reward(real.clone(), real, FID)
    assert torch.allclose(reward, torch.ones(2))
    assert torch.allclose(terms["ssim"], torch.ones(2), atol=1e-5)
    assert torch.isinf(terms["psnr"]).all() or (terms["psnr"] > 100).all()
    for noise in (0.02, 0.1, 0.3):
        noisy = (real + noise * torch.randn(real.shape, generator=torch.Generator().manual_seed(1))).clamp(
            0, 1
        )
        worse, _ = clip_fidelity_reward(noisy, real, FID)
        assert (worse < reward).all()


def test_fidelity_decreases_with_corruption_and_is_per_camera():
    real = _clip(3, (1, 4, 2, 3, 32, 32))  # two cameras
    g = torch.Generator().manual_seed(0)
    scores = []
    for noise in (0.0, 0.05, 0.2):
        gen = (real + noise * torch.randn(real.shape, generator=g)).clamp(0, 1)
        scores.append(clip_fidelity_reward(gen, real, FID)[0].item())
    assert scores[0] > scores[1] > scores[2]
    one_bad = real.clone()
    one_bad[:, :, 1] = _clip(9, (1, 4, 3, 32, 32))
    both = frame_fidelity(one_bad, real, FID)
    camera_1 = frame_fidelity(one_bad[:, :, 1], real[:, :, 1], FID)
    # Camera 0 is perfect (SSIM 1): the clip's SSIM is the mean over the two cameras.
    assert (camera_1["ssim"] < 0.9).all()
    assert torch.allclose(both["ssim"], (1 + camera_1["ssim"]) / 2, atol=1e-5)
    assert (both["score"] < 1).all()


def test_psnr_is_mapped_into_the_configured_range():
    real = torch.zeros(1, 1, 3, 16, 16)
    gen = torch.full_like(real, 0.1)  # mse 0.01 -> 20 dB
    out = frame_fidelity(gen, real, FidelityRewardConfig(ssim_weight=0.0, psnr_weight=1.0, ssim_window=7))
    assert out["psnr"].item() == pytest.approx(20.0, abs=1e-4)
    assert out["score"].item() == pytest.approx((20 - 10) / (40 - 10), abs=1e-5)


def test_fidelity_rejects_bad_input():
    with pytest.raises(ValueError, match="differ in shape"):
        frame_fidelity(torch.zeros(1, 2, 3, 16, 16), torch.zeros(1, 3, 3, 16, 16), FID)
    with pytest.raises(ValueError, match="smaller than fidelity.ssim_window"):
        frame_fidelity(torch.zeros(1, 2, 3, 6, 6), torch.zeros(1, 2, 3, 6, 6), FidelityRewardConfig())
    with pytest.raises(ValueError, match="ssim_window"):
        FidelityRewardConfig(ssim_window=4).validate()


def _smooth_trajectory(length: int = 12) -> torch.Tensor:
    t = torch.arange(length, dtype=torch.float32)[:, None] / TABLETOP_ARM.fps
    centre = (torch.tensor(TABLETOP_ARM.position_lower) + torch.tensor(TABLETOP_ARM.position_upper)) / 2
    return (centre + 0.3 * torch.sin(2 * math.pi * 0.3 * t + torch.arange(4))).unsqueeze(0)  # [1, L, 4]


@pytest.fixture(scope="module")
def squeezenet_weights(tmp_path_factory):
    """A torchvision squeezenet1_1 state dict on disk (random weights: LPIPS's maths, not its calibration)."""
    import torchvision

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("lpips") / "squeezenet1_1.pth"
    torch.save(torchvision.models.squeezenet1_1(weights=None).state_dict(), path)
    return path


def test_lpips_joins_the_score_from_local_weights_only(squeezenet_weights):
    cfg = FidelityRewardConfig(
        ssim_window=7, lpips_weight=1.0, lpips_net="squeeze", lpips_backbone=str(squeezenet_weights)
    )
    cfg.validate()
    real = _clip(0, shape=(2, 3, 3, 64, 64))
    same = frame_fidelity(real.clone(), real, cfg)
    assert torch.allclose(same["lpips"], torch.zeros(2, 3), atol=1e-6)
    assert torch.allclose(same["score"], torch.ones(2, 3))
    noisy = (real + 0.2 * torch.randn(real.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    with_lpips, without = frame_fidelity(noisy, real, cfg), frame_fidelity(noisy, real, FID)
    assert (with_lpips["lpips"] > 0).all()
    # The score is the weighted mean of the three terms; SSIM and PSNR are those of the LPIPS-free score.
    p_norm = ((with_lpips["psnr"] - cfg.psnr_floor) / (cfg.psnr_ceiling - cfg.psnr_floor)).clamp(0, 1)
    expected = (0.5 * without["ssim"] + 0.5 * p_norm + 1.0 * (1 - with_lpips["lpips"].clamp(0, 1))) / 2.0
    assert torch.allclose(with_lpips["score"], expected, atol=1e-6)
    assert torch.allclose(with_lpips["ssim"], without["ssim"])


def test_lpips_without_local_weights_is_a_clear_error(tmp_path, squeezenet_weights):
    missing = tmp_path / "nothing.pth"
    with pytest.raises(FileNotFoundError, match="fidelity.lpips_backbone"):
        FidelityRewardConfig(lpips_weight=0.5, lpips_backbone=str(missing)).validate()
    with pytest.raises(ValueError, match="lpips_net"):
        FidelityRewardConfig(lpips_weight=0.5, lpips_net="resnet").validate()
    # Weights of another network than lpips_net are refused, naming the file.
    wrong = FidelityRewardConfig(lpips_weight=0.5, lpips_net="alex", lpips_backbone=str(squeezenet_weights))
    with pytest.raises(ValueError, match="not a torchvision alex state dict"):
        frame_fidelity(_clip(0, (1, 1, 3, 64, 64)), _clip(1, (1, 1, 3, 64, 64)), wrong)
    FidelityRewardConfig(lpips_weight=0.0, lpips_backbone=str(missing)).validate()  # off: never looked at


def test_jerky_trajectory_scores_lower_than_smooth():
    smooth = _smooth_trajectory()
    jerky = smooth.clone()
    jerky[:, 1::2] += 0.05  # a 0.05 rad zig-zag on top of the same motion
    cfg = ExecutabilityRewardConfig(following_weight=0.0)
    r_smooth, t_smooth = executability_reward(smooth, smooth, TABLETOP_ARM, cfg)
    r_jerky, t_jerky = executability_reward(jerky, smooth, TABLETOP_ARM, cfg)
    assert r_jerky.item() < r_smooth.item()
    for term in ("velocity", "acceleration", "jerk"):
        assert t_jerky[term].item() > t_smooth[term].item()
    assert jerk_rms(jerky, TABLETOP_ARM.fps).item() > 10 * jerk_rms(smooth, TABLETOP_ARM.fps).item()
    assert t_smooth["violation_rate"].item() == 0


def test_limit_violations_are_counted_and_penalised():
    smooth = _smooth_trajectory(10)
    bad = smooth.clone()
    upper = TABLETOP_ARM.position_upper[1]
    bad[0, 4:7, 1] = upper + 0.05  # three steps above the shoulder's upper limit
    terms = executability_terms(bad, smooth, TABLETOP_ARM)
    assert terms["position_violations"].item() == 3
    # Jumping up to and back from the out-of-range plateau is faster than the velocity limit allows.
    jump = (upper + 0.05 - smooth[0, 3, 1]).abs().item() * TABLETOP_ARM.fps
    assert jump > TABLETOP_ARM.velocity_limit[1]
    assert terms["velocity_violations"].item() == 2
    entries = 10 * 4 + 9 * 4
    assert terms["violation_rate"].item() == pytest.approx(5 / entries)
    cfg = ExecutabilityRewardConfig()
    assert (
        executability_reward(bad, smooth, TABLETOP_ARM, cfg)[0]
        < executability_reward(smooth, smooth, TABLETOP_ARM, cfg)[0]
    )


def test_action_following_error():
    smooth = _smooth_trajectory()
    assert executability_terms(smooth, smooth, TABLETOP_ARM)["following_error"].item() == 0
    span = torch.tensor(TABLETOP_ARM.position_upper) - torch.tensor(TABLETOP_ARM.position_lower)
    shifted = smooth + 0.1 * span  # every joint off by 10% of its range
    err = executability_terms(shifted, smooth, TABLETOP_ARM)["following_error"].item()
    assert err == pytest.approx(0.1, abs=1e-5)


def test_executability_rejects_bad_input():
    with pytest.raises(ValueError, match="4 joints"):
        executability_terms(torch.zeros(1, 6, 3), torch.zeros(1, 6, 3), TABLETOP_ARM)
    with pytest.raises(ValueError, match="at least 4"):
        executability_terms(torch.zeros(1, 3, 4), torch.zeros(1, 3, 4), TABLETOP_ARM)
    with pytest.raises(ValueError, match=r"\[B, L, J\]"):
        executability_terms(torch.zeros(1, 6, 4), torch.zeros(1, 5, 4), TABLETOP_ARM)
    with pytest.raises(ValueError, match="jerk_weight"):
        ExecutabilityRewardConfig(jerk_weight=-1).validate()


def test_optimality_probability():
    equal = optimality_probability(torch.full((3, 4), 0.7), advantage_clip=2.0)
    assert torch.allclose(equal, torch.full((3, 4), 0.5))
    r = optimality_probability(torch.tensor([[0.1, 0.2, 0.3, 0.9]]), advantage_clip=2.0)
    assert ((r >= 0) & (r <= 1)).all()
    assert r[0, 3] == r.max() and r[0, 0] == r.min()
    assert r[0, 3] > 0.5 > r[0, 0]
    # Scale-free: multiplying rewards by a constant does not change r.
    assert torch.allclose(optimality_probability(torch.tensor([[1.0, 2.0, 3.0, 9.0]]) * 10, 2.0), r)
    with pytest.raises(ValueError, match="G >= 2"):
        optimality_probability(torch.zeros(4, 1), 2.0)
