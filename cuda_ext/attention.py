"""Block-causal (frame-causal) attention: the op the world model's transformer calls.

Tokens come in frames of `frame_len` tokens. A query in frame i attends every key in frames <= i, and with
`window=w` only keys in frames > i - w (a sliding window of w frames, its own included). Within a frame
attention is bidirectional. When q is shorter than k (decoding with a KV cache) the queries are the last
`Lq` positions of the key sequence, so query j sits at key position `Lk - Lq + j`.

`teacher_forced=True` is the diffusion-forcing training layout (Lq == Lk = (2T - 1) * frame_len): T clean
frames (times 0..T-1) in the block-causal layout, then noisy copies of frames 1..T-1. A noisy frame of
time t sees the clean frames of times t - w + 1 .. t - 1 and itself, exactly what it sees when generated
in a KV-cache rollout, so every frame of a window is a training target in one pass.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from worldloop.cuda_ext.backend import resolve_backend, unsupported_dtype


def _times(positions: torch.Tensor, frame_len: int, clean_frames: int | None):
    """(time, is_noisy) of token positions; all tokens are clean when clean_frames is None."""
    frame = positions // frame_len
    if clean_frames is None:
        return frame, torch.zeros_like(frame, dtype=torch.bool)
    noisy = frame >= clean_frames
    return torch.where(noisy, frame - clean_frames + 1, frame), noisy


@functools.lru_cache(maxsize=32)
def frame_causal_mask(
    q_len: int,
    k_len: int,
    frame_len: int,
    window: int | None,
    device: torch.device,
    teacher_forced: bool = False,
) -> torch.Tensor:
    """Boolean [q_len, k_len] mask, True where the query may attend the key (cached: do not modify in place)."""
    clean_frames = (k_len // frame_len + 1) // 2 if teacher_forced else None
    tq, nq = _times(torch.arange(q_len, device=device) + (k_len - q_len), frame_len, clean_frames)
    tk, nk = _times(torch.arange(k_len, device=device), frame_len, clean_frames)
    # clean keys of earlier times (a noisy query: strictly earlier), within the window
    allowed = ~nk[None, :] & (tk[None, :] <= tq[:, None] - nq[:, None].long())
    if window is not None:
        allowed &= tk[None, :] > tq[:, None] - window
    # a noisy query also sees its own noisy frame
    return allowed | (nq[:, None] & nk[None, :] & (tk[None, :] == tq[:, None]))


def block_causal_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_len: int,
    window: int | None = None,
    scale: float | None = None,
    teacher_forced: bool = False,
) -> torch.Tensor:
    """PyTorch reference: SDPA with a dense boolean frame-causal mask (differentiable, any device)."""
    mask = frame_causal_mask(q.shape[-2], k.shape[-2], frame_len, window, q.device, teacher_forced)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _check_inputs(q, k, v, frame_len: int, window: int | None, teacher_forced: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"block_causal_attention: {name} must be [B, heads, L, D], got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(
            f"block_causal_attention: k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape"
        )
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"block_causal_attention: q {tuple(q.shape)} and k {tuple(k.shape)} must share B, heads and D"
        )
    if q.shape[-2] > k.shape[-2]:
        raise ValueError(
            f"block_causal_attention: q has {q.shape[-2]} tokens but k only {k.shape[-2]}; "
            "queries must be the last positions of the key sequence"
        )
    if frame_len < 1:
        raise ValueError(f"block_causal_attention: frame_len must be >= 1, got {frame_len}")
    if window is not None and window < 1:
        raise ValueError(f"block_causal_attention: window must be >= 1 frame or None, got {window}")
    if teacher_forced:
        frames, rest = divmod(k.shape[-2], frame_len)
        if q.shape[-2] != k.shape[-2] or rest or frames % 2 == 0:
            raise ValueError(
                "block_causal_attention: teacher_forced needs q and k of (2T - 1) * frame_len tokens, got "
                f"q {q.shape[-2]}, k {k.shape[-2]} tokens with frame_len={frame_len}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"block_causal_attention: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")


def block_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_len: int,
    window: int | None = None,
    scale: float | None = None,
    backend: str | None = None,
    teacher_forced: bool = False,
) -> torch.Tensor:
    """Frame-causal attention of q [B, H, Lq, D] over k, v [B, H, Lk, D] -> [B, H, Lq, D].

    `scale` defaults to 1/sqrt(D). `backend` overrides `$WORLDLOOP_KERNELS` (see `cuda_ext.backend`).
    `teacher_forced` selects the training layout of the module docstring. Differentiable on every path.
    """
    _check_inputs(q, k, v, frame_len, window, teacher_forced)
    unsupported = unsupported_dtype(q.dtype) or (
        f"head dim {q.shape[-1]} > 256" if q.shape[-1] > 256 else None
    )
    path = resolve_backend("block_causal_attention", backend, q.device, unsupported=unsupported)
    if path == "reference":
        return block_causal_attention_reference(q, k, v, frame_len, window, scale, teacher_forced)
    from worldloop.cuda_ext.triton_kernels.attention import triton_block_causal_attention

    return triton_block_causal_attention(q, k, v, frame_len, window, scale, teacher_forced)
