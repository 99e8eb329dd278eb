"""Fine-tune a BC policy with RL inside the world model; the simulator only evaluates.

python finetune_policy.py --config configs/finetune/tiny.yaml \
    --policy.path=outputs/policy/tiny/pretrained_model --world_model=outputs/world_model/tiny/pretrained_model

`--algorithm.type=grpo` (default: group-relative baseline, `rl_finetune/policy_rl/grpo/`),
`--algorithm.type=ppo` (a value head on the BC policy's observation features and GAE,
`rl_finetune/policy_rl/ppo/`) or `--algorithm.type=nft` (likelihood-free DiffusionNFT on the policy's own
chunks, `rl_finetune/policy_rl/nft/`); the chosen algorithm's settings under `--algorithm.*` (e.g.
`--algorithm.lr=1e-4`). `--eval.keep=best_imagined` ends with the evaluated weights of the highest
imagined success (chosen without the simulator) instead of the last ones.

Writes `<output_dir>/pretrained_model/` (the fine-tuned policy), `summary.json` (imagined vs sim success
before/after, sim steps used for training (always 0) and for evaluation, wall time), `metrics.jsonl` and
`learning_curve.png`; `checkpoints/<iteration>/` at each passed evaluation (`--resume=true` continues from the
last one exactly).

The closed loop, `--loop.rounds=N --loop.dataset_root=<the world model's LeRobotDataset>`: each round runs
the current policy in the sim for `--loop.episodes` episodes and records them (failures included), adds them
to a grown copy of the world model's data, fine-tunes the world model on it for
`--loop.world_model_train.steps` steps from its current weights, then fine-tunes the policy in imagination
again (`rl_finetune/closed_loop.py`). Writes `round_<r>/` per round, `closed_loop.json` and `closed_loop.png`
(sim success and imagined-vs-sim gap per round); sim steps are reported for collection, evaluation and
training (always 0) separately.
"""

from __future__ import annotations

import logging
import os

from worldloop.common.config import parse_cli
from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig, finetune


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = parse_cli(FinetunePolicyConfig, args)
    if cfg.loop.rounds:
        from worldloop.rl_finetune.closed_loop import run_closed_loop

        result = run_closed_loop(cfg)
        for r in result["rounds"]:
            before, after = r["before"], r["after"]
            print(
                f"round {r['round']}: recorded {r['recorded']['episodes']} sim episodes "
                f"({r['recorded']['sim_success']:.0%} success), data {r['dataset']['episodes']} episodes; "
                f"sim success {before['sim_success']:.1%} -> {after['sim_success']:.1%}, gap "
                f"{before['gap']:+.2f} -> {after['gap']:+.2f}"
            )
        steps = result["sim_steps"]
        print(
            f"sim steps: training {steps['training']}, collection {steps['collection']}, evaluation "
            f"{steps['evaluation']}; {result['wall_seconds'] / 60:.1f} min; wrote {cfg.output_dir}"
        )
        return
    summary = finetune(cfg)
    before, after = summary["before"], summary["after"]
    print(
        f"sim success {before['sim_success']:.1%} -> {after['sim_success']:.1%}, imagined "
        f"{before['imagined_success']:.1%} -> {after['imagined_success']:.1%}; sim steps for training "
        f"{summary['train_sim_steps']}, for evaluation {summary['eval_sim_steps']}; "
        f"{summary['wall_seconds'] / 60:.1f} min; wrote {cfg.output_dir}"
    )


if __name__ == "__main__":
    main()
