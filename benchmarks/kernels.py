"""cuda_ext kernels against PyTorch baselines: time (ms) and peak memory (MB), forward and forward+backward.

    python benchmarks/kernels.py                      # defaults below
    python benchmarks/kernels.py --repeats=50 --dtype=float16

On a CUDA machine, for world-model shapes (frames x tokens/frame: 8x64, 16x256, 32x1024; head dim 64; and
the teacher-forced training layout with 2T - 1 frames):
- block-causal attention: our Triton kernel vs SDPA with a dense boolean mask, FlexAttention (compiled)
  with a block mask, and xformers' memory-efficient attention with the mask as an additive bias (when
  xformers is installed);
- AdaLN modulation (alone, and fused with the gated residual) and the denoise step: our kernels (Triton, and CUDA C++ for the denoise step when it
  builds) vs eager PyTorch and torch.compile of the same reference.
On a CPU-only machine it says so, times only the PyTorch reference paths at the smallest shapes (labelled
device=cpu; these are not kernel timings), and exits 0. Results: benchmarks/results/kernels.json.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.cuda_ext.adaln import adaln_modulate_reference, gated_residual_adaln_reference
from worldloop.cuda_ext.attention import frame_causal_mask
from worldloop.cuda_ext.denoise import denoise_step_reference


@dataclass
class KernelBenchmarkConfig:
    repeats: int = 20
    warmup: int = 5
    dtype: str = "bfloat16"  # GPU input dtype (CPU timings use float32)
    head_dim: int = 64
    window: int = 0  # attention window in frames; 0 = all earlier frames


# (layout, batch, heads, frames, tokens per frame); teacher-forced (training) has 2T - 1 frames
GPU_ATTENTION_SHAPES = [
    ("block_causal", 4, 16, 8, 64),
    ("block_causal", 2, 16, 16, 256),
    ("block_causal", 1, 8, 32, 1024),
    ("teacher_forced", 4, 16, 15, 64),
    ("teacher_forced", 2, 16, 15, 256),
    ("teacher_forced", 1, 8, 31, 1024),
]
CPU_ATTENTION_SHAPES = [("block_causal", 1, 8, 8, 64), ("teacher_forced", 1, 8, 7, 64)]
# AdaLN x [batch, frames * tokens, channels]; denoise latent [batch, frames, channels, height, width]
GPU_ADALN_SHAPES = [(8, 16, 256, 768)]
CPU_ADALN_SHAPES = [(4, 8, 64, 192)]
GPU_LATENT_SHAPES = [(16, 16, 4, 64, 64)]
CPU_LATENT_SHAPES = [(16, 4, 3, 64, 64)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable[[], object], device: torch.device, cfg: KernelBenchmarkConfig) -> dict:
    """Mean wall time per call (ms) after warm-up, and the peak extra memory of one call (MB, CUDA only)."""
    try:
        for _ in range(cfg.warmup):
            fn()
        _sync(device)
        peak_mb = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            _sync(device)
            peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
        start = time.perf_counter()
        for _ in range(cfg.repeats):
            fn()
        _sync(device)
        return {"ms": (time.perf_counter() - start) * 1e3 / cfg.repeats, "peak_mb": peak_mb}
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"ms": None, "peak_mb": None, "error": "out of memory"}
    except Exception as err:  # a baseline that cannot run this shape is a result, not a crash
        return {"ms": None, "peak_mb": None, "error": f"{type(err).__name__}: {str(err)[:200]}"}


def _forward_backward(attn: Callable, q, k, v) -> Callable[[], object]:
    def run():
        out = attn(q, k, v)
        return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    return run


def attention_methods(
    frame_len: int, length: int, window: int | None, teacher_forced: bool, device: torch.device
) -> dict[str, Callable]:
    """name -> attn(q, k, v) for every method that can run here (masks built once, outside the timing)."""
    mask = frame_causal_mask(length, length, frame_len, window, device, teacher_forced)
    methods = {"sdpa_dense_mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)}
    if device.type != "cuda":
        return methods
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled_flex = torch.compile(flex_attention)
    clean = (length // frame_len + 1) // 2 if teacher_forced else length  # all tokens clean when not TF

    def frame_rule(b, h, q_idx, kv_idx):
        # the same rule as cuda_ext.frame_causal_mask, written in index arithmetic for FlexAttention
        fq, fk = q_idx // frame_len, kv_idx // frame_len
        nq, nk = fq >= clean, fk >= clean
        tq, tk = torch.where(nq, fq - clean + 1, fq), torch.where(nk, fk - clean + 1, fk)
        allowed = ~nk & (tk <= tq - nq.to(tq.dtype))
        if window is not None:
            allowed = allowed & (tk > tq - window)
        return allowed | (nq & nk & (tk == tq))

    block_mask = create_block_mask(frame_rule, None, None, length, length, device=device)
    methods["flex_block_mask"] = lambda q, k, v: compiled_flex(q, k, v, block_mask=block_mask)
    try:
        import xformers.ops as xops

        def xformers_bias(q, k, v):
            bias = torch.zeros(mask.shape, device=q.device, dtype=q.dtype).masked_fill(~mask, float("-inf"))
            bias = bias.expand(q.shape[0], q.shape[1], *mask.shape)
            out = xops.memory_efficient_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_bias=bias)
            return out.transpose(1, 2)

        methods["xformers_bias"] = xformers_bias
    except ImportError:
        print("xformers is not installed: its column is skipped")
    from worldloop.cuda_ext.triton_kernels.attention import triton_block_causal_attention

    methods["triton_block_causal"] = lambda q, k, v: triton_block_causal_attention(
        q, k, v, frame_len, window, None, teacher_forced
    )
    return methods


def bench_attention(cfg, device, dtype, shapes) -> list[dict]:
    rows = []
    window = cfg.window or None
    for layout, batch, heads, frames, tokens in shapes:
        length = frames * tokens
        teacher_forced = layout == "teacher_forced"
        q, k, v = (
            torch.randn(batch, heads, length, cfg.head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        for name, attn in attention_methods(tokens, length, window, teacher_forced, device).items():
            with torch.no_grad():
                fwd = measure(partial(attn, q, k, v), device, cfg)
            fwd_bwd = measure(_forward_backward(attn, q, k, v), device, cfg)
            rows.append(
                {
                    "op": "attention",
                    "device": device.type,
                    "shape": f"{layout} B{batch} H{heads} {frames}x{tokens} D{cfg.head_dim} window={window}",
                    "method": name,
                    "fwd_ms": fwd["ms"],
                    "fwd_bwd_ms": fwd_bwd["ms"],
                    "fwd_bwd_peak_mb": fwd_bwd["peak_mb"],
                    "error": fwd.get("error") or fwd_bwd.get("error"),
                }
            )
    return rows


def bench_elementwise(cfg, device, dtype, adaln_shapes, latent_shapes) -> list[dict]:
    """AdaLN modulation and the denoise step: eager reference, torch.compile of it, our kernels (GPU)."""
    rows = []
    for batch, frames, tokens, channels in adaln_shapes:
        x, y = (torch.randn(batch, frames * tokens, channels, device=device, dtype=dtype) for _ in range(2))
        gate, shift, scale = (
            torch.randn(batch, frames, channels, device=device, dtype=dtype) for _ in range(3)
        )
        shape = f"{tuple(x.shape)} F{frames}"
        ops = {
            "adaln_modulate": (adaln_modulate_reference, (x, shift, scale, tokens)),
            "gated_residual_adaln": (gated_residual_adaln_reference, (x, y, gate, shift, scale, tokens)),
        }
        for op, (reference, args) in ops.items():
            methods = {"eager": reference}
            if device.type == "cuda":
                from worldloop.cuda_ext.triton_kernels import adaln as triton_adaln

                methods["torch_compile"] = torch.compile(reference)
                methods["triton"] = getattr(triton_adaln, f"triton_{op}")
            for name, fn in methods.items():
                with torch.no_grad():
                    result = measure(partial(fn, *args), device, cfg)
                rows.append(_elementwise_row(op, device, shape, name, result))
    for shape in latent_shapes:
        x, v_cond, v_uncond = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
        dt = torch.full((shape[0],), -0.25, device=device)

        def eager(x, v_cond, v_uncond, dt):
            return denoise_step_reference(x, v_cond, dt, v_uncond, 3.0, (-1.0, 1.0))

        methods = {"eager": eager}
        if device.type == "cuda":
            from worldloop.cuda_ext.cuda_build import cuda_build_problem
            from worldloop.cuda_ext.fused_denoise import fused_denoise_step

            methods["torch_compile"] = torch.compile(eager)
            methods["triton"] = lambda x, vc, vu, dt: fused_denoise_step(
                x, vc, dt, vu, 3.0, (-1.0, 1.0), None, "triton"
            )
            if cuda_build_problem() is None:
                methods["cuda_cpp"] = lambda x, vc, vu, dt: fused_denoise_step(
                    x, vc, dt, vu, 3.0, (-1.0, 1.0), None, "cuda"
                )
        for name, fn in methods.items():
            with torch.no_grad():
                result = measure(partial(fn, x, v_cond, v_uncond, dt), device, cfg)
            rows.append(_elementwise_row("denoise_step (cfg+clamp)", device, str(shape), name, result))
    return rows


def _elementwise_row(op, device, shape, method, result) -> dict:
    return {
        "op": op,
        "device": device.type,
        "shape": shape,
        "method": method,
        "fwd_ms": result["ms"],
        "peak_mb": result["peak_mb"],
        "error": result.get("error"),
    }


def speedups(attention: list[dict], elementwise: list[dict]) -> list[dict]:
    """The issue's targets: Triton vs FlexAttention (fwd+bwd), fused kernels vs eager (forward)."""
    by_key = {(r["op"], r["shape"], r["method"]): r for r in attention + elementwise}
    rows = []
    for (op, shape, method), row in by_key.items():
        if method not in ("triton_block_causal", "triton", "cuda_cpp"):
            continue
        baseline, column = ("flex_block_mask", "fwd_bwd_ms") if op == "attention" else ("eager", "fwd_ms")
        base = by_key.get((op, shape, baseline), {}).get(column)
        ours = row.get(column)
        ratio = base / ours if base and ours else None
        rows.append(
            {"op": op, "shape": shape, "kernel": method, "vs": f"{baseline} {column}", "speedup": ratio}
        )
    return rows


def main() -> None:
    cfg = parse_cli(KernelBenchmarkConfig)
    torch.manual_seed(0)
    if torch.cuda.is_available():
        device, dtype = torch.device("cuda"), getattr(torch, cfg.dtype)
        print(f"CUDA device: {torch.cuda.get_device_name(0)}; inputs {dtype}")
        attention = bench_attention(cfg, device, dtype, GPU_ATTENTION_SHAPES)
        elementwise = bench_elementwise(cfg, device, dtype, GPU_ADALN_SHAPES, GPU_LATENT_SHAPES)
    else:
        device, dtype = torch.device("cpu"), torch.float32
        print(
            "No CUDA device: the GPU kernel benchmark is skipped. Below are CPU timings of the PyTorch "
            "reference paths only (float32, smallest shapes); they say nothing about the kernels."
        )
        attention = bench_attention(cfg, device, dtype, CPU_ATTENTION_SHAPES)
        elementwise = bench_elementwise(cfg, device, dtype, CPU_ADALN_SHAPES, CPU_LATENT_SHAPES)
    print_table(attention, title="\nblock-causal attention")
    print_table(elementwise, title="\nAdaLN modulation and denoise step (forward)")
    ratios = speedups(attention, elementwise)
    if ratios:
        print_table(
            ratios, title="\nspeedups (targets on H100: >= 1.3x Flex fwd+bwd from 16x256; >= 2x eager)"
        )
    path = write_result(
        "kernels",
        {
            "cuda_available": device.type == "cuda",
            "dtype": str(dtype),
            "repeats": cfg.repeats,
            "threads": torch.get_num_threads(),
            "attention": attention,
            "elementwise": elementwise,
            "speedups": ratios,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
