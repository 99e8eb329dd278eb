"""The supervised training loop shared by the world-model and policy trainers.

Runs under `accelerate launch` (DDP on GPUs, or several CPU processes with gloo) or as a plain single
process. It owns what every trainer needs and models must not know about: the optimiser and the
warmup + cosine schedule, gradient accumulation and clipping, EMA weights, TensorBoard/wandb logging, a tqdm
bar, periodic evaluation, atomic checkpoints and exact resume.

Exact resume: the data order is a pure function of (seed, epoch, rank), so a checkpoint only has to record
the epoch and the number of batches already consumed; together with the optimiser, scheduler, EMA and every
rank's RNG state, the step after a resume computes the same loss as the uninterrupted run.

Layout under `output_dir`:
    checkpoints/<step:07d>/pretrained_model/   what `save_pretrained` writes (EMA weights when EMA is on)
    checkpoints/<step:07d>/training_state/     model.safetensors (raw), ema.safetensors, optimizer.pt,
                                               scheduler.pt, rng.pt, state.json
    checkpoints/last                           name of the newest complete checkpoint
    pretrained_model/                          the final export
    logs/                                      TensorBoard (or wandb) logs
    eval/<step>/                               whatever `eval_fn` writes (videos, plots)
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from worldloop.common.checkpoint import (
    atomic_directory,
    atomic_write_text,
    load_json,
    load_tensors,
    load_torch,
    save_json,
    save_tensors,
    save_torch,
)
from worldloop.common.ema import EMA
from worldloop.common.run_record import cpu_model

LossFn = Callable[[nn.Module, dict], "tuple[torch.Tensor, dict[str, float]]"]
SaveFn = Callable[[nn.Module, Path], None]
EvalFn = Callable[[nn.Module, int, Path], "dict[str, float]"]

logger = logging.getLogger(__name__)


@dataclass
class TrainLoopConfig:
    steps: int = 2000  # optimiser steps
    batch_size: int = 32  # per process and micro-batch
    grad_accum: int = 1
    lr: float = 3e-4
    weight_decay: float = 0.01
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # the cosine schedule ends at lr * min_lr_ratio
    grad_clip: float = 1.0  # 0 disables clipping
    ema_decay: float = 0.999  # 0 disables EMA
    checkpoint_every: int = 500
    keep_checkpoints: int = 2  # the newest N; 0 keeps every one (snapshots for a policy zoo)
    log_every: int = 20
    eval_every: int = 0  # 0: evaluate only at the end
    mixed_precision: str = "no"  # no | fp16 | bf16
    num_workers: int = 0
    seed: int = 0
    report_to: str = "tensorboard"  # tensorboard | wandb | none
    find_unused_parameters: bool = False


def _validate(cfg: TrainLoopConfig) -> None:
    positive = ("steps", "batch_size", "grad_accum", "checkpoint_every", "log_every")
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"train.{name} must be positive, got {getattr(cfg, name)}")
    if cfg.mixed_precision not in ("no", "fp16", "bf16"):
        raise ValueError(f"train.mixed_precision must be no, fp16 or bf16, got {cfg.mixed_precision!r}")
    if cfg.report_to not in ("tensorboard", "wandb", "none"):
        raise ValueError(f"train.report_to must be tensorboard, wandb or none, got {cfg.report_to!r}")
    if not 0.0 <= cfg.ema_decay < 1.0:
        raise ValueError(f"train.ema_decay must be in [0, 1), got {cfg.ema_decay}")
    if cfg.keep_checkpoints < 0:
        raise ValueError(
            f"train.keep_checkpoints must be >= 0 (0 keeps every one), got {cfg.keep_checkpoints}"
        )


def check_launcher_flags(cfg: TrainLoopConfig, env: dict[str, str] | None = None) -> str | None:
    """Reconcile what `accelerate launch` passes through the environment with the loop's own settings.

    The loop counts optimiser steps itself (`train.grad_accum` micro-batches per step). accelerate reads
    ACCELERATE_GRADIENT_ACCUMULATION_STEPS (its `--gradient_accumulation_steps`) before the value it is
    given, so another value there would make it skip optimiser steps that the loop, its schedule and its
    checkpoints count: that is an error. Its `--mixed_precision` (and `accelerate config`'s) arrives as
    ACCELERATE_MIXED_PRECISION but the value the loop passes wins: a different one gets the returned warning.
    """
    env = os.environ if env is None else env
    accum = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    if accum is not None and accum.strip() != str(cfg.grad_accum):
        raise ValueError(
            f"accelerate's gradient accumulation ({accum!r}: accelerate launch --gradient_accumulation_steps "
            f"or ACCELERATE_GRADIENT_ACCUMULATION_STEPS) differs from train.grad_accum={cfg.grad_accum}; the "
            f"loop counts optimiser steps itself: drop the launcher flag and pass --train.grad_accum={accum}"
        )
    precision = env.get("ACCELERATE_MIXED_PRECISION", "").strip().lower()
    if precision and precision != cfg.mixed_precision:
        return (
            f"accelerate's mixed precision {precision!r} (accelerate launch --mixed_precision or accelerate "
            f"config) is ignored: this run uses train.mixed_precision={cfg.mixed_precision!r}; pass "
            f"--train.mixed_precision={precision} to change it"
        )
    return None


def cpu_bf16_note(cfg: TrainLoopConfig, device_type: str, extensions: list[str] | None) -> str | None:
    """A warning for bf16 trained on a CPU whose `extensions` (run_record.cpu_model's) lack bf16 instructions:
    there it is emulated, and a step took 10x longer than fp32 (docs/experiments.md, 2026-12-04). None where
    bf16 is not asked for, the training device (`device_type`) is not the CPU, or the extensions are unknown."""
    if cfg.mixed_precision != "bf16" or device_type != "cpu" or extensions is None:
        return None
    if {"avx512_bf16", "amx_tile"} & set(extensions):
        return None
    return (
        "train.mixed_precision='bf16' on a CPU without bf16 instructions (no avx512_bf16 or amx): it is "
        "emulated, and was measured 10x slower than fp32 on such a CPU; pass --train.mixed_precision=no"
    )


def lr_lambda(cfg: TrainLoopConfig) -> Callable[[int], float]:
    """Linear warmup, then cosine decay from 1 to `min_lr_ratio` at `steps`."""

    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / max(1, cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


class EpochBatches:
    """Batches of dataset indices for one rank: a seeded permutation per epoch, split across ranks."""

    def __init__(self, num_items: int, batch_size: int, seed: int, rank: int, world_size: int):
        self.per_rank = num_items // world_size
        self.batches_per_epoch = self.per_rank // batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the training set has {num_items} items: too few for batch_size {batch_size} on "
                f"{world_size} process(es); lower train.batch_size or add data"
            )
        self.num_items, self.batch_size, self.seed = num_items, batch_size, seed
        self.rank, self.world_size = rank, world_size

    def epoch(self, epoch: int, start_batch: int = 0) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(self.num_items, generator=g)[: self.per_rank * self.world_size]
        mine = perm[self.rank :: self.world_size].tolist()
        batches = [
            mine[i * self.batch_size : (i + 1) * self.batch_size] for i in range(self.batches_per_epoch)
        ]
        return batches[start_batch:]


def _checkpoint_dirs(output_dir: Path) -> list[Path]:
    root = output_dir / "checkpoints"
    return sorted(p for p in root.glob("[0-9]*") if p.is_dir()) if root.is_dir() else []


def last_checkpoint(output_dir: str | Path) -> Path | None:
    output_dir = Path(output_dir)
    marker = output_dir / "checkpoints" / "last"
    if marker.is_file():
        path = output_dir / "checkpoints" / marker.read_text().strip()
        if path.is_dir():
            return path
    dirs = _checkpoint_dirs(output_dir)
    return dirs[-1] if dirs else None


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def run_training(
    model: nn.Module,
    train_dataset: Dataset,
    loss_fn: LossFn,
    cfg: TrainLoopConfig,
    output_dir: str | Path,
    save_pretrained: SaveFn,
    resume: bool = False,
    eval_fn: EvalFn | None = None,
    collate_fn: Callable | None = None,
) -> nn.Module:
    """Train `model` on `train_dataset`; returns the EMA (or raw) unwrapped model. See the module docstring."""
    from accelerate import Accelerator
    from accelerate.utils import AutocastKwargs, DistributedDataParallelKwargs, gather_object

    _validate(cfg)
    launcher_note = check_launcher_flags(cfg)
    output_dir = Path(output_dir)
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision,
        gradient_accumulation_steps=cfg.grad_accum,
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_dir=str(output_dir / "logs"),
        kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=cfg.find_unused_parameters),
            # Autocast caches each weight's low-precision copy until its outermost region ends. A model whose
            # forward runs a pass under no_grad first (the world model's context and self-rollout passes)
            # would cache copies without a graph, and the passes after would train nothing through them:
            # under bf16 the DiT got no gradient at all and its output layer stayed at its zero init.
            AutocastKwargs(cache_enabled=False),
        ],
    )
    rank, world = accelerator.process_index, accelerator.num_processes
    precision_note = cpu_bf16_note(cfg, accelerator.device.type, cpu_model()["cpu_extensions"])
    for note in (launcher_note, precision_note):
        if note and accelerator.is_main_process:
            logger.warning(note)
    if accelerator.device.type == "cpu" and world > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Several CPU processes on one machine: split the cores instead of oversubscribing them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    resume_from = last_checkpoint(output_dir) if resume else None
    if resume and resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {output_dir / 'checkpoints'}")

    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.99),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    ema = EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 else None

    step, epoch, batch_in_epoch = 0, 0, 0
    if resume_from is not None:
        state_dir = resume_from / "training_state"
        model.load_state_dict(load_tensors(state_dir / "model.safetensors"))
        optimizer.load_state_dict(load_torch(state_dir / "optimizer.pt"))
        scheduler.load_state_dict(load_torch(state_dir / "scheduler.pt"))
        meta = load_json(state_dir / "state.json")
        step, epoch, batch_in_epoch = meta["step"], meta["epoch"], meta["batch_in_epoch"]
        if meta["world_size"] != world:
            raise ValueError(
                f"{resume_from}: written by {meta['world_size']} process(es), resumed with {world}; "
                "exact resume needs the same number of processes"
            )
        if ema is not None:
            ema.load_state_dict(load_tensors(state_dir / "ema.safetensors"), meta["ema_updates"])
    else:
        # Different noise on each rank, reproducible from the seed.
        torch.manual_seed(cfg.seed * 1000 + rank)

    model, optimizer = accelerator.prepare(model, optimizer)
    if ema is not None:
        ema.model.to(accelerator.device)
    if resume_from is not None:
        _set_rng_state(load_torch(resume_from / "training_state" / "rng.pt")[rank])
        accelerator.print(f"resumed from {resume_from} at step {step}")

    if accelerator.is_main_process and cfg.report_to != "none":
        accelerator.init_trackers("worldloop", config={k: v for k, v in vars(cfg).items()})

    batches = EpochBatches(len(train_dataset), cfg.batch_size, cfg.seed, rank, world)

    def micro_batches() -> Iterator[dict]:
        nonlocal epoch, batch_in_epoch
        while True:
            loader = DataLoader(
                train_dataset,
                batch_sampler=batches.epoch(epoch, batch_in_epoch),
                num_workers=cfg.num_workers,
                collate_fn=collate_fn,
                # Its own generator: creating a loader must not draw from the global RNG, or a resumed run
                # would diverge from the uninterrupted one.
                generator=torch.Generator().manual_seed(cfg.seed + epoch),
            )
            for batch in loader:
                batch_in_epoch += 1
                yield _to_device(batch, accelerator.device)
            epoch, batch_in_epoch = epoch + 1, 0

    def export_model() -> nn.Module:
        return ema.model if ema is not None else accelerator.unwrap_model(model)

    def save_checkpoint() -> None:
        rng_states = gather_object([_rng_state()])
        if not accelerator.is_main_process:
            return
        target = output_dir / "checkpoints" / f"{step:07d}"
        with atomic_directory(target) as tmp:
            save_pretrained(export_model(), tmp / "pretrained_model")
            state_dir = tmp / "training_state"
            state_dir.mkdir()
            save_tensors(accelerator.unwrap_model(model).state_dict(), state_dir / "model.safetensors")
            if ema is not None:
                save_tensors(ema.state_dict(), state_dir / "ema.safetensors")
            save_torch(optimizer.state_dict(), state_dir / "optimizer.pt")
            save_torch(scheduler.state_dict(), state_dir / "scheduler.pt")
            save_torch(rng_states, state_dir / "rng.pt")
            save_json(
                {
                    "step": step,
                    "epoch": epoch,
                    "batch_in_epoch": batch_in_epoch,
                    "world_size": world,
                    "ema_updates": ema.num_updates if ema is not None else 0,
                },
                state_dir / "state.json",
            )
        atomic_write_text(output_dir / "checkpoints" / "last", target.name)
        if cfg.keep_checkpoints:
            for old in _checkpoint_dirs(output_dir)[: -cfg.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)

    def evaluate() -> None:
        if eval_fn is None or not accelerator.is_main_process:
            return
        metrics = eval_fn(export_model(), step, output_dir / "eval" / f"{step:07d}")
        if metrics:
            accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=step)
            accelerator.print(f"eval @ {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))

    model.train()
    data = micro_batches()
    bar = tqdm(total=cfg.steps, initial=step, desc="train", disable=not accelerator.is_main_process)
    running: dict[str, float] = {}
    seen_since_log, t_log = 0, time.perf_counter()
    while step < cfg.steps:
        for _ in range(cfg.grad_accum):
            batch = next(data)
            with accelerator.accumulate(model):
                loss, logs = loss_fn(model, batch)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite training loss {loss.item()} at step {step}")
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.grad_clip > 0:
                    logs["grad_norm"] = float(accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            for k, v in {"loss": loss.item(), **logs}.items():
                running[k] = running.get(k, 0.0) + v / cfg.grad_accum
            seen_since_log += cfg.batch_size * world
        scheduler.step()
        if ema is not None:
            ema.update(accelerator.unwrap_model(model))
        step += 1
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            n = cfg.log_every if step % cfg.log_every == 0 else step % cfg.log_every
            logs = {f"train/{k}": v / n for k, v in running.items()}
            logs["train/lr"] = scheduler.get_last_lr()[0]
            logs["train/samples_per_s"] = seen_since_log / (time.perf_counter() - t_log)
            accelerator.log(logs, step=step)
            bar.set_postfix(loss=f"{logs['train/loss']:.4f}", sps=f"{logs['train/samples_per_s']:.0f}")
            running, seen_since_log, t_log = {}, 0, time.perf_counter()
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_checkpoint()
        if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
            evaluate()
    bar.close()
    evaluate()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with atomic_directory(output_dir / "pretrained_model") as tmp:
            save_pretrained(export_model(), tmp)
    accelerator.wait_for_everyone()  # every rank returns once the export is on disk (a next stage loads it)
    # Trackers end here, but not the process group (`end_training` would destroy it): post-training runs
    # its second stage, and the closed loop its next round, in the same processes.
    for tracker in accelerator.trackers:
        tracker.finish()
    return export_model()


def _to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch
