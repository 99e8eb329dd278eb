"""Frame-level AdaLN: LayerNorm (no affine) modulated by a per-frame shift and scale, and the gated residual.

A DiT block conditioned per frame (action + noise level) computes, for x [B, L, C] with L = F * frame_len
and conditioning vectors [B, F, C] broadcast over the frame's tokens:

    h = adaln_modulate(x, shift, scale, frame_len)        # LayerNorm(x) * (1 + scale) + shift
    x = gated_residual(x, attn(h), gate, frame_len)       # x + gate * attn(h)

and, between two sub-blocks, the residual update and the next modulation fused in one pass:

    x, h = gated_residual_adaln(x, attn(h), gate_attn, shift_mlp, scale_mlp, frame_len)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldloop.cuda_ext.backend import ADALN_MAX_CHANNELS, resolve_backend, unsupported_dtype


def _per_token(cond: torch.Tensor, frame_len: int) -> torch.Tensor:
    """[B, F, C] -> [B, F * frame_len, C] (a broadcast view, no copy)."""
    b, f, c = cond.shape
    return cond[:, :, None, :].expand(b, f, frame_len, c).reshape(b, f * frame_len, c)


def adaln_modulate_reference(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, frame_len: int, eps: float = 1e-6
) -> torch.Tensor:
    normed = F.layer_norm(x, x.shape[-1:], eps=eps)
    return normed * (1 + _per_token(scale, frame_len)) + _per_token(shift, frame_len)


def gated_residual_reference(
    residual: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, frame_len: int
) -> torch.Tensor:
    return residual + _per_token(gate, frame_len) * y


def gated_residual_adaln_reference(
    residual: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    frame_len: int,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    x = gated_residual_reference(residual, y, gate, frame_len)
    return x, adaln_modulate_reference(x, shift, scale, frame_len, eps)


def _check_frames(op: str, x: torch.Tensor, frame_len: int, **conds: torch.Tensor) -> None:
    if x.dim() != 3:
        raise ValueError(f"{op}: x must be [B, L, C], got {tuple(x.shape)}")
    if frame_len < 1 or x.shape[1] % frame_len:
        raise ValueError(f"{op}: sequence length {x.shape[1]} is not a multiple of frame_len={frame_len}")
    expected = (x.shape[0], x.shape[1] // frame_len, x.shape[2])
    for name, t in conds.items():
        if tuple(t.shape) != expected:
            raise ValueError(f"{op}: {name} must be [B, F, C] = {expected}, got {tuple(t.shape)}")
        if not t.is_floating_point() or t.device != x.device:
            raise ValueError(
                f"{op}: {name} is {t.dtype} on {t.device}; expected floating point on {x.device}"
            )


def _unsupported(*tensors: torch.Tensor) -> str | None:
    """Why the kernels cannot take these inputs (dtype of any of them, channel count), or None."""
    channels = tensors[0].shape[-1]
    if channels > ADALN_MAX_CHANNELS:
        return f"{channels} channels > {ADALN_MAX_CHANNELS}"
    return next((why for why in (unsupported_dtype(t.dtype) for t in tensors) if why), None)


def adaln_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    frame_len: int,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm(x) * (1 + scale) + shift with x [B, L, C] and per-frame shift, scale [B, L // frame_len, C].

    The LayerNorm has no affine parameters (the modulation replaces them). Differentiable on every path.
    """
    _check_frames("adaln_modulate", x, frame_len, shift=shift, scale=scale)
    path = resolve_backend("adaln_modulate", backend, x.device, unsupported=_unsupported(x, shift, scale))
    if path == "reference":
        return adaln_modulate_reference(x, shift, scale, frame_len, eps)
    from worldloop.cuda_ext.triton_kernels.adaln import triton_adaln_modulate

    return triton_adaln_modulate(x, shift, scale, frame_len, eps)


def gated_residual(
    residual: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, frame_len: int, backend: str | None = None
) -> torch.Tensor:
    """residual + gate * y with residual, y [B, L, C] and a per-frame gate [B, L // frame_len, C]."""
    _check_frames("gated_residual", residual, frame_len, gate=gate)
    if y.shape != residual.shape or y.device != residual.device:
        raise ValueError(
            f"gated_residual: y {tuple(y.shape)} on {y.device} must match residual {tuple(residual.shape)} "
            f"on {residual.device}"
        )
    unsupported = _unsupported(residual, y, gate)
    path = resolve_backend("gated_residual", backend, residual.device, unsupported=unsupported)
    if path == "reference":
        return gated_residual_reference(residual, y, gate, frame_len)
    from worldloop.cuda_ext.triton_kernels.adaln import triton_gated_residual

    return triton_gated_residual(residual, y, gate, frame_len)


def gated_residual_adaln(
    residual: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    frame_len: int,
    eps: float = 1e-6,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, h) with x = residual + gate * y and h = LayerNorm(x) * (1 + scale) + shift, per frame.

    The same as `gated_residual` followed by `adaln_modulate`, in one pass on the kernel path.
    """
    _check_frames("gated_residual_adaln", residual, frame_len, gate=gate, shift=shift, scale=scale)
    if y.shape != residual.shape or y.device != residual.device:
        raise ValueError(
            f"gated_residual_adaln: y {tuple(y.shape)} on {y.device} must match residual "
            f"{tuple(residual.shape)} on {residual.device}"
        )
    unsupported = _unsupported(residual, y, gate, shift, scale)
    path = resolve_backend("gated_residual_adaln", backend, residual.device, unsupported=unsupported)
    if path == "reference":
        return gated_residual_adaln_reference(residual, y, gate, shift, scale, frame_len, eps)
    from worldloop.cuda_ext.triton_kernels.adaln import triton_gated_residual_adaln

    return triton_gated_residual_adaln(residual, y, gate, shift, scale, frame_len, eps)
