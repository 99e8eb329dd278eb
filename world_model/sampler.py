"""Euler, Heun and re-noising samplers along the rectified-flow path, any number of steps, optional guidance.

The sampler sees the network only through `denoise(x_t, t) -> (x0_cond, x0_uncond | None)`, so it is the
same for every output parameterisation (they are converted to x0 first) and for cached or recomputed
rollouts. Classifier-free guidance on actions combines the two x0 estimates: x0_uncond + w (x0_cond -
x0_uncond); w = 1 is plain conditional sampling. Only the unconditional estimate is computed when w != 1.

Euler and Heun integrate the flow's ODE: every bit of randomness is in the starting noise, and a model that
predicts the mean clean frame at high noise draws nearly the same frame from any noise. "renoise" takes
each step's clean estimate back to the next, lower noise level with fresh noise (x_next = (1 - t_next) x0 +
t_next * fresh), so randomness enters at every level down to 0: where the future is uncertain, samples
keep differing. With 2 steps it draws the same distribution as Euler; it differs from 3 steps on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from worldloop import cuda_ext

METHODS = ("euler", "heun", "renoise")

Denoiser = Callable[[torch.Tensor, float], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class SamplerConfig:
    method: str = "euler"  # euler | heun | renoise
    steps: int = 2  # the CPU prototype was best at 2 Euler steps
    guidance_scale: float = 1.0  # > 1 needs a model trained with action dropout
    shift: float = 1.0  # > 1 spends more steps at high noise: t' = s t / (1 + (s - 1) t)
    # > 0: pixels of a drawn frame that differ from the frame before it by at most this much in every
    # channel (encoded units; pixels in [-1, 1]), and do not touch one that differs more, are copied from that
    # frame. Most of a scene stands still; a small per-frame error there compounds over a rollout into a
    # fading scene, which copying the last frame never suffers (world_model.model.keep_still_pixels).
    still_threshold: float = 0.0

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"sampler.method={self.method!r}; expected one of {METHODS}")
        if self.steps < 1:
            raise ValueError(f"sampler.steps={self.steps} must be >= 1")
        if self.shift <= 0:
            raise ValueError(f"sampler.shift={self.shift} must be > 0")
        if self.still_threshold < 0:
            raise ValueError(f"sampler.still_threshold={self.still_threshold} must be >= 0")


def noise_levels(steps: int, shift: float = 1.0) -> list[float]:
    """steps + 1 levels from 1 (pure noise) down to 0."""
    levels = []
    for i in range(steps + 1):
        t = 1 - i / steps
        levels.append(shift * t / (1 + (shift - 1) * t))
    return levels


def _velocities(denoise: Denoiser, x: torch.Tensor, t: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Velocity dx/dt of the straight path through x and the x0 estimate (conditional, unconditional)."""
    x0_cond, x0_uncond = denoise(x, t)
    return (x - x0_cond) / t, None if x0_uncond is None else (x - x0_uncond) / t


def sample(
    denoise: Denoiser, noise: torch.Tensor, cfg: SamplerConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """From pure noise (t = 1) to a clean sample (t = 0): the ODE integrated with cuda_ext's fused update
    step (euler, heun), or re-noised at each level with fresh noise drawn from `generator` (renoise)."""
    levels = noise_levels(cfg.steps, cfg.shift)
    scale = cfg.guidance_scale
    if cfg.method == "renoise":
        return _renoise(denoise, noise, levels, scale, generator)
    x = noise
    for t, t_next in zip(levels[:-1], levels[1:]):
        v_cond, v_uncond = _velocities(denoise, x, t)
        x_euler = cuda_ext.denoise_step(x, v_cond, t_next - t, v_uncond, scale)
        if cfg.method == "heun" and t_next > 0:
            v_first = cuda_ext.guided_velocity(v_cond, v_uncond, scale)
            v_cond, v_uncond = _velocities(denoise, x_euler, t_next)
            x = cuda_ext.denoise_step(x, v_cond, t_next - t, v_uncond, scale, v_first=v_first)
        else:
            x = x_euler
    return x


def _renoise(
    denoise: Denoiser, x: torch.Tensor, levels: list[float], scale: float, generator: torch.Generator | None
) -> torch.Tensor:
    for t, t_next in zip(levels[:-1], levels[1:]):
        x0_cond, x0_uncond = denoise(x, t)
        x0 = x0_cond if x0_uncond is None else x0_uncond + scale * (x0_cond - x0_uncond)
        if t_next == 0:
            return x0
        fresh = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        x = (1 - t_next) * x0 + t_next * fresh
    return x
