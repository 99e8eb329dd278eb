"""Rollout stability: the clip-fidelity reward.

A world model trained with teacher forcing is never shown its own mistakes; rolled out on its own
predictions it drifts and blurs. Here the model rolls out G candidate futures from a real start state under
the real actions, each candidate is scored against the real future, and the model is pushed towards its
better candidates and away from its worse ones (after "Persistent Robot World Models").

Reward (per candidate clip of L frames, V cameras; frames in [0, 1]):

    s_k   = mean_v SSIM(gen[k, v], real[k, v])
    p_k   = clip((PSNR(gen[k], real[k]) - p_floor) / (p_ceiling - p_floor), 0, 1)
    R     = mean_k (w_ssim s_k + w_psnr p_k) / (w_ssim + w_psnr)

so identical clips score exactly 1, the maximum. LPIPS is left out: it needs downloaded weights.

The objective that optimises it is DiffusionNFT (rl_finetune/nft.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pytorch_msssim import ssim


@dataclass
class FidelityRewardConfig:
    ssim_weight: float = 0.5
    psnr_weight: float = 0.5
    psnr_floor: float = 10.0  # dB mapped to 0
    psnr_ceiling: float = 40.0  # dB mapped to 1 (identical frames have infinite PSNR, also 1)
    ssim_window: int = (
        7  # Gaussian window of SSIM (odd; frames must be at least this large), as world_model/metrics
    )

    def validate(self) -> None:
        if self.ssim_weight < 0 or self.psnr_weight < 0 or self.ssim_weight + self.psnr_weight <= 0:
            raise ValueError(
                f"fidelity.ssim_weight={self.ssim_weight} and fidelity.psnr_weight={self.psnr_weight} "
                "must be >= 0 with a positive sum"
            )
        if self.psnr_ceiling <= self.psnr_floor:
            raise ValueError(
                f"fidelity.psnr_ceiling={self.psnr_ceiling} must exceed fidelity.psnr_floor={self.psnr_floor}"
            )
        if self.ssim_window < 3 or self.ssim_window % 2 == 0:
            raise ValueError(f"fidelity.ssim_window={self.ssim_window} must be an odd number >= 3")


def _per_camera(frames: torch.Tensor) -> torch.Tensor:
    """[B, L, 3, H, W] or [B, L, V, 3, H, W] -> [B, L, V, 3, H, W]."""
    if frames.dim() == 5:
        return frames.unsqueeze(2)
    if frames.dim() == 6:
        return frames
    raise ValueError(f"frames: expected [B, L, (V,) 3, H, W], got {list(frames.shape)}")


def frame_fidelity(
    generated: torch.Tensor, real: torch.Tensor, cfg: FidelityRewardConfig
) -> dict[str, torch.Tensor]:
    """Per-frame SSIM, PSNR (dB) and the combined score in [0, 1], each [B, L] (averaged over cameras).

    generated, real: [B, L, (V,) 3, H, W] floats in [0, 1].
    """
    if generated.shape != real.shape:
        raise ValueError(
            f"generated {list(generated.shape)} and real {list(real.shape)} clips differ in shape"
        )
    gen, ref = _per_camera(generated).float(), _per_camera(real).float()
    b, length, v = gen.shape[:3]
    h, w = gen.shape[-2:]
    if min(h, w) < cfg.ssim_window:
        raise ValueError(f"frames are {h}x{w}: smaller than fidelity.ssim_window={cfg.ssim_window}")
    s = ssim(
        gen.flatten(0, 2), ref.flatten(0, 2), data_range=1.0, size_average=False, win_size=cfg.ssim_window
    )
    s = s.view(b, length, v).mean(2)
    mse = (gen - ref).pow(2).flatten(3).mean(-1)  # [B, L, V]
    psnr_views = 10 * torch.log10(1.0 / mse.clamp_min(1e-12))
    p_norm = ((psnr_views - cfg.psnr_floor) / (cfg.psnr_ceiling - cfg.psnr_floor)).clamp(0, 1).mean(2)
    score = (cfg.ssim_weight * s + cfg.psnr_weight * p_norm) / (cfg.ssim_weight + cfg.psnr_weight)
    return {"ssim": s, "psnr": psnr_views.mean(2), "score": score}


def clip_fidelity_reward(
    generated: torch.Tensor, real: torch.Tensor, cfg: FidelityRewardConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-level reward R [B] (mean over frames of the per-frame score) and its terms, each [B]."""
    per_frame = frame_fidelity(generated, real, cfg)
    terms = {name: value.mean(1) for name, value in per_frame.items()}
    return terms["score"], terms
