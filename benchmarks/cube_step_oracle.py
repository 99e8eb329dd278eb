"""How far the pushed cube's next step can be told from what the world model reads: its one-step slope's ceiling.

`benchmarks/world_model_fidelity.py` scores how far a model moves the cube one step ahead of the real past
(`objects.one_step.slope`: the drawn move on the true one, through the origin; every push model so far ~0.55).
Whether that is the model's shortfall or the limit of what its inputs say about the step, this benchmark
measures apart from any world model. Two regressors are fitted to the cube's true one-step move (the sim's
position, projected into the camera, in px) on the training episodes' steps and scored on exactly the
held-out steps the fidelity benchmark scores (its windows, the same `min_step_px`, the cube visible in the
last real frame):

- `frames`: a small CNN reading what a world model's one-step prediction reads: the `eval.context` real
  frames before the step and the actions up to it (the last one leads the step);
- `state`: an MLP reading the sim's state instead (joint states and the cube's position in the last two
  frames, the same actions): what decides the step, up to the unrecorded velocities.

A predictor that draws the conditional mean of the move (or a sample of its distribution) from its inputs
scores a slope of E[p^2] / E[t^2] in expectation, below 1 by what its inputs leave unknown: a fitted
regressor's slope is a lower bound on that ceiling, so a world model far below the `frames` regressor is
short of what its inputs allow, not held back by an unpredictable world. Each regressor's figures are also
given on its training steps (how well it fits), beside `persistence` (the true move of the step before) and
`zero` (no move).

    python benchmarks/cube_step_oracle.py --dataset.root=outputs/data/push_wm --name=cube_step_oracle_push
    python benchmarks/cube_step_oracle.py --dataset.root=outputs/data/push_wm --augment_shift=4 \
        --name=cube_step_oracle_push_shift4   # the frames CNN fitted on shifted frames: it overfits without
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import write_result  # noqa: E402
from benchmarks.world_model_fidelity import instructed_cube_xyz, object_truth  # noqa: E402
from worldloop.common.config import ConfigError, parse_cli  # noqa: E402
from worldloop.common.rng import torch_seeded  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.data.dataset import DatasetConfig, EpisodeDataset  # noqa: E402
from worldloop.data.features import ENVIRONMENT_STATE  # noqa: E402
from worldloop.world_model.metrics import HeldOutWindows  # noqa: E402
from worldloop.world_model.object_tracking import locate_each, move_slope, pearson  # noqa: E402
from worldloop.world_model.trainer import EvalConfig, held_out_windows  # noqa: E402


@dataclass
class CubeStepOracleConfig:
    # The push data the fidelity benchmark scores (cameras and frame size as the tiny world model reads it)
    dataset: DatasetConfig = field(
        default_factory=lambda: DatasetConfig(
            root="outputs/data/push_wm", cameras=["front"], image_size=[64, 64]
        )
    )
    # The scored windows: the fidelity benchmark's push figure (64 held-out windows, context 4, horizon 30)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(max_windows=64))
    # Windows of the training episodes the regressors fit on (each gives `horizon` steps). On push, 512 overfit the
    # frames CNN (slope 0.88 on its training steps, 0.36 held out; docs/experiments.md, 2026-12-06); the state MLP
    # fitted them no better than it scored held out.
    train_windows: int = 512
    # The frames CNN's training examples moved by a random offset of up to this many px (all C frames alike,
    # edges repeated): the cube's move in px is the same in the moved frames, so the CNN cannot learn where
    # things sit in its training frames instead of how they move. 0 -> none (held out 0.36 where it fitted 0.88); 4
    # -> 0.61 held out, 0.67 fitted (docs/experiments.md, 2026-12-06).
    augment_shift: int = 0
    steps: int = 3000  # optimiser steps of each regressor
    batch_size: int = 64
    lr: float = 1.0e-3
    min_step_px: float = (
        0.7  # scored steps: the cube truly moves at least this far (as the fidelity benchmark)
    )
    threads: int = 0  # torch threads; 0 -> torch's default
    seed: int = 0
    name: str = "cube_step_oracle"  # benchmarks/results/<name>.json

    def validate(self) -> None:
        for key in ("train_windows", "steps", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)}: expected >= 1")
        if self.augment_shift < 0:
            raise ConfigError(f"augment_shift={self.augment_shift}: expected >= 0 px")
        if self.eval.context < 2:
            raise ConfigError(
                f"eval.context={self.eval.context}: the state regressor reads the last two frames"
            )


class StepFrames:
    """The real frames each one-step example reads, gathered on demand: example i reads frames k .. k + C - 1 of
    window w, (w, k) = where[i], from frames [W, T, 3, h, w] (uint8); indexing gives them [n, C, 3, h, w] in [0, 1]."""

    def __init__(self, frames: torch.Tensor, where: torch.Tensor, context: int):
        self.frames, self.where, self.reading = frames, where, torch.arange(context)

    def __len__(self) -> int:
        return len(self.where)

    def __getitem__(self, pick) -> torch.Tensor:
        w, k = self.where[pick].T
        return self.frames[w[:, None], k[:, None] + self.reading].float() / 255


@dataclass
class OneStepExamples:
    """Every step of a set of windows as a one-step example: frames (the real frames before the step), actions
    [N, C, A] (the last leads the step), state [N, 2, S + 3] (joint state and cube position in the last two
    frames), move [N, 2] (the cube's true move in px), before [N, 2] (the true move of the step before; NaN at
    a window's first step) and seen [N] (the cube shows in the last real frame)."""

    frames: StepFrames
    actions: torch.Tensor
    state: torch.Tensor
    move: torch.Tensor
    before: torch.Tensor
    seen: torch.Tensor


def one_step_examples(
    dataset: EpisodeDataset, windows: HeldOutWindows, context: int, camera: str
) -> OneStepExamples:
    truth = object_truth(dataset, windows, context, camera)
    if truth is None:
        raise SystemExit(
            f"{dataset.root} records no {ENVIRONMENT_STATE} at the served frame size: nothing to score "
            "(record push data with record_demos.py --environment_state=true)"
        )
    pixels, start, colours = truth  # [N, H, 2] in frames C .. T-1, [N, 2] in frame C-1
    frames = windows.frames[:, :, 0] if windows.frames.dim() == 6 else windows.frames  # the tracked camera
    n, horizon = pixels.shape[:2]
    path = torch.cat([start[:, None], pixels], 1)
    move = path[:, 1:] - path[:, :-1]  # step k: frame C-1+k -> C+k
    before = torch.cat([torch.full_like(move[:, :1], float("nan")), move[:, :-1]], 1)
    # Step k reads frames k .. C-1+k and actions k .. C-1+k (action i leads frame i to i + 1)
    last = torch.arange(horizon) + context - 1
    seen = ~torch.isnan(locate_each(frames[:, last], colours)[0][..., 0])
    span = torch.arange(context - 2, context - 1 + horizon)  # frames C-2 .. T-2
    both = torch.cat([windows.state[:, span], instructed_cube_xyz(dataset, windows, span)], -1)
    where = torch.stack(torch.meshgrid(torch.arange(n), torch.arange(horizon), indexing="ij"), -1).flatten(
        0, 1
    )
    return OneStepExamples(
        frames=StepFrames((frames * 255).round().to(torch.uint8), where, context),
        actions=windows.actions[where[:, :1], where[:, 1:] + torch.arange(context)].float(),
        state=torch.stack([both[:, :-1], both[:, 1:]], 2).flatten(0, 1).float(),  # frames C-2+k, C-1+k
        move=move.flatten(0, 1),
        before=before.flatten(0, 1),
        seen=seen.flatten(0, 1),
    )


class FramesRegressor(nn.Module):
    """C frames (stacked, with pixel coordinates) and C actions -> a 2-D move in px."""

    def __init__(self, context: int, action_dim: int, size: int):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(3 * context + 2, 32, 3, padding=1), nn.SiLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.SiLU(),
        )  # fmt: skip
        grid = torch.linspace(-1, 1, size)
        self.register_buffer("coords", torch.stack(torch.meshgrid(grid, grid, indexing="ij")))
        self.head = nn.Sequential(
            nn.Linear(64 * (size // 8) ** 2 + context * action_dim, 256), nn.SiLU(), nn.Linear(256, 2)
        )

    def forward(self, frames: torch.Tensor, actions: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        x = frames.flatten(1, 2) * 2 - 1
        x = torch.cat([x, self.coords.expand(len(x), -1, -1, -1)], 1)
        return self.head(torch.cat([self.convs(x).flatten(1), actions.flatten(1)], 1))


class StateRegressor(nn.Module):
    """The last two frames' joint states and cube position, and C actions -> a 2-D move in px."""

    def __init__(self, context: int, action_dim: int, state_dim: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(2 * state_dim + context * action_dim, 256), nn.SiLU(),
            nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 2),
        )  # fmt: skip

    def forward(self, frames: torch.Tensor, actions: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([state.flatten(1), actions.flatten(1)], 1))


def shifted(frames: torch.Tensor, most: int, generator: torch.Generator) -> torch.Tensor:
    """Each example's frames [n, C, 3, h, w] moved by one random whole-pixel offset of -most .. most px in each
    axis, the same for its C frames; the edge rows and columns are repeated into what the move uncovers."""
    h, w = frames.shape[-2:]
    padded = nn.functional.pad(frames.flatten(1, 2), (most,) * 4, mode="replicate").unflatten(
        1, frames.shape[1:3]
    )
    dy, dx = torch.randint(0, 2 * most + 1, (2, len(frames)), generator=generator).tolist()
    return torch.stack([p[..., y : y + h, x : x + w] for p, y, x in zip(padded, dy, dx, strict=True)])


def standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    dims = tuple(range(train.dim() - 1))
    mean, std = train.mean(dims), train.std(dims).clamp_min(1e-6)
    return [(x - mean) / std for x in (train, *others)]


def fit(
    model: nn.Module, inputs: tuple, move: torch.Tensor, cfg: CubeStepOracleConfig, label: str, shift: int = 0
) -> float:
    """Adam on the MSE of the move (px), a cosine schedule; the frames (inputs[0]) of each batch `shifted` by up
    to `shift` px when it is > 0. Returns the seconds taken."""
    started = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps)
    generator = torch.Generator().manual_seed(cfg.seed)
    bar = tqdm(range(cfg.steps), desc=f"fit {label}", mininterval=5)
    for _ in bar:
        pick = torch.randint(len(move), (cfg.batch_size,), generator=generator)
        frames, *rest = (x[pick] for x in inputs)
        if shift:
            frames = shifted(frames, shift, generator)
        loss = (model(frames, *rest) - move[pick]).square().sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return time.perf_counter() - started


@torch.no_grad()
def predict(model: nn.Module, inputs: tuple, batch: int = 512) -> torch.Tensor:
    model.eval()
    n = len(inputs[0])
    return torch.cat([model(*(x[i : i + batch] for x in inputs)) for i in range(0, n, batch)])


def slope_and_r(predicted: torch.Tensor, true: torch.Tensor) -> dict:
    """As `one_step_motion` scores a drawn move: the slope through the origin of predicted on true, and
    Pearson r over x and y pooled; NaN with fewer than 3 steps."""
    if len(true) < 3:
        return {"slope": float("nan"), "r": float("nan"), "steps": len(true)}
    p, t = predicted.double(), true.double()
    return {"slope": move_slope(p, t), "r": pearson(p.flatten(), t.flatten()), "steps": len(true)}


def scores(predicted: torch.Tensor, move: torch.Tensor, seen: torch.Tensor, min_step: float) -> dict:
    """slope_and_r on the steps where the cube shows and truly moves at least min_step px; `explained`: the
    share of the move's mean square the prediction explains, on every step (moving or not)."""
    pick = seen & (move.norm(dim=-1) >= min_step)
    explained = 1 - (predicted - move).square().sum(-1).mean() / move.square().sum(-1).mean()
    return {**slope_and_r(predicted[pick], move[pick]), "explained": float(explained)}


def main() -> None:
    cfg = parse_cli(CubeStepOracleConfig)
    figures = run_benchmark(cfg)
    print(f"wrote {write_result(cfg.name, figures)}")


def run_benchmark(cfg: CubeStepOracleConfig) -> dict:
    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dataset = EpisodeDataset(cfg.dataset)
    train_eps, held_eps = dataset.split()
    ctx, camera = cfg.eval.context, dataset.cameras[0]
    held = held_out_windows(dataset, held_eps, cfg.eval)
    fitted = held_out_windows(dataset, train_eps, EvalConfig(
        context=ctx, horizon=cfg.eval.horizon, max_windows=cfg.train_windows, stride=cfg.eval.stride
    ))  # fmt: skip
    if held is None or fitted is None:
        raise SystemExit(f"{dataset.root}: no episode of {ctx + cfg.eval.horizon} frames in both splits")
    train, test = (one_step_examples(dataset, w, ctx, camera) for w in (fitted, held))
    actions = standardise(train.actions, test.actions)
    state = standardise(train.state, test.state)
    size = train.frames.frames.shape[-1]
    if cfg.augment_shift >= size // 2:
        raise ConfigError(f"augment_shift={cfg.augment_shift}: expected under half the {size}-px frame")
    figures: dict = {
        "dataset": cfg.dataset.root,
        "windows": {"train": len(fitted), "held_out": len(held)},
        "examples": {"train": len(train.move), "held_out": len(test.move)},
        "min_step_px": cfg.min_step_px,
        "augment_shift": cfg.augment_shift,
    }
    rows = []
    for label, ex in (("held_out", test), ("train", train)):
        known = ~torch.isnan(ex.before[:, 0])
        figures[f"persistence_{label}"] = scores(
            ex.before[known], ex.move[known], ex.seen[known], cfg.min_step_px
        )
        figures[f"zero_{label}"] = scores(torch.zeros_like(ex.move), ex.move, ex.seen, cfg.min_step_px)
    for label, make in (
        ("frames", lambda: FramesRegressor(ctx, train.actions.shape[-1], size)),
        ("state", lambda: StateRegressor(ctx, train.actions.shape[-1], train.state.shape[-1])),
    ):
        with torch_seeded(cfg.seed):
            model = make()
        inputs = (train.frames, actions[0], state[0])
        seconds = fit(model, inputs, train.move, cfg, label, cfg.augment_shift if label == "frames" else 0)
        figures[label] = {
            "held_out": scores(
                predict(model, (test.frames, actions[1], state[1])), test.move, test.seen, cfg.min_step_px
            ),
            "train": scores(predict(model, inputs), train.move, train.seen, cfg.min_step_px),
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": seconds,
        }
    for label in ("frames", "state", "persistence", "zero"):
        for split in ("held_out", "train"):
            got = figures[label][split] if label in ("frames", "state") else figures[f"{label}_{split}"]
            rows.append(
                {
                    "predictor": label,
                    "split": split,
                    **{k: got[k] for k in ("slope", "r", "explained", "steps")},
                }
            )
    print_table(rows, f"the cube's one-step move on steps of >= {cfg.min_step_px} px")
    if not all(math.isfinite(figures[k]["held_out"]["slope"]) for k in ("frames", "state")):
        print("fewer than 3 held-out steps move the cube: no slope", file=sys.stderr)
    return figures


if __name__ == "__main__":
    main()
