"""The one place the world model computes attention, so the backbone never changes with the backend.

Two token layouts occur (a frame is `frame_len` consecutive tokens: all patches of all views of a step):

- block-causal: a frame sees itself and at most `context` earlier frames. Used by rollouts (a KV-cache
  decode passes the newest frames as queries, the cached frames plus themselves as keys) and by the
  recompute-everything path.
- teacher-forced (training): the clean frames 0..T-1 in block-causal layout, then noisy copies of frames
  1..T-1; noisy frame i sees clean frames i-context..i-1 and itself, exactly what it sees in a KV-cache
  rollout, so every frame of a window is a training target in one pass.

Both layouts are `cuda_ext.block_causal_attention` (its `window` counts the frame itself, hence
`context + 1`; `teacher_forced=True` selects the training layout). `dit.attention_backend` picks how:

- `sdpa`: the reference, torch SDPA with a dense boolean [L, L] mask (any device; the correctness oracle).
- `flex`: PyTorch FlexAttention with a block mask built once per shape from the frame rule (no dense
  mask; compiled on CUDA, eager elsewhere).
- `triton`: our Triton flash kernel (forward and backward for both layouts, split-KV decode); CPU tensors
  need `TRITON_INTERPRET=1`.
- `auto`: on CUDA, our kernel for both layouts (measured on an H200, docs/kernels.md: base.yaml trains at
  1.67 steps/s with it, 1.36 with FlexAttention, 0.90 with SDPA; rollouts are within a few percent of
  either, and FlexAttention would recompile for every cache length); the reference elsewhere.
  `WORLDLOOP_KERNELS=off` (cuda_ext's switch) makes it the reference everywhere.
"""

from __future__ import annotations

import torch

from worldloop import cuda_ext
from worldloop.cuda_ext.attention import flex_block_causal_attention
from worldloop.cuda_ext.backend import requested_backend

BACKENDS = ("auto", "sdpa", "flex", "triton")


def check_backend(backend: str, field: str = "dit.attention_backend") -> None:
    """Raise a ValueError naming `field` unless `backend` is one of BACKENDS."""
    if backend not in BACKENDS:
        renamed = " ('cuda_ext' is now 'triton')" if backend == "cuda_ext" else ""
        raise ValueError(
            f"{field}={backend!r} is not an attention backend; expected one of {BACKENDS}{renamed}"
        )


def resolve_backend(backend: str, device: torch.device) -> str:
    """The implementation `backend` runs for tensors on `device`: 'sdpa', 'flex' or 'triton'."""
    check_backend(backend)
    if backend != "auto":
        return backend
    if device.type != "cuda" or requested_backend() == "off":
        return "sdpa"
    return "triton"


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
    path = resolve_backend(backend, q.device)
    if path != "sdpa" and torch.is_autocast_enabled(q.device.type):
        # Autocast leaves q and k in float32 where a norm ran in it; SDPA casts all three itself, the
        # kernels need one dtype.
        dtype = torch.get_autocast_dtype(q.device.type)
        q, k, v = (t.to(dtype) for t in (q, k, v))
    window = context + 1
    if path == "flex":
        return flex_block_causal_attention(q, k, v, frame_len, window, teacher_forced=teacher_forced)
    kernel = "off" if path == "sdpa" else "triton"
    return cuda_ext.block_causal_attention(
        q, k, v, frame_len, window=window, backend=kernel, teacher_forced=teacher_forced
    )
