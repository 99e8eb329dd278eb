"""How long a training step of the push recipe's two phases takes here, and what the recipe's steps add up to.

    python benchmarks/world_model_step_time.py --dataset.root=outputs/data/push_wm

The recipe (docs/training.md) is `configs/world_model/tiny.yaml` (teacher forcing), then the self-rollout phase
(`world_model/recipe.py`'s overrides, `self_rollout_steps` steps) from its weights. Each phase's model is built
as `train_world_model.py` builds it and trained for `warmup` + `steps` steps on the dataset's training windows
(the loss the shared loop calls, then AdamW); the timed steps give milliseconds per step for data, forward,
backward and the optimiser. A full run also spends time on its end-of-run evaluation and calibrations, which
this leaves out: `recipe_minutes` is a floor for what `training.json` records. Issue 24 asks for a recipe that
trains in at most 60 minutes on 2 CPU cores; this measures it in a few minutes on the host at hand.

`--mixed_precision=bf16` times both phases as `--train.mixed_precision=bf16` trains them (forward under bf16
autocast, the weights and the optimiser in fp32): on CPUs with AVX-512 BF16 it is the one precision lever a CPU
has. What it does to the model's quality is a training-seed comparison, not this benchmark's.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.data.dataset import DatasetConfig  # noqa: E402
from worldloop.world_model.recipe import (  # noqa: E402
    SELF_ROLLOUT_PHASE_ARGS,
    SELF_ROLLOUT_STEPS,
    TEACHER_FORCING_PHASE_ARGS,
)
from worldloop.world_model.trainer import (  # noqa: E402
    TrainWorldModelConfig,
    new_model,
    open_dataset,
    training_embodiment,
    training_windows,
)


@dataclass
class StepTimeBenchmarkConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    train_config: str = "configs/world_model/tiny.yaml"
    self_rollout_steps: int = SELF_ROLLOUT_STEPS  # the second phase's steps in the recipe
    steps: int = 40  # timed steps per phase
    warmup: int = 3  # untimed steps first (allocator, oneDNN primitives)
    threads: int = 0  # torch threads; 0 -> torch's default
    seed: int = 0  # train.seed: the initial weights and the data order
    mixed_precision: str = "no"  # no | bf16: as train.mixed_precision (fp16 needs a GPU's grad scaler)
    name: str = "world_model_step_time"


def phase_config(cfg: StepTimeBenchmarkConfig, extra: tuple[str, ...]) -> TrainWorldModelConfig:
    if not cfg.dataset.root:
        raise ValueError("--dataset.root: a recording to train on is needed (e.g. outputs/data/push_wm)")
    return parse_cli(
        TrainWorldModelConfig,
        [
            "--config",
            cfg.train_config,
            f"--dataset.root={cfg.dataset.root}",
            f"--train.seed={cfg.seed}",
            f"--train.mixed_precision={cfg.mixed_precision}",
            *extra,
        ],
    )


def step_autocast(train: TrainWorldModelConfig) -> contextlib.AbstractContextManager:
    """The forward's precision context, as the trainer's accelerator gives it for `train.mixed_precision`:
    CPU autocast without its weight cache (common/training.py says why)."""
    if train.train.mixed_precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def time_phase(train: TrainWorldModelConfig, steps: int, warmup: int) -> dict[str, float]:
    """Milliseconds per step (data, forward, backward, optimiser, total) over `steps` steps after `warmup`."""
    dataset = open_dataset(train)
    train_eps, _ = dataset.split()
    model = new_model(train, dataset, train_eps, training_embodiment(train, None))
    windows = training_windows(train, dataset, train_eps)
    loader = DataLoader(
        windows,
        batch_size=train.train.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(train.train.seed),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.train.lr)
    model.train()
    totals = dict.fromkeys(("data", "forward", "backward", "optimiser"), 0.0)
    batches = iter(loader)
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        t1 = time.perf_counter()
        with step_autocast(train):
            loss, _ = model(batch)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        if i == 0:
            # a step that trains only part of the model is cheaper and is not the trainer's step
            untrained = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            if untrained:
                raise RuntimeError(
                    f"the timed step leaves {len(untrained)} parameters untrained: {untrained[:4]}"
                )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if i >= warmup:
            for key, seconds in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                totals[key] += seconds
    ms = {f"{k}_ms": 1000 * v / steps for k, v in totals.items()}
    return ms | {"step_ms": sum(ms.values()), "batch_size": train.train.batch_size, "window": train.window}


def run_benchmark(cfg: StepTimeBenchmarkConfig) -> dict:
    if cfg.steps < 1 or cfg.warmup < 0:
        raise ValueError(f"steps={cfg.steps}, warmup={cfg.warmup}: expected steps >= 1 and warmup >= 0")
    if cfg.mixed_precision not in ("no", "bf16"):
        raise ValueError(
            f"mixed_precision={cfg.mixed_precision!r}: expected no or bf16 (the CPU's precisions)"
        )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    first = phase_config(cfg, TEACHER_FORCING_PHASE_ARGS)
    second = phase_config(cfg, (*SELF_ROLLOUT_PHASE_ARGS, f"--train.steps={cfg.self_rollout_steps}"))
    phases = {}
    for name, train in (("teacher_forced", first), ("self_rollout", second)):
        phases[name] = time_phase(train, cfg.steps, cfg.warmup) | {"recipe_steps": train.train.steps}
    minutes = {k: v["step_ms"] * v["recipe_steps"] / 60_000 for k, v in phases.items()}
    figures = {
        "phases": phases,
        "recipe_minutes": {**minutes, "total": sum(minutes.values())},
        "mixed_precision": cfg.mixed_precision,
        "torch_threads": torch.get_num_threads(),
        "timed_steps": cfg.steps,
    }
    print_table([{"phase": k, **v} for k, v in phases.items()], "ms per training step")
    print_table(
        [figures["recipe_minutes"]], "the recipe's training steps, minutes (evaluation and calibration aside)"
    )
    return figures


def main() -> None:
    cfg = parse_cli(StepTimeBenchmarkConfig)
    figures = run_benchmark(cfg)
    print(f"wrote {write_result(cfg.name, figures)}")


if __name__ == "__main__":
    main()
