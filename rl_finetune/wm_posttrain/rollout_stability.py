"""Rollout stability: the clip-fidelity reward.

A world model trained with teacher forcing is never shown its own mistakes; rolled out on its own
predictions it drifts and blurs. Here the model rolls out G candidate futures from a real start state under
the real actions, each candidate is scored against the real future, and the model is pushed towards its
better candidates and away from its worse ones (after "Persistent Robot World Models").

Reward (per candidate clip of L frames, V cameras; frames in [0, 1]):

    s_k   = mean_v SSIM(gen[k, v], real[k, v])
    p_k   = clip((PSNR(gen[k], real[k]) - p_floor) / (p_ceiling - p_floor), 0, 1)
    l_k   = 1 - clip(mean_v LPIPS(gen[k, v], real[k, v]), 0, 1)          (only when w_lpips > 0)
    R     = mean_k (w_ssim s_k + w_psnr p_k + w_lpips l_k) / (w_ssim + w_psnr + w_lpips)

so identical clips score exactly 1, the maximum. LPIPS needs a pretrained backbone that nothing here may
download: with `lpips_weight > 0` it runs only on local weights (`lpips_backbone`, by default torchvision's
file for `lpips_net` in the torch hub cache) and otherwise stops with an error saying where it looked. Its
linear calibration layers ship inside the `lpips` package (`pip install 'worldloop[lpips]'`).

The objective that optimises it is DiffusionNFT (rl_finetune/nft.py).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from pytorch_msssim import ssim

# torchvision's published weight files of the backbones LPIPS is defined on (torch hub cache names).
LPIPS_BACKBONE_FILES = {
    "alex": "alexnet-owt-7be5be79.pth",
    "vgg": "vgg16-397923af.pth",
    "squeeze": "squeezenet1_1-b8a52dc0.pth",
}


@dataclass
class FidelityRewardConfig:
    ssim_weight: float = 0.5
    psnr_weight: float = 0.5
    psnr_floor: float = 10.0  # dB mapped to 0
    psnr_ceiling: float = 40.0  # dB mapped to 1 (identical frames have infinite PSNR, also 1)
    ssim_window: int = (
        7  # Gaussian window of SSIM (odd; frames must be at least this large), as world_model/metrics
    )
    lpips_weight: float = 0.0  # > 0 adds 1 - LPIPS to the score; needs local backbone weights
    lpips_net: str = "alex"  # alex | vgg | squeeze
    lpips_backbone: str = ""  # torchvision state dict of lpips_net; "" -> the torch hub cache's file

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
        if self.lpips_weight < 0:
            raise ValueError(f"fidelity.lpips_weight={self.lpips_weight} must be >= 0")
        if self.lpips_net not in LPIPS_BACKBONE_FILES:
            raise ValueError(
                f"fidelity.lpips_net={self.lpips_net!r}: expected one of {sorted(LPIPS_BACKBONE_FILES)}"
            )
        if self.lpips_weight > 0:
            lpips_backbone_path(self)  # fail at start-up, not at the first reward

    @property
    def total_weight(self) -> float:
        return self.ssim_weight + self.psnr_weight + self.lpips_weight


def lpips_backbone_path(cfg: FidelityRewardConfig) -> Path:
    """The local backbone weights LPIPS will load; an error naming the field and the path if absent."""
    if cfg.lpips_backbone:
        path = Path(cfg.lpips_backbone)
    else:
        path = Path(torch.hub.get_dir()) / "checkpoints" / LPIPS_BACKBONE_FILES[cfg.lpips_net]
    if not path.is_file():
        raise FileNotFoundError(
            f"fidelity.lpips_weight={cfg.lpips_weight} needs the {cfg.lpips_net} backbone's weights on disk, "
            f"and {path} does not exist: pass --fidelity.lpips_backbone=<torchvision state dict of "
            f"{cfg.lpips_net}> or --fidelity.lpips_weight=0 (nothing is downloaded)"
        )
    return path


@functools.lru_cache(maxsize=2)
def _lpips_model(net: str, backbone: str) -> torch.nn.Module:
    """LPIPS with its packaged linear layers and the backbone loaded from `backbone` (never downloaded)."""
    try:
        import lpips
    except ImportError as e:
        raise ImportError(
            "fidelity.lpips_weight > 0 needs the lpips package: pip install 'worldloop[lpips]'"
        ) from e
    # pnet_rand: build the backbone without its pretrained weights (which torchvision would download).
    with warnings.catch_warnings():  # lpips 0.1.4 calls torchvision with its deprecated `pretrained=`
        warnings.simplefilter("ignore", UserWarning)
        model = lpips.LPIPS(pretrained=True, net=net, pnet_rand=True, verbose=False)
    state = torch.load(backbone, map_location="cpu", weights_only=True)
    # lpips keeps torchvision's layer indices inside its slices: features.<i>.<p> -> slice<n>.<i>.<p>.
    ours = {key.split(".", 1)[1]: key for key in model.net.state_dict()}
    features = {k.removeprefix("features."): v for k, v in state.items() if k.startswith("features.")}
    mapped = {ours[k]: v for k, v in features.items() if k in ours}
    missing = sorted(set(ours.values()) - set(mapped))
    if missing:
        raise ValueError(f"{backbone} is not a torchvision {net} state dict: no weights for {missing[:3]}")
    model.net.load_state_dict(mapped)
    return model.eval().requires_grad_(False)


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
    out = {"ssim": s, "psnr": psnr_views.mean(2)}
    weighted = cfg.ssim_weight * s + cfg.psnr_weight * p_norm
    if cfg.lpips_weight > 0:
        model = _lpips_model(cfg.lpips_net, str(lpips_backbone_path(cfg))).to(gen.device)
        with torch.no_grad():
            dist = model(gen.flatten(0, 2) * 2 - 1, ref.flatten(0, 2) * 2 - 1)  # inputs in [-1, 1]
        out["lpips"] = dist.view(b, length, v).mean(2)
        weighted = weighted + cfg.lpips_weight * (1 - out["lpips"].clamp(0, 1))
    out["score"] = weighted / cfg.total_weight
    return out


def clip_fidelity_reward(
    generated: torch.Tensor, real: torch.Tensor, cfg: FidelityRewardConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-level reward R [B] (mean over frames of the per-frame score) and its terms, each [B]."""
    per_frame = frame_fidelity(generated, real, cfg)
    terms = {name: value.mean(1) for name, value in per_frame.items()}
    return terms["score"], terms
