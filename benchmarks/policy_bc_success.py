"""Sim success of a policy behaviour-cloned on expert demos, for several dataset sizes.

For each size N the policy trains on the first N training episodes of one dataset (same steps, same
config), then runs `eval_episodes` closed-loop episodes in the sim on held-out seeds.

python benchmarks/policy_bc_success.py                 # FlowVLA, configs/policy/tiny.yaml
python benchmarks/policy_bc_success.py --policy_config=configs/policy/act_tiny.yaml --name=policy_bc_success_act \
    --output_root=outputs/bench/policy_bc_act

Every training run keeps all its checkpoints under `<output_root>/<N>ep/`: pipelines/policy_zoo.py reuses them.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.vla.bc_training import TrainPolicyConfig, train_policy  # noqa: E402
from worldloop.vla.factory import load_policy  # noqa: E402
from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim  # noqa: E402


@dataclass
class BCBenchmarkConfig:
    name: str = "policy_bc_success"  # results file benchmarks/results/<name>.json
    policy_config: str = "configs/policy/tiny.yaml"
    dataset_root: str = "outputs/datasets/reach_expert_400"
    # training episodes; 360 is all of reach_expert_400 but the held-out tenth
    sizes: list[int] = field(default_factory=lambda: [20, 60, 360])
    steps: int = 0  # 0: the policy config's train.steps
    checkpoint_every: int = 0  # 0: the policy config's train.checkpoint_every
    eval_episodes: int = 50
    eval_seed: int = 100_000
    sim: SimEvalConfig = field(default_factory=SimEvalConfig)
    output_root: str = "outputs/bench/policy_bc"
    reuse: bool = True  # a size whose run already has pretrained_model/ is evaluated, not retrained


def run_size(cfg: BCBenchmarkConfig, episodes: int) -> dict:
    run_dir = Path(cfg.output_root) / f"{episodes}ep"
    overrides = [
        "--config",
        cfg.policy_config,
        f"--dataset.root={cfg.dataset_root}",
        f"--max_episodes={episodes}",
        f"--output_dir={run_dir}",
        "--train.keep_checkpoints=1000",
    ]
    if cfg.steps:
        overrides.append(f"--train.steps={cfg.steps}")
    if cfg.checkpoint_every:
        overrides.append(f"--train.checkpoint_every={cfg.checkpoint_every}")
    train_cfg = parse_cli(TrainPolicyConfig, overrides)
    t0, cpu0 = time.perf_counter(), time.process_time()
    if cfg.reuse and (run_dir / "pretrained_model").is_dir():
        policy, train_s, train_cpu_s = load_policy(run_dir / "pretrained_model"), None, None
    else:
        policy = train_policy(train_cfg)
        # CPU time as well as wall time: on a shared machine the wall time mostly measures the others.
        train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    summary = evaluate_in_sim(policy, cfg.sim, cfg.eval_episodes, cfg.eval_seed, run_dir / "eval_final")
    lo, hi = summary["success_ci95"]
    return {
        "episodes": episodes,
        "policy": train_cfg.policy.type,
        "steps": train_cfg.train.steps,
        "batch_size": train_cfg.train.batch_size,
        "train_minutes": None if train_s is None else round(train_s / 60, 1),
        "train_cpu_minutes": None if train_cpu_s is None else round(train_cpu_s / 60, 1),
        "eval_episodes": summary["episodes"],
        "success_rate": summary["success_rate"],
        "ci95_low": round(lo, 3),
        "ci95_high": round(hi, 3),
        "mean_progress": round(summary["mean_progress"], 3),
        "run_dir": str(run_dir),
    }


def main() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = parse_cli(BCBenchmarkConfig)
    rows = [run_size(cfg, n) for n in cfg.sizes]
    print_table(rows, f"BC success in sim ({cfg.sim.task}), {cfg.policy_config}, data {cfg.dataset_root}")
    figures = {
        "task": cfg.sim.task,
        "dataset_root": cfg.dataset_root,
        "policy_config": cfg.policy_config,
        "rows": rows,
    }
    print(f"wrote {write_result(cfg.name, figures)}")


if __name__ == "__main__":
    main()
