"""Rank policies in imagination against a LeRobot gym env (gym-pusht, ...): the check of imagination against an
environment nobody here wrote.

Each policy runs `episodes` episodes twice from the same starts: in the world model, from the env's own
reset frames for seeds seed.. (rendered, resized to the model's frame size, never stepped), and in the env
itself from those seeds. Both sides are scored by LeRobot's own episode metrics: the max reward of an
episode (on pusht, the T's coverage of the target, clipped at 95% = 1), averaged over episodes, and the
success rate. In imagination the reward is the world model's reward head (clipped to [0, 1]), and success
its success head at the calibrated threshold; the result names that judge.

`rank_by="max_reward"` (LeRobot's pusht metric) or `"success"` picks what the ranking figures (Pearson,
Spearman, MMRV, each with a bootstrap 95% interval over episodes) compare. A policy whose two 95% intervals
of that metric do not overlap is flagged with both numbers.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from worldloop.common.checkpoint import save_json
from worldloop.rl_finetune.imagination.evaluation import evaluate_in_imagination
from worldloop.rl_finetune.imagination.initial_states import lerobot_env_starts
from worldloop.rl_finetune.imagination.ranking import interval_disagreement, ranking_cis, ranking_report
from worldloop.vla.factory import load_policy
from worldloop.vla.lerobot_env_evaluation import LeRobotEnvEvalConfig, evaluate_in_lerobot_env
from worldloop.world_model.world_model_env import WorldModelEnv

RANK_BY = ("max_reward", "success")


def _metric(summary: dict, rank_by: str) -> tuple[np.ndarray, tuple[float, float, float]]:
    """Per-episode values of `rank_by`, and their mean with its 95% interval as (mean, low, high)."""
    values = np.array([float(e[rank_by]) for e in summary["per_episode"]])
    if rank_by == "success":
        return values, (summary["success_rate"], *summary["success_ci95"])
    half = 1.96 * values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("inf")
    mean = float(values.mean())
    return values, (mean, mean - half, mean + half)


def rank_against_env(
    policy_paths: list[str],
    names: list[str],
    env: WorldModelEnv,
    env_cfg: LeRobotEnvEvalConfig,
    episodes: int,
    seed: int,
    output_dir: Path,
    rank_by: str = "max_reward",
    batch_envs: int = 10,
    resize: str = "",
    device: str = "cpu",
) -> dict:
    """Every policy in imagination and in the env from the same seeded starts; rows, ranking, intervals and
    disagreements, also saved as `output_dir/ranking.json`."""
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by={rank_by!r}: expected one of {RANK_BY}")
    if env.config.horizon != env_cfg.max_steps:
        raise ValueError(
            f"imagination horizon {env.config.horizon} differs from env max_steps {env_cfg.max_steps}: "
            "compared episodes must last as long"
        )
    starts = lerobot_env_starts(env, env_cfg, episodes, seed, resize)
    rows, records, samples = [], {}, ([], [])
    t0 = time.perf_counter()
    for name, path in zip(names, policy_paths):
        policy = load_policy(path, device)
        imagined, _ = evaluate_in_imagination(
            policy, env, starts, seed, batch_envs, output_dir / name, videos=2
        )
        real = evaluate_in_lerobot_env(policy, env_cfg, episodes, seed, output_dir / name, device)
        (im_values, im_ci), (env_values, env_ci) = _metric(imagined, rank_by), _metric(real, rank_by)
        samples[0].append(im_values)
        samples[1].append(env_values)
        flag = interval_disagreement(im_ci, env_ci, reference_name="env")
        records[name] = {"policy": path, "imagination": imagined, "env": real, "disagreement": flag}
        rows.append(
            {"policy": name, "imagined": im_ci[0], "env": env_ci[0],
             "imagined_ci": "{:.2f}-{:.2f}".format(*im_ci[1:]), "env_ci": "{:.2f}-{:.2f}".format(*env_ci[1:]),
             "imagined_success": imagined["success_rate"], "env_success": real["success_rate"]}
        )  # fmt: skip
    result = {
        "rank_by": rank_by,
        "reference": f"lerobot_env {env_cfg.type or env_cfg.gym_id}",
        "episodes": episodes,
        "seed": seed,
        "judge": env.judge(),
        "rows": rows,
        "disagreements": {n: r["disagreement"] for n, r in records.items() if r["disagreement"]},
        "seconds": time.perf_counter() - t0,
    }
    if len(rows) >= 2:
        result["ranking"] = ranking_report([r["imagined"] for r in rows], [r["env"] for r in rows])
        result["ranking_ci95"] = ranking_cis(*samples)
        # LeRobot reports success where any policy succeeds: the success ranking, when it is defined.
        if any(r["env_success"] > 0 for r in rows):
            result["success_ranking"] = ranking_report(
                [r["imagined_success"] for r in rows], [r["env_success"] for r in rows]
            )
    save_json({"summary": result, "policies": records}, output_dir / "ranking.json")
    return result
