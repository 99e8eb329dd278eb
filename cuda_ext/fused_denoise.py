"""The fused sampler update (Triton or CUDA C++ forward) as a differentiable op.

The forward is one kernel; the backward is closed form (the update is linear in x and the velocities, and
the clamp passes gradient where the unclamped value lies in [low, high], as torch.clamp does).
Gradients flow to x and the velocities; dt is treated as a constant.
"""

from __future__ import annotations

import torch


class _FusedDenoiseStep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, v_cond, v_uncond, v_first, dt_per_sample, guidance_scale, clamp, path):
        x, v_cond = x.contiguous(), v_cond.contiguous()
        v_uncond = v_uncond.contiguous() if v_uncond is not None else None
        v_first = v_first.contiguous() if v_first is not None else None
        if path == "cuda":
            from worldloop.cuda_ext.cuda_build import load_denoise_extension

            out = load_denoise_extension().denoise_step(
                x, v_cond, v_uncond, v_first, dt_per_sample, float(guidance_scale),
                clamp is not None, *(clamp or (0.0, 0.0)),
            )  # fmt: skip
        else:
            from worldloop.cuda_ext.triton_kernels.denoise import triton_denoise_step

            out = triton_denoise_step(x, v_cond, dt_per_sample, v_uncond, guidance_scale, clamp, v_first)
        ctx.save_for_backward(x, v_cond, v_uncond, v_first, dt_per_sample)
        ctx.guidance_scale, ctx.clamp = guidance_scale, clamp
        return out

    @staticmethod
    def backward(ctx, grad):
        x, v_cond, v_uncond, v_first, dt = ctx.saved_tensors
        g = ctx.guidance_scale
        dt = dt.to(grad.dtype).view(-1, *([1] * (grad.dim() - 1)))
        if ctx.clamp is not None:
            v = v_cond if v_uncond is None else v_uncond + g * (v_cond - v_uncond)
            if v_first is not None:
                v = 0.5 * (v_first + v)
            unclamped = x + dt * v
            grad = grad * ((unclamped >= ctx.clamp[0]) & (unclamped <= ctx.clamp[1])).to(grad.dtype)
        step = grad * dt * (0.5 if v_first is not None else 1.0)
        d_cond = step * g if v_uncond is not None else step
        d_uncond = step * (1.0 - g) if v_uncond is not None else None
        d_first = grad * dt * 0.5 if v_first is not None else None
        return grad, d_cond, d_uncond, d_first, None, None, None, None


def fused_denoise_step(x, v_cond, dt, v_uncond, guidance_scale, clamp, v_first, path: str) -> torch.Tensor:
    """Run the update on `path` ('triton' or 'cuda'); `dt` a float or a [B] tensor."""
    if isinstance(dt, torch.Tensor):
        dt_per_sample = dt.detach().to(device=x.device, dtype=torch.float32).contiguous()
    else:
        dt_per_sample = torch.full((x.shape[0],), float(dt), device=x.device, dtype=torch.float32)
    clamp = (float(clamp[0]), float(clamp[1])) if clamp is not None else None
    return _FusedDenoiseStep.apply(x, v_cond, v_uncond, v_first, dt_per_sample, guidance_scale, clamp, path)
