"""Block-causal (frame-causal) attention: the op the world model's transformer calls.

Tokens come in frames of `frame_len` tokens. A query in frame i attends every key in frames <= i, and with
`window=w` only keys in frames > i - w (a sliding window of w frames, its own included). Within a frame
attention is bidirectional. When q is shorter than k (decoding with a KV cache) the queries are the last
`Lq` positions of the key sequence, so query j sits at key position `Lk - Lq + j`.

`teacher_forced=True` is the diffusion-forcing training layout (Lq == Lk = (2T - 1) * frame_len): T clean
frames (times 0..T-1) in the block-causal layout, then noisy copies of frames 1..T-1. A noisy frame of
time t sees the clean frames of times t - w + 1 .. t - 1 and itself, exactly what it sees when generated
in a KV-cache rollout, so every frame of a window is a training target in one pass.

Three implementations of the same rule: the reference (SDPA with the dense [Lq, Lk] boolean mask from
`frame_causal_mask`), our Triton kernel (`block_causal_attention`'s kernel path) and PyTorch's FlexAttention
(`flex_block_causal_attention`) with a `BlockMask` that `frame_block_mask` builds from the frame-level rule,
never materialising a token-level mask. The rule itself is written once, in `_frame_rule`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from worldloop.cuda_ext.backend import resolve_backend, unsupported_dtype

FLEX_BLOCK_SIZE = 128  # FlexAttention's default tile: the block mask is built at this granularity
# Compiled FlexAttention graphs kept, one per shape (see flex_block_causal_attention).
FLEX_RECOMPILE_LIMIT = 64


def _clean_frames(k_len: int, frame_len: int, teacher_forced: bool) -> int | None:
    """T of the teacher-forced layout ((2T - 1) frames of keys), None for the plain block-causal one."""
    return (k_len // frame_len + 1) // 2 if teacher_forced else None


def _frame_rule(fq, fk, clean_frames: int | None, window: int | None):
    """True where a query in frame `fq` may see a key in frame `fk` (broadcasting integer index tensors).

    Frames are sequence frames: with `clean_frames` (teacher-forced) frames >= clean_frames are the noisy
    copies of times 1..T-1. Written with elementwise tensor ops only, so it also serves as FlexAttention's
    `mask_mod` (traced with vmap / torch.compile).
    """
    if clean_frames is None:
        allowed = fk <= fq
        return allowed & (fk > fq - window) if window is not None else allowed
    nq, nk = fq >= clean_frames, fk >= clean_frames
    tq = torch.where(nq, fq - clean_frames + 1, fq)
    tk = torch.where(nk, fk - clean_frames + 1, fk)
    # clean keys of earlier times (a noisy query: strictly earlier), within the window
    allowed = ~nk & (tk <= tq - nq.to(tq.dtype))
    if window is not None:
        allowed = allowed & (tk > tq - window)
    # a noisy query also sees its own noisy frame
    return allowed | (nq & nk & (tk == tq))


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
    fq = (torch.arange(q_len, device=device) + (k_len - q_len)) // frame_len
    fk = torch.arange(k_len, device=device) // frame_len
    return _frame_rule(fq[:, None], fk[None, :], _clean_frames(k_len, frame_len, teacher_forced), window)


def _ordered_blocks(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[nq, nk] bool block map -> (blocks per row [1, 1, nq], their column indices first [1, 1, nq, nk]),
    the int32 layout of `BlockMask` (selected columns first, in order)."""
    counts = selected.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


@functools.lru_cache(maxsize=32)
def frame_block_mask(
    q_len: int,
    k_len: int,
    frame_len: int,
    window: int | None,
    device: torch.device,
    teacher_forced: bool = False,
    block_size: int = FLEX_BLOCK_SIZE,
):
    """FlexAttention `BlockMask` of `frame_causal_mask` (cached per shape and device; do not modify).

    Built from the frame-level rule: a tile of block_size x block_size tokens spans a few frames of queries
    and of keys, and as the rule depends only on the two frames, the tile is empty, full (the kernel skips
    `mask_mod`) or partial (the kernel applies `mask_mod`) by counting allowed frame pairs in its rectangle
    (2-D prefix sums over the [frames, frames] rule). The work is O(frames^2 + tiles), nothing is [Lq, Lk].
    Tiles reaching past the sequence end are never full, as in `create_block_mask`. Batch and heads are
    broadcast (size 1), so one mask serves every batch size.
    """
    from torch.nn.attention.flex_attention import BlockMask

    clean = _clean_frames(k_len, frame_len, teacher_forced)
    offset = k_len - q_len  # query row j sits at key position offset + j
    frames = -(-k_len // frame_len)
    index = torch.arange(frames, device=device)
    rule = _frame_rule(index[:, None], index[None, :], clean, window).to(torch.int32)
    # prefix[i, j] = rule[:i, :j].sum()
    prefix = F.pad(rule.cumsum(0).cumsum(1), (1, 0, 1, 0))

    def spans(length: int, shift: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """First and last frame of each tile, and whether it reaches past `length`."""
        start = torch.arange(0, length, block_size, device=device)
        end = torch.clamp(start + block_size, max=length)
        return (start + shift) // frame_len, (end - 1 + shift) // frame_len, start + block_size > length

    q_first, q_last, q_pad = spans(q_len, offset)
    k_first, k_last, k_pad = spans(k_len, 0)
    r0, r1, c0, c1 = q_first[:, None], q_last[:, None] + 1, k_first[None, :], k_last[None, :] + 1
    allowed = prefix[r1, c1] - prefix[r0, c1] - prefix[r1, c0] + prefix[r0, c0]
    full = (allowed == (r1 - r0) * (c1 - c0)) & ~q_pad[:, None] & ~k_pad[None, :]
    partial = (allowed > 0) & ~full

    def mask_mod(b, h, q_idx, kv_idx):
        return _frame_rule((q_idx + offset) // frame_len, kv_idx // frame_len, clean, window)

    return BlockMask.from_kv_blocks(
        *_ordered_blocks(partial),
        *_ordered_blocks(full),
        BLOCK_SIZE=block_size,
        mask_mod=mask_mod,
        seq_lengths=(q_len, k_len),
    )


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


@functools.lru_cache(maxsize=1)
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_block_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_len: int,
    window: int | None = None,
    scale: float | None = None,
    teacher_forced: bool = False,
) -> torch.Tensor:
    """`block_causal_attention` through PyTorch's FlexAttention and the cached `frame_block_mask`.

    On CUDA, flex_attention is compiled once (torch.compile) with the batch dimension marked dynamic: a
    new batch size does not recompile (batch 1 is one more specialisation), a new sequence shape does.
    Elsewhere it runs eagerly: exact and differentiable, but eager FlexAttention materialises the scores
    (torch 2.10's compiled CPU FlexAttention has no backward), so on CPU it serves tests, not speed.
    """
    _check_inputs(q, k, v, frame_len, window, teacher_forced)
    block_mask = frame_block_mask(q.shape[-2], k.shape[-2], frame_len, window, q.device, teacher_forced)
    if q.device.type != "cuda":
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    for t in (q, k, v):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    # One compiled graph per sequence shape (and grad mode, dtype): dynamo's default limit of 8 per function
    # is soon reached by a training run plus a benchmark, and past it dynamo would silently run FlexAttention
    # eagerly (dense scores); a higher limit, and an error rather than that fallback.
    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
        return _compiled_flex_attention()(q, k, v, block_mask=block_mask, scale=scale)


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
