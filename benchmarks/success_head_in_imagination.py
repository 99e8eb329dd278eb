"""Does the reward RL optimises tell the truth where the policy goes? The success heads on a policy's
imagined episodes, judged against the simulator's own rule applied to the imagined arm.

    python benchmarks/success_head_in_imagination.py --policy=outputs/rl_setting/policy_bc \
        --world_models="[outputs/rl_setting/world_model/first_state/pretrained_model, \
outputs/rl_setting/world_model/first_state_6400/pretrained_model]"

RL in imagination is rewarded by the heads, on the states the policy visits. `success_head.py` scores them
on recorded episodes; here the policy acts in each world model from the same simulator resets (by default
the first starts `rl_in_imagination.py` trains from), without stopping at success, and every imagined step is
judged twice: by the heads, and by the reach rule on the imagined joint state (the fingertip within the
radius of the named cube, the objects where the reset put them). The joint states follow the commanded
actions whatever the frames show (their error against the simulator is small next to a step), so the second
verdict is the truth the heads should give. Reported per world model: the per-step AUROC, and per episode,
at the calibrated threshold, the share the heads call a success, the share that is one, and the heads'
precision and recall. A head with low precision pays RL for its mistakes. Reach only.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.common.stats import auroc  # noqa: E402
from worldloop.rl_finetune.imagination.evaluation import evaluate_in_imagination  # noqa: E402
from worldloop.rl_finetune.imagination.initial_states import sim_starts  # noqa: E402
from worldloop.rl_finetune.imagination.policy_ranking import reached_along_imagined_paths  # noqa: E402
from worldloop.vla.factory import load_policy  # noqa: E402
from worldloop.vla.sim_evaluation import SimEvalConfig  # noqa: E402
from worldloop.world_model.model import WorldModel  # noqa: E402
from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig  # noqa: E402


@dataclass
class SuccessHeadInImaginationConfig:
    policy: str = "outputs/rl_setting/policy_bc"
    world_models: list[str] = field(default_factory=list)  # pretrained world-model directories to compare
    episodes: int = 64
    seed: int = 50_000  # the first starts of rl_in_imagination.py's training pool (finetune starts.seed)
    horizon: int = 50
    sampler_steps: int = 2  # as configs/finetune/tiny.yaml
    batch_envs: int = 16
    threads: int = 2
    name: str = "success_head_in_imagination"  # result file: benchmarks/results/<name>.json


def step_truth(sim_cfg: SimEvalConfig, per_episode: list[dict], seed: int) -> np.ndarray:
    """[N, T] whether the reach rule holds at each imagined step (joint_states[1:]) of each episode."""
    return np.stack(reached_along_imagined_paths(per_episode, sim_cfg, seed))[:, 1:]


def judge(per_episode: list[dict], truth: np.ndarray, threshold: float) -> dict:
    probs = np.asarray([e["success_probs"] for e in per_episode])
    if probs.shape != truth.shape:
        raise ValueError(f"{probs.shape} success probabilities for {truth.shape} judged steps")
    called, real = (probs >= threshold).any(1), truth.any(1)
    return {
        "per_step_auroc": auroc(probs.ravel().tolist(), truth.ravel().tolist()),
        "threshold": threshold,
        "heads_success": float(called.mean()),
        "true_success": float(real.mean()),
        "precision": float(real[called].mean()) if called.any() else float("nan"),
        "recall": float(called[real].mean()) if real.any() else float("nan"),
    }


def main() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = parse_cli(SuccessHeadInImaginationConfig)
    if not cfg.world_models:
        raise SystemExit("--world_models is empty: name one or more pretrained world models to judge")
    torch.set_num_threads(cfg.threads)
    policy = load_policy(cfg.policy)
    sim_cfg = SimEvalConfig(task="reach", max_steps=cfg.horizon)
    rows = []
    for path in cfg.world_models:
        env_cfg = WorldModelEnvConfig(
            horizon=cfg.horizon, sampler_steps=cfg.sampler_steps, terminate_on_success=False
        )
        env = WorldModelEnv(WorldModel.from_pretrained(path), env_cfg)
        starts = sim_starts(env, sim_cfg, cfg.episodes, cfg.seed)
        summary, _ = evaluate_in_imagination(policy, env, starts, cfg.seed, cfg.batch_envs)
        truth = step_truth(sim_cfg, summary["per_episode"], cfg.seed)
        rows.append({"world_model": path, **judge(summary["per_episode"], truth, env.success_threshold)})
    print_table(
        rows, title=f"success heads on {cfg.policy}'s imagined episodes ({cfg.episodes}, seeds {cfg.seed}+)"
    )
    figures = {"policy": cfg.policy, "episodes": cfg.episodes, "seed": cfg.seed, "rows": rows}
    path = write_result(cfg.name, figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
