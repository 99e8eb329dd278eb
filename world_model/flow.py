"""The rectified-flow noise path and the network's output parameterisations.

x_t = (1 - t) * x0 + t * noise, t in [0, 1] (t = 1 is pure noise). The network output `out` means, by
`parameterisation`:
- "x0": the clean frame (what worked on CPU: see notes/world-model-on-cpu.md);
- "velocity": v = noise - x0, the rectified-flow velocity;
- "edm": EDM-style preconditioning, x0 = c_skip(t) x_t + c_out(t) out with the input scaled by c_in(t),
  so input and target have unit variance at every noise level.
The sampler only ever sees x0 estimates (`to_x0`); the loss uses each parameterisation's native target.
"""

from __future__ import annotations

import torch

PARAMETERISATIONS = ("x0", "velocity", "edm")


def _expand(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """t has the leading dims of x (e.g. [B, T]); append singleton dims for the rest."""
    return t.reshape(*t.shape, *([1] * (x.dim() - t.dim())))


def add_noise(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    t = _expand(t, x0)
    return (1 - t) * x0 + t * noise


def _edm_coefficients(t: torch.Tensor, sigma_data: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # x_t = a x0 + b noise with a = 1 - t, b = t: the EDM coefficients for a general affine path.
    a, b = 1 - t, t
    norm = (a**2 * sigma_data**2 + b**2).clamp_min(1e-8)
    c_skip = a * sigma_data**2 / norm
    c_out = b * sigma_data / norm.sqrt()
    c_in = 1 / norm.sqrt()
    return c_skip, c_out, c_in


def input_scale(x_t: torch.Tensor, t: torch.Tensor, parameterisation: str, sigma_data: float) -> torch.Tensor:
    """What the network reads: x_t itself, or x_t * c_in(t) under EDM preconditioning."""
    if parameterisation == "edm":
        return x_t * _expand(_edm_coefficients(t, sigma_data)[2], x_t)
    return x_t


def to_x0(
    out: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, parameterisation: str, sigma_data: float
) -> torch.Tensor:
    if parameterisation == "x0":
        return out
    if parameterisation == "velocity":
        return x_t - _expand(t, x_t) * out
    if parameterisation == "edm":
        c_skip, c_out, _ = _edm_coefficients(t, sigma_data)
        return _expand(c_skip, x_t) * x_t + _expand(c_out, x_t) * out
    raise ValueError(f"parameterisation {parameterisation!r} unknown; expected one of {PARAMETERISATIONS}")


def training_target(
    x0: torch.Tensor,
    noise: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    parameterisation: str,
    sigma_data: float,
) -> torch.Tensor:
    """What the network output should equal for this parameterisation."""
    if parameterisation == "x0":
        return x0
    if parameterisation == "velocity":
        return noise - x0
    if parameterisation == "edm":
        c_skip, c_out, _ = _edm_coefficients(t, sigma_data)
        return (x0 - _expand(c_skip, x_t) * x_t) / _expand(c_out, x_t).clamp_min(1e-4)
    raise ValueError(f"parameterisation {parameterisation!r} unknown; expected one of {PARAMETERISATIONS}")


def sample_training_t(shape: tuple[int, ...], distribution: str, generator=None, device=None) -> torch.Tensor:
    """Noise levels for training: 'uniform' on [0, 1] or 'logit_normal' (SD3) which favours mid levels."""
    if distribution == "uniform":
        return torch.rand(shape, generator=generator, device=device)
    if distribution == "logit_normal":
        return torch.sigmoid(torch.randn(shape, generator=generator, device=device))
    raise ValueError(f"noise distribution {distribution!r} unknown; expected 'uniform' or 'logit_normal'")
