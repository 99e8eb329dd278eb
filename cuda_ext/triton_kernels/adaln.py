"""Fused frame-level AdaLN (+ gated residual) in Triton.

Row r of x [B, L, C] is token t = r % L of batch b = r // L, in frame t // frame_len; its conditioning
row is b * F + frame in the [B, F, C] shift/scale/gate tensors.

Forward, one program per token row: optionally first x = residual + gate * y (stored: it is the block's
new residual stream), then mean and variance in fp32, normalise, apply the frame's (1 + scale) and shift,
store the output and the row's mean and 1/std for the backward. Eager PyTorch makes ~5-7 passes over
[B, L, C] (add, multiply, layer_norm, expand, multiply, add) with a temporary each.

Backward, one program per (batch, frame) walking the frame's rows, so the per-frame reductions
dshift = sum(dh), dscale = sum(dh * xhat) (and dgate = sum(dx * y)) stay in registers: no atomics,
deterministic. Per row dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dh * (1 + scale), plus
the gradient arriving at the stored residual stream; then d residual = dx and dy = gate * dx.

gated_residual alone (out = residual + gate * y) is one elementwise pass; its backward is three cheap
PyTorch ops (d residual = dout, dy = gate * dout, dgate = per-frame sum of dout * y).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from worldloop.cuda_ext.backend import ADALN_MAX_CHANNELS


@triton.jit
def _adaln_fwd(
    X, Y, GATE, X_OUT, SHIFT, SCALE, MODULATED, MEAN, RSTD, L, C, frame_len, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cond_row = (row // L) * (L // frame_len) + (row % L) // frame_len
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    x = tl.load(X + row * C + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        gate = tl.load(GATE + cond_row * C + cols, mask=ok, other=0.0).to(tl.float32)
        x_new = (x + gate * tl.load(Y + row * C + cols, mask=ok, other=0.0).to(tl.float32)).to(
            X_OUT.dtype.element_ty
        )
        tl.store(X_OUT + row * C + cols, x_new, mask=ok)
        x = x_new.to(tl.float32)  # normalise the stored (rounded) stream, as the unfused ops do
    mean = tl.sum(x, 0) / C
    centred = tl.where(ok, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, 0) / C + eps)
    scale = tl.load(SCALE + cond_row * C + cols, mask=ok, other=0.0).to(tl.float32)
    shift = tl.load(SHIFT + cond_row * C + cols, mask=ok, other=0.0).to(tl.float32)
    h = centred * rstd * (1.0 + scale) + shift
    tl.store(MODULATED + row * C + cols, h.to(MODULATED.dtype.element_ty), mask=ok)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _adaln_bwd(
    X, SCALE, DH, MEAN, RSTD, DX, DSHIFT, DSCALE, DX_OUT, Y, GATE, DY, DGATE, C, frame_len,
    HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    frame = tl.program_id(0)  # flat index over (batch, frame): rows frame*frame_len ... + frame_len - 1
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    one_plus_scale = 1.0 + tl.load(SCALE + frame * C + cols, mask=ok, other=0.0).to(tl.float32)
    dshift = tl.zeros([BLOCK_C], dtype=tl.float32)
    dscale = tl.zeros([BLOCK_C], dtype=tl.float32)
    dgate = tl.zeros([BLOCK_C], dtype=tl.float32)
    if HAS_RESIDUAL:
        gate = tl.load(GATE + frame * C + cols, mask=ok, other=0.0).to(tl.float32)
    for i in range(0, frame_len):
        row = frame * frame_len + i
        x = tl.load(X + row * C + cols, mask=ok, other=0.0).to(tl.float32)
        dh = tl.load(DH + row * C + cols, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(ok, (x - tl.load(MEAN + row)) * rstd, 0.0)
        dshift += dh
        dscale += dh * xhat
        g = dh * one_plus_scale
        dx = rstd * (g - tl.sum(g, 0) / C - xhat * (tl.sum(g * xhat, 0) / C))
        if HAS_RESIDUAL:
            dx += tl.load(DX_OUT + row * C + cols, mask=ok, other=0.0).to(tl.float32)
            dgate += dx * tl.load(Y + row * C + cols, mask=ok, other=0.0).to(tl.float32)
            tl.store(DY + row * C + cols, (gate * dx).to(DY.dtype.element_ty), mask=ok)
        tl.store(DX + row * C + cols, dx.to(DX.dtype.element_ty), mask=ok)
    tl.store(DSHIFT + frame * C + cols, dshift.to(DSHIFT.dtype.element_ty), mask=ok)
    tl.store(DSCALE + frame * C + cols, dscale.to(DSCALE.dtype.element_ty), mask=ok)
    if HAS_RESIDUAL:
        tl.store(DGATE + frame * C + cols, dgate.to(DGATE.dtype.element_ty), mask=ok)


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
    if channels > ADALN_MAX_CHANNELS:
        raise ValueError(
            f"adaln (triton): {channels} channels do not fit one row block (max {ADALN_MAX_CHANNELS})"
        )
    return triton.next_power_of_2(channels)


def _result_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype eager PyTorch would return (e.g. an fp32 residual stream with bf16 autocast conditioning)."""
    return functools.reduce(torch.promote_types, (t.dtype for t in tensors))


class _AdaLN(torch.autograd.Function):
    """h = modulate(LayerNorm(x)); with residual/y/gate, x = residual + gate * y is computed and returned too.

    Inputs may differ in dtype (the kernels convert every load to fp32); outputs take the promoted dtype
    and each gradient its input's dtype, as in eager PyTorch.
    """

    @staticmethod
    def forward(ctx, x, shift, scale, frame_len, eps, y=None, gate=None):
        has_residual = y is not None
        x, shift, scale = x.contiguous(), shift.contiguous(), scale.contiguous()
        y = y.contiguous() if has_residual else x
        gate = gate.contiguous() if has_residual else scale
        ctx.input_dtypes = tuple(t.dtype for t in (x, shift, scale, y, gate))
        batch, length, channels = x.shape
        rows = batch * length
        out_dtype = _result_dtype(x, shift, scale, y, gate)
        x_out = torch.empty(x.shape, device=x.device, dtype=_result_dtype(x, y, gate)) if has_residual else x
        h = torch.empty(x.shape, device=x.device, dtype=out_dtype)
        mean = torch.empty(rows, device=x.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        _adaln_fwd[(rows,)](
            x, y, gate, x_out, shift, scale, h, mean, rstd, length, channels, frame_len, eps,
            HAS_RESIDUAL=has_residual, BLOCK_C=_block_c(channels),
        )  # fmt: skip
        ctx.save_for_backward(x_out, scale, mean, rstd, y, gate)
        ctx.frame_len, ctx.has_residual = frame_len, has_residual
        return (x_out, h) if has_residual else h

    @staticmethod
    def backward(ctx, *grads):
        x, scale, mean, rstd, y, gate = ctx.saved_tensors
        x_dtype, shift_dtype, scale_dtype, y_dtype, gate_dtype = ctx.input_dtypes
        if ctx.has_residual:
            dx_out, dh = grads
            dx_out = torch.zeros_like(x) if dx_out is None else dx_out.contiguous()
        else:
            (dh,), dx_out = grads, x  # dx_out is not read without a residual
        dh = torch.zeros(x.shape, device=x.device, dtype=x.dtype) if dh is None else dh.contiguous()
        dx = torch.empty(x.shape, device=x.device, dtype=x_dtype)
        dshift = torch.empty(scale.shape, device=x.device, dtype=shift_dtype)
        dscale = torch.empty(scale.shape, device=x.device, dtype=scale_dtype)
        dy = torch.empty(x.shape, device=x.device, dtype=y_dtype) if ctx.has_residual else dx
        dgate = torch.empty(scale.shape, device=x.device, dtype=gate_dtype) if ctx.has_residual else dshift
        frames = scale.shape[0] * scale.shape[1]
        _adaln_bwd[(frames,)](
            x, scale, dh, mean, rstd, dx, dshift, dscale, dx_out, y, gate, dy, dgate, x.shape[2], ctx.frame_len,
            HAS_RESIDUAL=ctx.has_residual, BLOCK_C=_block_c(x.shape[2]),
        )  # fmt: skip
        if ctx.has_residual:
            return dx, dshift, dscale, None, None, dy, dgate
        return dx, dshift, dscale, None, None, None, None


class _GatedResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, residual, y, gate, frame_len):
        residual, y, gate = residual.contiguous(), y.contiguous(), gate.contiguous()
        batch, length, channels = residual.shape
        out = torch.empty(residual.shape, device=residual.device, dtype=_result_dtype(residual, y, gate))
        _gated_residual_fwd[(batch * length,)](
            residual, y, gate, out, length, channels, frame_len, BLOCK_C=_block_c(channels)
        )
        ctx.save_for_backward(y, gate)
        ctx.frame_len, ctx.residual_dtype = frame_len, residual.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        y, gate = ctx.saved_tensors
        batch, frames, channels = gate.shape
        per_frame = (batch, frames, ctx.frame_len, channels)
        dy = (dout.reshape(per_frame) * gate[:, :, None, :]).reshape(y.shape).to(y.dtype)
        dgate = (dout.reshape(per_frame) * y.reshape(per_frame)).sum(2).to(gate.dtype)
        return dout.to(ctx.residual_dtype), dy, dgate, None


def triton_adaln_modulate(x, shift, scale, frame_len: int, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm(x) * (1 + scale) + shift per frame, fused (see the module docstring)."""
    return _AdaLN.apply(x, shift, scale, frame_len, eps)


def triton_gated_residual_adaln(residual, y, gate, shift, scale, frame_len: int, eps: float = 1e-6):
    """(x, h): x = residual + gate * y and h = LayerNorm(x) * (1 + scale) + shift, in one pass."""
    return _AdaLN.apply(residual, shift, scale, frame_len, eps, y, gate)


def triton_gated_residual(residual, y, gate, frame_len: int) -> torch.Tensor:
    """residual + gate * y per frame in one pass."""
    return _GatedResidual.apply(residual, y, gate, frame_len)
