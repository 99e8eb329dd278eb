"""Evaluate a saved policy: success rate with a Wilson 95% interval, mean progress, videos, JSON summary.

python evaluate_policy.py --backend sim --policy.path outputs/policy/tiny/pretrained_model --episodes 50
python evaluate_policy.py --config configs/eval/tiny.yaml --policy.path ... --sim.task=push

Backends: `sim` (the MuJoCo tabletop envs). The summary goes to `<output_dir>/summary.json`
(default: `<policy.path>/../eval_<backend>_<task>`), videos to `<output_dir>/videos/`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from common.checkpoint import save_json
from common.config import ConfigError, parse_cli
from vla.factory import load_policy
from vla.sim_evaluation import SimEvalConfig, evaluate_in_sim

BACKENDS = ("sim",)


@dataclass
class PolicyPath:
    path: str = ""  # a pretrained policy directory (config.yaml, model.safetensors, stats.json)


@dataclass
class EvaluatePolicyConfig:
    backend: str = "sim"
    policy: PolicyPath = field(default_factory=PolicyPath)
    episodes: int = 50
    seed: int = 100_000  # env seeds seed..seed+episodes-1; far from the recording seeds
    output_dir: str = ""
    device: str = "cpu"
    sim: SimEvalConfig = field(default_factory=SimEvalConfig)


def evaluate(cfg: EvaluatePolicyConfig) -> tuple[dict, Path]:
    """Run the chosen backend; returns the summary and the directory it was written to."""
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"--backend={cfg.backend!r}: expected one of {BACKENDS}")
    if not cfg.policy.path:
        raise ConfigError("--policy.path is required: a directory written by train_policy.py")
    policy = load_policy(cfg.policy.path, cfg.device)
    output_dir = Path(cfg.output_dir or Path(cfg.policy.path).parent / f"eval_{cfg.backend}_{cfg.sim.task}")
    summary = evaluate_in_sim(policy, cfg.sim, cfg.episodes, cfg.seed, output_dir, cfg.device)
    summary["policy_path"] = str(cfg.policy.path)
    save_json(summary, output_dir / "summary.json")
    return summary, output_dir


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = parse_cli(EvaluatePolicyConfig, args)
    summary, output_dir = evaluate(cfg)
    lo, hi = summary["success_ci95"]
    print(
        f"{summary['task']}: success {summary['success_rate']:.1%} (95% CI {lo:.1%}-{hi:.1%}) over "
        f"{summary['episodes']} episodes, mean progress {summary['mean_progress']:.3f}; wrote {output_dir}"
    )


if __name__ == "__main__":
    main()
