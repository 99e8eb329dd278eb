"""The one place the world model computes attention, so the backbone never changes with the backend.

Two token layouts occur (a frame is `frame_len` consecutive tokens: all patches of all views of a step):

- block-causal: a frame sees itself and at most `context` earlier frames. Used by rollouts (a KV-cache
  decode passes the newest frames as queries, the cached frames plus themselves as keys) and by the
  recompute-everything path. This is `cuda_ext.block_causal_attention` (its `window` counts the frame
  itself, hence `context + 1`).
- teacher-forced (training): the clean frames 0..T-1 in block-causal layout, then noisy copies of frames
  1..T-1; noisy frame i sees clean frames i-context..i-1 and itself, exactly what it sees in a KV-cache
  rollout, so every frame of a window is a training target in one pass. No kernel implements this mask:
  it always runs through torch SDPA with a boolean mask.

Backends: `sdpa` (the PyTorch reference path of cuda_ext: SDPA with a boolean mask), `cuda_ext` (the
custom kernels when the tensors are on a GPU, the reference elsewhere) and `xformers` (optional install).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from worldloop import cuda_ext

BACKENDS = ("sdpa", "xformers", "cuda_ext")


@functools.lru_cache(maxsize=32)
def teacher_forced_mask(num_frames: int, frame_len: int, context: int, device: torch.device) -> torch.Tensor:
    """[L, L] bool (True = may attend) for T clean frames followed by noisy frames 1..T-1."""
    time = torch.arange(num_frames, device=device)
    # clean i -> clean j for i - context <= j <= i
    c2c = (time[None, :] <= time[:, None]) & (time[None, :] >= time[:, None] - context)
    # noisy i -> clean j for i - context <= j <= i - 1, and noisy i -> itself
    noisy = time[1:]
    n2c = (time[None, :] < noisy[:, None]) & (time[None, :] >= noisy[:, None] - context)
    n2n = torch.eye(num_frames - 1, dtype=torch.bool, device=device)
    top = torch.cat([c2c, torch.zeros(num_frames, num_frames - 1, dtype=torch.bool, device=device)], 1)
    frames = torch.cat([top, torch.cat([n2c, n2n], 1)], 0)
    return frames.repeat_interleave(frame_len, 0).repeat_interleave(frame_len, 1)


def frame_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_len: int,
    context: int,
    teacher_forced: bool = False,
    backend: str = "sdpa",
) -> torch.Tensor:
    """Attention over frames. q [B, heads, Lq, D], k, v [B, heads, Lk, D] -> [B, heads, Lq, D]."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} unknown; expected one of {BACKENDS}")
    if teacher_forced:
        if q.shape[2] != k.shape[2] or (q.shape[2] // frame_len) % 2 == 0:
            raise ValueError(
                f"teacher-forced attention needs 2T-1 frames of queries and keys, got q={q.shape[2]}, "
                f"k={k.shape[2]} tokens with frame_len={frame_len}"
            )
        mask = teacher_forced_mask((q.shape[2] // frame_len + 1) // 2, frame_len, context, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if backend == "xformers":
        return _xformers_attention(q, k, v, frame_len, context)
    kernel = "off" if backend == "sdpa" else None  # None: cuda_ext picks by device / $WORLDLOOP_KERNELS
    return cuda_ext.block_causal_attention(q, k, v, frame_len, window=context + 1, backend=kernel)


def _xformers_attention(q, k, v, frame_len: int, context: int) -> torch.Tensor:
    try:
        import xformers.ops as xops
    except ImportError as e:
        raise ImportError("attention backend 'xformers' needs `pip install xformers`") from e
    mask = cuda_ext.frame_causal_mask(q.shape[2], k.shape[2], frame_len, context + 1, q.device)
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    bias = bias.expand(q.shape[0], q.shape[1], *mask.shape)
    # xformers takes [B, L, heads, D]
    out = xops.memory_efficient_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias
    )
    return out.transpose(1, 2)
