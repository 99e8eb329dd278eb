"""Fused frame-level AdaLN and gated residual in Triton.

adaln_modulate, forward: one program per token row. It loads the row once, computes mean and variance in
fp32, normalises, and applies its frame's (1 + scale) and shift (row r of batch b is token t = r % L, frame
t // frame_len), writing the output and the row's mean and 1/std for the backward. Eager PyTorch makes
~5 passes over [B, L, C] (layer_norm, expand, multiply, add) and materialises the broadcast scale/shift.

adaln_modulate, backward: one program per (batch, frame) walks the frame's rows, so the per-frame
reductions dshift = sum(dy) and dscale = sum(dy * xhat) stay in registers (no atomics, deterministic), and
for each row dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * (1 + scale).

gated_residual: forward out = residual + gate * y in one pass per row; its backward is three cheap
PyTorch ops (d residual = dout, dy = gate * dout, dgate = per-frame sum of dout * y).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cuda_ext.adaln import MAX_KERNEL_CHANNELS


@triton.jit
def _adaln_fwd(
    X, SHIFT, SCALE, Y, MEAN, RSTD, L, C, frame_len, eps,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cond_row = (row // L) * (L // frame_len) + (row % L) // frame_len
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    x = tl.load(X + row * C + cols, mask=ok, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / C
    centred = tl.where(ok, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, 0) / C + eps)
    scale = tl.load(SCALE + cond_row * C + cols, mask=ok, other=0.0).to(tl.float32)
    shift = tl.load(SHIFT + cond_row * C + cols, mask=ok, other=0.0).to(tl.float32)
    y = centred * rstd * (1.0 + scale) + shift
    tl.store(Y + row * C + cols, y.to(Y.dtype.element_ty), mask=ok)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _adaln_bwd(
    X, SCALE, DY, MEAN, RSTD, DX, DSHIFT, DSCALE, C, frame_len,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    frame = tl.program_id(0)  # flat index over (batch, frame): rows frame*frame_len ... + frame_len - 1
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    one_plus_scale = 1.0 + tl.load(SCALE + frame * C + cols, mask=ok, other=0.0).to(tl.float32)
    dshift = tl.zeros([BLOCK_C], dtype=tl.float32)
    dscale = tl.zeros([BLOCK_C], dtype=tl.float32)
    for i in range(0, frame_len):
        row = frame * frame_len + i
        x = tl.load(X + row * C + cols, mask=ok, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * C + cols, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(ok, (x - tl.load(MEAN + row)) * rstd, 0.0)
        dshift += dy
        dscale += dy * xhat
        g = dy * one_plus_scale
        dx = rstd * (g - tl.sum(g, 0) / C - xhat * (tl.sum(g * xhat, 0) / C))
        tl.store(DX + row * C + cols, dx.to(DX.dtype.element_ty), mask=ok)
    tl.store(DSHIFT + frame * C + cols, dshift.to(DSHIFT.dtype.element_ty), mask=ok)
    tl.store(DSCALE + frame * C + cols, dscale.to(DSCALE.dtype.element_ty), mask=ok)


@triton.jit
def _gated_residual_fwd(RES, Y, GATE, OUT, L, C, frame_len, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    cond_row = (row // L) * (L // frame_len) + (row % L) // frame_len
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    res = tl.load(RES + row * C + cols, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(Y + row * C + cols, mask=ok, other=0.0).to(tl.float32)
    gate = tl.load(GATE + cond_row * C + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * C + cols, (res + gate * y).to(OUT.dtype.element_ty), mask=ok)


def _block_c(channels: int) -> int:
    if channels > MAX_KERNEL_CHANNELS:
        raise ValueError(
            f"adaln (triton): {channels} channels do not fit one row block (max {MAX_KERNEL_CHANNELS})"
        )
    return triton.next_power_of_2(channels)


class _AdaLNModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shift, scale, frame_len, eps):
        x, shift, scale = x.contiguous(), shift.contiguous(), scale.contiguous()
        batch, length, channels = x.shape
        rows = batch * length
        y = torch.empty_like(x)
        mean = torch.empty(rows, device=x.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        block = _block_c(channels)
        _adaln_fwd[(rows,)](x, shift, scale, y, mean, rstd, length, channels, frame_len, eps, BLOCK_C=block)
        ctx.save_for_backward(x, scale, mean, rstd)
        ctx.frame_len = frame_len
        return y

    @staticmethod
    def backward(ctx, dy):
        x, scale, mean, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        dshift, dscale = torch.empty_like(scale), torch.empty_like(scale)
        frames = scale.shape[0] * scale.shape[1]
        _adaln_bwd[(frames,)](
            x, scale, dy, mean, rstd, dx, dshift, dscale, x.shape[2], ctx.frame_len,
            BLOCK_C=_block_c(x.shape[2]),
        )  # fmt: skip
        return dx, dshift, dscale, None, None


class _GatedResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, residual, y, gate, frame_len):
        residual, y, gate = residual.contiguous(), y.contiguous(), gate.contiguous()
        batch, length, channels = residual.shape
        out = torch.empty_like(residual)
        _gated_residual_fwd[(batch * length,)](
            residual, y, gate, out, length, channels, frame_len, BLOCK_C=_block_c(channels)
        )
        ctx.save_for_backward(y, gate)
        ctx.frame_len = frame_len
        return out

    @staticmethod
    def backward(ctx, dout):
        y, gate = ctx.saved_tensors
        batch, frames, channels = gate.shape
        per_frame = (batch, frames, ctx.frame_len, channels)
        dy = (dout.reshape(per_frame) * gate[:, :, None, :]).reshape(y.shape)
        dgate = (dout.reshape(per_frame) * y.reshape(per_frame)).sum(2)
        return dout, dy, dgate, None


def triton_adaln_modulate(x, shift, scale, frame_len: int, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm(x) * (1 + scale) + shift per frame, fused (see the module docstring)."""
    return _AdaLNModulate.apply(x, shift, scale, frame_len, eps)


def triton_gated_residual(residual, y, gate, frame_len: int) -> torch.Tensor:
    """residual + gate * y per frame in one pass."""
    return _GatedResidual.apply(residual, y, gate, frame_len)
