"""The GPU path measured in one process: attention, decode, fused ops, base.yaml training and imagination.

    python benchmarks/kernels.py                  # on a CUDA machine -> benchmarks/results/kernels.json
    python benchmarks/kernels.py --smoke=true     # small shapes, any machine -> benchmarks/results/kernels_smoke.json
    bash benchmarks/gpu_session.sh                # what a session with a lent GPU runs (docs/kernels.md)

Sections (`--sections`, all by default), each figure a ratio of timings taken in this process:
- attention: block-causal attention, forward and forward+backward, our Triton kernel vs FlexAttention
  (compiled, block mask from the frame rule) vs SDPA with a dense boolean mask, for 16 frames x 256 tokens
  and for base.yaml's teacher-forced training sequence (2 * window - 1 frames of 512 tokens);
- decode: one new frame over the KV cache of base.yaml's context (inference): our split-KV kernel vs
  FlexAttention vs dense-mask SDPA, batch 1 and 16;
- elementwise: fused AdaLN (alone, and fused with the gated residual; forward and forward+backward) and the
  fused denoise step (Triton, CUDA C++ when it builds) vs eager PyTorch and torch.compile of it;
- train: base.yaml training steps/s and peak memory in bf16 (the model's own autocast loss, AdamW), one
  row per attention backend, on a generated batch;
- imagine: imagined frames/s with the KV cache at base.yaml's size (128x128, 2 views), batch 1 and 16,
  `auto` (our kernels) vs `sdpa`, bf16 autocast;
- train_run: `train_run_steps` steps of base.yaml through the shared training loop (`run_training`, as
  train_world_model.py runs it: AdamW, warmup, EMA, bf16, a checkpoint) on a generated dataset of moving
  squares steered by the actions (no LeRobot files): wall time, steps/s, peak memory, loss first vs last.

`--smoke=true` (forced without CUDA) runs every section at small shapes with tiny.yaml, the PyTorch paths
only (FlexAttention eagerly), and records the GPU-only rows as skipped with the reason: it checks that the
script runs; its timings say nothing about a GPU.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import RESULTS  # noqa: E402
from worldloop.common.config import load_config, parse_cli  # noqa: E402
from worldloop.common.run_record import print_table, write_run_record  # noqa: E402
from worldloop.cuda_ext.adaln import adaln_modulate_reference, gated_residual_adaln_reference  # noqa: E402
from worldloop.cuda_ext.attention import (  # noqa: E402
    block_causal_attention_reference,
    flex_block_causal_attention,
)
from worldloop.cuda_ext.denoise import denoise_step_reference  # noqa: E402
from worldloop.world_model.trainer import TrainWorldModelConfig  # noqa: E402

SECTIONS = ("attention", "decode", "elementwise", "train", "imagine", "train_run")
# The targets on an H100 (an H200 is labelled by its device name): name -> (ratio row, minimum)
TARGETS = {
    "attention fwd+bwd: ours vs FlexAttention": 1.3,
    "decode: ours vs dense-mask SDPA": 2.0,
    "fused AdaLN / denoise step vs eager": 2.0,
    "imagined frames/s at batch 1": 50.0,
}


@dataclass
class KernelBenchmarkConfig:
    smoke: bool = False  # small shapes and tiny.yaml, PyTorch paths only (forced without CUDA)
    sections: list[str] = field(default_factory=lambda: list(SECTIONS))
    repeats: int = 20
    warmup: int = 5
    dtype: str = "bfloat16"  # attention / elementwise inputs on CUDA (smoke: float32)
    model_config: str = "configs/world_model/base.yaml"  # smoke: configs/world_model/tiny.yaml
    train_steps: int = 10  # timed optimiser steps per attention backend (after up to 3 warm-up steps)
    train_batch: int = 0  # 0: the config's train.batch_size
    train_run_steps: int = 200
    imagine_frames: int = 16  # frames imagined per timed rollout
    out: str = ""  # "": benchmarks/results/kernels.json (kernels_smoke.json with smoke)

    def apply_smoke(self) -> None:
        """Small enough for a test on a shared CPU: tiny.yaml further shrunk by `smoke_model`."""
        self.model_config = "configs/world_model/tiny.yaml"
        self.repeats, self.warmup = min(self.repeats, 2), 1
        self.train_steps, self.train_batch = min(self.train_steps, 2), self.train_batch or 2
        self.train_run_steps, self.imagine_frames = min(self.train_run_steps, 3), min(self.imagine_frames, 2)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> dict:
    """Mean wall time per call (ms) after warm-up, and the peak memory of one call above what was allocated
    before it (MB, CUDA only); errors (out of memory, a path that cannot take the shape) become the row's."""
    try:
        for _ in range(warmup):
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
        for _ in range(repeats):
            fn()
        _sync(device)
        return {"ms": (time.perf_counter() - start) * 1e3 / repeats, "peak_mb": peak_mb, "error": None}
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"ms": None, "peak_mb": None, "error": "out of memory"}
    except Exception as err:  # a path that cannot run this shape is a result, not a crash
        return {"ms": None, "peak_mb": None, "error": f"{type(err).__name__}: {str(err)[:300]}"}


def _skipped(reason: str) -> dict:
    return {"ms": None, "peak_mb": None, "error": f"skipped: {reason}"}


def _forward_backward(fn: Callable, *inputs: torch.Tensor) -> Callable[[], object]:
    def run():
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(outs, inputs, [torch.ones_like(o) for o in outs])

    return run


def _ratio(base: float | None, ours: float | None) -> float | None:
    return base / ours if base and ours else None


# ---- attention and decode -----------------------------------------------------------------------------


def attention_methods(frame_len, window, teacher_forced, device) -> dict[str, Callable | str]:
    """name -> attn(q, k, v), or the reason it cannot run here. The dense mask and the block mask are cached
    per shape by cuda_ext, so they are built in the warm-up, outside the timing."""
    methods: dict[str, Callable | str] = {
        "sdpa_dense_mask": partial(
            block_causal_attention_reference,
            frame_len=frame_len,
            window=window,
            teacher_forced=teacher_forced,
        ),
        "flex_block_mask": partial(
            flex_block_causal_attention, frame_len=frame_len, window=window, teacher_forced=teacher_forced
        ),
    }
    if device.type == "cuda":
        from worldloop.cuda_ext.triton_kernels.attention import triton_block_causal_attention

        methods["ours_triton"] = partial(
            triton_block_causal_attention, frame_len=frame_len, window=window, teacher_forced=teacher_forced
        )
    else:
        methods["ours_triton"] = "needs CUDA (Triton)"
    return methods


def _attention_row(section, label, layout, shape, method, device, fwd, fwd_bwd=None) -> dict:
    return {
        "section": section,
        "shape": label,
        "layout": layout,
        "B, H, Lq, Lk, D": shape,
        "method": method if not (method == "flex_block_mask" and device.type != "cuda") else "flex_eager",
        "fwd_ms": fwd["ms"],
        "fwd_bwd_ms": fwd_bwd["ms"] if fwd_bwd else None,
        "peak_mb": (fwd_bwd or fwd)["peak_mb"],
        "error": fwd["error"] or (fwd_bwd or {}).get("error"),
    }


def bench_attention(cfg, device, dtype, shapes) -> list[dict]:
    """Training-layout attention: forward (no grad) and forward+backward of each method."""
    rows = []
    for label, layout, batch, heads, frames, frame_len, head_dim, window in shapes:
        length, teacher_forced = frames * frame_len, layout == "teacher_forced"
        q, k, v = (
            torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        shape = f"{batch}, {heads}, {length}, {length}, {head_dim}"
        for name, attn in attention_methods(frame_len, window, teacher_forced, device).items():
            if isinstance(attn, str):
                rows.append(_attention_row("attention", label, layout, shape, name, device, _skipped(attn)))
                continue
            with torch.no_grad():
                fwd = measure(partial(attn, q, k, v), device, cfg.repeats, cfg.warmup)
            fwd_bwd = measure(_forward_backward(attn, q, k, v), device, cfg.repeats, cfg.warmup)
            rows.append(_attention_row("attention", label, layout, shape, name, device, fwd, fwd_bwd))
        del q, k, v
    return rows


def bench_decode(cfg, device, dtype, shapes) -> list[dict]:
    """Inference decode: the newest frame's queries over the cached context plus itself."""
    rows = []
    for label, batch, heads, cached_frames, frame_len, head_dim in shapes:
        lk = (cached_frames + 1) * frame_len
        q = torch.randn(batch, heads, frame_len, head_dim, device=device, dtype=dtype)
        k, v = (torch.randn(batch, heads, lk, head_dim, device=device, dtype=dtype) for _ in range(2))
        shape = f"{batch}, {heads}, {frame_len}, {lk}, {head_dim}"
        for name, attn in attention_methods(frame_len, cached_frames + 1, False, device).items():
            if isinstance(attn, str):
                result = _skipped(attn)
            else:
                with torch.no_grad():  # no grad: our kernel takes the split-KV path
                    result = measure(partial(attn, q, k, v), device, cfg.repeats, cfg.warmup)
            rows.append(_attention_row("decode", label, "block_causal", shape, name, device, result))
    return rows


# ---- fused elementwise ops ---------------------------------------------------------------------------


def bench_elementwise(cfg, device, dtype, adaln_shapes, latent_shapes) -> list[dict]:
    """AdaLN modulation (forward and forward+backward) and the denoise step (forward): eager reference,
    torch.compile of it, our kernels (CUDA only)."""
    rows = []
    on_cuda = device.type == "cuda"
    for batch, frames, frame_len, channels in adaln_shapes:
        x, y = (
            torch.randn(batch, frames * frame_len, channels, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2)
        )
        gate, shift, scale = (
            torch.randn(batch, frames, channels, device=device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        shape = f"x {tuple(x.shape)}, {frames} frames"
        ops = {
            "adaln_modulate": (adaln_modulate_reference, (x, shift, scale)),
            "gated_residual_adaln": (gated_residual_adaln_reference, (x, y, gate, shift, scale)),
        }
        for op, (reference, args) in ops.items():
            methods = {
                "eager": reference,
                "torch_compile": COMPILE_ON_CPU,
                "ours_triton": "needs CUDA (Triton)",
            }
            if on_cuda:
                from worldloop.cuda_ext.triton_kernels import adaln as triton_adaln

                methods["torch_compile"] = torch.compile(reference)
                methods["ours_triton"] = getattr(triton_adaln, f"triton_{op}")
            for name, fn in methods.items():
                if isinstance(fn, str):
                    rows.append(_elementwise_row(op, shape, name, _skipped(fn), None))
                    continue
                fn = partial(fn, frame_len=frame_len)
                with torch.no_grad():
                    fwd = measure(partial(fn, *args), device, cfg.repeats, cfg.warmup)
                fwd_bwd = measure(_forward_backward(fn, *args), device, cfg.repeats, cfg.warmup)
                rows.append(_elementwise_row(op, shape, name, fwd, fwd_bwd))
    for shape in latent_shapes:
        x, v_cond, v_uncond = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
        dt = torch.full((shape[0],), -0.25, device=device)

        def eager(x, v_cond, v_uncond, dt):
            return denoise_step_reference(x, v_cond, dt, v_uncond, 3.0, (-1.0, 1.0))

        methods = {"eager": eager}
        if on_cuda:
            from worldloop.cuda_ext.cuda_build import cuda_build_problem
            from worldloop.cuda_ext.fused_denoise import fused_denoise_step

            methods["torch_compile"] = torch.compile(eager)
            methods["ours_triton"] = lambda x, vc, vu, dt: fused_denoise_step(
                x, vc, dt, vu, 3.0, (-1.0, 1.0), None, "triton"
            )
            problem = cuda_build_problem()
            methods["ours_cuda_cpp"] = problem or (
                lambda x, vc, vu, dt: fused_denoise_step(x, vc, dt, vu, 3.0, (-1.0, 1.0), None, "cuda")
            )
        else:
            methods["torch_compile"], methods["ours_triton"] = COMPILE_ON_CPU, "needs CUDA (Triton)"
        for name, fn in methods.items():
            if isinstance(fn, str):
                rows.append(
                    _elementwise_row("denoise_step (cfg+clamp)", str(shape), name, _skipped(fn), None)
                )
                continue
            with torch.no_grad():
                result = measure(partial(fn, x, v_cond, v_uncond, dt), device, cfg.repeats, cfg.warmup)
            rows.append(_elementwise_row("denoise_step (cfg+clamp)", str(shape), name, result, None))
    return rows


COMPILE_ON_CPU = "CPU: a GPU baseline (compiling it here would take longer than the smoke run)"


def _elementwise_row(op, shape, method, fwd, fwd_bwd) -> dict:
    return {
        "op": op,
        "shape": shape,
        "method": method,
        "fwd_ms": fwd["ms"],
        "fwd_bwd_ms": fwd_bwd["ms"] if fwd_bwd else None,
        "peak_mb": fwd["peak_mb"],
        "error": fwd["error"] or (fwd_bwd or {}).get("error"),
    }


# ---- the world model: training and imagination ------------------------------------------------------


def moving_squares(n: int, window: int, num_views: int, size: int, action_dim: int, seed: int) -> dict:
    """A generated training set: each view shows a square whose motion the actions steer (action i moves
    it from frame i to frame i + 1; view v sees the scene mirrored v times), so the next frame is predictable
    from the last one and the action. frames [n, window, V, 3, size, size] uint8, actions [n, window, A]."""
    g = torch.Generator().manual_seed(seed)
    actions = torch.rand(n, window, action_dim, generator=g) * 2 - 1
    half = size // 8
    pos = torch.rand(n, 2, generator=g) * (size - 2 * half) + half
    steps = [pos]
    for i in range(window - 1):
        pos = (pos + actions[:, i, :2] * size / 16).clamp(half, size - half)
        steps.append(pos)
    centre = torch.stack(steps, 1)  # [n, window, 2]
    grid = torch.arange(size).float()
    inside_y = (grid[None, None, :] - centre[..., 0:1]).abs() < half
    inside_x = (grid[None, None, :] - centre[..., 1:2]).abs() < half
    square = inside_y[..., :, None] & inside_x[..., None, :]  # [n, window, size, size]
    colour = (torch.rand(n, 1, 3, 1, 1, generator=g) * 200 + 55).to(torch.uint8)
    views = [square if v % 2 == 0 else square.flip(-1) for v in range(num_views)]
    frames = torch.stack([s[:, :, None] * colour for s in views], 2)  # [n, window, V, 3, size, size]
    return {"frames": frames.to(torch.uint8), "actions": actions}


class GeneratedWindows(torch.utils.data.Dataset):
    """`moving_squares` as WorldModelWindows-like items for the shared training loop."""

    def __init__(self, data: dict):
        self.data = data

    def __len__(self) -> int:
        return len(self.data["frames"])

    def __getitem__(self, i: int) -> dict:
        return {"frames": self.data["frames"][i], "actions": self.data["actions"][i]}


def _world_model(train_cfg: TrainWorldModelConfig, backend: str, device: torch.device):
    from worldloop.world_model.model import WorldModel

    train_cfg.model.dit.attention_backend = backend
    torch.manual_seed(0)
    return WorldModel(train_cfg.model).to(device)


def _peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None


def _reset_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _backends(device: torch.device) -> dict[str, str | None]:
    """Attention backend -> why it cannot run here (None: it can)."""
    return {"sdpa": None, "flex": None, "triton": None if device.type == "cuda" else "needs CUDA (Triton)"}


def _train_step(model, optimizer, data: dict, precision: torch.dtype | None) -> torch.Tensor:
    with torch.autocast(data["frames"].device.type, dtype=precision, enabled=precision is not None):
        loss, _ = model.compute_loss(data["frames"], data["actions"])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def _time_training(cfg, device, train_cfg, backend: str, batch: int, precision) -> dict:
    """Steps/s, samples/s and peak memory of `cfg.train_steps` optimiser steps (after up to 3 warm-up steps
    that compile the kernels and allocate the optimiser state) on a generated batch."""
    dit = train_cfg.model.dit
    data = moving_squares(batch, train_cfg.window, dit.num_views, dit.image_size, dit.action_dim, seed=1)
    data = {k: v.to(device) for k, v in data.items()}
    _reset_memory(device)
    model = _world_model(train_cfg, backend, device)
    step = partial(_train_step, model, torch.optim.AdamW(model.parameters(), lr=1e-4), data, precision)
    for _ in range(max(1, min(cfg.warmup, 3))):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(cfg.train_steps):
        loss = step()
    _sync(device)
    seconds = (time.perf_counter() - start) / cfg.train_steps
    return {"steps_per_s": 1 / seconds, "samples_per_s": batch / seconds, "peak_mb": _peak_mb(device),
            "loss": loss.item(), "error": None}  # fmt: skip


def bench_train(cfg, device, train_cfg: TrainWorldModelConfig) -> list[dict]:
    """Optimiser steps/s and peak memory of the config's model in its mixed precision, per attention backend.
    A batch that does not fit is recorded as such, then halved until one fits."""
    precision = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(train_cfg.train.mixed_precision)
    rows = []
    for backend, why_not in _backends(device).items():
        batch = cfg.train_batch or train_cfg.train.batch_size
        while batch >= 1:
            row = {
                "backend": backend,
                "batch": batch,
                "window": train_cfg.window,
                "precision": str(precision or torch.float32),
            }
            if why_not:
                rows.append({**row, "steps_per_s": None, "peak_mb": None, "error": f"skipped: {why_not}"})
                break
            try:
                row.update(_time_training(cfg, device, train_cfg, backend, batch, precision))
            except torch.cuda.OutOfMemoryError:
                row.update(steps_per_s=None, peak_mb=None, error="out of memory")
            except Exception as err:
                row.update(steps_per_s=None, peak_mb=None, error=f"{type(err).__name__}: {str(err)[:300]}")
            rows.append(row)
            _reset_memory(device)
            if row["error"] != "out of memory":
                break
            batch //= 2
    return rows


def _rollout(model, data: dict, context: int, precision: torch.dtype | None, horizon: int):
    """A KV-cache rollout of `horizon` frames after `context` frames of `data` (on the model's device)."""
    device = next(model.parameters()).device
    frames, actions = data["frames"].to(device), data["actions"].to(device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.autocast(device.type, dtype=precision or torch.bfloat16, enabled=precision is not None):
        return model.rollout(
            frames[:, :context], actions[:, : context - 1], actions[:, context - 1 : context - 1 + horizon],
            generator=gen, use_cache=True,
        )  # fmt: skip


def bench_imagine(cfg, device, train_cfg: TrainWorldModelConfig) -> list[dict]:
    """Imagined frames/s of a KV-cache rollout from the config's eval context, batch 1 and 16."""
    dit = train_cfg.model.dit
    context = train_cfg.eval.context
    batches = (1, 2) if cfg.smoke else (1, 16)
    precision = torch.bfloat16 if device.type == "cuda" else None
    rows = []
    for backend in ("auto", "sdpa"):
        model = _world_model(train_cfg, backend, device).eval()
        for batch in batches:
            data = moving_squares(
                batch, context + cfg.imagine_frames, dit.num_views, dit.image_size, dit.action_dim, 2
            )
            rollout = partial(_rollout, model, data, context, precision)
            row = {"backend": backend, "batch": batch, "views": dit.num_views, "size": dit.image_size}
            try:
                rollout(2)  # warm-up: compiles the kernels for these shapes
                _sync(device)
                start = time.perf_counter()
                rollout(cfg.imagine_frames)
                _sync(device)
                seconds = time.perf_counter() - start
                row.update(
                    frames_per_s=batch * cfg.imagine_frames / seconds,
                    view_frames_per_s=batch * cfg.imagine_frames * dit.num_views / seconds,
                    sampler_steps=train_cfg.model.sampler.steps,
                    error=None,
                )
            except torch.cuda.OutOfMemoryError:
                row.update(frames_per_s=None, error="out of memory")
            except Exception as err:
                row.update(frames_per_s=None, error=f"{type(err).__name__}: {str(err)[:300]}")
            rows.append(row)
        model = None
        _reset_memory(device)
    return rows


def train_run(cfg, device, train_cfg: TrainWorldModelConfig) -> dict:
    """`train_run_steps` steps of the config through the shared training loop on a generated dataset."""
    from worldloop.common.training import run_training

    loop = train_cfg.train
    loop.steps = cfg.train_run_steps
    loop.batch_size = cfg.train_batch or loop.batch_size
    loop.warmup_steps = min(loop.warmup_steps, max(1, loop.steps // 10))
    loop.checkpoint_every = loop.log_every = loop.steps
    loop.eval_every, loop.report_to, loop.num_workers = 0, "none", 0
    dit = train_cfg.model.dit
    windows = GeneratedWindows(
        moving_squares(
            max(4 * loop.batch_size, 64), train_cfg.window, dit.num_views, dit.image_size, dit.action_dim, 3
        )
    )
    losses = []

    def loss_fn(model, batch):
        loss, logs = model(batch)
        losses.append(logs["loss/diffusion"])
        return loss, logs

    out_of_memory_at = []
    while True:
        _reset_memory(device)
        model = _world_model(train_cfg, dit.attention_backend, device)
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as out:
                run_training(model, windows, loss_fn, loop, out, lambda m, path: m.save_pretrained(path))
                saved = sorted(p.name for p in (Path(out) / "pretrained_model").iterdir())
            break
        except torch.cuda.OutOfMemoryError:
            if loop.batch_size == 1:
                raise
            out_of_memory_at.append(loop.batch_size)  # recorded, then the run starts over at half the batch
            loop.batch_size //= 2
            losses.clear()
            model = None
    seconds = time.perf_counter() - start
    tenth = max(1, len(losses) // 10)
    return {
        "steps": loop.steps,
        "batch": loop.batch_size,
        "out_of_memory_at_batch": out_of_memory_at,
        "attention_backend": dit.attention_backend,
        "precision": loop.mixed_precision,
        "wall_s": seconds,
        "steps_per_s_wall": loop.steps / seconds,  # start to end: compiling and the checkpoint included
        "peak_mb": _peak_mb(device),
        "diffusion_loss_first_tenth": sum(losses[:tenth]) / tenth,
        "diffusion_loss_last_tenth": sum(losses[-tenth:]) / tenth,
        "exported": saved,
    }


# ---- ratios, targets, main ----------------------------------------------------------------------------


def _what(row: dict) -> tuple[str, str]:
    """(section or op, shape): rows comparable with each other."""
    return row.get("section", row.get("op")), row["shape"]


def speedups(attention: list[dict], elementwise: list[dict]) -> list[dict]:
    """Ours vs each baseline on the same shape (base time / our time), per timing column: what the targets read."""
    rows = []
    for section_rows in (attention, elementwise):
        for ours in (r for r in section_rows if r["method"].startswith("ours")):
            bases = (
                r for r in section_rows if not r["method"].startswith("ours") and _what(r) == _what(ours)
            )
            for base in bases:
                for column in ("fwd_ms", "fwd_bwd_ms"):
                    ratio = _ratio(base.get(column), ours.get(column))
                    if ratio is not None:
                        what, shape = _what(ours)
                        rows.append(
                            {"what": what, "shape": shape, "ours": ours["method"], "vs": base["method"],
                             "timing": column, "speedup": ratio}
                        )  # fmt: skip
    return rows


def target_checks(ratios: list[dict], imagine: list[dict]) -> list[dict]:
    """Each target of the issue against the measured figure (None: not measured here)."""

    def worst(pred) -> float | None:
        values = [r["speedup"] for r in ratios if pred(r)]
        return min(values) if values else None

    attention = worst(
        lambda r: r["what"] == "attention" and r["vs"] == "flex_block_mask" and r["timing"] == "fwd_bwd_ms"
    )
    decode = worst(
        lambda r: r["what"] == "decode" and r["vs"] == "sdpa_dense_mask" and r["ours"] == "ours_triton"
    )
    fused = worst(lambda r: r["vs"] == "eager" and r["timing"] == "fwd_ms" and r["ours"] == "ours_triton")
    batch1 = [
        r["frames_per_s"]
        for r in imagine
        if r["backend"] == "auto" and r["batch"] == 1 and r.get("frames_per_s")
    ]
    figures = [attention, decode, fused, batch1[0] if batch1 else None]
    return [
        {"target": name, "minimum": minimum, "measured (worst shape)": got, "met": None if got is None else got >= minimum}
        for (name, minimum), got in zip(TARGETS.items(), figures)
    ]  # fmt: skip


def smoke_model(train_cfg: TrainWorldModelConfig) -> TrainWorldModelConfig:
    """tiny.yaml shrunk to seconds a step on a shared CPU: 32x32 frames of 4 tokens, one block, 3 frames."""
    dit = train_cfg.model.dit
    dit.image_size, dit.patch_size, dit.width, dit.depth, dit.heads = 32, 16, 32, 1, 2
    dit.output_conv_channels, dit.context_frames = 8, 2
    train_cfg.model.idm.channels = 8
    train_cfg.window, train_cfg.eval.context = 3, 2
    return train_cfg


def world_model_config(cfg: KernelBenchmarkConfig) -> TrainWorldModelConfig:
    """The benchmarked model's config (a fresh copy each call: the sections set its attention backend)."""
    train_cfg = load_config(TrainWorldModelConfig, cfg.model_config)
    return smoke_model(train_cfg) if cfg.smoke else train_cfg


def _shapes(cfg, train_cfg: TrainWorldModelConfig, device):
    """Attention, decode, AdaLN and latent shapes: the issue's and the config's (small ones for smoke)."""
    dit = train_cfg.model.dit
    head_dim, heads, fl = dit.width // dit.heads, dit.heads, dit.frame_len
    batch = cfg.train_batch or train_cfg.train.batch_size
    tf_frames, window = 2 * train_cfg.window - 1, dit.context_frames + 1
    name = "smoke model" if cfg.smoke else Path(cfg.model_config).name
    if cfg.smoke:
        attention = [
            ("block-causal 4x16", "block_causal", 1, 2, 4, 16, 16, None),
            (f"{name} training", "teacher_forced", batch, heads, tf_frames, fl, head_dim, window),
        ]
        decode = [(f"{name} decode B1", 1, heads, dit.context_frames, fl, head_dim)]
        return attention, decode, [(2, 3, 16, 32)], [(2, dit.num_views, 3, 16, 16)]
    attention = [
        ("16x256 block-causal", "block_causal", 4, 8, 16, 256, 64, None),
        (f"{name} training", "teacher_forced", batch, heads, tf_frames, fl, head_dim, window),
    ]
    decode = [(f"{name} decode B{b}", b, heads, dit.context_frames, fl, head_dim) for b in (1, 16)]
    adaln = [(batch, tf_frames, fl, dit.width)]
    latent = [(16, dit.num_views, 3, dit.image_size, dit.image_size), (16, 16, 4, 64, 64)]
    return attention, decode, adaln, latent


def _versions(device: torch.device) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))
        if device.type == "cuda"
        else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
    }


def main() -> None:
    cfg = parse_cli(KernelBenchmarkConfig)
    unknown = sorted(set(cfg.sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"--sections: unknown {unknown}; expected some of {list(SECTIONS)}")
    if not cfg.sections:
        raise ValueError(f"--sections: empty; expected some of {list(SECTIONS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not cfg.smoke:
        print("No CUDA device: running the smoke mode (small shapes, PyTorch paths; GPU rows skipped).")
        cfg.smoke = True
    if cfg.smoke:
        cfg.apply_smoke()
    dtype = getattr(torch, cfg.dtype) if device.type == "cuda" else torch.float32
    train_cfg = world_model_config(cfg)
    attention_shapes, decode_shapes, adaln_shapes, latent_shapes = _shapes(cfg, train_cfg, device)
    versions = _versions(device)
    print(
        f"device {versions['device']}, torch {versions['torch']}, triton {versions['triton']}, inputs {dtype}"
    )
    torch.manual_seed(0)
    figures: dict = {"mode": "smoke" if cfg.smoke else "full", **versions, "dtype": str(dtype)}
    figures["shapes"] = {
        "attention": attention_shapes,
        "decode": decode_shapes,
        "adaln": adaln_shapes,
        "latent": latent_shapes,
        "fields": {
            "attention": "label, layout, batch, heads, frames, frame_len, head_dim, window",
            "decode": "label, batch, heads, cached frames, frame_len, head_dim",
            "adaln": "batch, frames, frame_len, channels",
            "latent": "denoised tensor",
        },
    }
    figures["timings"] = {"repeats": cfg.repeats, "warmup": cfg.warmup, "section_seconds": {}}
    sections = {
        "attention": lambda: bench_attention(cfg, device, dtype, attention_shapes),
        "decode": lambda: bench_decode(cfg, device, dtype, decode_shapes),
        "elementwise": lambda: bench_elementwise(cfg, device, dtype, adaln_shapes, latent_shapes),
        "train": lambda: bench_train(cfg, device, world_model_config(cfg)),
        "imagine": lambda: bench_imagine(cfg, device, world_model_config(cfg)),
        "train_run": lambda: [train_run(cfg, device, world_model_config(cfg))],
    }
    default = "kernels_smoke.json" if cfg.smoke else "kernels.json"
    path = Path(cfg.out or RESULTS / default)
    figures["sections_done"] = []
    for name in SECTIONS:
        if name in cfg.sections:
            start = time.perf_counter()
            figures[name] = sections[name]()
            seconds = figures["timings"]["section_seconds"][name] = time.perf_counter() - start
            print_table(figures[name], title=f"\n{name} ({seconds:.0f} s)")
            figures["sections_done"].append(name)
            # written after every section: a run stopped at a time limit keeps what it measured
            write_run_record(path, "kernels", summarise(figures, smoke=cfg.smoke))
    print_table(figures["speedups"], title="\nspeedups (ours vs each baseline, same process)")
    print_table(figures["targets"], title=f"\ntargets (set for an H100; this device: {versions['device']})")
    print(f"\nwrote {path}")


def summarise(figures: dict, smoke: bool) -> dict:
    """Add the speedups and the target checks of the sections measured so far to `figures` (in place)."""
    ratios = speedups(
        figures.get("attention", []) + figures.get("decode", []), figures.get("elementwise", [])
    )
    figures["speedups"] = ratios
    figures["targets"] = target_checks(ratios, figures.get("imagine", []))
    if smoke:  # small shapes: the figures check the code paths, not the H100 targets
        figures["targets"] = [
            {**t, "met": None, "note": "not judged: smoke shapes"} for t in figures["targets"]
        ]
    return figures


if __name__ == "__main__":
    main()
