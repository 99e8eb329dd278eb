"""The sampler's update step: classifier-free-guidance combine + Euler (or Heun corrector) + optional clamp.

For a flow/velocity sampler stepping from noise level t to t + dt:

    v      = v_uncond + guidance_scale * (v_cond - v_uncond)     # CFG; v = v_cond without v_uncond
    x_next = x + dt * v                                           # Euler
    x_next = x + dt * (v_first + v) / 2                           # Heun corrector, v_first = predictor's v
    x_next = x_next.clamp(*clamp)                                 # optional

Heun: call once with the velocity at x (that Euler result is the predictor), evaluate the model at the
predictor, then call again with `v_first=` the guided velocity at x.
"""

from __future__ import annotations

import torch

from worldloop.cuda_ext.backend import resolve_backend, unsupported_dtype


def guided_velocity(
    v_cond: torch.Tensor, v_uncond: torch.Tensor | None = None, guidance_scale: float = 1.0
) -> torch.Tensor:
    """Classifier-free guidance combine (the velocity a Heun corrector needs as `v_first`)."""
    if v_uncond is None:
        return v_cond
    return v_uncond + guidance_scale * (v_cond - v_uncond)


def _per_sample(dt: float | torch.Tensor, x: torch.Tensor) -> float | torch.Tensor:
    """A float, or a [B] tensor viewed as [B, 1, ..., 1] to broadcast over x."""
    if isinstance(dt, torch.Tensor):
        return dt.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    return dt


def denoise_step_reference(
    x: torch.Tensor,
    v_cond: torch.Tensor,
    dt: float | torch.Tensor,
    v_uncond: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
    clamp: tuple[float, float] | None = None,
    v_first: torch.Tensor | None = None,
) -> torch.Tensor:
    v = guided_velocity(v_cond, v_uncond, guidance_scale)
    if v_first is not None:
        v = 0.5 * (v_first + v)
    out = x + _per_sample(dt, x) * v
    return out if clamp is None else out.clamp(clamp[0], clamp[1])


def _check_inputs(x, v_cond, dt, v_uncond, clamp, v_first) -> None:
    for name, t in (("v_cond", v_cond), ("v_uncond", v_uncond), ("v_first", v_first)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or t.device != x.device):
            raise ValueError(
                f"denoise_step: {name} is {tuple(t.shape)} {t.dtype} on {t.device}; "
                f"expected x's {tuple(x.shape)} {x.dtype} on {x.device}"
            )
    if isinstance(dt, torch.Tensor) and (dt.dim() != 1 or dt.shape[0] != x.shape[0]):
        raise ValueError(f"denoise_step: a tensor dt must be [B] = [{x.shape[0]}], got {tuple(dt.shape)}")
    if clamp is not None and (len(clamp) != 2 or clamp[0] > clamp[1]):
        raise ValueError(f"denoise_step: clamp must be (low, high) with low <= high, got {clamp}")


def denoise_step(
    x: torch.Tensor,
    v_cond: torch.Tensor,
    dt: float | torch.Tensor,
    v_uncond: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
    clamp: tuple[float, float] | None = None,
    v_first: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """One sampler update over the latent x [B, ...]; `dt` is a float or a per-sample [B] tensor.

    Without `v_first` it is the Euler step, with it the Heun corrector (see the module docstring).
    Differentiable on every path: gradients flow to x and the velocities (the kernel paths treat dt as a
    constant; the reference also differentiates a tensor dt).
    """
    _check_inputs(x, v_cond, dt, v_uncond, clamp, v_first)
    path = resolve_backend(
        "denoise_step", backend, x.device, has_cuda_extension=True, unsupported=unsupported_dtype(x.dtype)
    )
    if path == "reference":
        return denoise_step_reference(x, v_cond, dt, v_uncond, guidance_scale, clamp, v_first)
    from worldloop.cuda_ext.fused_denoise import fused_denoise_step

    return fused_denoise_step(x, v_cond, dt, v_uncond, guidance_scale, clamp, v_first, path)
