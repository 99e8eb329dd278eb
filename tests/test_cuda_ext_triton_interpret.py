"""Triton kernels against their PyTorch references on CPU, through the Triton interpreter (fp32).

TRITON_INTERPRET=1 must be set before triton is imported, and another test may already have imported it in
this pytest process, so the kernels run in one child process (this file run as a script, which sets the
variable first) and each test checks that child's report for one case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 2e-5

# name -> (B, H, Lq, Lk, D, frame_len, window, block_m, block_n, teacher_forced); blocks None = defaults.
ATTENTION_CASES = {
    "several_frames_blocks_straddle_frames": (2, 1, 30, 30, 16, 6, None, 16, 16, False),
    "length_not_multiple_of_block": (1, 2, 37, 37, 24, 5, None, 16, 16, False),
    "one_frame": (1, 1, 9, 9, 16, 9, None, 16, 16, False),
    "window_of_two_frames": (1, 2, 40, 40, 16, 4, 2, 16, 16, False),
    "window_larger_than_sequence": (1, 1, 24, 24, 16, 4, 50, 16, 16, False),
    "frame_len_one_is_token_causal": (1, 1, 19, 19, 16, 1, None, 16, 16, False),
    "decode_last_frame_over_kv_cache": (2, 1, 8, 40, 32, 8, None, 16, 16, False),
    "decode_with_window": (1, 2, 6, 42, 16, 6, 3, 16, 16, False),
    "head_dim_64_default_blocks": (1, 1, 70, 70, 64, 10, None, None, None, False),
    "head_dim_128_default_blocks": (1, 1, 33, 33, 128, 11, 2, None, None, False),
    # teacher-forced training layout: (2T - 1) frames; blocks straddle the clean/noisy boundary
    "teacher_forced_t3_window2": (1, 2, 25, 25, 16, 5, 2, 16, 16, True),
    "teacher_forced_t4_no_window": (2, 1, 42, 42, 16, 6, None, 16, 16, True),
    "teacher_forced_window_one_sees_only_itself": (1, 1, 27, 27, 16, 9, 1, 16, 16, True),
    "teacher_forced_window_larger_than_sequence": (1, 1, 44, 44, 32, 4, 50, 16, 16, True),
    "teacher_forced_one_frame": (1, 1, 7, 7, 16, 7, 3, 16, 16, True),
}
# Inference decode through the split-KV path: name -> (B, H, Lq, Lk, D, frame_len, window, num_splits)
DECODE_CASES = {
    "split_kv_decode_three_splits": (2, 2, 8, 40, 16, 8, None, 3),
    "split_kv_decode_window_some_splits_empty": (1, 2, 6, 42, 16, 6, 2, 4),
    "split_kv_decode_cache_not_multiple_of_block": (1, 1, 5, 53, 32, 5, None, 2),
}
# name -> (B, F, frame_len, C, dtype of y and the conditioning); x, the residual stream, is fp32
ADALN_CASES = {
    "adaln_odd_channels": (2, 3, 4, 24, "float32"),
    "adaln_one_frame_odd_everything": (1, 1, 5, 7, "float32"),
    "adaln_wide": (2, 2, 3, 160, "float32"),
    "adaln_fp32_stream_fp16_conditioning": (2, 2, 3, 40, "float16"),  # as under autocast
}
# Mixed dtypes: eager PyTorch rounds intermediates such as (1 + scale) and gate * y to fp16, the kernels
# compute them in fp32, so the two differ by about one fp16 ulp of values of order 1-4.
# The DiT pass sums over many tokens and layers: float32 rounding of order 1e-6 relative.
CASE_TOLERANCE = {"adaln_fp32_stream_fp16_conditioning": 1e-2, "dit_teacher_forced_pass_triton_vs_sdpa": 1e-4}
DENOISE_CASES = ("euler", "cfg_per_sample_dt", "heun_cfg_clamp", "heun_clamp_bf16_shape")
# The world model's `attention_backend: triton` (world_model/attention.py) against `sdpa`.
WORLD_MODEL_CASES = (
    "frame_attention_triton_backend_teacher_forced",
    "dit_teacher_forced_pass_triton_vs_sdpa",
)
DISPATCH_CASES = ("env_forces_triton_through_public_api",)
ALL_CASES = [
    *ATTENTION_CASES,
    *DECODE_CASES,
    *ADALN_CASES,
    *DENOISE_CASES,
    *WORLD_MODEL_CASES,
    *DISPATCH_CASES,
]


def _max_errors(got, expected) -> list[float]:
    for a, b in zip(got, expected):
        if a.dtype != b.dtype:
            raise AssertionError(f"kernel gave {a.dtype}, reference {b.dtype}")
    return [float((a.detach().float() - b.detach().float()).abs().max()) for a, b in zip(got, expected)]


def _attention_case(name):
    import torch

    from worldloop.cuda_ext.attention import block_causal_attention_reference
    from worldloop.cuda_ext.triton_kernels.attention import triton_block_causal_attention

    b, h, lq, lk, d, frame_len, window, bm, bn, teacher_forced = ATTENTION_CASES[name]
    g = torch.Generator().manual_seed(0)
    # q, k, v as the world model makes them: [B, L, H, D] projections viewed as [B, H, L, D] (not contiguous).
    q = torch.randn(b, lq, h, d, generator=g).transpose(1, 2).requires_grad_()
    k = torch.randn(b, lk, h, d, generator=g).transpose(1, 2).requires_grad_()
    v = torch.randn(b, lk, h, d, generator=g).transpose(1, 2).requires_grad_()
    out = triton_block_causal_attention(q, k, v, frame_len, window, None, teacher_forced, bm, bn)
    grad = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    ref = block_causal_attention_reference(q, k, v, frame_len, window, None, teacher_forced)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    return _max_errors((out, *grads), (ref, *ref_grads))


def _decode_case(name):
    import torch

    from worldloop.cuda_ext.attention import block_causal_attention_reference
    from worldloop.cuda_ext.triton_kernels.attention import decode_split_kv

    b, h, lq, lk, d, frame_len, window, num_splits = DECODE_CASES[name]
    g = torch.Generator().manual_seed(4)
    q = torch.randn(b, h, lq, d, generator=g)
    # the KV cache: a slice of a longer preallocated buffer
    k, v = (torch.randn(b, h, lk + 7, d, generator=g)[:, :, :lk] for _ in range(2))
    out = decode_split_kv(q, k, v, frame_len, window, None, 16, 16, num_splits)
    return _max_errors((out,), (block_causal_attention_reference(q, k, v, frame_len, window),))


def _adaln_case(name):
    import torch

    from worldloop.cuda_ext.adaln import (
        adaln_modulate_reference,
        gated_residual_adaln_reference,
        gated_residual_reference,
    )
    from worldloop.cuda_ext.triton_kernels.adaln import (
        triton_adaln_modulate,
        triton_gated_residual,
        triton_gated_residual_adaln,
    )

    b, f, frame_len, c, cond_dtype = ADALN_CASES[name]
    cond_dtype = getattr(torch, cond_dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, f * frame_len, c, generator=g).requires_grad_()
    y = torch.randn(b, f * frame_len, c, generator=g).to(cond_dtype).requires_grad_()
    shift, scale, gate = (torch.randn(b, f, c, generator=g).to(cond_dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(x.shape, generator=g)
    errors = []
    for kernel, reference, inputs in (
        (triton_adaln_modulate, adaln_modulate_reference, (x, shift, scale)),
        (triton_gated_residual, gated_residual_reference, (x, y, gate)),
    ):
        out = kernel(*inputs, frame_len)
        ref = reference(*inputs, frame_len)
        errors += _max_errors(
            (out, *torch.autograd.grad(out, inputs, grad)), (ref, *torch.autograd.grad(ref, inputs, grad))
        )
    # fused: gradients arrive at both outputs (the residual stream and the modulated activations)
    inputs = (x, y, gate, shift, scale)
    grad_x = torch.randn(x.shape, generator=g)
    outs = triton_gated_residual_adaln(*inputs, frame_len)
    refs = gated_residual_adaln_reference(*inputs, frame_len)
    errors += _max_errors(
        (*outs, *torch.autograd.grad(outs, inputs, (grad_x, grad))),
        (*refs, *torch.autograd.grad(refs, inputs, (grad_x, grad))),
    )
    # fused, only the modulated output used downstream (no gradient at the residual stream)
    out_h = triton_gated_residual_adaln(*inputs, frame_len)[1]
    ref_h = gated_residual_adaln_reference(*inputs, frame_len)[1]
    errors += _max_errors(torch.autograd.grad(out_h, inputs, grad), torch.autograd.grad(ref_h, inputs, grad))
    return errors


def _denoise_case(name):
    import torch

    from worldloop import cuda_ext

    g = torch.Generator().manual_seed(2)
    shape = (3, 4, 5, 7) if name != "heun_clamp_bf16_shape" else (2, 3, 16, 16)
    x, vc, vu, vf = (torch.randn(shape, generator=g).requires_grad_() for _ in range(4))
    dt = torch.tensor([0.1, -0.3, 0.7][: shape[0]])
    kwargs = {
        "euler": dict(dt=0.25),
        "cfg_per_sample_dt": dict(dt=dt, v_uncond=vu, guidance_scale=2.5),
        "heun_cfg_clamp": dict(dt=dt, v_uncond=vu, guidance_scale=1.7, clamp=(-0.5, 0.8), v_first=vf),
        "heun_clamp_bf16_shape": dict(dt=0.5, v_first=vf, clamp=(-1.0, 1.0)),
    }[name]
    inputs = [t for t in (x, vc, kwargs.get("v_uncond"), kwargs.get("v_first")) if t is not None]
    out = cuda_ext.denoise_step(x, vc, backend="triton", **kwargs)
    ref = cuda_ext.denoise_step(x, vc, backend="off", **kwargs)
    grad = torch.randn(shape, generator=g)
    return _max_errors(
        (out, *torch.autograd.grad(out, inputs, grad)), (ref, *torch.autograd.grad(ref, inputs, grad))
    )


def _world_model_case(name):
    import torch

    from worldloop.world_model.attention import frame_attention
    from worldloop.world_model.dit import VideoDiT, VideoDiTConfig

    g = torch.Generator().manual_seed(5)
    if name == "frame_attention_triton_backend_teacher_forced":
        q, k, v = (torch.randn(2, 2, 35, 16, generator=g).requires_grad_() for _ in range(3))
        grad = torch.randn(q.shape, generator=g)
        results = []
        for backend in ("triton", "sdpa"):
            out = frame_attention(q, k, v, frame_len=5, context=2, teacher_forced=True, backend=backend)
            results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
        if "BlockCausalAttention" not in type(results[0][0].grad_fn).__name__:
            raise AssertionError(
                f"backend='triton' did not run the Triton kernel (grad_fn {results[0][0].grad_fn})"
            )
        return _max_errors(*results)
    # dit_teacher_forced_pass_triton_vs_sdpa: the training pass, forward and parameter gradients
    torch.manual_seed(0)
    cfg = VideoDiTConfig(
        image_size=16, patch_size=8, width=32, depth=2, heads=2, context_frames=2, output_conv_channels=0
    )
    dit = VideoDiT(cfg)
    for p in dit.parameters():  # AdaLN and the output layers start at zero: make every path carry signal
        torch.nn.init.normal_(p, std=0.2)
    x, prev = (torch.randn(2, 5, 1, 3, 16, 16, generator=g) for _ in range(2))
    a, t = torch.randn(2, 5, 4, generator=g), torch.rand(2, 5, generator=g)
    valid, index = torch.ones(2, 5, dtype=torch.bool), torch.tensor([0, 1, 2, 1, 2])
    results = []
    for backend in ("triton", "sdpa"):
        cfg.attention_backend = backend
        out, _ = dit(x, prev, a, valid, t, index, teacher_forced=True)
        results.append((out, *torch.autograd.grad(out.square().mean(), list(dit.parameters()))))
    return _max_errors(*results)


def _dispatch_case(name):
    import torch

    from worldloop import cuda_ext
    from worldloop.cuda_ext.attention import block_causal_attention_reference

    os.environ["WORLDLOOP_KERNELS"] = "triton"
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 12, 16, generator=g).requires_grad_() for _ in range(3))
    out = cuda_ext.block_causal_attention(q, k, v, frame_len=4)
    if out.grad_fn is None or "BlockCausalAttention" not in type(out.grad_fn).__name__:
        raise AssertionError(
            f"WORLDLOOP_KERNELS=triton did not run the Triton kernel (grad_fn {out.grad_fn})"
        )
    return _max_errors((out,), (block_causal_attention_reference(q, k, v, 4),))


def _run_all_cases() -> dict:
    report = {}
    for name in ALL_CASES:
        runner = (
            _attention_case
            if name in ATTENTION_CASES
            else _decode_case
            if name in DECODE_CASES
            else _adaln_case
            if name in ADALN_CASES
            else _denoise_case
            if name in DENOISE_CASES
            else _world_model_case
            if name in WORLD_MODEL_CASES
            else _dispatch_case
        )
        try:
            start = time.perf_counter()
            report[name] = {"errors": runner(name), "seconds": time.perf_counter() - start}
        except Exception as err:  # report every case, not just the first failure
            report[name] = {"exception": f"{type(err).__name__}: {err}"}
    return report


@pytest.fixture(scope="module")
def interpreter_report() -> dict:
    # The checkout first where `worldloop` resolves through PYTHONPATH (a worktree beside an editable install).
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    env.pop("WORLDLOOP_KERNELS", None)
    proc = subprocess.run(
        [sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"interpreter run failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ALL_CASES)
def test_triton_kernel_matches_reference(interpreter_report, case):
    result = interpreter_report[case]
    assert "exception" not in result, result.get("exception")
    assert result["errors"], "no outputs were compared"
    tolerance = CASE_TOLERANCE.get(case, TOLERANCE)
    assert max(result["errors"]) < tolerance, f"max abs errors (output, grads...): {result['errors']}"


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    print(json.dumps(_run_all_cases()))
