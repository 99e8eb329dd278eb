"""Block-causal flash attention in Triton: forward, backward (autograd.Function) and KV-cache decode.

Token layouts (a frame is `frame_len` consecutive tokens; a token's "time" is the step it shows):

- block-causal: frame f has time f. A query sees keys of times <= its own (and > its own - window).
  Query row j sits at key position (Lk - Lq) + j, so q shorter than k is decoding over a KV cache.
- teacher-forced (training, Lq == Lk): T clean frames (times 0..T-1), then T-1 noisy frames (times
  1..T-1). A clean query sees clean keys as above; a noisy query sees clean keys of times < its own (and
  > its own - window) and its own noisy frame, which is what it sees in a KV-cache rollout.

Algorithm (FlashAttention-2 with frame-level block skipping):

- Forward: one program per (query block of BLOCK_M rows, batch * head). It visits only key blocks that
  can hold allowed keys: the clean keys from the window start of its earliest time to the end of its latest
  time, then (teacher-forced) the noisy frames of its own noisy rows, so the work is ~half of dense
  attention, O(window) per query with a window. Inside a block the exact rule sets disallowed scores to
  -inf. Online softmax in base 2 with a running max m, running sum l and an fp32 accumulator; it writes
  O = acc / l and the row log-sum-exp.
- Decode: the same kernel with Lq < Lk (any strided view of a preallocated cache works, nothing is
  copied). For inference the keys are also split across programs (flash-decoding, `decode_split_kv`),
  since a new frame's few query blocks would leave most of the GPU idle.
- Backward: delta = rowsum(dO * O) (PyTorch), then one kernel per key block accumulating dK and dV over the
  query blocks that can see it, and one kernel per query block accumulating dQ over its visible key blocks,
  both recomputing P = exp(QK^T * scale - lse). Two kernels instead of atomics keep it deterministic.

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
def _time_of(pos, frame_len, clean_frames, TEACHER_FORCED: tl.constexpr):
    """(time, noisy 0/1) of token positions."""
    frame = pos // frame_len
    if TEACHER_FORCED:
        noisy = (frame >= clean_frames).to(tl.int32)
        return frame - noisy * (clean_frames - 1), noisy
    else:
        return frame, frame * 0


@triton.jit
def _allowed(q_pos, k_idx, k_lo, k_hi, frame_len, clean_frames, window,
             HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr):  # fmt: skip
    """[BLOCK_M, BLOCK_N] mask: the key lies in [k_lo, k_hi) and the layout's rule lets the query see it."""
    tq, nq = _time_of(q_pos, frame_len, clean_frames, TEACHER_FORCED)
    tk, nk = _time_of(k_idx, frame_len, clean_frames, TEACHER_FORCED)
    allowed = tk[None, :] <= tq[:, None] - nq[:, None]
    if HAS_WINDOW:
        allowed &= tk[None, :] > tq[:, None] - window
    if TEACHER_FORCED:
        own_noisy_frame = (nq[:, None] == 1) & (nk[None, :] == 1) & (tk[None, :] == tq[:, None])
        allowed = (allowed & (nk[None, :] == 0)) | own_noisy_frame
    return allowed & ((k_idx >= k_lo) & (k_idx < k_hi))[None, :]


@triton.jit
def _key_ranges(first_pos, last_pos, Lk, frame_len, clean_frames, window,
                HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr):  # fmt: skip
    """Two key ranges [lo1, hi1), [lo2, hi2) holding every key visible to query positions first..last."""
    if TEACHER_FORCED:
        clean_end = clean_frames * frame_len
        # Earliest and latest time among the rows; a block straddling the clean/noisy boundary holds clean
        # rows up to time T - 1 and noisy rows from time 1.
        first_clean = first_pos < clean_end
        last_noisy = last_pos >= clean_end
        first_time = first_pos // frame_len
        last_time = last_pos // frame_len
        t_first = tl.where(
            first_clean,
            tl.where(last_noisy, tl.minimum(first_time, 1), first_time),
            first_time - clean_frames + 1,
        )
        t_last = tl.where(
            last_noisy, tl.where(first_clean, clean_frames - 1, last_time - clean_frames + 1), last_time
        )
        lo1 = 0
        if HAS_WINDOW:
            lo1 = tl.maximum(t_first - window + 1, 0) * frame_len
        hi1 = tl.minimum((t_last + 1) * frame_len, clean_end)
        lo2 = tl.maximum(first_pos, clean_end) // frame_len * frame_len
        hi2 = tl.where(last_pos >= clean_end, tl.minimum((last_pos // frame_len + 1) * frame_len, Lk), lo2)
    else:
        lo1 = 0
        if HAS_WINDOW:
            lo1 = tl.maximum(first_pos // frame_len - window + 1, 0) * frame_len
        hi1 = tl.minimum((last_pos // frame_len + 1) * frame_len, Lk)
        lo2 = hi1 * 0
        hi2 = lo2
    return lo1, hi1, lo2, hi2


@triton.jit
def _query_ranges(first_key, last_key, Lq, offset, frame_len, clean_frames, window,
                  HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr):  # fmt: skip
    """Two query-row ranges [lo1, hi1), [lo2, hi2) holding every query that sees keys first..last."""
    if TEACHER_FORCED:
        clean_end = clean_frames * frame_len
        has_clean = first_key < clean_end
        has_noisy = last_key >= clean_end
        t_first = first_key // frame_len
        t_last = tl.minimum(last_key, clean_end - 1) // frame_len
        # clean queries of times t_first .. t_last + window - 1
        lo1 = tl.where(has_clean, t_first * frame_len, 0)
        hi1 = clean_end
        if HAS_WINDOW:
            hi1 = tl.minimum((t_last + window) * frame_len, clean_end)
        hi1 = tl.where(has_clean, hi1, 0)
        # noisy queries: times t_first + 1 .. t_last + window - 1 (from clean keys), own frames (noisy keys)
        from_clean_lo = (clean_frames + t_first) * frame_len
        from_clean_hi = Lq
        if HAS_WINDOW:
            from_clean_hi = tl.minimum((clean_frames + t_last + window - 1) * frame_len, Lq)
        own_lo = tl.maximum(first_key, clean_end) // frame_len * frame_len
        own_hi = tl.minimum((last_key // frame_len + 1) * frame_len, Lq)
        lo2 = tl.where(
            has_clean, tl.where(has_noisy, tl.minimum(from_clean_lo, own_lo), from_clean_lo), own_lo
        )
        hi2 = tl.where(
            has_clean, tl.where(has_noisy, tl.maximum(from_clean_hi, own_hi), from_clean_hi), own_hi
        )
    else:
        lo1 = tl.maximum((first_key // frame_len) * frame_len - offset, 0)
        hi1 = Lq
        if HAS_WINDOW:
            hi1 = tl.minimum((last_key // frame_len + window) * frame_len - offset, Lq)
        lo2 = lo1 * 0
        hi2 = lo2
    return lo1, hi1, lo2, hi2


@triton.jit
def _fwd_range(acc, m_i, l_i, q, q_pos, k_ptrs0, v_ptrs0, skl, svl, offs_d, d_ok, lo, hi,
               frame_len, clean_frames, window, qk_scale_log2,
               HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    for start_n in range(lo // BLOCK_N * BLOCK_N, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ok = (offs_n >= lo) & (offs_n < hi)
        k = tl.load(k_ptrs0 + offs_n[None, :] * skl, mask=k_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, k) * qk_scale_log2
        rule = _allowed(q_pos, offs_n, lo, hi, frame_len, clean_frames, window, HAS_WINDOW, TEACHER_FORCED)
        s = tl.where(rule, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs0 + offs_n[:, None] * svl, mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attn_fwd(
    Q, K, V, OUT, LSE,
    sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sob, soh, sol, sod,
    H, Lq, Lk, D, frame_len, clean_frames, window, qk_scale_log2, split_len, so_split, slse_split,
    HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
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
    offset = Lk - Lq
    q_pos = offs_m + offset
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :] * sqd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    first_pos = pid_m * BLOCK_M + offset
    last_pos = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, Lq - 1) + offset
    lo1, hi1, lo2, hi2 = _key_ranges(
        first_pos, last_pos, Lk, frame_len, clean_frames, window, HAS_WINDOW, TEACHER_FORCED
    )
    lo1 = tl.maximum(lo1, split * split_len)
    hi1 = tl.minimum(hi1, split * split_len + split_len)
    k_ptrs0 = K + b * skb + h * skh + offs_d[:, None] * skd
    v_ptrs0 = V + b * svb + h * svh + offs_d[None, :] * svd
    acc, m_i, l_i = _fwd_range(
        acc, m_i, l_i, q, q_pos, k_ptrs0, v_ptrs0, skl, svl, offs_d, d_ok, lo1, hi1,
        frame_len, clean_frames, window, qk_scale_log2, HAS_WINDOW, TEACHER_FORCED, BLOCK_N,
    )  # fmt: skip
    if TEACHER_FORCED:
        acc, m_i, l_i = _fwd_range(
            acc, m_i, l_i, q, q_pos, k_ptrs0, v_ptrs0, skl, svl, offs_d, d_ok, lo2, hi2,
            frame_len, clean_frames, window, qk_scale_log2, HAS_WINDOW, TEACHER_FORCED, BLOCK_N,
        )  # fmt: skip

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(
        OUT + b * sob + h * soh + offs_m[:, None] * sol + offs_d[None, :] * sod,
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
    tl.store(LSE + bh * Lq + offs_m, m_i + tl.log2(l_safe), mask=row_ok)


@triton.jit
def _dkdv_range(dk, dv, k, v, offs_n, q_ptrs0, do_ptrs0, sql, sdl, LSE_ROW, DELTA_ROW, d_ok, lo, hi, Lq, offset,
                frame_len, clean_frames, window, qk_scale_log2,
                HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    for start_m in range(lo // BLOCK_M * BLOCK_M, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = (offs_m >= lo) & (offs_m < hi)
        qd_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(q_ptrs0 + offs_m[:, None] * sql, mask=qd_mask, other=0.0)
        do = tl.load(do_ptrs0 + offs_m[:, None] * sdl, mask=qd_mask, other=0.0)
        lse = tl.load(LSE_ROW + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA_ROW + offs_m, mask=row_ok, other=0.0)
        rule = _allowed(offs_m + offset, offs_n, 0, Lq + offset, frame_len, clean_frames, window,
                        HAS_WINDOW, TEACHER_FORCED)  # fmt: skip
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        p = tl.where(rule & row_ok[:, None], tl.exp2(s - lse[:, None]), 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sdb, sdh, sdl, sdd,
    H, Lq, Lk, D, frame_len, clean_frames, window, qk_scale_log2, sm_scale,
    HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
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

    offset = Lk - Lq
    first_key = pid_n * BLOCK_N
    last_key = tl.minimum(pid_n * BLOCK_N + BLOCK_N, Lk) - 1
    lo1, hi1, lo2, hi2 = _query_ranges(
        first_key, last_key, Lq, offset, frame_len, clean_frames, window, HAS_WINDOW, TEACHER_FORCED
    )
    q_ptrs0 = Q + b * sqb + h * sqh + offs_d[None, :] * sqd
    do_ptrs0 = DO + b * sdb + h * sdh + offs_d[None, :] * sdd
    dk, dv = _dkdv_range(
        dk, dv, k, v, offs_n, q_ptrs0, do_ptrs0, sql, sdl, LSE + bh * Lq, DELTA + bh * Lq, d_ok, lo1, hi1,
        Lq, offset, frame_len, clean_frames, window, qk_scale_log2, HAS_WINDOW, TEACHER_FORCED, BLOCK_M,
    )  # fmt: skip
    if TEACHER_FORCED:
        dk, dv = _dkdv_range(
            dk, dv, k, v, offs_n, q_ptrs0, do_ptrs0, sql, sdl, LSE + bh * Lq, DELTA + bh * Lq, d_ok, lo2, hi2,
            Lq, offset, frame_len, clean_frames, window, qk_scale_log2, HAS_WINDOW, TEACHER_FORCED, BLOCK_M,
        )  # fmt: skip
    tl.store(
        DK + b * skb + h * skh + offs_n[:, None] * skl + offs_d[None, :] * skd,
        (dk * sm_scale).to(DK.dtype.element_ty),
        mask=kd_mask,
    )
    tl.store(
        DV + b * svb + h * svh + offs_n[:, None] * svl + offs_d[None, :] * svd,
        dv.to(DV.dtype.element_ty),
        mask=kd_mask,
    )


@triton.jit
def _dq_range(dq, q, do, lse, delta, q_pos, k_ptrs0, v_ptrs0, skl, svl, d_ok, row_ok, lo, hi,
              frame_len, clean_frames, window, qk_scale_log2,
              HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    for start_n in range(lo // BLOCK_N * BLOCK_N, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kd_mask = ((offs_n >= lo) & (offs_n < hi))[:, None] & d_ok[None, :]
        k = tl.load(k_ptrs0 + offs_n[:, None] * skl, mask=kd_mask, other=0.0)
        v = tl.load(v_ptrs0 + offs_n[:, None] * svl, mask=kd_mask, other=0.0)
        rule = _allowed(q_pos, offs_n, lo, hi, frame_len, clean_frames, window, HAS_WINDOW, TEACHER_FORCED)
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        p = tl.where(rule & row_ok[:, None], tl.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ,
    sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sdb, sdh, sdl, sdd,
    H, Lq, Lk, D, frame_len, clean_frames, window, qk_scale_log2, sm_scale,
    HAS_WINDOW: tl.constexpr, TEACHER_FORCED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
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
    lo1, hi1, lo2, hi2 = _key_ranges(
        first_pos, last_pos, Lk, frame_len, clean_frames, window, HAS_WINDOW, TEACHER_FORCED
    )
    k_ptrs0 = K + b * skb + h * skh + offs_d[None, :] * skd
    v_ptrs0 = V + b * svb + h * svh + offs_d[None, :] * svd
    dq = _dq_range(
        dq, q, do, lse, delta, offs_m + offset, k_ptrs0, v_ptrs0, skl, svl, d_ok, row_ok, lo1, hi1,
        frame_len, clean_frames, window, qk_scale_log2, HAS_WINDOW, TEACHER_FORCED, BLOCK_N,
    )  # fmt: skip
    if TEACHER_FORCED:
        dq = _dq_range(
            dq, q, do, lse, delta, offs_m + offset, k_ptrs0, v_ptrs0, skl, svl, d_ok, row_ok, lo2, hi2,
            frame_len, clean_frames, window, qk_scale_log2, HAS_WINDOW, TEACHER_FORCED, BLOCK_N,
        )  # fmt: skip
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


def _clean_frames(length: int, frame_len: int, teacher_forced: bool) -> int:
    """T for the teacher-forced layout (2T - 1 frames); unused (0) otherwise."""
    return (length // frame_len + 1) // 2 if teacher_forced else 0


class _BlockCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, frame_len, window, scale, teacher_forced, block_m, block_n):
        batch, heads, lq, head_dim = q.shape
        lk = k.shape[2]
        bm, bn, bd = _block_sizes(head_dim, block_m, block_n)
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        clean_frames = _clean_frames(lk, frame_len, teacher_forced)
        out = torch.empty_like(q)
        lse = torch.empty(batch * heads, lq, device=q.device, dtype=torch.float32)
        _attn_fwd[(triton.cdiv(lq, bm), batch * heads, 1)](
            q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            heads, lq, lk, head_dim, frame_len, clean_frames, window or 0, sm_scale * _LOG2E,
            triton.cdiv(lk, bn) * bn, 0, 0,
            HAS_WINDOW=window is not None, TEACHER_FORCED=teacher_forced, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (frame_len, window, sm_scale, teacher_forced, clean_frames, bm, bn, bd)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        frame_len, window, sm_scale, teacher_forced, clean_frames, bm, bn, bd = ctx.config
        batch, heads, lq, head_dim = q.shape
        lk = k.shape[2]
        # One contiguous layout for inputs and gradients, so each gradient is written with its input's strides.
        q, k, v, grad_out = (t.contiguous() for t in (q, k, v, grad_out))
        delta = (grad_out.float() * out.float()).sum(-1).reshape(batch * heads, lq)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        common = (heads, lq, lk, head_dim, frame_len, clean_frames, window or 0, sm_scale * _LOG2E, sm_scale)
        meta = dict(
            HAS_WINDOW=window is not None, TEACHER_FORCED=teacher_forced, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd
        )
        strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(grad_out))
        _attn_bwd_dkdv[(triton.cdiv(lk, bn), batch * heads)](
            q, k, v, grad_out, lse, delta, dk, dv, *strides, *common, **meta
        )
        _attn_bwd_dq[(triton.cdiv(lq, bm), batch * heads)](
            q, k, v, grad_out, lse, delta, dq, *strides, *common, **meta
        )
        return dq, dk, dv, None, None, None, None, None, None


def _decode_num_splits(programs: int, key_blocks: int) -> int:
    """Enough programs to fill a large GPU (~256), but at least 4 key blocks of work per split."""
    return max(1, min(256 // max(programs, 1), key_blocks // 4))


def decode_split_kv(q, k, v, frame_len, window, scale, block_m=None, block_n=None, num_splits=None):
    """Inference-only decode (flash-decoding) in the block-causal layout: split the KV cache, then merge.

    Each of `num_splits` programs per query block covers one slice of the keys and writes its normalised
    partial output and log-sum-exp (fp32); the merge weights each slice by 2^(lse_slice - lse_total).
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
        heads, lq, lk, head_dim, frame_len, 0, window or 0, sm_scale * _LOG2E, split_len,
        partial.stride(0), lse.stride(0),
        HAS_WINDOW=window is not None, TEACHER_FORCED=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
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
    teacher_forced: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Frame-causal flash attention (see the module docstring). `block_m`/`block_n` override tile sizes.

    Decoding without gradients (q shorter than k, no input needing grad) takes the split-KV path.
    """
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if q.shape[2] < k.shape[2] and not needs_grad:
        return decode_split_kv(q, k, v, frame_len, window, scale, block_m, block_n)
    return _BlockCausalAttention.apply(q, k, v, frame_len, window, scale, teacher_forced, block_m, block_n)
