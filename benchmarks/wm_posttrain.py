"""World-model post-training, before vs after, on the same held-out start states.

    python benchmarks/wm_posttrain.py --before=outputs/world_model/tiny/pretrained_model \
        --after=outputs/wm_posttrain/tiny/pretrained_model --dataset.root=outputs/data/tabletop

Both models roll out autoregressively from the same real context frames under the same real actions with
the same sampling noise (rl_finetune/wm_posttrain/evaluation.py), on held-out episodes (the dataset's seeded
split, the one world-model training and post-training hold out). Measured:
- SSIM / PSNR at horizons 1, 10, 20, 30 and the paired win rate: the share of start states where the
  after-model's clip fidelity (mean per-frame score over the horizon) beats the before-model's (ties 1/2);
- the actions the (frozen, shared) inverse dynamics model of the before-model decodes from each rollout:
  jerk RMS, limit-violation rate, action-following error; the same IDM on the real frames is the floor;
- the horizon-1 check (SSIM must not drop by more than 0.005) and issue 6's targets, reported met or not;
- what post-training has to work with: `candidates` rollouts of the before-model from each start state with
  different sampling noise, as post-training draws its groups; the spread of their clip rewards (the
  rollout-stability reward) and how much the best of them beats their mean. Likelihood-free RL can only
  move the model towards the better of its own samples: with no spread there is nothing to learn from.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.embodiment import EmbodimentSpec  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.data.dataset import DatasetConfig, EpisodeDataset  # noqa: E402
from worldloop.data.windows import WorldModelWindows  # noqa: E402
from worldloop.rl_finetune.wm_posttrain.evaluation import (  # noqa: E402
    executability_summary,
    fidelity_summary,
    held_out_rollouts,
)
from worldloop.rl_finetune.wm_posttrain.rollout_stability import FidelityRewardConfig  # noqa: E402
from worldloop.world_model.checkpoint_inputs import dataset_config_for, embodiment_of  # noqa: E402
from worldloop.world_model.model import WorldModel  # noqa: E402

HORIZONS = (1, 10, 20, 30)


@dataclass
class WMPosttrainBenchmarkConfig:
    before: str = "outputs/world_model/tiny/pretrained_model"
    after: str = "outputs/wm_posttrain/tiny/pretrained_model"
    dataset: DatasetConfig = field(default_factory=DatasetConfig)  # --dataset.root: the WM's training data
    horizon: int = 30
    context: int = 0  # 0 -> the before-model's dit.context_frames
    start_states: int = 32  # held-out start states, spread evenly over the held-out windows
    stride: int = 5  # frames between candidate start states inside an episode
    seed: int = 0
    batch_size: int = 8
    # The clip score of the win rate; --fidelity.lpips_weight > 0 adds LPIPS (local weights only).
    fidelity: FidelityRewardConfig = field(default_factory=FidelityRewardConfig)
    # The robot whose limits judge the decoded actions: "" -> the one the before-model's checkpoint stores.
    embodiment: str = ""
    name: str = "wm_posttrain"  # the result file: benchmarks/results/<name>.json
    candidates: int = 8  # rollouts of the before-model per start state for the spread figures; 0 skips
    candidate_sampler_steps: int = 0  # denoising steps per frame of those rollouts; 0 -> the model's own


def model_figures(result: dict[str, torch.Tensor], spec: EmbodimentSpec) -> dict[str, float]:
    """One model's held-out figures: fidelity at HORIZONS, the clip score, and what its IDM decodes."""
    fidelity = fidelity_summary(result, list(HORIZONS))
    figures = {k: v for k, v in fidelity.items() if "@" in k}
    figures["clip_score"] = fidelity["fidelity/score"]
    executable = executability_summary(result, spec)
    figures["jerk_rms"] = executable["exec/jerk_rms"]
    figures["violation_rate"] = executable["exec/violation_rate"]
    figures["following_error"] = executable["exec/following_error"]
    return figures


def compare(results: dict[str, dict[str, torch.Tensor]], spec: EmbodimentSpec, horizon: int) -> dict:
    """Before vs after on the same start states: per-model figures, the IDM on the real frames (the floor),
    the relative changes, the paired win rate and issue 6's targets (met or not)."""
    b, a = (model_figures(results[name], spec) for name in ("before", "after"))
    clip_before, clip_after = results["before"]["score"].mean(1), results["after"]["score"].mean(1)
    win_rate = float(((clip_after > clip_before).float() + 0.5 * (clip_after == clip_before).float()).mean())
    real = results["before"]
    on_real = executability_summary({**real, "decoded": real["decoded_real"]}, spec)
    idm_floor = {
        "jerk_rms": on_real["exec/jerk_rms"],
        "violation_rate": on_real["exec/violation_rate"],
        "following_error": on_real["exec/following_error"],
        "commanded_jerk_rms": on_real["exec/commanded_jerk_rms"],
    }
    last_h = f"ssim@{max(h for h in HORIZONS if h <= horizon)}"
    change = {
        f"{last_h}_relative": _relative(a[last_h], b[last_h]),
        "jerk_rms_relative": _relative(a["jerk_rms"], b["jerk_rms"]),
        "violation_rate_relative": _relative(a["violation_rate"], b["violation_rate"]),
        "following_error_relative": _relative(a["following_error"], b["following_error"]),
        "ssim@1_delta": a["ssim@1"] - b["ssim@1"],
        "paired_win_rate": win_rate,
    }
    targets = {
        "horizon1_ssim_drop_at_most_0.005": change["ssim@1_delta"] >= -0.005,
        f"{last_h}_up_5pct": change[f"{last_h}_relative"] >= 0.05,
        "win_rate_at_least_75pct": win_rate >= 0.75,
        "violation_rate_down_20pct": change["violation_rate_relative"] <= -0.20,
        "jerk_down_20pct": change["jerk_rms_relative"] <= -0.20,
    }
    return {
        "before": b,
        "after": a,
        "idm_on_real_frames": idm_floor,
        "change": change,
        "targets_met": targets,
    }


def candidate_spread(
    model: WorldModel,
    windows: WorldModelWindows,
    indices: list[int],
    context: int,
    cfg: WMPosttrainBenchmarkConfig,
) -> dict[str, float]:
    """`cfg.candidates` rollouts per start state with different noise: the spread of their clip rewards."""
    rewards = torch.stack(
        [
            held_out_rollouts(
                model, windows, indices, context, cfg.horizon, cfg.fidelity, seed=cfg.seed + 1 + k,
                batch_size=cfg.batch_size, sampler_steps=cfg.candidate_sampler_steps or None,
            )["score"].mean(1)
            for k in range(cfg.candidates)
        ],
        1,
    )  # fmt: skip  # [start states, candidates]
    return {
        "group_size": cfg.candidates,
        "sampler_steps": cfg.candidate_sampler_steps or model.cfg.sampler.steps,
        "clip_reward_mean": float(rewards.mean()),
        "clip_reward_group_std": float(rewards.std(1).mean()),
        "best_minus_mean": float((rewards.max(1).values - rewards.mean(1)).mean()),
        "between_start_states_std": float(rewards.mean(1).std()),
    }


def _relative(after: float, before: float) -> float:
    return (after - before) / abs(before) if before else float("nan")


def run_benchmark(cfg: WMPosttrainBenchmarkConfig) -> dict:
    """Roll both models out from the same held-out start states, print the tables, return the figures."""
    before = WorldModel.from_pretrained(cfg.before)
    after = WorldModel.from_pretrained(cfg.after)
    if before.cfg.cameras != after.cfg.cameras or before.cfg.frame_size != after.cfg.frame_size:
        raise ValueError(f"{cfg.before} and {cfg.after} differ in cameras or image size: not comparable")
    spec = embodiment_of(before, cfg.embodiment)
    context = cfg.context or before.cfg.dit.context_frames
    ds = dataset_config_for(before.cfg, cfg.dataset)
    dataset = EpisodeDataset(ds)
    _, held_out = dataset.split()
    windows = WorldModelWindows(dataset, held_out, context=context, horizon=cfg.horizon, stride=cfg.stride)
    count = min(cfg.start_states, len(windows))
    indices = torch.linspace(0, len(windows) - 1, count).round().long().unique().tolist()
    print(f"{len(indices)} start states from {len(held_out)} held-out episodes, horizon {cfg.horizon}")

    results, seconds = {}, {}
    for name, model in (("before", before), ("after", after)):
        t0 = time.perf_counter()
        results[name] = held_out_rollouts(
            model,
            windows,
            indices,
            context,
            cfg.horizon,
            cfg.fidelity,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            progress=True,
            decoder=before,
        )
        seconds[name] = time.perf_counter() - t0
    compared = compare(results, spec, cfg.horizon)
    b, a, idm_floor = compared["before"], compared["after"], compared["idm_on_real_frames"]
    change, targets = compared["change"], compared["targets_met"]

    rows = [{"metric": k, "before": b[k], "after": a[k], "idm_on_real": idm_floor.get(k)} for k in b]
    print_table(rows, title=f"world-model post-training, {len(indices)} held-out start states")
    print_table([{"figure": k, "value": v} for k, v in change.items()])
    print_table([{"target": k, "met": v} for k, v in targets.items()])

    spread = candidate_spread(before, windows, indices, context, cfg) if cfg.candidates > 1 else None
    if spread:
        print_table(
            [{"figure": k, "value": v} for k, v in spread.items()], title="candidates of the before-model"
        )

    return {
        "before_model": cfg.before,
        "after_model": cfg.after,
        "dataset": ds.root,
        "held_out_episodes": len(held_out),
        "start_states": len(indices),
        "horizon": cfg.horizon,
        "context": context,
        "embodiment": spec.name,
        **compared,
        "rollout_seconds": seconds,
        "candidates": spread,
    }


def main() -> None:
    cfg = parse_cli(WMPosttrainBenchmarkConfig)
    figures = run_benchmark(cfg)
    path = write_result(cfg.name, figures, command=" ".join(shlex.quote(x) for x in ["python", *sys.argv]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
