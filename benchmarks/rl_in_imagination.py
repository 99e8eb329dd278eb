"""RL in imagination: sim success of the BC policy before and after fine-tuning in the world model.

python benchmarks/rl_in_imagination.py --finetune_config=configs/finetune/tiny.yaml \
    --policy=outputs/policy/tiny/pretrained_model --world_model=outputs/world_model/tiny/pretrained_model
    [--finetune.algorithm.type=ppo] [--loop_rounds=3 --loop_dataset_root=outputs/data/reach_wm]
    [--finetune.algorithm.lr=1e-4] [--seeds=[0,1,2] --jobs=2 --threads=1]

Runs `finetune_policy.py` (imagination only for training; sim steps counted, must be 0; with
`--finetune.rollouts=sim` the simulator's own rollouts instead, the recipe's ceiling) with the config's
algorithm (GRPO) or another (`--finetune.algorithm.type=ppo`), or with `--loop_rounds=N` the closed loop (the policy's sim
episodes recorded into the world model's data, world model and policy fine-tuned again, N rounds), then
evaluates the BC and the final policy in the simulator on `final_episodes` held-out episodes (seeds
disjoint from training starts, in-loop evaluation and recording) with Wilson 95% intervals. Prints the
table and writes benchmarks/results/rl_in_imagination[_ppo][_loop].json; the learning curve PNG is
`<output_dir>/learning_curve.png`, the loop's per-round plot `<output_dir>/closed_loop.png`.
Any `--finetune.<key>=<value>` is passed on to the fine-tuning config as `--<key>=<value>` (e.g.
`--finetune.env.success_threshold=0.9`, `--finetune.algorithm.lr=1e-4`), after the config file.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import ConfigError, parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.common.stats import mean_ci  # noqa: E402
from worldloop.rl_finetune.closed_loop import run_closed_loop  # noqa: E402
from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig, finetune, finished_run  # noqa: E402
from worldloop.rl_finetune.sim_steps import count_sim_steps  # noqa: E402
from worldloop.vla.factory import load_policy  # noqa: E402
from worldloop.vla.sim_evaluation import evaluate_in_sim  # noqa: E402


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
    loop_rounds: int = 0  # > 0: the closed loop with this many rounds
    loop_dataset_root: str = ""  # the closed loop: the world model's training data; "" -> the config's
    loop_episodes: int = 0  # sim episodes recorded per round; 0 -> the config's
    loop_world_model_steps: int = 0  # world-model fine-tune steps per round; 0 -> the config's
    # timing_only: one GRPO iteration with the config's group sizes (weights do not change the cost):
    # wall time per iteration and its split into imagination and the update; no sim, no before/after.
    timing_only: bool = False
    # Fine-tune once per seed (finetune's --seed; each under <output_dir>/seed_<s>) and report the mean gain
    # with its Student-t 95% interval and every seed's gain; None: one run with the config's seed.
    seeds: list[int] | None = None
    # Seeds fine-tuned at once, each in its own process with `threads` threads (jobs x threads <= cores).
    jobs: int = 1
    observe: str = (
        ""  # drawn | first_frame: what the policy sees in imagination; "" -> the config's env.observe
    )
    # "" -> rl_in_imagination[_ppo|_nft][_loop] (timing_only: rl_in_imagination_timing[_ppo|_nft]); another
    # name keeps a smoke run apart
    result_name: str = ""


def time_one_iteration(cfg: RLInImaginationBenchmarkConfig, ft_cfg: FinetunePolicyConfig) -> None:
    import time

    from worldloop.rl_finetune.policy_rl.finetune import make_trainer, training_starts
    from worldloop.rl_finetune.policy_rl.flow_policy_gradient import mixed_starts
    from worldloop.world_model.model import WorldModel
    from worldloop.world_model.world_model_env import WorldModelEnv

    env = WorldModelEnv(WorldModel.from_pretrained(cfg.world_model), ft_cfg.env)
    trainer = make_trainer(ft_cfg, load_policy(cfg.policy), env)
    starts = training_starts(ft_cfg, env).select(list(range(ft_cfg.algorithm.starts_per_iteration)))
    t0 = time.perf_counter()
    with count_sim_steps() as counter:
        data = trainer.collect(starts, seed=0)
        t1 = time.perf_counter()
        logs = trainer.update(data, seed=0)
    t2 = time.perf_counter()
    row = {"algorithm": ft_cfg.algorithm.type, "episodes": ft_cfg.episodes_per_iteration, "horizon": ft_cfg.env.horizon, "imagine_s": t1 - t0, "update_s": t2 - t1,
           "chunk_samples": len(data), "gradient_steps": logs["gradient_steps"], "sim_steps": counter.steps,
           "imagined_success": data.success.mean().item(), "mixed_starts": mixed_starts(data.success, trainer.cfg)}  # fmt: skip
    print_table([row], title=f"one {trainer.algorithm} iteration in imagination")
    figures = {"one_iteration": row, "iterations_per_60_min": 3600 / (t2 - t0), "policy": cfg.policy,
               "world_model": cfg.world_model, "finetune_config": cfg.finetune_config,
               ft_cfg.algorithm.type: vars(ft_cfg.algorithm), "load_average_1_5_15min": os.getloadavg()}  # fmt: skip
    suffix = "" if ft_cfg.algorithm.type == "grpo" else f"_{ft_cfg.algorithm.type}"
    path = write_result(
        cfg.result_name or f"rl_in_imagination_timing{suffix}",
        figures,
        " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
    )
    print(f"wrote {path}")


PASSED_ON = "--finetune."  # options for the fine-tuning config rather than the benchmark


def main() -> None:
    args = sys.argv[1:]
    spaced = [a for a in args if a.startswith(PASSED_ON) and "=" not in a]
    if spaced:  # its value would otherwise land among the benchmark's own options
        raise ConfigError(f"{spaced[0]}: pass fine-tuning options as {PASSED_ON}<key>=<value>, with '='")
    cfg = parse_cli(RLInImaginationBenchmarkConfig, [a for a in args if not a.startswith(PASSED_ON)])
    passed_on = ["--" + a[len(PASSED_ON) :] for a in args if a.startswith(PASSED_ON)]
    if cfg.jobs < 1:
        raise ConfigError(f"jobs={cfg.jobs}: the number of seeds fine-tuned at once must be at least 1")
    torch.set_num_threads(cfg.threads)
    overrides = [
        f"--policy.path={cfg.policy}",
        f"--world_model={cfg.world_model}",
        f"--output_dir={cfg.output_dir}",
    ]
    optional = {
        "iterations": cfg.iterations, "loop.rounds": cfg.loop_rounds,
        "loop.dataset_root": cfg.loop_dataset_root, "loop.episodes": cfg.loop_episodes,
        "loop.world_model_train.steps": cfg.loop_world_model_steps,
    }  # fmt: skip
    overrides += [f"--{key}={value}" for key, value in optional.items() if value]
    if cfg.observe:
        overrides.append(f"--env.observe={cfg.observe}")

    def config_for(seed: int | None) -> FinetunePolicyConfig:
        # With --seeds each run writes under <output_dir>/seed_<s>; the passed-on options come last.
        per_seed = (
            []
            if seed is None
            else [f"--seed={seed}", f"--output_dir={Path(cfg.output_dir) / f'seed_{seed}'}"]
        )
        return parse_cli(
            FinetunePolicyConfig, ["--config", cfg.finetune_config, *overrides, *passed_on, *per_seed]
        )

    ft_cfg = config_for(None)
    if cfg.timing_only:
        time_one_iteration(cfg, ft_cfg)
        return
    bc = evaluate_final(cfg, ft_cfg, cfg.policy)
    seed_cfgs = [config_for(seed) for seed in cfg.seeds or [None]]
    jobs = min(cfg.jobs, len(seed_cfgs))
    if jobs > 1:
        # spawn: a forked child would inherit this process's OpenMP and EGL state
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            runs = list(pool.map(partial(finetune_and_evaluate, cfg), seed_cfgs))
    else:
        runs = [finetune_and_evaluate(cfg, seed_cfg) for seed_cfg in seed_cfgs]
    figures = figures_of(cfg, ft_cfg, bc, runs)
    name = "rl_in_imagination" + ("" if ft_cfg.algorithm.type == "grpo" else f"_{ft_cfg.algorithm.type}")
    name = cfg.result_name or name + ("_loop" if ft_cfg.loop.rounds else "")
    path = write_result(name, figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


def finetune_and_evaluate(
    cfg: RLInImaginationBenchmarkConfig, ft_cfg: FinetunePolicyConfig
) -> tuple[FinetunePolicyConfig, dict, dict]:
    """One seed's run: fine-tuned, then its final policy evaluated in the sim (in a worker with --jobs)."""
    torch.set_num_threads(cfg.threads)
    summary, final_policy = run_finetuning(ft_cfg)
    return ft_cfg, summary, evaluate_final(cfg, ft_cfg, final_policy)


def run_finetuning(ft_cfg: FinetunePolicyConfig) -> tuple[dict, str]:
    """Fine-tune in imagination (or run the closed loop); returns its summary and the final policy's path. A finished
    run of the same config in its output_dir (`finished_run`) is reused."""
    if not ft_cfg.loop.rounds:
        summary = finished_run(ft_cfg)
        if summary is None:
            summary = finetune(ft_cfg)
        else:
            print(f"{ft_cfg.output_dir}: a finished run of this config, reused (delete it to train again)")
        return summary, str(Path(ft_cfg.output_dir) / "pretrained_model")
    loop = run_closed_loop(ft_cfg)
    summary = {
        "train_sim_steps": loop["sim_steps"]["training"],
        "eval_sim_steps": loop["sim_steps"]["evaluation"],
        "wall_seconds": loop["wall_seconds"],
        "iterations_run": sum(r["policy"]["iterations_run"] for r in loop["rounds"]),
        "stopped": [r["policy"]["stopped"] for r in loop["rounds"]],
        "evaluations": [
            {"round": r["round"], "before": r["before"], "after": r["after"]} for r in loop["rounds"]
        ],
        "loop": loop,
    }
    return summary, loop["final"]["policy"]


def evaluate_final(cfg: RLInImaginationBenchmarkConfig, ft_cfg: FinetunePolicyConfig, path: str) -> dict:
    """The policy at `path` on `final_episodes` held-out sim episodes (seeds final_seed..)."""
    with count_sim_steps() as counter:
        result = evaluate_in_sim(load_policy(path), ft_cfg.eval.sim, cfg.final_episodes, cfg.final_seed, None)
    result["sim_steps"] = counter.steps
    return result


FINAL_KEYS = ("success_rate", "success_ci95", "mean_progress", "episodes")


def seed_figures(ft_cfg: FinetunePolicyConfig, summary: dict, bc: dict, final: dict) -> dict:
    """One run's figures: its held-out sim success and gain over BC, and where the run ended."""
    after = summary.get("after")  # the kept weights' in-loop evaluation (None: the closed loop)
    cpu_seconds = summary.get("cpu_seconds")  # the closed loop does not count it
    return {
        "seed": ft_cfg.seed,
        "after": {k: final[k] for k in FINAL_KEYS},
        "gain_points": 100 * (final["success_rate"] - bc["success_rate"]),
        "train_sim_steps": summary["train_sim_steps"],
        "eval_sim_steps_in_loop": summary["eval_sim_steps"],
        "finetune_wall_minutes": summary["wall_seconds"] / 60,
        # CPU time of the fine-tuning process, all threads: the budget is 60 CPU-minutes
        "finetune_cpu_minutes": None if cpu_seconds is None else cpu_seconds / 60,
        "iterations_run": summary["iterations_run"],
        "stopped": summary["stopped"],
        # the evaluated weights the run ended with (eval.keep); None: the closed loop
        "kept_iteration": None if after is None else after["iteration"],
        # imagined - sim success at the kept weights, on the in-loop held-out evaluation
        "imagined_minus_sim_at_kept": None if after is None else after["gap"],
        # the judge's verdicts on the training rollouts (None: the closed loop)
        "training_rollouts": summary.get("training_rollouts"),
        "in_loop_evaluations": summary["evaluations"],
        "learning_curve_png": None
        if ft_cfg.loop.rounds
        else str(Path(ft_cfg.output_dir) / "learning_curve.png"),
    }


def sim_row(policy: str, seed, result: dict) -> dict:
    lo, hi = result["success_ci95"]
    return {"policy": policy, "seed": seed, "sim_success": result["success_rate"], "ci95": f"{lo:.2f}-{hi:.2f}",
            "progress": result["mean_progress"], "episodes": result["episodes"], "sim_steps": result["sim_steps"]}  # fmt: skip


def figures_of(
    cfg: RLInImaginationBenchmarkConfig, ft_cfg: FinetunePolicyConfig, bc: dict, runs: list
) -> dict:
    """Print the before/after table and return the result's figures; with several seeds, the mean gain
    with its Student-t 95% interval and each seed's gain."""
    per_seed = [seed_figures(seed_cfg, summary, bc, final) for seed_cfg, summary, final in runs]
    rows = [sim_row("bc", "", bc)] + [sim_row("finetuned", c.seed, final) for c, _, final in runs]
    where = (
        f"in imagination (observe={ft_cfg.env.observe})"
        if ft_cfg.rollouts == "imagination"
        else "on the simulator's own rollouts (the recipe's ceiling; training steps the sim)"
    )
    how = f"{ft_cfg.algorithm.type.upper()} {where}" + (
        f", closed loop of {ft_cfg.loop.rounds} rounds" if ft_cfg.loop.rounds else ""
    )
    print_table(rows, title=f"\nsim success before/after {how} ({ft_cfg.eval.sim.task})")
    gains = [s["gain_points"] for s in per_seed]
    for s in per_seed:
        cpu = "unknown" if s["finetune_cpu_minutes"] is None else f"{s['finetune_cpu_minutes']:.1f}"
        print(
            f"seed {s['seed']}: gain {s['gain_points']:+.1f} points; sim steps for training "
            f"{s['train_sim_steps']}; wall {s['finetune_wall_minutes']:.1f} min, CPU {cpu} min; stopped: {s['stopped']}"
        )
    figures = {
        "algorithm": ft_cfg.algorithm.type,
        # imagination, or sim: the diagnostic whose training rollouts are the simulator's (finetune's rollouts)
        "rollouts": ft_cfg.rollouts,
        "observe": ft_cfg.env.observe,
        "before": {k: bc[k] for k in FINAL_KEYS},
        "gain_points": float(sum(gains) / len(gains)),
        "target_gain_points": 20,
        "finetune_config_resolved": asdict(ft_cfg),
        "policy": cfg.policy,
        "world_model": cfg.world_model,
        "finetune_config": cfg.finetune_config,
    }
    if cfg.seeds:
        ci = mean_ci(gains)
        print(
            f"mean gain {ci['mean']:+.1f} points, 95% CI [{ci['low']:+.1f}, {ci['high']:+.1f}] over seeds {cfg.seeds}"
        )
        figures.update(
            {"seeds": cfg.seeds, "gain_points_ci95": [ci["low"], ci["high"]], "gain_points_std": ci["std"],
             "every_seed_positive": all(g > 0 for g in gains), "per_seed": per_seed}
        )  # fmt: skip
    else:
        figures.update(per_seed[0])  # one run: its figures at the top level, as before --seeds
    if ft_cfg.loop.rounds:
        figures["loop"] = [
            loop_figures(summary["loop"], seed_cfg.output_dir) for seed_cfg, summary, _ in runs
        ]
    figures["load_average_1_5_15min"] = os.getloadavg()  # the machine is shared: contention slows everything
    return figures


def loop_figures(loop: dict, output_dir: str) -> dict:
    return {
        "rounds": [
            {"round": r["round"], "recorded_sim_success": r["recorded"]["sim_success"],
             "dataset_episodes": r["dataset"]["episodes"], "world_model_steps": r["world_model"]["steps"],
             "world_model_loss_first_last_tenth": [r["world_model"]["loss_first_tenth"],
                                                   r["world_model"]["loss_last_tenth"]],
             "sim_success_after": r["after"]["sim_success"], "gap_after": r["after"]["gap"]}
            for r in loop["rounds"]
        ],
        "collection_sim_steps": loop["sim_steps"]["collection"],
        "closed_loop_png": str(Path(output_dir) / "closed_loop.png"),
    }  # fmt: skip


if __name__ == "__main__":
    main()
