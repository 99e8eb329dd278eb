"""RL in imagination: sim success of the BC policy before and after GRPO fine-tuning in the world model.

python benchmarks/rl_in_imagination.py --finetune_config=configs/finetune/tiny.yaml \
    --policy=outputs/policy/tiny/pretrained_model --world_model=outputs/world_model/tiny/pretrained_model

Runs `finetune_policy.py`'s loop (imagination only for training; sim steps counted, must be 0), then
evaluates the BC and the fine-tuned policy in the simulator on `final_episodes` held-out episodes (seeds
disjoint from training starts) with Wilson 95% intervals. Prints the table, writes
benchmarks/results/rl_in_imagination.json; the learning curve PNG is `<output_dir>/learning_curve.png`.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import print_table, write_result  # noqa: E402
from common.config import parse_cli  # noqa: E402
from rl_finetune.policy_finetune import FinetunePolicyConfig, finetune  # noqa: E402
from rl_finetune.sim_steps import count_sim_steps  # noqa: E402
from vla.factory import load_policy  # noqa: E402
from vla.sim_evaluation import evaluate_in_sim  # noqa: E402


@dataclass
class RLInImaginationBenchmarkConfig:
    finetune_config: str = "configs/finetune/tiny.yaml"  # the finetune_policy.py config to run
    policy: str = "outputs/policy/tiny/pretrained_model"
    world_model: str = "outputs/world_model/tiny/pretrained_model"
    output_dir: str = "outputs/benchmarks/rl_in_imagination"
    iterations: int = 0  # 0 -> the config's
    final_episodes: int = 100  # sim episodes for the before/after comparison
    final_seed: int = 200_000  # disjoint from training starts and the in-loop evaluation
    threads: int = 2
    # timing_only: one GRPO iteration with the config's group sizes (weights do not change the cost):
    # wall time per iteration and its split into imagination and the update; no sim, no before/after.
    timing_only: bool = False


def time_one_iteration(cfg: RLInImaginationBenchmarkConfig, ft_cfg: FinetunePolicyConfig) -> None:
    import time

    from rl_finetune.grpo import GRPOTrainer
    from rl_finetune.policy_finetune import training_starts
    from world_model.model import WorldModel
    from world_model.world_model_env import WorldModelEnv

    env = WorldModelEnv(WorldModel.from_pretrained(cfg.world_model), ft_cfg.env)
    trainer = GRPOTrainer(load_policy(cfg.policy), env, ft_cfg.grpo, seed=ft_cfg.seed)
    starts = training_starts(ft_cfg, env).select(list(range(ft_cfg.grpo.starts_per_iteration)))
    t0 = time.perf_counter()
    with count_sim_steps() as counter:
        data = trainer.collect(starts, seed=0)
        t1 = time.perf_counter()
        logs = trainer.update(data, seed=0)
    t2 = time.perf_counter()
    episodes = ft_cfg.grpo.starts_per_iteration * ft_cfg.grpo.group_size
    row = {"episodes": episodes, "horizon": ft_cfg.env.horizon, "imagine_s": t1 - t0, "update_s": t2 - t1,
           "chunk_samples": len(data), "gradient_steps": logs["gradient_steps"], "sim_steps": counter.steps}  # fmt: skip
    print_table([row], title="one GRPO iteration in imagination")
    figures = {"one_iteration": row, "iterations_per_60_min": 3600 / (t2 - t0), "policy": cfg.policy,
               "world_model": cfg.world_model, "finetune_config": cfg.finetune_config,
               "grpo": vars(ft_cfg.grpo), "load_average_1_5_15min": os.getloadavg()}  # fmt: skip
    path = write_result(
        "rl_in_imagination_timing", figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    )
    print(f"wrote {path}")


def main() -> None:
    cfg = parse_cli(RLInImaginationBenchmarkConfig)
    torch.set_num_threads(cfg.threads)
    overrides = [
        f"--policy.path={cfg.policy}",
        f"--world_model={cfg.world_model}",
        f"--output_dir={cfg.output_dir}",
    ]
    if cfg.iterations:
        overrides.append(f"--iterations={cfg.iterations}")
    ft_cfg = parse_cli(FinetunePolicyConfig, ["--config", cfg.finetune_config, *overrides])
    if cfg.timing_only:
        time_one_iteration(cfg, ft_cfg)
        return
    summary = finetune(ft_cfg)

    rows, finals = [], {}
    for name, path in (("bc", cfg.policy), ("finetuned", str(Path(cfg.output_dir) / "pretrained_model"))):
        sim_cfg = ft_cfg.eval.sim
        with count_sim_steps() as counter:
            result = evaluate_in_sim(load_policy(path), sim_cfg, cfg.final_episodes, cfg.final_seed, None)
        finals[name] = result
        lo, hi = result["success_ci95"]
        rows.append(
            {"policy": name, "sim_success": result["success_rate"], "ci95": f"{lo:.2f}-{hi:.2f}",
             "progress": result["mean_progress"], "episodes": result["episodes"], "sim_steps": counter.steps}
        )  # fmt: skip
    print_table(rows, title=f"\nsim success before/after GRPO in imagination ({ft_cfg.eval.sim.task})")
    gain = finals["finetuned"]["success_rate"] - finals["bc"]["success_rate"]
    print(
        f"\ngain {gain:+.1%}; sim steps for training {summary['train_sim_steps']}; "
        f"fine-tuning wall time {summary['wall_seconds'] / 60:.1f} min; stopped: {summary['stopped']}"
    )
    figures = {
        "before": {k: finals["bc"][k] for k in ("success_rate", "success_ci95", "mean_progress", "episodes")},
        "after": {
            k: finals["finetuned"][k] for k in ("success_rate", "success_ci95", "mean_progress", "episodes")
        },
        "gain_points": 100 * gain,
        "target_gain_points": 20,
        "train_sim_steps": summary["train_sim_steps"],
        "eval_sim_steps_in_loop": summary["eval_sim_steps"],
        "finetune_wall_minutes": summary["wall_seconds"] / 60,
        "iterations_run": summary["iterations_run"],
        "stopped": summary["stopped"],
        "in_loop_evaluations": summary["evaluations"],
        "learning_curve_png": str(Path(cfg.output_dir) / "learning_curve.png"),
        "policy": cfg.policy,
        "world_model": cfg.world_model,
        "finetune_config": cfg.finetune_config,
    }
    figures["load_average_1_5_15min"] = os.getloadavg()  # the machine is shared: contention slows everything
    path = write_result("rl_in_imagination", figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
