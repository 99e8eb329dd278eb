"""Fine-tune a BC policy with RL inside the world model (GRPO); the simulator only evaluates.

python finetune_policy.py --config configs/finetune/tiny.yaml \
    --policy.path=outputs/policy/tiny/pretrained_model --world_model=outputs/world_model/tiny/pretrained_model

Writes `<output_dir>/pretrained_model/` (the fine-tuned policy), `summary.json` (imagined vs sim success
before/after, sim steps used for training (always 0) and for evaluation, wall time), `metrics.jsonl` and
`learning_curve.png`; `checkpoints/<iteration>/` at each passed evaluation (`--resume=true` continues from the
last one exactly).
"""

from __future__ import annotations

import logging
import os

from common.config import parse_cli
from rl_finetune.policy_finetune import FinetunePolicyConfig, finetune


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = parse_cli(FinetunePolicyConfig, args)
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
