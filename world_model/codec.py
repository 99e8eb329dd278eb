"""Where the diffusion runs: pixel space (default) or the latent space of a diffusers AutoencoderKL.

The autoencoder is loaded from a local directory (never the hub) and kept frozen; the DiT then works on
latents [latent_channels, H / f, W / f] scaled by the autoencoder's `scaling_factor` (and `shift_factor`
when it has one), and rollouts decode what they imagine back to pixels. The inverse dynamics model always
reads pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class AutoencoderConfig:
    path: str = ""  # local diffusers AutoencoderKL directory; "" -> pixel space
    image_size: int = 64  # pixel resolution of the frames it encodes


class FrameCodec(nn.Module):
    """Pixels in [-1, 1] <-> what the DiT denoises."""

    def __init__(self, cfg: AutoencoderConfig):
        super().__init__()
        self.cfg = cfg
        self.vae = None
        if cfg.path:
            from diffusers import AutoencoderKL

            path = Path(cfg.path)
            if not (path / "config.json").is_file():
                raise FileNotFoundError(
                    f"autoencoder.path={cfg.path}: not a local diffusers AutoencoderKL directory (no config.json)"
                )
            self.vae = (
                AutoencoderKL.from_pretrained(str(path), local_files_only=True).eval().requires_grad_(False)
            )

    @property
    def latent(self) -> bool:
        return self.vae is not None

    def latent_shape(self) -> tuple[int, int]:
        """(channels, size) of what `encode` returns for frames of `cfg.image_size`."""
        factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        return self.vae.config.latent_channels, self.cfg.image_size // factor

    def _factors(self) -> tuple[float, float]:
        return self.vae.config.scaling_factor, self.vae.config.get("shift_factor") or 0.0

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[..., 3, H, W] in [-1, 1] -> [..., C, h, w] (the mean of the posterior: deterministic)."""
        if self.vae is None:
            return x
        scale, shift = self._factors()
        z = self.vae.encode(x.flatten(0, -4)).latent_dist.mean
        return ((z - shift) * scale).unflatten(0, x.shape[:-3])

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The inverse of `encode`, clamped to [-1, 1]."""
        if self.vae is None:
            return z.clamp(-1, 1)
        scale, shift = self._factors()
        x = self.vae.decode(z.flatten(0, -4) / scale + shift).sample
        return x.clamp(-1, 1).unflatten(0, z.shape[:-3])
