"""Block-causal flash attention in Triton: forward, backward (autograd.Function) and KV-cache decode.

Algorithm (FlashAttention-2 with frame-causal block skipping):

- Forward: one program per (query block of BLOCK_M rows, batch * head). Query row j sits at key position
  p = (Lk - Lq) + j, in frame p // frame_len. The program visits only the key blocks that can hold allowed
  keys: from the first key of frame (min_frame - window + 1) (0 without a window) to the last key of its
  last query's frame, so the work is ~half of dense attention (and O(window) per query with a window).
  Inside a block, scores outside the frame rule are set to -inf. It keeps the running max m, the running
  sum l and the fp32 accumulator (online softmax in base 2), writes O = acc / l and the row log-sum-exp.
- Decode: Lq < Lk; the queries are the newest frame(s) and k, v the KV cache (any strided view of a
  preallocated cache works, nothing is copied). With gradients it is the same kernel; for inference the
  keys are also split across programs (flash-decoding, `decode_split_kv`) since few query blocks would
  leave most of the GPU idle.
- Backward: delta = rowsum(dO * O) (PyTorch), then one kernel per key block accumulating dK and dV over the
  query blocks that can see it (frames from the key's own up to key frame + window - 1), and one kernel per
  query block accumulating dQ over its visible key blocks, both recomputing P = exp(QK^T * scale - lse).
  Two kernels instead of atomics keep the result deterministic.

Inputs fp16/bf16 (fp32 on GPU runs tl.dot in its default TF32 precision; the CPU interpreter is exact fp32),
accumulation always fp32. Head dims up to 256 (padded to a power of two with masking).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _frame_rule(q_pos, k_idx, Lk, frame_len, window, HAS_WINDOW: tl.constexpr):
    """[BLOCK_M, BLOCK_N] mask: key in range and in an allowed frame for the query positions."""
    q_frame = q_pos // frame_len
    k_frame = k_idx // frame_len
    allowed = (k_frame[None, :] <= q_frame[:, None]) & (k_idx[None, :] < Lk)
    if HAS_WINDOW:
        allowed &= k_frame[None, :] > q_frame[:, None] - window
    return allowed


@triton.jit
def _attn_fwd(
    Q, K, V, OUT, LSE,
    sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sob, soh, sol, sod,
    H, Lq, Lk, D, frame_len, window, qk_scale_log2, split_len, so_split, slse_split,
    HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    split = tl.program_id(2)  # split-KV decode: this program covers keys [split * split_len, + split_len)
    OUT += split * so_split
    LSE += split * slse_split
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < Lq
    d_ok = offs_d < D
    q_pos = offs_m + (Lk - Lq)

    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :] * sqd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Keys this block can see: up to the end of its last row's frame, from the window start of its first row.
    first_pos = pid_m * BLOCK_M + (Lk - Lq)
    last_pos = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, Lq - 1) + (Lk - Lq)
    hi = tl.minimum((last_pos // frame_len + 1) * frame_len, Lk)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first_pos // frame_len - window + 1, 0) * frame_len
        lo = (lo // BLOCK_N) * BLOCK_N
    lo = tl.maximum(lo, split * split_len)  # split_len is a multiple of BLOCK_N
    hi = tl.minimum(hi, split * split_len + split_len)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ok = offs_n < Lk
        k = tl.load(
            K + b * skb + h * skh + offs_n[None, :] * skl + offs_d[:, None] * skd,
            mask=k_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        s = tl.dot(q, k) * qk_scale_log2
        s = tl.where(_frame_rule(q_pos, offs_n, Lk, frame_len, window, HAS_WINDOW), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + b * svb + h * svh + offs_n[:, None] * svl + offs_d[None, :] * svd,
            mask=k_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(
        OUT + b * sob + h * soh + offs_m[:, None] * sol + offs_d[None, :] * sod,
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
    tl.store(LSE + bh * Lq + offs_m, m_i + tl.log2(l_safe), mask=row_ok)


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sdb, sdh, sdl, sdd,
    H, Lq, Lk, D, frame_len, window, qk_scale_log2, sm_scale,
    HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_ok = offs_n < Lk
    d_ok = offs_d < D
    kd_mask = k_ok[:, None] & d_ok[None, :]
    k = tl.load(
        K + b * skb + h * skh + offs_n[:, None] * skl + offs_d[None, :] * skd, mask=kd_mask, other=0.0
    )
    v = tl.load(
        V + b * svb + h * svh + offs_n[:, None] * svl + offs_d[None, :] * svd, mask=kd_mask, other=0.0
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # Queries that can see this key block: from its first key's frame to (last key's frame + window - 1).
    offset = Lk - Lq
    first_frame = (pid_n * BLOCK_N) // frame_len
    lo = tl.maximum(first_frame * frame_len - offset, 0)
    lo = (lo // BLOCK_M) * BLOCK_M
    hi = Lq
    if HAS_WINDOW:
        last_frame = (tl.minimum(pid_n * BLOCK_N + BLOCK_N, Lk) - 1) // frame_len
        hi = tl.minimum((last_frame + window) * frame_len - offset, Lq)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Lq
        qd_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(
            Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :] * sqd, mask=qd_mask, other=0.0
        )
        do = tl.load(
            DO + b * sdb + h * sdh + offs_m[:, None] * sdl + offs_d[None, :] * sdd, mask=qd_mask, other=0.0
        )
        lse = tl.load(LSE + bh * Lq + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)
        allowed = _frame_rule(offs_m + offset, offs_n, Lk, frame_len, window, HAS_WINDOW) & row_ok[:, None]
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    tl.store(
        DK + b * skb + h * skh + offs_n[:, None] * skl + offs_d[None, :] * skd,
        dk.to(DK.dtype.element_ty),
        mask=kd_mask,
    )
    tl.store(
        DV + b * svb + h * svh + offs_n[:, None] * svl + offs_d[None, :] * svd,
        dv.to(DV.dtype.element_ty),
        mask=kd_mask,
    )


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ,
    sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sdb, sdh, sdl, sdd,
    H, Lq, Lk, D, frame_len, window, qk_scale_log2, sm_scale,
    HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < Lq
    d_ok = offs_d < D
    qd_mask = row_ok[:, None] & d_ok[None, :]
    offset = Lk - Lq
    q_pos = offs_m + offset
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :] * sqd, mask=qd_mask, other=0.0
    )
    do = tl.load(
        DO + b * sdb + h * sdh + offs_m[:, None] * sdl + offs_d[None, :] * sdd, mask=qd_mask, other=0.0
    )
    lse = tl.load(LSE + bh * Lq + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * Lq + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    first_pos = pid_m * BLOCK_M + offset
    last_pos = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, Lq - 1) + offset
    hi = tl.minimum((last_pos // frame_len + 1) * frame_len, Lk)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first_pos // frame_len - window + 1, 0) * frame_len
        lo = (lo // BLOCK_N) * BLOCK_N
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kd_mask = (offs_n < Lk)[:, None] & d_ok[None, :]
        k = tl.load(
            K + b * skb + h * skh + offs_n[:, None] * skl + offs_d[None, :] * skd, mask=kd_mask, other=0.0
        )
        v = tl.load(
            V + b * svb + h * svh + offs_n[:, None] * svl + offs_d[None, :] * svd, mask=kd_mask, other=0.0
        )
        allowed = _frame_rule(q_pos, offs_n, Lk, frame_len, window, HAS_WINDOW) & row_ok[:, None]
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(
        DQ + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :] * sqd,
        (dq * sm_scale).to(DQ.dtype.element_ty),
        mask=qd_mask,
    )


def _block_sizes(head_dim: int, block_m: int | None, block_n: int | None) -> tuple[int, int, int]:
    block_d = max(16, triton.next_power_of_2(head_dim))
    if block_d > 256:
        raise ValueError(f"block_causal_attention (triton): head dim {head_dim} > 256 is not supported")
    default_n = 64 if block_d <= 64 else 32
    return block_m or 64, block_n or default_n, block_d


def _strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    return tuple(t.stride())


class _BlockCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, frame_len, window, scale, block_m, block_n):
        batch, heads, lq, head_dim = q.shape
        lk = k.shape[2]
        bm, bn, bd = _block_sizes(head_dim, block_m, block_n)
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        out = torch.empty_like(q)
        lse = torch.empty(batch * heads, lq, device=q.device, dtype=torch.float32)
        grid = (triton.cdiv(lq, bm), batch * heads, 1)
        _attn_fwd[grid](
            q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            heads, lq, lk, head_dim, frame_len, window or 0, sm_scale * _LOG2E, triton.cdiv(lk, bn) * bn, 0, 0,
            HAS_WINDOW=window is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (frame_len, window, sm_scale, bm, bn, bd)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        frame_len, window, sm_scale, bm, bn, bd = ctx.config
        batch, heads, lq, head_dim = q.shape
        lk = k.shape[2]
        # One contiguous layout for inputs and gradients, so each gradient is written with its input's strides.
        q, k, v, grad_out = (t.contiguous() for t in (q, k, v, grad_out))
        delta = (grad_out.float() * out.float()).sum(-1).reshape(batch * heads, lq)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        common = (heads, lq, lk, head_dim, frame_len, window or 0, sm_scale * _LOG2E, sm_scale)
        meta = dict(HAS_WINDOW=window is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd)
        strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(grad_out))
        _attn_bwd_dkdv[(triton.cdiv(lk, bn), batch * heads)](
            q, k, v, grad_out, lse, delta, dk, dv, *strides, *common, **meta
        )
        _attn_bwd_dq[(triton.cdiv(lq, bm), batch * heads)](
            q, k, v, grad_out, lse, delta, dq, *strides, *common, **meta
        )
        return dq, dk, dv, None, None, None, None, None


def _decode_num_splits(programs: int, key_blocks: int) -> int:
    """Enough programs to fill a large GPU (~256), but at least 4 key blocks of work per split."""
    return max(1, min(256 // max(programs, 1), key_blocks // 4))


def decode_split_kv(q, k, v, frame_len, window, scale, block_m=None, block_n=None, num_splits=None):
    """Inference-only decode (flash-decoding): split the KV cache across programs, then merge.

    A new frame's queries are few (one frame: one or a handful of query blocks), so the plain forward would
    run only B * heads programs over the whole cache. Here each of `num_splits` programs per query block
    covers one slice of the keys and writes its normalised partial output and log-sum-exp (fp32); the
    merge weights each slice by 2^(lse_slice - lse_total).
    """
    batch, heads, lq, head_dim = q.shape
    lk = k.shape[2]
    bm, bn, bd = _block_sizes(head_dim, block_m, block_n)
    sm_scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    programs = triton.cdiv(lq, bm) * batch * heads
    splits = num_splits or _decode_num_splits(programs, triton.cdiv(lk, bn))
    split_len = triton.cdiv(triton.cdiv(lk, splits), bn) * bn
    splits = triton.cdiv(lk, split_len)
    partial = torch.empty(splits, batch, heads, lq, head_dim, device=q.device, dtype=torch.float32)
    lse = torch.empty(splits, batch * heads, lq, device=q.device, dtype=torch.float32)
    _attn_fwd[(triton.cdiv(lq, bm), batch * heads, splits)](
        q, k, v, partial, lse, *_strides(q), *_strides(k), *_strides(v), *partial.stride()[1:],
        heads, lq, lk, head_dim, frame_len, window or 0, sm_scale * _LOG2E, split_len,
        partial.stride(0), lse.stride(0),
        HAS_WINDOW=window is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
    )  # fmt: skip
    weights = torch.softmax(lse * math.log(2.0), dim=0).view(splits, batch, heads, lq, 1)
    return (weights * partial).sum(0).to(q.dtype)


def triton_block_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_len: int,
    window: int | None = None,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Frame-causal flash attention (see the module docstring). `block_m`/`block_n` override tile sizes.

    Decoding without gradients (q shorter than k, no input needing grad) takes the split-KV path.
    """
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if q.shape[2] < k.shape[2] and not needs_grad:
        return decode_split_kv(q, k, v, frame_len, window, scale, block_m, block_n)
    return _BlockCausalAttention.apply(q, k, v, frame_len, window, scale, block_m, block_n)
