"""Evaluate a saved policy: success rate with a Wilson 95% interval, mean progress, videos, JSON summary.

python evaluate_policy.py --backend sim --policy.path outputs/policy/tiny/pretrained_model --episodes 50
python evaluate_policy.py --config configs/eval/tiny.yaml --policy.path ... --sim.task=push

Backends: `sim` (the MuJoCo tabletop envs). The summary goes to `<output_dir>/summary.json`
(default: `<policy.path>/../eval_<backend>_<task>`), videos to `<output_dir>/videos/`.

Backend `imagination` (rl_finetune.imagination.policy_ranking) runs the policy in a world model from the sim's initial
states; `--rank a b ... --compare-sim` ranks several policies against the simulator (Pearson, Spearman, MMRV):
python evaluate_policy.py --backend imagination --imagination.world_model=... --rank a b c --compare-sim

Backend `lerobot_env` (vla.lerobot_env_evaluation) runs the policy in one of LeRobot's gym envs (or any
gymnasium id) with the same summary, to compare with published LeRobot numbers:
python evaluate_policy.py --backend lerobot_env --env.type=pusht --policy.path=<LeRobot pusht policy dir>

`--policy.path` may also be a directory written by LeRobot's own save_pretrained (config.json: ACT,
Diffusion, SmolVLA, pi0, ... with local weights; `--policy.type=lerobot`, detected from the files);
`--policy.camera_map='{observation.images.top: front}'` feeds its image inputs from our cameras.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from worldloop.common.checkpoint import save_json
from worldloop.common.config import ConfigError, parse_cli
from worldloop.rl_finetune.imagination.evaluation import ImaginationEvalConfig
from worldloop.rl_finetune.imagination.policy_ranking import fold_cli_args, print_ranking, rank_policies
from worldloop.vla.factory import load_policy
from worldloop.vla.lerobot_env_evaluation import LeRobotEnvEvalConfig, evaluate_in_lerobot_env
from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim

BACKENDS = ("sim", "imagination", "lerobot_env")


@dataclass
class PolicyPath:
    path: str = ""  # a pretrained policy directory (config.yaml, model.safetensors, stats.json)
    type: str = ""  # "" reads it from the directory; "lerobot" for a directory LeRobot saved (config.json)
    camera_map: dict[str, str] = field(default_factory=dict)  # LeRobot policies: image input -> our camera


@dataclass
class EvaluatePolicyConfig:
    backend: str = "sim"
    policy: PolicyPath = field(default_factory=PolicyPath)
    episodes: int = 50
    seed: int = 100_000  # env seeds seed..seed+episodes-1; far from the recording seeds
    output_dir: str = ""
    device: str = "cpu"
    sim: SimEvalConfig = field(default_factory=SimEvalConfig)
    imagination: ImaginationEvalConfig = field(default_factory=ImaginationEvalConfig)
    env: LeRobotEnvEvalConfig = field(default_factory=LeRobotEnvEvalConfig)  # backend lerobot_env
    rank: list[str] = field(default_factory=list)  # several policy paths (backend imagination)
    compare_sim: bool = False  # imagination: also run the sim from the same starts and compare


def evaluate(cfg: EvaluatePolicyConfig) -> tuple[dict, Path]:
    """Run the chosen backend; returns the summary and the directory it was written to."""
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"--backend={cfg.backend!r}: expected one of {BACKENDS}")
    if cfg.backend == "imagination" or cfg.rank:
        raise ConfigError(
            "backend imagination and --rank run through main() (rl_finetune.imagination.policy_ranking)"
        )
    if not cfg.policy.path:
        raise ConfigError(
            "--policy.path is required: a directory written by train_policy.py or by LeRobot's save_pretrained"
        )
    policy = load_policy(cfg.policy.path, cfg.device, cfg.policy.type, cfg.policy.camera_map)
    if cfg.backend == "lerobot_env":
        env_name = cfg.env.type or cfg.env.gym_id.replace("/", "_")
        output_dir = Path(cfg.output_dir or Path(cfg.policy.path).parent / f"eval_{cfg.backend}_{env_name}")
        summary = evaluate_in_lerobot_env(policy, cfg.env, cfg.episodes, cfg.seed, output_dir, cfg.device)
    else:
        output_dir = Path(
            cfg.output_dir or Path(cfg.policy.path).parent / f"eval_{cfg.backend}_{cfg.sim.task}"
        )
        summary = evaluate_in_sim(policy, cfg.sim, cfg.episodes, cfg.seed, output_dir, cfg.device)
    summary["policy_path"] = str(cfg.policy.path)
    save_json(summary, output_dir / "summary.json")
    return summary, output_dir


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = parse_cli(EvaluatePolicyConfig, fold_cli_args(sys.argv[1:] if args is None else list(args)))
    if cfg.backend == "imagination" or cfg.rank:
        if cfg.backend != "imagination":
            raise ConfigError(
                f"--rank evaluates in imagination: pass --backend imagination (got {cfg.backend!r})"
            )
        paths = list(cfg.rank) or ([cfg.policy.path] if cfg.policy.path else [])
        if not paths:
            raise ConfigError("give --policy.path (one policy) or --rank path_a path_b ... (several)")
        default = (
            f"outputs/ranking/{cfg.sim.task}"
            if cfg.rank
            else Path(paths[0]).parent / f"eval_imagination_{cfg.sim.task}"
        )
        # writes ranking.json (+ the scatter PNG with --compare-sim)
        output_dir = Path(cfg.output_dir or default)
        result = rank_policies(
            paths,
            cfg.imagination,
            cfg.sim,
            cfg.episodes,
            cfg.seed,
            output_dir,
            cfg.device,
            compare_sim=cfg.compare_sim,
        )
        print_ranking(result, output_dir)
        return
    summary, output_dir = evaluate(cfg)
    lo, hi = summary["success_ci95"]
    print(
        f"{summary['task']}: success {summary['success_rate']:.1%} (95% CI {lo:.1%}-{hi:.1%}) over "
        f"{summary['episodes']} episodes, mean progress {summary['mean_progress']:.3f}; wrote {output_dir}"
    )


if __name__ == "__main__":
    main()
